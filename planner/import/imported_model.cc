#include "planner/import/imported_model.h"

#include <algorithm>
#include <string>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "core/base/status_macros.h"
#include "planner/parameter_counts.h"

namespace attend::planner {

std::string SanitizeText(absl::string_view text) {
  std::string out;
  for (char c : text.substr(0, kMaxNameBytes)) {
    const unsigned char u = static_cast<unsigned char>(c);
    out.push_back(u >= 0x20 && u < 0x7F ? c : '?');
  }
  return out;
}

std::string ModelKey(absl::string_view text) {
  std::string key;
  bool dash = false;
  for (char c : text) {
    const char l = absl::ascii_tolower(static_cast<unsigned char>(c));
    if ((l >= 'a' && l <= 'z') || (l >= '0' && l <= '9') || l == '.') {
      if (dash && !key.empty()) key.push_back('-');
      dash = false;
      key.push_back(l);
      if (key.size() >= 64) break;
    } else {
      dash = true;
    }
  }
  return key;
}

void NameImportedModel(absl::string_view name, absl::string_view label,
                       absl::string_view fallback_key, ModelSpec* model) {
  if (!name.empty()) {
    model->name = std::string(name);
    model->display_name = std::string(name);
    return;
  }
  model->name = ModelKey(label);
  if (model->name.empty()) model->name = std::string(fallback_key);
  model->display_name = label.empty() ? model->name : SanitizeText(label);
}

absl::StatusOr<ModelSpec> FinishImportedModel(ModelSpec m) {
  const bool uniform =
      std::all_of(m.layer_specs.begin(), m.layer_specs.end(), [&](const LayerSpec& l) {
        return l.kind == LayerKind::kAttention && l.window_tokens == 0 &&
               (l.n_head_kv == 0 || l.n_head_kv == m.n_head_kv);
      });
  if (uniform) m.layer_specs.clear();
  ATTEND_ASSIGN_OR_RETURN(m, CanonicalModel(m));
  absl::StatusOr<ParameterCount> count = ComputeParameters(m);
  if (count.ok()) {
    m.parameters = count->total;
    m.active_parameters = count->active;
    m.parameters_source =
        absl::StrCat("computed from the shape (ComputeParameters: embeddings, attention, ",
                     HasGatedMlp(m) ? "gated MLP, norms)" : "two-matrix MLP, LayerNorms)");
  } else {
    m.parameters = 0;
    m.active_parameters = 0;
    m.parameters_source = absl::StrCat("unknown: ", count.status().message());
  }
  return m;
}

}  // namespace attend::planner
