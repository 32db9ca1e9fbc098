// A whole attention layer, as in the lessons: project x with Wq, Wk, Wv, attend per head
// (n_head query heads sharing n_head_kv key/value heads), concatenate the heads and mix them with
// Wo.
//
// Thread-safety: a MultiHeadAttention is immutable after Create(); Forward() may be called
// concurrently.
#ifndef ATTEND_CORE_LESSONS_MULTI_HEAD_ATTENTION_H_
#define ATTEND_CORE_LESSONS_MULTI_HEAD_ATTENTION_H_

#include <cstdint>
#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "core/attention/attention.h"
#include "core/attention/attention_engine.h"
#include "core/base/cancellation.h"
#include "core/base/tensor.h"

namespace attend {

// Parameter counts of one layer's projections (no biases).
struct ParameterCounts {
  int64_t wq = 0;
  int64_t wk = 0;
  int64_t wv = 0;
  int64_t wo = 0;
  int64_t total = 0;
  int64_t kv = 0;  // wk + wv: the part that GQA and MQA shrink
};

// Counts for Wq [d_model, n_head*head_dim], Wk [d_model, n_head_kv*head_dim],
// Wv [d_model, n_head_kv*head_dim_v] and Wo [n_head*head_dim_v, d_out] (d_out 0: no Wo).
// REQUIRES: the products fit in int64 (callers validate shapes first).
ParameterCounts CountParameters(int64_t d_model, int64_t n_head, int64_t n_head_kv,
                                int64_t head_dim, int64_t head_dim_v, int64_t d_out);

class MultiHeadAttention {
 public:
  // Copies the weights (any dtype) as float32. `wo` is optional: without it the layer returns the
  // concatenated heads. `n_head_kv` 0 means n_head. Checks that the shapes agree with the head
  // counts and that every weight is finite; errors are INVALID_ARGUMENT naming the matrix and
  // the shapes (or the element), or RESOURCE_EXHAUSTED over `limits.max_tensor_elements`.
  static absl::StatusOr<MultiHeadAttention> Create(const TensorView& wq, const TensorView& wk,
                                                   const TensorView& wv,
                                                   const std::optional<TensorView>& wo,
                                                   int64_t n_head, int64_t n_head_kv,
                                                   const AttentionLimits& limits);

  struct Output {
    std::vector<float> output;   // [n, d_out] or [n, n_head * head_dim_v]
    std::vector<float> weights;  // [n_head, n, n] when requested
    std::vector<float> q;        // [n, n_head, head_dim]
    std::vector<float> k;        // [n, n_head_kv, head_dim]
    std::vector<float> v;        // [n, n_head_kv, head_dim_v]
    AttentionStats stats;
  };

  // Runs the layer on x [n, d_model]. Projections and Wo are f32 matmuls; options.precision
  // applies to the attention products. Returns q/k/v only when `keep_projections`. CANCELLED
  // when `cancel` is set during the call (checked between the steps and the attention's tiles).
  absl::StatusOr<Output> Forward(const TensorView& x, const AttentionOptions& options,
                                 bool want_weights, bool keep_projections,
                                 const AttentionEngine& engine, const AttentionLimits& limits,
                                 const Cancellation* cancel = nullptr) const;

  int64_t d_model() const { return d_model_; }
  int64_t n_head() const { return n_head_; }
  int64_t n_head_kv() const { return n_head_kv_; }
  int64_t head_dim() const { return head_dim_; }
  int64_t head_dim_v() const { return head_dim_v_; }
  // Columns of the output: Wo's, or n_head * head_dim_v without Wo.
  int64_t d_out() const { return has_wo_ ? d_out_ : n_head_ * head_dim_v_; }
  bool has_wo() const { return has_wo_; }
  ParameterCounts parameter_counts() const;
  // Parameters of Wk and Wv.
  int64_t kv_params() const { return parameter_counts().kv; }

 private:
  MultiHeadAttention() = default;

  int64_t d_model_ = 0, n_head_ = 0, n_head_kv_ = 0, head_dim_ = 0, head_dim_v_ = 0, d_out_ = 0;
  bool has_wo_ = false;
  std::vector<float> wq_, wk_, wv_, wo_;
};

}  // namespace attend

#endif  // ATTEND_CORE_LESSONS_MULTI_HEAD_ATTENTION_H_
