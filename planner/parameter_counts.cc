#include "planner/parameter_counts.h"

#include <algorithm>
#include <optional>

#include "absl/strings/str_cat.h"
#include "core/base/tensor.h"

namespace attend::planner {

ProjectionParameters LayerProjectionParameters(const ModelSpec& model, int64_t layer) {
  const int64_t kv = LayerKvHeads(model, layer);
  ProjectionParameters p;
  p.wq = model.d_model * model.n_head * model.head_dim;
  p.wk = model.d_model * kv * model.head_dim;
  p.wv = model.d_model * kv * model.head_dim_v;
  p.wo = model.n_head * model.head_dim_v * model.d_model;
  return p;
}

std::vector<LayerProjectionKind> LayerProjectionKinds(const ModelSpec& model) {
  std::vector<LayerProjectionKind> kinds;
  if (model.d_model <= 0) return kinds;
  for (int64_t layer = 0; layer < model.layers; ++layer) {
    const LayerKind kind = LayerKindOf(model, layer);
    if (kind != LayerKind::kAttention && kind != LayerKind::kChunkedAttention) continue;
    const int64_t kv = LayerKvHeads(model, layer);
    // A handful of kinds at most (kMaxLayers bounds the scan), so a linear search is enough.
    auto it = std::find_if(kinds.begin(), kinds.end(),
                           [kv](const LayerProjectionKind& k) { return k.n_head_kv == kv; });
    if (it == kinds.end()) {
      kinds.push_back({kv, 1, layer, LayerProjectionParameters(model, layer)});
    } else {
      ++it->layers;
    }
  }
  return kinds;
}

bool HasGatedMlp(const ModelSpec& model) { return model.architecture != "falcon"; }

absl::StatusOr<ParameterCount> ComputeParameters(const ModelSpec& model) {
  for (const auto& [field, value] : {std::pair<const char*, int64_t>{"d_model", model.d_model},
                                     {"vocab_size", model.vocab_size},
                                     {"intermediate_size", model.intermediate_size}}) {
    if (value <= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, " is unknown (0): the parameter count cannot be computed"));
    }
  }
  if (HasNonAttentionLayers(model)) {
    // Latent attention, recurrent mixers and feed-forward-only blocks have weights of their own
    // shapes (down/up projections, SSM in/out projections) that the rules below do not describe.
    return absl::InvalidArgumentError(
        "the parameter count of latent-attention, linear-attention, state-space and "
        "feed-forward-only layers is not computed from the shape; give the published count");
  }
  // Under the CanonicalModel bounds each per-layer term fits in int64 (the largest, experts x 3 x
  // d_model x intermediate, stays below 2^58), but summed over 4096 layers they can overflow, so
  // the sums are checked.
  const bool qkv_bias = model.architecture == "qwen2";
  const bool falcon = model.architecture == "falcon";
  const int64_t experts = std::max<int64_t>(model.experts, 1);
  const int64_t experts_active = std::max<int64_t>(model.experts_active, 1);
  // Parameters of one norm: an RMSNorm's weight, or a LayerNorm's weight and bias (Falcon).
  const int64_t norm = falcon ? 2 * model.d_model : model.d_model;

  ParameterCount count;
  count.embedding = model.vocab_size * model.d_model;
  count.lm_head = model.tied_embeddings ? 0 : count.embedding;
  const int64_t mlp_matrices = HasGatedMlp(model) ? 3 : 2;
  std::optional<int64_t> mlp = CheckedMul(mlp_matrices * model.d_model, model.intermediate_size);
  if (!mlp) return absl::InvalidArgumentError("the MLP parameter count overflows int64");
  count.per_layer_mlp = *mlp;
  const int64_t router = experts > 1 ? model.d_model * experts : 0;

  std::optional<int64_t> total = count.embedding + count.lm_head + norm;
  std::optional<int64_t> active = total;
  for (int64_t layer = 0; layer < model.layers; ++layer) {
    const int64_t kv = LayerKvHeads(model, layer);
    // Falcon-7B's multi-query layer feeds attention and MLP from one input LayerNorm; Falcon's
    // other layouts have two norms per layer, as Llama-style layers do (gemma2 adds two
    // post-norms).
    int64_t norms_per_layer = model.architecture == "gemma2" ? 4 : 2;
    if (falcon && kv == 1) norms_per_layer = 1;
    int64_t attention = LayerProjectionParameters(model, layer).total();
    if (qkv_bias)
      attention += model.n_head * model.head_dim + kv * (model.head_dim + model.head_dim_v);
    if (layer == 0) count.per_layer_attention = attention;
    const int64_t fixed = attention + router + norms_per_layer * norm;
    std::optional<int64_t> all_experts = CheckedMul(*mlp, experts);
    std::optional<int64_t> used_experts = CheckedMul(*mlp, experts_active);
    if (!all_experts || !used_experts || !total || !active) {
      return absl::InvalidArgumentError("the parameter count overflows int64");
    }
    total = CheckedAdd(*total, fixed);
    if (total) total = CheckedAdd(*total, *all_experts);
    active = CheckedAdd(*active, fixed);
    if (active) active = CheckedAdd(*active, *used_experts);
  }
  if (!total || !active) return absl::InvalidArgumentError("the parameter count overflows int64");
  count.total = *total;
  count.active = *active;
  return count;
}

}  // namespace attend::planner
