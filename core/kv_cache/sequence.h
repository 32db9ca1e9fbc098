// A cached sequence's state, shared by the parts of the KV cache (internal to core/kv_cache:
// kv_cache.cc, sequence_registry.cc, token_storage.cc).
//
// Thread-safety: the atomics may be read and written anywhere; `mu` guards the layers (see the
// lock order in kv_cache.h).
#ifndef ATTEND_CORE_KV_CACHE_SEQUENCE_H_
#define ATTEND_CORE_KV_CACHE_SEQUENCE_H_

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "core/base/mutex.h"
#include "core/kv_cache/block_pool.h"
#include "core/kv_cache/kv_cache.h"
#include "core/kv_cache/layout.h"

namespace attend::kv {

// One layer of a sequence. Block i holds tokens [i * tpb, (i + 1) * tpb). With a sliding window,
// blocks that no future query can see are released and left null.
struct CachedLayer {
  std::vector<BlockRef> blocks;
  int64_t tokens = 0;
  // The first token whose row the layer holds when that is inside a held block: a snapshot
  // loaded with bigger blocks than it was saved with starts its window's rows there, and the
  // rows before it in that block are not the sequence's. 0 otherwise.
  int64_t first_kept = 0;
};

struct Sequence {
  std::string id;  // set before the sequence is published, never after
  SequenceConfig config;
  BlockLayout layout;
  int64_t created_ms = 0;
  std::string forked_from;
  std::atomic<int64_t> last_used_ms{0};
  // Operations holding it (SequenceRegistry::Lease); changed under the registry's lock, so that
  // eviction, which looks at it under that lock, never takes a sequence in use.
  std::atomic<int> in_use{0};
  // Tokens over all layers, readable without `mu` (for stats).
  std::atomic<int64_t> total_tokens{0};
  // Charged against KvCacheOptions::max_bookkeeping_bytes while the sequence is published (see
  // BookkeepingBytes): set before, then changed only under the registry's lock (and `mu`) as its
  // block tables grow or shrink.
  int64_t bookkeeping_bytes = 0;
  Mutex mu;
  // Set by Release under `mu`. An operation that looked the sequence up before the Release and
  // waited for `mu` finds it set and answers NOT_FOUND instead of using what is left.
  bool released ABSL_GUARDED_BY(mu) = false;
  // Set by Seal under `mu` while a hand-off copies the sequence elsewhere: every change (append,
  // truncate, fork from it, release) then answers UNAVAILABLE, so that the copy is its last state.
  bool sealed ABSL_GUARDED_BY(mu) = false;
  std::vector<CachedLayer> layers ABSL_GUARDED_BY(mu);
  int64_t reserved_tokens ABSL_GUARDED_BY(mu) = 0;
};

// The bytes a sequence of `layers` layers holding `block_refs` block references takes outside its
// blocks: the Sequence itself and its registry entry, a CachedLayer per layer, a BlockRef per
// reference. An estimate from the types' sizes (the allocator's own overhead is not counted),
// checked against the limit when the sequence is created or forked. References that appends add
// later are counted but not refused for: each is a block newly taken from the pool, so they are
// bounded by the pool's blocks.
inline int64_t BookkeepingBytes(int64_t layers, int64_t block_refs) {
  constexpr int64_t kPerSequence = static_cast<int64_t>(sizeof(Sequence)) + 256;
  return kPerSequence + layers * static_cast<int64_t>(sizeof(CachedLayer)) +
         block_refs * static_cast<int64_t>(sizeof(BlockRef));
}

// The bookkeeping (BookkeepingBytes) a block table gains going from `before` to `after` slots
// (negative when it shrinks).
inline int64_t SlotBytes(size_t after, size_t before) {
  return (static_cast<int64_t>(after) - static_cast<int64_t>(before)) *
         static_cast<int64_t>(sizeof(BlockRef));
}

}  // namespace attend::kv

#endif  // ATTEND_CORE_KV_CACHE_SEQUENCE_H_
