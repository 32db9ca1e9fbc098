#include "core/attention/testing/reference_attention.h"

#include <cmath>
#include <limits>

#include "core/base/status_macros.h"

namespace attend {

absl::StatusOr<ReferenceResult> ReferenceAttention(const TensorView& q, const TensorView& k,
                                                   const TensorView& v,
                                                   const AttentionOptions& options) {
  ATTEND_ASSIGN_OR_RETURN(const AttentionShape s,
                          ValidateAttention(q, k, v, options, AttentionLimits{}));
  const double scale = EffectiveScale(options, s);
  const int64_t group = s.group_size();
  ReferenceResult result;
  result.output.assign(static_cast<size_t>(s.output_elements()), 0.0);
  result.weights.assign(static_cast<size_t>(s.weight_elements()), 0.0);
  std::vector<double> scores(static_cast<size_t>(s.n_kv));

  for (int64_t h = 0; h < s.n_head; ++h) {
    const int64_t g = h / group;
    for (int64_t i = 0; i < s.n_q; ++i) {
      // Scores of the visible keys; -inf marks the hidden ones.
      double max = -std::numeric_limits<double>::infinity();
      for (int64_t j = 0; j < s.n_kv; ++j) {
        if (!IsVisible(options.mask, s.n_q, s.n_kv, i, j)) {
          scores[j] = -std::numeric_limits<double>::infinity();
          continue;
        }
        double dot = 0.0;
        for (int64_t c = 0; c < s.head_dim; ++c) {
          dot += static_cast<double>(q.At((i * s.n_head + h) * s.head_dim + c)) *
                 static_cast<double>(k.At((j * s.n_head_kv + g) * s.head_dim + c));
        }
        scores[j] = dot * scale;
        if (scores[j] > max) max = scores[j];
      }
      if (max == -std::numeric_limits<double>::infinity()) continue;  // sees nothing: zeros
      double sum = 0.0;
      for (int64_t j = 0; j < s.n_kv; ++j) {
        scores[j] = std::exp(scores[j] - max);
        sum += scores[j];
      }
      double* weights = &result.weights[(h * s.n_q + i) * s.n_kv];
      double* out = &result.output[(i * s.n_head + h) * s.head_dim_v];
      for (int64_t j = 0; j < s.n_kv; ++j) {
        weights[j] = scores[j] / sum;
        if (weights[j] == 0.0) continue;
        for (int64_t c = 0; c < s.head_dim_v; ++c) {
          out[c] +=
              weights[j] * static_cast<double>(v.At((j * s.n_head_kv + g) * s.head_dim_v + c));
        }
      }
    }
  }
  return result;
}

}  // namespace attend
