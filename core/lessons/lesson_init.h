// Inputs of an attention layer drawn the way the lessons' Java programs draw them, so that a seed
// reproduces their printed numbers through the API (lesson 003 Examples 4, 7, 8 and 9).
//
// One JavaRandom(seed) draws, in this order and each row-major: x [n, d_model],
// Wq [d_model, n_head * head_dim], Wk [d_model, n_head_kv * head_dim],
// Wv [d_model, n_head_kv * head_dim], then, with `with_wo`, Wo [n_head * head_dim, d_out]. Every
// element is (float)(nextGaussian() * stddev), the product taken in double as Java does. Head h
// owns columns [h * head_dim, (h + 1) * head_dim) of Wq, which is how Example 9 slices its one
// d_model x d_model matrix per projection (it does not draw a matrix per head).
//
// Thread-safety: pure functions.
#ifndef ATTEND_CORE_LESSONS_LESSON_INIT_H_
#define ATTEND_CORE_LESSONS_LESSON_INIT_H_

#include <cstdint>
#include <limits>
#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "core/attention/attention.h"
#include "core/base/cancellation.h"
#include "core/base/tensor.h"

namespace attend {

// Mirrors attend.v1.LessonInit; error messages name its fields as "init.<field>".
struct LessonInitSpec {
  int64_t seed = 0;
  std::optional<double> stddev;  // unset: kDefaultStddev
  int64_t n = 0;
  int64_t d_model = 0;
  int64_t head_dim = 0;  // 0: d_model / n_head
  bool with_wo = false;
  int64_t d_out = 0;  // 0: d_model
  int64_t n_head = 1;
  int64_t n_head_kv = 0;  // 0: n_head
};

inline constexpr double kDefaultLessonStddev = 0.5;

// The drawn matrices, float32 row-major, with their shapes. `wo` is empty without with_wo.
struct LessonInputs {
  std::vector<float> x, wq, wk, wv, wo;
  Shape x_shape, wq_shape, wk_shape, wv_shape, wo_shape;
  int64_t head_dim = 0;

  TensorView x_view() const { return {DType::kFloat32, x_shape, x.data()}; }
  TensorView wq_view() const { return {DType::kFloat32, wq_shape, wq.data()}; }
  TensorView wk_view() const { return {DType::kFloat32, wk_shape, wk.data()}; }
  TensorView wv_view() const { return {DType::kFloat32, wv_shape, wv.data()}; }
  std::optional<TensorView> wo_view() const {
    if (wo_shape.empty()) return std::nullopt;
    return TensorView{DType::kFloat32, wo_shape, wo.data()};
  }
};

// Checks every field before anything is allocated: n, d_model >= 1; head_dim >= 0 (0 needs
// n_head to divide d_model); d_out >= 0 and only with with_wo; stddev finite and > 0 when set;
// n_head >= 1 and n_head_kv dividing it; every matrix within `limits.max_tensor_elements`, and
// all of them together within `max_total_elements` (a server passes what one request message
// could have carried, so that a few bytes of init cannot make it allocate more than the tensors
// themselves could). INVALID_ARGUMENT naming the field and the limit, RESOURCE_EXHAUSTED for
// element limits. Then draws. CANCELLED when `cancel` is set between matrices.
absl::StatusOr<LessonInputs> DrawLessonInputs(
    const LessonInitSpec& spec, const AttentionLimits& limits,
    int64_t max_total_elements = std::numeric_limits<int64_t>::max(),
    const Cancellation* cancel = nullptr);

}  // namespace attend

#endif  // ATTEND_CORE_LESSONS_LESSON_INIT_H_
