// The reference scaled dot-product attention: plain loops, double accumulation, the mask taken
// pair by pair from IsVisible. It is slow on purpose and stays as the oracle that the oneDNN
// engine is tested against.
//
// Thread-safety: pure function.
#ifndef ATTEND_CORE_ATTENTION_TESTING_REFERENCE_ATTENTION_H_
#define ATTEND_CORE_ATTENTION_TESTING_REFERENCE_ATTENTION_H_

#include <vector>

#include "absl/status/statusor.h"
#include "core/attention/attention.h"

namespace attend {

struct ReferenceResult {
  std::vector<double> output;   // [n_q, n_head, head_dim_v]
  std::vector<double> weights;  // [n_head, n_q, n_kv]
};

// Attention of q over k/v with `options` (precision is ignored: the reference always computes
// in double from the inputs as given). Validates like the engine, with default limits.
absl::StatusOr<ReferenceResult> ReferenceAttention(const TensorView& q, const TensorView& k,
                                                   const TensorView& v,
                                                   const AttentionOptions& options);

}  // namespace attend

#endif  // ATTEND_CORE_ATTENTION_TESTING_REFERENCE_ATTENTION_H_
