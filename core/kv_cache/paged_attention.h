// Attention of new queries over a sequence's paged keys and values: the compute behind Append
// and DecodeBatch.
//
// Each (sequence, key/value head) is a tile::Work whose tiles are the sequence's blocks (see
// core/attention/tile_attention.h): the query heads of a group are folded into the rows of one
// matrix (so each cached byte is read once per key/value head, not once per query head), the blocks
// a row can see are walked with an online softmax, decode-sized work streams the blocks through
// vector kernels in their stored dtype, and prefill-sized work uses fixed-shape oneDNN matmuls.
//
// Thread-safety: RunPagedAttention may be called concurrently; the blocks it reads must not be
// written meanwhile (the cache holds each sequence's lock).
#ifndef ATTEND_CORE_KV_CACHE_PAGED_ATTENTION_H_
#define ATTEND_CORE_KV_CACHE_PAGED_ATTENTION_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "core/attention/attention.h"
#include "core/attention/mask.h"
#include "core/base/cancellation.h"
#include "core/kv_cache/block_pool.h"
#include "core/kv_cache/layout.h"

namespace attend::kv {

// One sequence's part of a call: its cached keys/values in one layer, its new queries, and
// where the results go.
struct PagedProblem {
  const BlockLayout* layout = nullptr;
  const std::vector<BlockRef>* blocks = nullptr;
  int64_t tokens = 0;  // cached tokens in the layer, the new ones included
  MaskSpec mask;
  float scale = 1.0f;
  const float* q = nullptr;  // [n, n_head, head_dim], float32
  int64_t n = 0;             // new queries; they sit at positions tokens - n ... tokens - 1
  int64_t n_head = 0;
  float* output = nullptr;   // [n, n_head, head_dim_v]
  float* weights = nullptr;  // [n_head, n, tokens], or nullptr
};

// Computes every problem. `precision` kBFloat16 multiplies in bf16 (natively, or emulated with
// bf16-rounded values on f32 kernels when the CPU has no bf16 matmul); kFloat32 in f32; kAuto
// follows the storage dtype of each problem. `threads` 0 = all. Adds the work to `stats`.
// CANCELLED (outputs partial) when `cancel` is set during the call.
absl::Status RunPagedAttention(absl::Span<const PagedProblem> problems, Precision precision,
                               int threads, AttentionStats* stats,
                               const Cancellation* cancel = nullptr);

// Creates the oneDNN primitives that prefills over blocks of `layout` with `n_head` query heads
// use (precision kAuto), by computing one causal prefill over scratch blocks (at most
// 16 x the block size, freed before returning) so that the first real Append does not pay for
// them (~0.3 ms per primitive, tens of ms in all). Cheap when they already exist.
absl::Status WarmUpPagedAttention(const BlockLayout& layout, int64_t n_head, int threads);

}  // namespace attend::kv

#endif  // ATTEND_CORE_KV_CACHE_PAGED_ATTENTION_H_
