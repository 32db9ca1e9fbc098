#include "client/cli/render/attention_heatmap.h"

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "client/cli/render/format.h"
#include "client/output_file.h"

namespace attend::cli {
namespace {

// "causal, window 4", or "no mask".
std::string MaskWords(const client::MaskSettings& mask) {
  std::vector<std::string> words;
  if (mask.causal) words.push_back("causal");
  if (mask.window_tokens > 0) words.push_back(absl::StrCat("window ", mask.window_tokens));
  return words.empty() ? "no mask" : absl::StrJoin(words, ", ");
}

}  // namespace

void HeatmapFlags::DeclareScale(Flags& f) {
  f.Add("heatmap_scale", &scale,
        "colours of --heatmap: 'auto' (each picture its own range) or 'fixed' (0 to 1, "
        "comparable across pictures)")
      .Values({"auto", "fixed"}, "--heatmap_scale: '%s'; use auto (default) or fixed")
      .Shown("auto");
}

absl::Status HeatmapFlags::Check() const {
  if (scale && !path) {
    return absl::InvalidArgumentError("--heatmap_scale goes with --heatmap <file.svg>");
  }
  return absl::OkStatus();
}

Heatmap AttentionHeatmap(const client::FloatTensor& weights, AttentionPicture picture) {
  const int64_t heads = weights.shape[0], n_q = weights.shape[1], n_kv = weights.shape[2];
  Heatmap h;
  h.title = std::move(picture.title);
  h.heads = heads;
  h.rows = n_q;
  h.cols = n_kv;
  h.values = weights.values;
  h.masked.resize(weights.values.size());
  for (int64_t head = 0; head < heads; ++head) {
    for (int64_t i = 0; i < n_q; ++i) {
      for (int64_t j = 0; j < n_kv; ++j) {
        h.masked[static_cast<size_t>((head * n_q + i) * n_kv + j)] =
            !client::KeyVisible(picture.mask, n_q, n_kv, i, j);
      }
    }
  }
  // Queries named on their own (the "it" of a lesson) keep their own numbers unless the mask,
  // which goes by position, makes the position matter.
  const bool positional =
      picture.query_labels.empty() || picture.mask.causal || picture.mask.window_tokens > 0;
  if (picture.query_labels.empty() && !picture.key_labels.empty() && n_q <= n_kv) {
    picture.query_labels.assign(picture.key_labels.end() - n_q, picture.key_labels.end());
  }
  if (positional && n_q < n_kv) h.row_offset = n_kv - n_q;
  const bool shared =
      picture.n_head_kv > 0 && picture.n_head_kv < heads && heads % picture.n_head_kv == 0;
  std::string heads_words = Plural(heads, "head", "heads");
  if (shared) {
    const int64_t group = heads / picture.n_head_kv;
    for (int64_t head = 0; head < heads; ++head) {
      h.panel_titles.push_back(absl::StrCat("head ", head, " (KV head ", head / group, ")"));
    }
    absl::StrAppend(&heads_words, " sharing ",
                    Plural(picture.n_head_kv, "key/value head", "key/value heads"));
  }
  h.subtitle = absl::StrCat(heads_words, ", ", Plural(n_q, "query", "queries"), " x ",
                            Plural(n_kv, "key", "keys"), "; ", MaskWords(picture.mask));
  if (h.row_offset > 0 && n_q == 1) {
    absl::StrAppend(&h.subtitle, "; the query is position ", h.row_offset, " (the last)");
  } else if (h.row_offset > 0) {
    absl::StrAppend(&h.subtitle, "; queries are positions ", h.row_offset, "-", n_kv - 1,
                    " (the last ", n_q, ")");
  }
  h.row_labels = std::move(picture.query_labels);
  h.column_labels = std::move(picture.key_labels);
  if (picture.fixed_scale) h.value_max = 1.0;
  return h;
}

int WriteAttentionHeatmap(Context& c, const HeatmapFlags& heatmap,
                          const client::FloatTensor& weights, AttentionPicture picture) {
  const int64_t heads = weights.shape[0], n_q = weights.shape[1], n_kv = weights.shape[2];
  if (absl::Status s = heatmap.Check(); !s.ok()) return UsageError(c, s);
  picture.fixed_scale = heatmap.scale == "fixed";
  const Heatmap h = AttentionHeatmap(weights, std::move(picture));
  absl::StatusOr<std::string> svg = RenderHeatmapSvg(h);
  if (!svg.ok()) return LocalError(c, svg.status());
  const std::string& path = *heatmap.path;
  if (absl::Status s = client::WriteFile(path, *svg); !s.ok()) return LocalError(c, s);
  if (c.json) return kExitOk;
  *c.out << "wrote " << path << ": " << Plural(heads, "head", "heads") << " of " << n_q << " x "
         << n_kv << " weights";
  const HeatmapDrawn drawn = DrawnPart(h);
  if (drawn.truncated) {
    *c.out << " (drawn: the first " << Plural(drawn.panels, "head", "heads") << ", "
           << Plural(drawn.rows, "query", "queries") << " and " << Plural(drawn.cols, "key", "keys")
           << ")";
  }
  *c.out << "\n";
  return kExitOk;
}

}  // namespace attend::cli
