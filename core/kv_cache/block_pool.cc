#include "core/kv_cache/block_pool.h"

#include <algorithm>
#include <cstring>
#include <memory>
#include <utility>

namespace attend::kv {
namespace {

// A slab holds about this many bytes of blocks: big enough that rounding it up to whole huge
// pages wastes under 1/8 of it, small enough that a small cache does not map much ahead of use.
constexpr int64_t kSlabBytes = 8 * kHugePageBytes;

thread_local int64_t returned_on_this_thread = 0;

}  // namespace

BlockPool::BlockPool(int64_t capacity_bytes, int64_t block_bytes, bool huge_pages)
    : block_bytes_(block_bytes),
      total_blocks_(block_bytes > 0 ? std::max<int64_t>(capacity_bytes, 0) / block_bytes : 0),
      slab_blocks_(block_bytes > 0 ? std::max<int64_t>(1, kSlabBytes / block_bytes) : 1),
      huge_pages_(huge_pages) {}

// Slabs unmap themselves; REQUIRES (header) that every block has been returned.
BlockPool::~BlockPool() = default;

int64_t BlockPool::used_blocks() const {
  MutexLock lock(&mu_);
  return used_;
}

int64_t BlockPool::free_blocks() const {
  MutexLock lock(&mu_);
  return total_blocks_ - used_;
}

bool BlockPool::MapSlab(int64_t count) {
  if (count <= 0) return false;  // cannot happen while used_ + count <= total_blocks_
  LargeMemory slab = LargeMemory::Map(count * block_bytes_, huge_pages_);
  if (!slab) return false;
  blocks_.reserve(blocks_.size() + static_cast<size_t>(count));
  // Pushed in reverse so that fresh_.back() hands the slab out in address order.
  for (int64_t i = count - 1; i >= 0; --i) {
    blocks_.push_back(std::make_unique<Block>(Block{slab.data() + i * block_bytes_}));
    fresh_.push_back(blocks_.back().get());
  }
  slabs_.push_back(std::move(slab));
  mapped_blocks_ += count;
  return true;
}

bool BlockPool::TryAllocate(int64_t count, std::vector<BlockRef>* out, Refusal* refusal) {
  if (count <= 0) return count == 0;
  std::vector<Block*> fresh, reused;
  {
    MutexLock lock(&mu_);
    if (total_blocks_ - used_ < count) {
      if (refusal != nullptr) *refusal = Refusal{total_blocks_ - used_, false};
      return false;
    }
    // Returned blocks first, then never-used ones, then a new slab: memory already touched is
    // reused before any is added, so the process holds about the cache's peak use, not its
    // budget, and a warm block's memset costs less than faulting in a fresh page. Mapping a slab
    // is a system call on untouched memory (the page faults come later, at first write), so it
    // stays under the lock.
    while (static_cast<int64_t>(fresh.size() + reused.size()) < count) {
      if (!free_.empty()) {
        reused.push_back(free_.back());
        free_.pop_back();
      } else if (!fresh_.empty()) {
        fresh.push_back(fresh_.back());
        fresh_.pop_back();
      } else if (!MapSlab(std::min(slab_blocks_, total_blocks_ - mapped_blocks_))) {
        // Nothing handed out: the blocks go back where they came from (a slab mapped by this
        // call stays, fresh, for later requests).
        fresh_.insert(fresh_.end(), fresh.rbegin(), fresh.rend());
        free_.insert(free_.end(), reused.rbegin(), reused.rend());
        if (refusal != nullptr) *refusal = Refusal{total_blocks_ - used_, true};
        return false;
      }
    }
    used_ += count;
  }
  // Zeroing happens outside the lock: it is the slow part.
  for (Block* block : reused) std::memset(block->data, 0, static_cast<size_t>(block_bytes_));
  out->reserve(out->size() + fresh.size() + reused.size());
  for (const std::vector<Block*>* taken : {&fresh, &reused}) {
    for (Block* block : *taken) out->push_back(BlockRef(block, [this](Block* b) { Return(b); }));
  }
  return true;
}

int64_t BlockPool::ReturnedOnThisThread() { return returned_on_this_thread; }

void BlockPool::Return(Block* block) {
  ++returned_on_this_thread;
  MutexLock lock(&mu_);
  --used_;
  free_.push_back(block);
}

}  // namespace attend::kv
