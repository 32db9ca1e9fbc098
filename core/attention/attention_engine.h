// The attention engine: scaled dot-product attention for f32 and bf16 inputs, MHA, GQA and MQA,
// with masks, returning the output and (on request) the attention weights.
//
// How it computes (see core/attention/tile_attention.h): the queries of each key/value head's group
// are folded into blocks of up to 64 rows (so each key and value is read once per key/value head,
// not per query head) and walked over the keys in tiles with an online softmax, skipping tiles no
// row can see (causal prefill does about half the work, windows less). Prefill-sized blocks
// multiply with fixed-shape oneDNN matmuls over tiles of up to kKeyTile keys (created once per
// head configuration, never per request shape) from one head-major, zero-padded copy of K and V
// per call; decode-sized blocks use vector kernels that stream K and V where they are. When
// there are fewer blocks than threads (decode over few heads), the keys are split across
// threads and the partial softmaxes merged. K and V are never copied per query head.
//
// bf16 precision multiplies bf16 operands with f32 accumulation and softmax: natively on AMX /
// AVX512-BF16, emulated elsewhere (operands and probabilities rounded to bf16, f32 kernels), in
// which case stats.engine says "onednn/bf16-emulated".
//
// Memory: the head-major copy of K and V for prefill-sized calls (converted inputs otherwise,
// only when a dtype differs), and per thread a few tiles (64 x kKeyTile scores, key and value
// tiles). Copies of 1 MiB or more come from the engine's ScratchPool, which keeps up to
// EngineOptions::scratch_cache_bytes of them mapped between calls (core/base/scratch_pool.h says
// why).
//
// Thread-safety: Compute() may be called concurrently from many threads.
#ifndef ATTEND_CORE_ATTENTION_ATTENTION_ENGINE_H_
#define ATTEND_CORE_ATTENTION_ATTENTION_ENGINE_H_

#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "core/attention/attention.h"
#include "core/attention/tile_attention.h"
#include "core/base/cancellation.h"
#include "core/base/scratch_pool.h"

namespace attend {

struct EngineOptions {
  // OpenMP threads for one call; 0 = all (omp_get_max_threads()).
  int threads = 0;
  // Copy buffers kept mapped between calls (shared by concurrent calls): enough for the K and V
  // copies of an 8192-token prefill with 8 key/value heads of 128 in f32.
  int64_t scratch_cache_bytes = int64_t{64} << 20;
  // Which of a prefill's key and value tiles, read by many query tiles, are packed once into the
  // matmul's own layout (tile::TilePacking says why bf16 only by default). attention_bench's
  // BM_CausalPrefill packed:0 compares with none.
  tile::TilePacking tile_packing = tile::TilePacking::kBf16;
};

class AttentionEngine {
 public:
  explicit AttentionEngine(EngineOptions options = {})
      : options_(options), scratch_(std::make_shared<ScratchPool>(options.scratch_cache_bytes)) {}

  // Computes the attention of `problem` into `output` ([n_q, n_head, head_dim_v] f32) and, when
  // `weights` is non-empty, the weights ([n_head, n_q, n_kv] f32). INVALID_ARGUMENT when an
  // output span has the wrong size or when scores overflow float32 (the inputs' magnitudes are
  // too large for the chosen precision). When `cancel` is set during the call, it stops between
  // tiles and returns CANCELLED (the outputs are then partial).
  absl::Status Compute(const AttentionProblem& problem, absl::Span<float> output,
                       absl::Span<float> weights, AttentionStats* stats,
                       const Cancellation* cancel = nullptr) const;

  // PrepareAttention (with `limits`, on this engine's threads), then Compute.
  // REQUIRES: the views' data hold their shapes' elements.
  absl::Status Compute(const TensorView& q, const TensorView& k, const TensorView& v,
                       const AttentionOptions& options, const AttentionLimits& limits,
                       absl::Span<float> output, absl::Span<float> weights, AttentionStats* stats,
                       const Cancellation* cancel = nullptr) const;

  // OpenMP threads per call (0 = all), for PrepareAttention's scan of the inputs.
  int threads() const { return options_.threads; }

  // Keys per matmul tile (prefill-sized calls), exposed for tests of tile edges.
  static constexpr int64_t kKeyTile = 512;
  // Keys per tile of the vector kernels (decode-sized calls: tile::UsesKernels), exposed for the
  // same reason.
  static constexpr int64_t kKernelKeyTile = 256;

  // The copy buffers cached between calls (for tests and monitoring).
  const ScratchPool& scratch() const { return *scratch_; }

 private:
  EngineOptions options_;
  std::shared_ptr<ScratchPool> scratch_;  // shared by copies of the engine
};

}  // namespace attend

#endif  // ATTEND_CORE_ATTENTION_ATTENTION_ENGINE_H_
