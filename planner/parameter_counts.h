// Parameter counts of a model computed from its shape (ModelSpec): the weights a decoder holds,
// for the cost model's 2P FLOPs per token and for the weights a memory budget must also hold.
//
// Thread-safety: pure functions.
#ifndef ATTEND_PLANNER_PARAMETER_COUNTS_H_
#define ATTEND_PLANNER_PARAMETER_COUNTS_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "planner/model.h"

namespace attend::planner {

// One layer's attention projections: Wq [d_model, n_head x head_dim], Wk [d_model, n_head_kv x
// head_dim], Wv [d_model, n_head_kv x head_dim_v], Wo [n_head x head_dim_v, d_model], with the
// layer's own n_head_kv (no biases).
struct ProjectionParameters {
  int64_t wq = 0;
  int64_t wk = 0;
  int64_t wv = 0;
  int64_t wo = 0;
  int64_t total() const { return wq + wk + wv + wo; }
};
// REQUIRES: `model` is canonical and 0 <= layer < model.layers.
ProjectionParameters LayerProjectionParameters(const ModelSpec& model, int64_t layer);

// The layers that share one set of projection shapes. Only a layer's n_head_kv changes Wk and
// Wv (windows do not touch the weights), so a model has one kind per distinct n_head_kv.
struct LayerProjectionKind {
  int64_t n_head_kv = 0;
  int64_t layers = 0;               // how many layers have this n_head_kv
  int64_t first_layer = 0;          // the lowest such layer index
  ProjectionParameters parameters;  // of one such layer
};
// One entry per distinct n_head_kv of the attention and chunked-attention layers (the only kinds
// with Wq/Wk/Wv/Wo of these shapes), in the order of each kind's first layer, so a uniform model
// has exactly one (layer 0's) and a model without such layers none. Empty when d_model is 0
// (unknown): the projections cannot be sized without it. REQUIRES: `model` is canonical.
std::vector<LayerProjectionKind> LayerProjectionKinds(const ModelSpec& model);

struct ParameterCount {
  int64_t total = 0;
  int64_t active = 0;               // total minus the experts a token does not use
  int64_t embedding = 0;            // token embedding table (vocab x d_model)
  int64_t lm_head = 0;              // 0 when tied
  int64_t per_layer_attention = 0;  // Wq+Wk+Wv+Wo (+ q/k/v biases) of layer 0
  int64_t per_layer_mlp = 0;        // one expert's MLP (three matrices when gated, else two)
};

// Whether the architecture's MLP is gated: three d_model x intermediate matrices (gate, up,
// down), as in Llama, Mistral, Qwen2 and Gemma. False for "falcon", whose MLP is two matrices
// with a GELU between them (dense_h_to_4h, dense_4h_to_h).
bool HasGatedMlp(const ModelSpec& model);

// Parameters of a decoder computed from the shape: embeddings (twice when untied), per layer
// Wq [d_model, n_head x head_dim], Wk and Wv [d_model, n_head_kv x head_dim(_v)] with that
// layer's n_head_kv, and Wo [n_head x head_dim_v, d_model], an MLP per expert (three
// d_model x intermediate matrices when gated, two otherwise; see HasGatedMlp), a router
// (d_model x experts) for MoE, the norms, q/k/v biases for qwen2, and the final norm. Norms are
// RMSNorm weights (2 x d_model per layer; 4 for gemma2's extra post-norms), except Falcon's
// LayerNorms, a weight and a bias each: one per multi-query layer (Falcon-7B's parallel block),
// two per layer otherwise (the new decoder architecture's ln_attn and ln_mlp, or the input and
// post-attention norms of a sequential one). This reproduces the published totals of Llama
// 2/3/3.1, Mistral, Mixtral, Qwen2 and Gemma 2 exactly (see the catalog tests) and Falcon-7B's
// and Falcon-40B's counts from their architecture (tied embeddings); other architectures are
// estimates (Falcon's linear biases, present when its config says bias: true, are not counted).
// INVALID_ARGUMENT when d_model, vocab_size or intermediate_size is 0 (unknown), or when some
// layer is not plain (or chunked) attention (HasNonAttentionLayers).
// REQUIRES: `model` is canonical.
absl::StatusOr<ParameterCount> ComputeParameters(const ModelSpec& model);

}  // namespace attend::planner

#endif  // ATTEND_PLANNER_PARAMETER_COUNTS_H_
