#include "core/lessons/softmax.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace attend {

absl::StatusOr<SoftmaxResult> Softmax(absl::Span<const double> logits, double temperature) {
  if (logits.empty()) return absl::InvalidArgumentError("logits: empty; need at least one score");
  if (!(temperature > 0.0) || !std::isfinite(temperature)) {
    return absl::InvalidArgumentError(
        absl::StrCat("temperature: ", temperature, "; must be positive and finite"));
  }
  const double kNegInf = -std::numeric_limits<double>::infinity();
  double max = kNegInf;
  for (size_t i = 0; i < logits.size(); ++i) {
    const double z = logits[i];
    if (std::isnan(z) || z == std::numeric_limits<double>::infinity()) {
      return absl::InvalidArgumentError(
          absl::StrCat("logits[", i, "] is ", z, "; scores must be finite or -inf"));
    }
    max = std::max(max, z);
  }
  SoftmaxResult result;
  result.probabilities.assign(logits.size(), 0.0);
  if (max == kNegInf) {
    result.log_sum_exp = kNegInf;
    return result;
  }
  // The largest logit is subtracted before dividing by the temperature: (z - max) / t is at most
  // 0 whatever t is, so a tiny temperature sends the others to exp(-inf) = 0 instead of
  // overflowing z / t to inf - inf = NaN.
  const double scaled_max = max / temperature;
  if (!std::isfinite(scaled_max)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "temperature: ", temperature, " is too small for these logits: the largest logit / ",
        "temperature, ", max, " / ", temperature, ", overflows double"));
  }
  double sum = 0.0;
  for (size_t i = 0; i < logits.size(); ++i) {
    const double e = std::exp((logits[i] - max) / temperature);  // exp(-inf) == 0 exactly
    result.probabilities[i] = e;
    sum += e;
  }
  double entropy = 0.0;
  for (double& p : result.probabilities) {
    p /= sum;
    if (p > 0.0) entropy -= p * std::log(p);
  }
  result.log_sum_exp = scaled_max + std::log(sum);
  result.entropy_nats = entropy;
  return result;
}

void SoftmaxInPlace(float* row, int64_t n, float scale) {
  float max = -std::numeric_limits<float>::infinity();
  for (int64_t j = 0; j < n; ++j) {
    row[j] *= scale;
    max = row[j] > max ? row[j] : max;
  }
  if (max == -std::numeric_limits<float>::infinity()) {
    for (int64_t j = 0; j < n; ++j) row[j] = 0.0f;
    return;
  }
  float sum = 0.0f;
  for (int64_t j = 0; j < n; ++j) {
    row[j] = std::exp(row[j] - max);
    sum += row[j];
  }
  const float inv = 1.0f / sum;
  for (int64_t j = 0; j < n; ++j) row[j] *= inv;
}

std::vector<double> SoftmaxJacobian(absl::Span<const double> p) {
  const size_t n = p.size();
  std::vector<double> jacobian(n * n);
  for (size_t i = 0; i < n; ++i) {
    for (size_t j = 0; j < n; ++j) {
      jacobian[i * n + j] = (i == j ? p[i] : 0.0) - p[i] * p[j];
    }
  }
  return jacobian;
}

}  // namespace attend
