// The pool of KV-cache blocks: a byte budget cut into equal blocks, handed out all-or-nothing
// and returned automatically when the last reference to a block goes away.
//
// Why equal blocks: sequences of different shapes then share one budget without fragmentation,
// the pool's accounting is exact (used, free, total are block counts), and a request's need is
// known before anything changes. Memory is mapped on first use, in slabs of several blocks, and
// kept for reuse, so the process holds at most the budget (rounded up to whole 2 MiB pages);
// returned blocks are handed out again before never-used ones, so the memory actually touched
// follows the cache's peak use; every block handed out is zeroed. Slabs are LargeMemory (huge-page
// candidates), because decode streams every block of a sequence for every token and reads faster
// from 2 MiB pages.
//
// Thread-safety: all methods are thread-safe. BlockRef copies may be made and dropped on any
// thread. REQUIRES: the pool outlives every BlockRef it handed out.
#ifndef ATTEND_CORE_KV_CACHE_BLOCK_POOL_H_
#define ATTEND_CORE_KV_CACHE_BLOCK_POOL_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "core/base/large_memory.h"
#include "core/base/mutex.h"

namespace attend::kv {

struct Block {
  char* data = nullptr;  // block_bytes, 64-byte aligned
};

// Shared ownership of a block; sequences that fork share blocks until one of them writes.
using BlockRef = std::shared_ptr<Block>;

class BlockPool {
 public:
  // REQUIRES: block_bytes >= 64, a multiple of 64; capacity_bytes >= 0. `huge_pages`: slabs are
  // advised as huge-page candidates (LargeMemory).
  BlockPool(int64_t capacity_bytes, int64_t block_bytes, bool huge_pages = true);
  ~BlockPool();

  BlockPool(const BlockPool&) = delete;
  BlockPool& operator=(const BlockPool&) = delete;

  int64_t block_bytes() const { return block_bytes_; }
  int64_t total_blocks() const { return total_blocks_; }
  int64_t used_blocks() const ABSL_LOCKS_EXCLUDED(mu_);
  int64_t free_blocks() const ABSL_LOCKS_EXCLUDED(mu_);

  // Why a TryAllocate handed out nothing, as the pool stood at that moment (blocks returned
  // since then do not change it, so an error built from it cannot contradict itself).
  struct Refusal {
    int64_t free_blocks = 0;     // free when the request was refused
    bool out_of_memory = false;  // enough were free, but the system would not map more memory
  };

  // Appends `count` zeroed blocks to `out`, or nothing (and returns false) when fewer than
  // `count` are free or memory cannot be obtained; then fills `*refusal` if given.
  bool TryAllocate(int64_t count, std::vector<BlockRef>* out, Refusal* refusal = nullptr)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Blocks the calling thread has returned to any pool so far. A block returns on the thread
  // that drops its last reference, so the difference across a call that drops references is
  // exactly the blocks that call freed, whatever other threads drop meanwhile.
  static int64_t ReturnedOnThisThread();

 private:
  void Return(Block* block) ABSL_LOCKS_EXCLUDED(mu_);
  // Maps one more slab (`count` blocks) and adds its blocks to fresh_; false when mapping fails.
  bool MapSlab(int64_t count) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const int64_t block_bytes_;
  const int64_t total_blocks_;
  const int64_t slab_blocks_;  // blocks per slab (the last one may have fewer)
  const bool huge_pages_;
  mutable Mutex mu_;
  int64_t used_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t mapped_blocks_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<LargeMemory> slabs_ ABSL_GUARDED_BY(mu_);
  std::vector<std::unique_ptr<Block>> blocks_ ABSL_GUARDED_BY(mu_);  // every mapped block
  // Blocks not in use: returned ones (to be zeroed before reuse) and never-used ones (zero).
  std::vector<Block*> free_ ABSL_GUARDED_BY(mu_);
  std::vector<Block*> fresh_ ABSL_GUARDED_BY(mu_);
};

}  // namespace attend::kv

#endif  // ATTEND_CORE_KV_CACHE_BLOCK_POOL_H_
