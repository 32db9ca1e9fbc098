// Numerically stable softmax over one vector, and its Jacobian.
//
// Stability: the largest finite score is subtracted before exponentiating, so no exp overflows
// whatever the magnitudes. A score of -inf gets a share of exactly 0. When no score is finite
// (every entry -inf, as for a fully masked attention row) every share is 0: there is nothing to
// attend to, and the caller sees zeros rather than NaN.
//
// Thread-safety: pure functions.
#ifndef ATTEND_CORE_LESSONS_SOFTMAX_H_
#define ATTEND_CORE_LESSONS_SOFTMAX_H_

#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace attend {

struct SoftmaxResult {
  std::vector<double> probabilities;
  // log(sum(exp(scores))), -inf when no score is finite.
  double log_sum_exp = 0.0;
  // -sum p log p in nats.
  double entropy_nats = 0.0;
};

// softmax(logits / temperature). INVALID_ARGUMENT when `logits` is empty or holds NaN or +inf,
// or when temperature is not positive and finite.
absl::StatusOr<SoftmaxResult> Softmax(absl::Span<const double> logits, double temperature = 1.0);

// In-place softmax of `row` scaled by `scale`, the step attention rows use. With scale > 0, -inf
// entries become 0 and a row with no finite entry becomes all 0. An entry that is NaN or
// overflows to +inf after scaling makes the row NaN; callers check their outputs for that.
void SoftmaxInPlace(float* row, int64_t n, float scale);

// diag(p) - p p^T as a row-major n x n matrix. Each row sums to 0 (because sum p = 1), and every
// entry goes to 0 as one share approaches 1: the saturation that stops gradients.
std::vector<double> SoftmaxJacobian(absl::Span<const double> probabilities);

}  // namespace attend

#endif  // ATTEND_CORE_LESSONS_SOFTMAX_H_
