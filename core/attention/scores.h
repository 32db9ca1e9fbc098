// The attention scores themselves, before softmax: what the lessons print as "raw scores" and
// "after the mask". The engine never materializes them (it runs an online softmax over tiles),
// so they are computed here, directly from the definition, only when a caller asks.
//
// Layouts (row-major), for a problem from PrepareAttention (see attention.h):
//   scores        [n_head, n_q, n_kv]  scale * q_i . k_j for every pair, masked or not
//   masked_scores [n_head, n_q, n_kv]  the same, -inf where IsVisible() is false
// Query head h reads key/value head h / group_size(), as in the engine. The products use the
// operands the engine uses: float32, or rounded to bfloat16 when the problem's precision resolves
// to kBFloat16; sums are taken in double, so a score is within a float rounding of exact.
//
// Cost: n_head * n_q * n_kv * head_dim multiply-adds and no memory beyond the outputs and a
// float32 copy of q and k; callers bound n_head * n_q * n_kv (max_score_elements) first.
//
// Thread-safety: pure; runs on up to `threads` OpenMP threads (0 = all).
#ifndef ATTEND_CORE_ATTENTION_SCORES_H_
#define ATTEND_CORE_ATTENTION_SCORES_H_

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "core/attention/attention.h"
#include "core/base/cancellation.h"

namespace attend {

// Writes both tables. INVALID_ARGUMENT when a span is not shape().weight_elements() long;
// CANCELLED (outputs partial) when `cancel` is set during the call.
absl::Status ComputeScores(const AttentionProblem& problem, absl::Span<float> scores,
                           absl::Span<float> masked_scores, const Cancellation* cancel = nullptr,
                           int threads = 0);

}  // namespace attend

#endif  // ATTEND_CORE_ATTENTION_SCORES_H_
