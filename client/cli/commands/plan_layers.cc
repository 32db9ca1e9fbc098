#include "client/cli/commands/plan_layers.h"

#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace attend::cli {
namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

// The layers as runs ("0-3, 5-11, 13-19"); an evenly strided list of single layers as
// "3, 7, ..., 47 (every 4th)"; past six runs otherwise, the first three and the last with "..."
// between (the group's count precedes the list).
std::string Indices(const v1::LayerGroupPlan& g) {
  const auto& l = g.layer_indices();
  std::vector<std::pair<int64_t, int64_t>> runs;
  for (const int64_t i : l) {
    if (!runs.empty() && runs.back().second + 1 == i) {
      runs.back().second = i;
    } else {
      runs.push_back({i, i});
    }
  }
  const auto run = [](const std::pair<int64_t, int64_t>& r) {
    return r.first == r.second ? absl::StrCat(r.first) : absl::StrCat(r.first, "-", r.second);
  };
  if (runs.size() <= 6)
    return absl::StrJoin(runs, ", ", [&](std::string* out, const auto& r) { out->append(run(r)); });
  const int64_t stride = l[1] - l[0];
  bool strided = runs.size() == static_cast<size_t>(l.size());
  for (int i = 1; strided && i < l.size(); ++i) strided = l[i] - l[i - 1] == stride;
  if (strided) {
    return absl::StrCat(l[0], ", ", l[1], ", ..., ", l[l.size() - 1], " (every ", stride,
                        stride == 2 ? "nd)" : (stride == 3 ? "rd)" : "th)"));
  }
  return absl::StrCat(run(runs[0]), ", ", run(runs[1]), ", ", run(runs[2]), ", ..., ",
                      run(runs.back()));
}

}  // namespace

std::string KvDTypeName(v1::KvDType dtype) {
  switch (dtype) {
    case v1::KV_FLOAT32:
      return "float32";
    case v1::KV_BFLOAT16:
      return "bfloat16";
    case v1::KV_FP8:
      return "fp8";
    case v1::KV_INT8:
      return "int8";
    case v1::KV_Q8_0:
      return "q8_0";
    case v1::KV_Q4_0:
      return "q4_0";
    default:
      return "float16";
  }
}

std::string LayerKindLabel(const v1::LayerSpec& l) {
  switch (l.kind()) {
    case v1::LAYER_CHUNKED_ATTENTION:
      return absl::StrCat("chunked ", Count(l.window_tokens()));
    case v1::LAYER_LATENT_ATTENTION:
      return absl::StrCat(
          "latent ", l.kv_lora_rank(), " + ", l.qk_rope_head_dim(),
          l.index_head_dim() > 0 ? absl::StrCat(", indexer ", l.index_head_dim()) : "");
    case v1::LAYER_LINEAR_ATTENTION:
      return "linear attention";
    case v1::LAYER_LIGHTNING_ATTENTION:
      return "lightning attention";
    case v1::LAYER_KIMI_DELTA_ATTENTION:
      return "kimi delta attention";
    case v1::LAYER_STATE_SPACE:
      return "state space";
    case v1::LAYER_FEED_FORWARD:
      return "feed-forward";
    default:
      return l.window_tokens() > 0 ? absl::StrCat("sliding window ", Count(l.window_tokens()))
                                   : "attention";
  }
}

void AddPlanStateFields(const v1::PlanKvCacheResponse& p, Fields* f) {
  if (p.expanded_bytes_per_token() != p.bytes_per_token()) {
    f->Add("  expanded (multi-head)",
           absl::StrCat(BytesWithCount(p.expanded_bytes_per_token()),
                        " per token if the latent layers cached every head"));
  }
  if (p.indexer_bytes_per_token() > 0) {
    // Part of the keys above: the indexer caches a key of every token.
    f->Add("  sparse-attention indexer",
           absl::StrCat(BytesWithCount(p.indexer_bytes_per_token()), " per token, ",
                        p.indexer_format(), " (in the keys above)"));
  }
  if (p.state_bytes_per_sequence() == 0) return;
  f->Add("state per sequence",
         absl::StrCat(BytesWithCount(p.state_bytes_per_sequence()), " in ",
                      KvDTypeName(p.state_dtype()), ", fixed (included above)"));
  if (p.batch() > 1) {
    f->Add(absl::StrCat("  state (", Plural(p.batch(), "sequence", "sequences"), ")"),
           BytesWithCount(p.state_total_bytes()));
  }
}

void PrintPlanLayers(std::ostream& out, const v1::PlanKvCacheResponse& p) {
  if (p.layer_groups_size() == 0) return;
  Table table({"layers", "kind", "kv heads", "bytes/token", "state/sequence",
               absl::StrCat("per sequence (", Count(p.context_tokens()), ")")});
  for (const v1::LayerGroupPlan& g : p.layer_groups()) {
    const bool kv = g.bytes_per_token() > 0;
    std::string per_token = kv ? Count(g.bytes_per_token()) : "-";
    if (g.expanded_bytes_per_token() != g.bytes_per_token()) {
      absl::StrAppend(&per_token, " (expanded ", Count(g.expanded_bytes_per_token()), ")");
    }
    table.AddRow(
        {absl::StrCat(g.layer_indices_size(), ": ", Indices(g)), LayerKindLabel(g.layer()),
         kv ? Count(g.layer().n_head_kv()) : "-", per_token,
         g.state_bytes_per_sequence() > 0 ? BinaryBytes(g.state_bytes_per_sequence()) : "-",
         BinaryBytes(g.bytes_per_sequence())});
  }
  out << "\nper layer (bytes per token and state of one layer; per sequence: all of the group's)\n"
      << table.Render();
}

void AddStateSeries(const v1::PlanKvCacheResponse& p, const std::vector<int64_t>& xs,
                    LineChart* chart) {
  if (p.state_total_bytes() == 0 || xs.empty()) return;
  ChartSeries s;
  s.name = absl::StrCat("state: ", BinaryBytes(p.state_total_bytes()), ", fixed");
  s.dashed = true;
  const double gib = static_cast<double>(p.state_total_bytes()) / kGiB;
  s.x = {static_cast<double>(xs.front()), static_cast<double>(xs.back())};
  s.y = {gib, gib};
  chart->series.push_back(std::move(s));
}

}  // namespace attend::cli
