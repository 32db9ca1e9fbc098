// `attend plan`'s lines about layers that are not plain attention: the per-sequence state and
// the expanded size of latent attention among the sizes, the per-layer breakdown (--layers),
// and the state's line on the plot.
//
// Thread-safety: pure functions.
#ifndef ATTEND_CLIENT_CLI_COMMANDS_PLAN_LAYERS_H_
#define ATTEND_CLIENT_CLI_COMMANDS_PLAN_LAYERS_H_

#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include "attend/v1/planner.pb.h"
#include "client/cli/render/format.h"
#include "client/cli/render/svg_chart.h"

namespace attend::cli {

// "attention", "sliding window 4,096", "chunked 8,192", "latent 512 + 64", "linear attention",
// "state space", "feed-forward".
std::string LayerKindLabel(const v1::LayerSpec& layer);

// A KV (or state) type's name as plans print it: "bfloat16", "fp8", "q4_0", ...
std::string KvDTypeName(v1::KvDType dtype);

// Adds "state per sequence" (and the batch's) when some layer holds a state, and "expanded
// (multi-head)" when some layer is latent.
void AddPlanStateFields(const v1::PlanKvCacheResponse& plan, Fields* fields);

// One row per group of the plan's layer_groups: layers, kind, KV heads, bytes per token per
// layer, state per layer, the group's bytes per sequence.
void PrintPlanLayers(std::ostream& out, const v1::PlanKvCacheResponse& plan);

// A dashed line at the batch's state (which the variant lines include), when there is one.
void AddStateSeries(const v1::PlanKvCacheResponse& plan, const std::vector<int64_t>& xs,
                    LineChart* chart);

}  // namespace attend::cli

#endif  // ATTEND_CLIENT_CLI_COMMANDS_PLAN_LAYERS_H_
