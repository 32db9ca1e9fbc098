// The oneDNN attention engine: scaled dot-product attention for f32 and bf16 inputs, MHA, GQA
// and MQA, with masks, returning the output and (on request) the attention weights.
//
// How it computes: the work is split into (query head, block of query rows) tiles run in
// parallel with OpenMP; each tile multiplies its queries by the keys that its rows can see
// (keys after the block's last visible key are skipped, so causal prefill does about half the
// work), applies the mask and a stable softmax per row, and multiplies by the values. Every
// operand is a strided view into the caller's tensors: K and V are never copied per query head
// (query head h reads key/value head h / group). bf16 precision converts inputs to bf16 once per
// call so the matmuls run on AMX/AVX512-BF16; accumulation and softmax stay f32. On CPUs where
// oneDNN has no bf16 matmul (AVX2-only), bf16 is emulated: inputs and probabilities are rounded
// to bf16 and multiplied by f32 kernels, so results match a bf16 kernel up to summation order,
// and stats.engine says "onednn/bf16-emulated".
//
// Memory: besides the converted inputs (only when a dtype differs from the precision), each
// thread holds one scores tile of at most kMaxTileElements floats.
//
// Thread-safety: Compute() may be called concurrently from many threads.
#ifndef ATTEND_CORE_ATTENTION_ENGINE_H_
#define ATTEND_CORE_ATTENTION_ENGINE_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "core/attention.h"

namespace attend {

struct EngineOptions {
  // OpenMP threads for one call; 0 = all (omp_get_max_threads()).
  int threads = 0;
};

class AttentionEngine {
 public:
  explicit AttentionEngine(EngineOptions options = {}) : options_(options) {}

  // Computes attention of q over k/v into `output` ([n_q, n_head, head_dim_v] f32) and, when
  // `weights` is non-empty, the weights ([n_head, n_q, n_kv] f32). Validates with `limits`
  // first; INVALID_ARGUMENT when an output span has the wrong size or when scores overflow
  // float32 (the inputs' magnitudes are too large for the chosen precision).
  // REQUIRES: the views' data hold their shapes' elements.
  absl::Status Compute(const TensorView& q, const TensorView& k, const TensorView& v,
                       const AttentionOptions& options, const AttentionLimits& limits,
                       absl::Span<float> output, absl::Span<float> weights,
                       AttentionStats* stats) const;

  // Query rows per tile and the largest scores tile, exposed for tests of tile edges.
  static constexpr int64_t kQueryBlock = 64;
  static constexpr int64_t kMaxTileElements = int64_t{1} << 22;

 private:
  EngineOptions options_;
};

}  // namespace attend

#endif  // ATTEND_CORE_ATTENTION_ENGINE_H_
