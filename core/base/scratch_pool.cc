#include "core/base/scratch_pool.h"

#include <algorithm>
#include <utility>

namespace attend {

LargeMemory ScratchPool::Take(int64_t bytes) {
  if (bytes <= 0) return LargeMemory();
  {
    MutexLock lock(&mu_);
    auto best = free_.end();
    for (auto it = free_.begin(); it != free_.end(); ++it) {
      if (it->size() >= bytes && (best == free_.end() || it->size() < best->size())) best = it;
    }
    if (best != free_.end()) {
      LargeMemory memory = std::move(*best);
      free_.erase(best);
      cached_bytes_ -= memory.size();
      return memory;
    }
  }
  return LargeMemory::Map(bytes);  // outside the lock: mapping can take a while
}

void ScratchPool::Give(LargeMemory memory) {
  if (!memory || memory.size() > max_cached_bytes_) return;  // unmapped here
  std::vector<LargeMemory> evicted;                          // unmapped after the lock is released
  MutexLock lock(&mu_);
  // Smallest first, so that the buffers that stay are the ones larger calls can use.
  std::sort(free_.begin(), free_.end(),
            [](const LargeMemory& a, const LargeMemory& b) { return a.size() < b.size(); });
  size_t drop = 0;
  while (cached_bytes_ + memory.size() > max_cached_bytes_) {
    cached_bytes_ -= free_[drop].size();
    ++drop;
  }
  for (size_t i = 0; i < drop; ++i) evicted.push_back(std::move(free_[i]));
  free_.erase(free_.begin(), free_.begin() + static_cast<std::ptrdiff_t>(drop));
  cached_bytes_ += memory.size();
  free_.push_back(std::move(memory));
}

int64_t ScratchPool::cached_bytes() const {
  MutexLock lock(&mu_);
  return cached_bytes_;
}

}  // namespace attend
