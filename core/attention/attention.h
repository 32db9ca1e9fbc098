// Scaled dot-product attention: the problem description shared by the reference implementation
// and the oneDNN engine, and the validation that every entry point runs first.
//
// Layouts (row-major):
//   q       [n_q, n_head, head_dim]
//   k       [n_kv, n_head_kv, head_dim]
//   v       [n_kv, n_head_kv, head_dim_v]
//   output  [n_q, n_head, head_dim_v]           float32
//   weights [n_head, n_q, n_kv]                 float32, masked entries exactly 0
// Query head h reads key/value head h / (n_head / n_head_kv): n_head_kv == n_head is multi-head
// attention, fewer is grouped-query attention (GQA), 1 is multi-query attention (MQA).
// A query that sees no key (see mask.h) gets output 0 and an all-zero weight row.
#ifndef ATTEND_CORE_ATTENTION_ATTENTION_H_
#define ATTEND_CORE_ATTENTION_ATTENTION_H_

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/attention/mask.h"
#include "core/base/tensor.h"

namespace attend {

enum class Precision {
  kAuto,      // kBFloat16 when q, k and v are all bfloat16, otherwise kFloat32
  kFloat32,   // f32 products and softmax
  kBFloat16,  // bf16 products with f32 accumulation; softmax in f32
};
absl::string_view PrecisionName(Precision precision);

struct AttentionShape {
  int64_t n_q = 0;
  int64_t n_kv = 0;
  int64_t n_head = 0;
  int64_t n_head_kv = 0;
  int64_t head_dim = 0;
  int64_t head_dim_v = 0;

  int64_t group_size() const { return n_head / n_head_kv; }
  int64_t output_elements() const { return n_q * n_head * head_dim_v; }
  int64_t weight_elements() const { return n_head * n_q * n_kv; }
};

struct AttentionOptions {
  MaskSpec mask;
  // Multiplies q.k before softmax; default 1 / sqrt(head_dim).
  std::optional<float> scale;
  Precision precision = Precision::kAuto;
};

// Limits checked before anything is allocated; the server sets them from flags.
struct AttentionLimits {
  int64_t max_tensor_elements = int64_t{1} << 26;
  // n_head * n_q * n_kv: bounds the work of one call and the size of its weights.
  int64_t max_score_elements = int64_t{1} << 32;
};

// Checks ranks, dimensions, head counts (n_head_kv divides n_head), matching head_dim and n_kv,
// element limits, the mask and the scale. Errors are INVALID_ARGUMENT or RESOURCE_EXHAUSTED and
// name the field and the shapes. REQUIRES: each view's data holds its shape's elements (the
// caller checked the byte length).
absl::StatusOr<AttentionShape> ValidateAttention(const TensorView& q, const TensorView& k,
                                                 const TensorView& v,
                                                 const AttentionOptions& options,
                                                 const AttentionLimits& limits);

// A problem that passed PrepareAttention: the inputs, the options and the shape. Only
// PrepareAttention makes one, so a call is validated once and everyone who needs the shape (the
// service sizing its response, the engine) reads the same one.
class AttentionProblem {
 public:
  const TensorView& q() const { return q_; }
  const TensorView& k() const { return k_; }
  const TensorView& v() const { return v_; }
  const AttentionOptions& options() const { return options_; }
  const AttentionShape& shape() const { return shape_; }
  // Whether every value of k and v was checked to be finite. False for decode-sized problems
  // (PrepareAttention says why): their keys that some query sees are checked by the computation
  // itself, and code that reads k or v otherwise must check them first.
  bool kv_checked() const { return kv_checked_; }

 private:
  friend absl::StatusOr<AttentionProblem> PrepareAttention(const TensorView& q, const TensorView& k,
                                                           const TensorView& v,
                                                           const AttentionOptions& options,
                                                           const AttentionLimits& limits,
                                                           int threads);
  AttentionProblem() = default;
  TensorView q_, k_, v_;
  AttentionOptions options_;
  AttentionShape shape_;
  bool kv_checked_ = true;
};

// ValidateAttention, then the values: NaN or an infinity in q, k or v is INVALID_ARGUMENT naming
// the tensor and the element (a large tensor is scanned on up to `threads` threads, 0 = all).
// For a decode-sized problem (the engine's vector kernels, tile::UsesKernels) only q and the keys
// no query sees are scanned here: scanning K and V ahead of a computation that reads each of
// their bytes once would read them twice (decode is memory-bound). A NaN or infinity at a key a
// query sees makes the output non-finite, and AttentionEngine::Compute then reports it by the
// same error; kv_checked() is false for such a problem.
// The views must outlive the problem. REQUIRES: as ValidateAttention.
absl::StatusOr<AttentionProblem> PrepareAttention(const TensorView& q, const TensorView& k,
                                                  const TensorView& v,
                                                  const AttentionOptions& options,
                                                  const AttentionLimits& limits, int threads = 0);

// The scale actually used: options.scale or 1 / sqrt(head_dim).
float EffectiveScale(const AttentionOptions& options, const AttentionShape& shape);
// kAuto resolved against the input dtypes.
Precision ResolvePrecision(Precision requested, const TensorView& q, const TensorView& k,
                           const TensorView& v);

struct AttentionStats {
  int64_t attended_pairs = 0;   // visible (query, key) pairs over all query heads
  int64_t attention_flops = 0;  // 2 * (head_dim + head_dim_v) per attended pair
  double compute_seconds = 0.0;
  std::string engine;
};

// Pairs and FLOPs of a problem under its mask.
AttentionStats CountAttentionWork(const AttentionShape& shape, const MaskSpec& mask);

}  // namespace attend

#endif  // ATTEND_CORE_ATTENTION_ATTENTION_H_
