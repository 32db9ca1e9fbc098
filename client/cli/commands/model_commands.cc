// `attend models` and `attend model`: the catalog's presets, and one model (a preset or an
// imported config.json / GGUF) in full.
#include <algorithm>
#include <cstdint>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "client/cli/commands/plan_layers.h"
#include "client/cli/commands/planner_commands.h"
#include "client/cli/connect/report_error.h"
#include "client/cli/framework/command.h"
#include "client/cli/render/format.h"

namespace attend::cli {
namespace {

// "8.03B", "19.4M".
std::string Parameters(int64_t n) {
  if (n <= 0) return "unknown";
  const double v = static_cast<double>(n);
  if (v >= 1e9) return absl::StrFormat("%.3gB", v / 1e9);
  if (v >= 1e6) return absl::StrFormat("%.3gM", v / 1e6);
  return Count(n);
}

// "4,096" when every layer slides with that window, "4,096 on 21/42" when some do, "-" when
// none does.
std::string WindowSummary(const v1::ModelSpec& m) {
  std::set<int64_t> windows;
  int windowed = 0;
  for (const v1::LayerSpec& l : m.layer_specs()) {
    if (l.window_tokens() > 0) {
      windows.insert(l.window_tokens());
      ++windowed;
    }
  }
  if (windowed == 0) return "-";
  std::vector<std::string> sizes;
  for (int64_t w : windows) sizes.push_back(Count(w));
  const std::string joined = absl::StrJoin(sizes, "/");
  if (windowed == m.layers()) return joined;
  return absl::StrCat(joined, " on ", windowed, "/", m.layers());
}

// Layer indices as "0, 2, 4, ..., 40" (all of them when there are few).
std::string LayerList(const std::vector<int>& layers) {
  if (layers.size() <= 8) return absl::StrJoin(layers, ", ");
  return absl::StrCat(layers[0], ", ", layers[1], ", ", layers[2], ", ..., ", layers.back());
}

// The distinct per-layer shapes of a model, one line each: the KV layers' heads and window, or
// what a layer without KV holds.
std::vector<std::string> LayerGroups(const v1::ModelSpec& m) {
  std::vector<std::pair<std::string, std::vector<int>>> groups;
  for (int i = 0; i < m.layer_specs_size(); ++i) {
    const v1::LayerSpec& l = m.layer_specs(i);
    std::string key;
    switch (l.kind()) {
      case v1::LAYER_ATTENTION:
        key = absl::StrCat(Plural(l.n_head_kv(), "key/value head", "key/value heads"), ", ",
                           l.window_tokens() > 0 ? absl::StrCat("sliding window of ",
                                                                Count(l.window_tokens()), " tokens")
                                                 : "full attention");
        break;
      case v1::LAYER_CHUNKED_ATTENTION:
      case v1::LAYER_LATENT_ATTENTION:
        key = absl::StrCat(Plural(l.n_head_kv(), "key/value head", "key/value heads"), ", ",
                           LayerKindLabel(l));
        break;
      default:
        key = LayerKindLabel(l);
        if (l.conv_state_values() + l.recurrent_state_values() > 0) {
          absl::StrAppend(&key, ", state of ", Count(l.conv_state_values()), " + ",
                          Count(l.recurrent_state_values()), " values");
        }
    }
    auto it =
        std::find_if(groups.begin(), groups.end(), [&](const auto& g) { return g.first == key; });
    if (it == groups.end()) {
      groups.push_back({key, {i}});
    } else {
      it->second.push_back(i);
    }
  }
  std::vector<std::string> lines;
  for (const auto& [key, layers] : groups) {
    lines.push_back(absl::StrCat(Plural(static_cast<int64_t>(layers.size()), "layer", "layers"),
                                 " (", LayerList(layers), "): ", key));
  }
  return lines;
}

// The variant's name; grouped-query says how many query heads share a key/value head.
std::string AttentionKind(int64_t n_head, int64_t n_head_kv) {
  const std::string variant = AttentionVariantName(n_head, n_head_kv);
  if (n_head_kv == n_head || n_head_kv == 1) return variant;
  return absl::StrCat(variant, ", ", n_head / n_head_kv, " query heads per key/value head");
}

// Lesson 3, Example 10's layout: "Wq 16,777,216  Wk 4,194,304  Wv 4,194,304  Wo 16,777,216
// parameters". A model whose layers differ in key/value heads gets one line per kind, led by
// which layers it covers, since Wk and Wv scale with them.
std::vector<std::string> ProjectionLines(const v1::PlanKvCacheResponse& plan) {
  std::vector<std::string> lines;
  for (const v1::ProjectionParameters& w : plan.projections()) {
    std::string line =
        absl::StrCat("Wq ", Count(w.wq()), "  Wk ", Count(w.wk()), "  Wv ", Count(w.wv()), "  Wo ",
                     Count(w.wo()), " parameters (", Count(w.total()), " in all)");
    if (plan.projections_size() > 1) {
      line = absl::StrCat(Plural(w.layers(), "layer", "layers"), " with ",
                          Plural(w.n_head_kv(), "key/value head", "key/value heads"),
                          " (first: layer ", w.first_layer(), "): ", line);
    }
    lines.push_back(std::move(line));
  }
  return lines;
}

int PrintModelDetails(Context& c, const client::PlannerClient& planner, const v1::ModelSpec& m) {
  if (c.json) {
    *c.out << ToJson(m);
    return kExitOk;
  }
  Fields f;
  f.Add("name", m.name());
  if (!m.architecture().empty()) f.Add("architecture", m.architecture());
  f.Add("layers", Count(m.layers()));
  f.Add("query heads", Count(m.n_head()));
  f.Add("key/value heads",
        absl::StrCat(Count(m.n_head_kv()), " (", AttentionKind(m.n_head(), m.n_head_kv()), ")"));
  f.Add("head size", m.head_dim_v() == m.head_dim()
                         ? Count(m.head_dim())
                         : absl::StrCat(Count(m.head_dim()), " (keys and queries), ",
                                        Count(m.head_dim_v()), " (values)"));
  if (m.d_model() > 0) f.Add("d_model", Count(m.d_model()));
  if (m.vocab_size() > 0) f.Add("vocabulary", Count(m.vocab_size()));
  if (m.intermediate_size() > 0) f.Add("MLP width", Count(m.intermediate_size()));
  if (m.experts() > 1) {
    f.Add("experts", absl::StrCat(m.experts(), " per layer, ", m.experts_active(), " per token"));
  }
  std::string params = m.parameters() > 0 ? absl::StrCat(Count(m.parameters()), " (",
                                                         Parameters(m.parameters()), ")")
                                          : "unknown";
  if (m.active_parameters() > 0 && m.active_parameters() != m.parameters()) {
    absl::StrAppend(&params, "; ", Count(m.active_parameters()), " (",
                    Parameters(m.active_parameters()), ") active per token");
  }
  f.Add("parameters", params);
  if (!m.parameters_source().empty()) f.Add("parameter count", m.parameters_source());
  f.Add("max context", m.max_context_tokens() > 0
                           ? absl::StrCat(Count(m.max_context_tokens()), " tokens")
                           : "unknown");
  f.Add("weights", m.weights_dtype().empty() ? "unknown type" : m.weights_dtype());
  f.Add("tied embeddings", m.tied_embeddings() ? "yes" : "no");
  const std::vector<std::string> groups = LayerGroups(m);
  if (groups.empty()) {
    f.Add("attention", absl::StrCat("every layer full attention with ",
                                    Plural(m.n_head_kv(), "key/value head", "key/value heads")));
  } else {
    for (size_t i = 0; i < groups.size(); ++i) f.Add(i == 0 ? "attention" : "", groups[i]);
  }
  // What the cache costs, and the per-layer projections, from the server: bytes per token do
  // not depend on the context.
  v1::PlanKvCacheRequest request;
  *request.mutable_model()->mutable_spec() = m;
  request.set_context_tokens(m.max_context_tokens() > 0 ? 0 : 1);
  absl::StatusOr<v1::PlanKvCacheResponse> plan = planner.PlanKvCache(request);
  if (!plan.ok()) return ReportError(c, plan.status());
  const std::vector<std::string> projections = ProjectionLines(*plan);
  for (size_t i = 0; i < projections.size(); ++i) {
    f.Add(i == 0 ? "per layer" : "", projections[i]);
  }
  std::string kv = absl::StrCat(BinaryBytes(plan->bytes_per_token()), " per token");
  if (m.max_context_tokens() > 0) {
    absl::StrAppend(&kv, ", ", BinaryBytes(plan->bytes_per_sequence()), " at ",
                    Count(m.max_context_tokens()), " tokens");
  }
  f.Add("KV cache (float16)", kv);
  f.Add("source", m.source());
  *c.out << m.display_name() << "\n" << f.Render("  ");
  return kExitOk;
}

int RunModel(Context& c, const ModelSource& source) {
  client::PlannerClient planner(c.Channel(), c.connection);
  if (source.given()) {
    v1::ModelRef ref;
    if (int code = ResolveModel(c, planner, source, &ref); code != kExitOk) return code;
    return PrintModelDetails(c, planner, ref.spec());
  }
  if (c.positional.size() != 1) {
    return UsageError(c, absl::InvalidArgumentError(
                             "give one model name (see 'attend models'), or --config / --gguf"));
  }
  absl::StatusOr<v1::ModelSpec> m = planner.GetModel(c.positional[0]);
  if (!m.ok()) return ReportError(c, m.status());
  return PrintModelDetails(c, planner, *m);
}

int RunModels(Context& c, const ModelSource& source) {
  if (!c.positional.empty() || source.given()) return RunModel(c, source);
  client::PlannerClient planner(c.Channel(), c.connection);
  absl::StatusOr<v1::ListModelsResponse> r = planner.ListModels();
  if (!r.ok()) return ReportError(c, r.status());
  if (c.json) {
    *c.out << ToJson(*r);
    return kExitOk;
  }
  Table table({"name", "layers", "heads", "kv heads", "head dim", "window", "params", "max context",
               "source"});
  for (const v1::ModelSpec& m : r->models()) {
    std::string params = Parameters(m.parameters());
    if (m.active_parameters() > 0 && m.active_parameters() != m.parameters()) {
      absl::StrAppend(&params, " (", Parameters(m.active_parameters()), " active)");
    }
    table.AddRow({m.name(), Count(m.layers()), Count(m.n_head()), Count(m.n_head_kv()),
                  m.head_dim_v() == m.head_dim() ? Count(m.head_dim())
                                                 : absl::StrCat(m.head_dim(), "/", m.head_dim_v()),
                  WindowSummary(m), params,
                  m.max_context_tokens() > 0 ? Count(m.max_context_tokens()) : "-",
                  Shorten(m.source(), 60)});
  }
  table.set_drop_order({"source", "window", "head dim", "max context"});
  const TableStyle style = TableStyleFromFlags(c.no_headers, c.wide);
  PrintTable(table, style, *c.out, *c.err);
  if (style.headers) {
    *c.out << "'attend model <name>' shows one in full; 'attend plan <name>' sizes its KV cache.\n";
  }
  return kExitOk;
}

}  // namespace

Command ModelsCommand() {
  Command models{
      "models", "list the model presets, or show one ('attend models <name>')",
      "attend models [<name>] [--json | -o wide] [--no-headers]",
      "Presets of published configurations; each names its source. With a name, the same as\n"
      "'attend model <name>'.\n"
      "Examples:\n  attend models\n  attend models llama-3-8b\n  attend --json models\n"};
  models.define = Define(RunModels);
  return models;
}

Command ModelCommand() {
  Command model{
      "model", "show one model preset (or an imported config.json / GGUF) in full",
      "attend model <name> | attend model --config config.json | --gguf model.gguf [<name>]",
      "Shape, parameter count and its source, per-layer attention (sliding windows) and the KV\n"
      "cache per token.\n"
      "Examples:\n  attend model llama-3-70b\n  attend model gemma-2-9b\n"
      "  attend model --config ~/models/Llama-3-8B/config.json\n"};
  model.define = Define(RunModel);
  return model;
}

}  // namespace attend::cli
