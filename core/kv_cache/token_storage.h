// How a sequence's tokens sit in its blocks: which blocks an append takes (new ones, and private
// copies of shared ones: copy-on-write), writing keys and values in the storage dtype (converted,
// or quantised to int8 with a scale per token and key/value head), and the blocks a sliding
// window no longer needs.
//
// Thread-safety: each function reads or changes only the layers it is given; the caller holds
// their sequence's lock.
#ifndef ATTEND_CORE_KV_CACHE_TOKEN_STORAGE_H_
#define ATTEND_CORE_KV_CACHE_TOKEN_STORAGE_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "core/base/tensor.h"
#include "core/kv_cache/block_pool.h"
#include "core/kv_cache/layout.h"
#include "core/kv_cache/sequence.h"

namespace attend::kv {

// Blocks an append of `n` tokens to `layer` must newly take: blocks past its end, and shared
// blocks it writes into (which it copies first).
int64_t BlocksToTake(const CachedLayer& layer, const BlockLayout& layout, int64_t n);
// The shared blocks among those: the ones the append copies (none once no one else holds them).
std::vector<const Block*> BlocksToCopy(const CachedLayer& layer, const BlockLayout& layout,
                                       int64_t n);

// Appends k [n, n_head_kv, head_dim] and v [n, n_head_kv, head_dim_v] (any float dtype) to
// `layer` in the layout's storage dtype, taking new blocks and private copies of shared ones
// from the back of `fresh`. A long append converts on up to `threads` OpenMP threads.
// REQUIRES: `fresh` holds at least BlocksToTake(layer, layout, n) blocks of `block_bytes`; the
// shapes match the layout.
void WriteTokens(const TensorView& k, const TensorView& v, const BlockLayout& layout,
                 int64_t block_bytes, int threads, std::vector<BlockRef>& fresh,
                 CachedLayer* layer);

// Releases the blocks of `layer` whose keys `window` (> 0) hides from every later query, except
// the first `reserved_blocks`, which stay taken.
void DropOutsideWindow(int64_t window, int64_t reserved_blocks, const BlockLayout& layout,
                       CachedLayer* layer);

// OK when every key that a query at position `tokens` may see under `window` is still cached in
// each of `layers` (a sliding window may have released the ones before); OUT_OF_RANGE saying
// `what` ("fork at") could not be done for `sequence` (a quoted id) and the shortest length
// possible otherwise.
absl::Status CheckWindowKept(absl::Span<const CachedLayer> layers, int64_t window,
                             const BlockLayout& layout, int64_t tokens, absl::string_view what,
                             absl::string_view sequence);

}  // namespace attend::kv

#endif  // ATTEND_CORE_KV_CACHE_TOKEN_STORAGE_H_
