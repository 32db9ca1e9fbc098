// Catalog presets of the 2025-2026 releases whose layers need the newer layer kinds and fields:
// DeepSeek sparse attention's indexer (DeepSeek-V3.2, GLM-5), lightning attention (MiniMax-M1),
// Kimi Delta Attention (Kimi Linear) and per-layer key/value heads (MiMo-V2-Flash). Part of
// Catalog() (catalog.h); each preset's source names the config it was read from.
//
// Thread-safety: pure function.
#ifndef ATTEND_PLANNER_CATALOG_RECENT_H_
#define ATTEND_PLANNER_CATALOG_RECENT_H_

#include <vector>

#include "planner/model.h"

namespace attend::planner {

// deepseek-v3.2, glm-5, minimax-m1, kimi-linear-48b and mimo-v2-flash, each canonical, with its
// source and published parameter count.
std::vector<ModelSpec> RecentPresets();

}  // namespace attend::planner

#endif  // ATTEND_PLANNER_CATALOG_RECENT_H_
