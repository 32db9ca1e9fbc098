#include "core/kv_cache/block_pool.h"

#include <cstdlib>
#include <cstring>

namespace attend::kv {

BlockPool::BlockPool(int64_t capacity_bytes, int64_t block_bytes)
    : block_bytes_(block_bytes),
      total_blocks_(block_bytes > 0 ? std::max<int64_t>(capacity_bytes, 0) / block_bytes : 0) {}

BlockPool::~BlockPool() {
  MutexLock lock(&mu_);
  for (Block* block : free_) {
    std::free(block->data);
    delete block;
  }
}

int64_t BlockPool::used_blocks() const {
  MutexLock lock(&mu_);
  return used_;
}

int64_t BlockPool::free_blocks() const {
  MutexLock lock(&mu_);
  return total_blocks_ - used_;
}

bool BlockPool::TryAllocate(int64_t count, std::vector<BlockRef>* out) {
  if (count <= 0) return count == 0;
  std::vector<Block*> taken;
  {
    MutexLock lock(&mu_);
    if (total_blocks_ - used_ < count) return false;
    used_ += count;
    while (static_cast<int64_t>(taken.size()) < count && !free_.empty()) {
      taken.push_back(free_.back());
      free_.pop_back();
    }
  }
  // Fresh memory and zeroing happen outside the lock: they are the slow part.
  bool failed = false;
  while (static_cast<int64_t>(taken.size()) < count) {
    void* memory = std::aligned_alloc(64, static_cast<size_t>(block_bytes_));
    if (memory == nullptr) {
      failed = true;
      break;
    }
    taken.push_back(new Block{static_cast<char*>(memory)});
  }
  if (failed) {
    MutexLock lock(&mu_);
    used_ -= count;
    for (Block* block : taken) free_.push_back(block);
    return false;
  }
  out->reserve(out->size() + taken.size());
  for (Block* block : taken) {
    std::memset(block->data, 0, static_cast<size_t>(block_bytes_));
    out->push_back(BlockRef(block, [this](Block* b) { Return(b); }));
  }
  return true;
}

void BlockPool::Return(Block* block) {
  MutexLock lock(&mu_);
  --used_;
  free_.push_back(block);
}

}  // namespace attend::kv
