// The catalog's presets whose layers are not all plain attention (latent attention, hybrids,
// chunked and sliding layers, state-space models), built in code because their layer specs
// follow each family's rule. Part of Catalog() (catalog.h).
//
// Thread-safety: pure function.
#ifndef ATTEND_PLANNER_CATALOG_HYBRID_H_
#define ATTEND_PLANNER_CATALOG_HYBRID_H_

#include <vector>

#include "planner/model.h"

namespace attend::planner {

// DeepSeek-V3, Qwen3-Next 80B-A3B, Jamba v0.1, gpt-oss-120b, Llama 4 Scout and Mamba-Codestral
// 7B (Mamba-2), each canonical, with its source and the published parameter count.
std::vector<ModelSpec> HybridPresets();

}  // namespace attend::planner

#endif  // ATTEND_PLANNER_CATALOG_HYBRID_H_
