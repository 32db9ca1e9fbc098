#include "client/cli/plan_layers.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace attend::cli {
namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

// "3, 7, 11, ..., 47", or all of them when there are few.
std::string Indices(const v1::LayerGroupPlan& g) {
  const auto& l = g.layer_indices();
  if (l.size() <= 6) return absl::StrJoin(l, ", ");
  return absl::StrCat(l[0], ", ", l[1], ", ", l[2], ", ..., ", l[l.size() - 1]);
}

// The state dtype's name as plan_command.cc prints KV types.
std::string StateDTypeName(v1::KvDType dtype) {
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

}  // namespace

std::string LayerKindLabel(const v1::LayerSpec& l) {
  switch (l.kind()) {
    case v1::LAYER_CHUNKED_ATTENTION:
      return absl::StrCat("chunked ", Count(l.window_tokens()));
    case v1::LAYER_LATENT_ATTENTION:
      return absl::StrCat("latent ", l.kv_lora_rank(), " + ", l.qk_rope_head_dim());
    case v1::LAYER_LINEAR_ATTENTION:
      return "linear attention";
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
  if (p.state_bytes_per_sequence() == 0) return;
  f->Add("state per sequence",
         absl::StrCat(BytesWithCount(p.state_bytes_per_sequence()), " in ",
                      StateDTypeName(p.state_dtype()), ", fixed (included above)"));
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
