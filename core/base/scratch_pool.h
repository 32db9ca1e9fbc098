// Large scratch buffers kept between calls, so that a call that needs megabytes of temporary
// memory (the attention engine's head-major copy of a prefill's K and V) does not map and fault
// it in afresh each time.
//
// Why: memory the allocator maps for a large request goes back to the kernel when freed, and the
// next call faults it in again, 4 KiB at a time, each page zeroed by the kernel. For a 2048-token
// prefill (8 heads x 128, f32) that was 8.5% of the call's time in a time profile (page faults
// and page clearing), for 16 MiB of copies. Buffers taken from here are reused as they are: their
// contents are whatever the previous user left, so users must write before they read.
//
// Memory: up to `max_cached_bytes` stay mapped while no call uses them (LargeMemory, 2 MiB
// units). A buffer larger than that is unmapped when given back.
//
// Thread-safety: Take and Give may be called concurrently; a buffer belongs to its taker until
// given back.
#ifndef ATTEND_CORE_BASE_SCRATCH_POOL_H_
#define ATTEND_CORE_BASE_SCRATCH_POOL_H_

#include <cstdint>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "core/base/large_memory.h"
#include "core/base/mutex.h"

namespace attend {

class ScratchPool {
 public:
  explicit ScratchPool(int64_t max_cached_bytes) : max_cached_bytes_(max_cached_bytes) {}
  ScratchPool(const ScratchPool&) = delete;
  ScratchPool& operator=(const ScratchPool&) = delete;

  // A buffer of at least `bytes`: the smallest cached one that is large enough, else a new
  // mapping (zeroed). Empty (no data) when bytes <= 0 or the mapping fails.
  LargeMemory Take(int64_t bytes);

  // Keeps `memory` for later Takes, evicting the smallest cached buffers as needed to stay within
  // max_cached_bytes; unmaps it instead when it alone exceeds that. Empty memory is ignored.
  void Give(LargeMemory memory);

  // Bytes currently cached (mapped and not taken).
  int64_t cached_bytes() const;

 private:
  const int64_t max_cached_bytes_;
  mutable Mutex mu_;
  std::vector<LargeMemory> free_ ABSL_GUARDED_BY(mu_);
  int64_t cached_bytes_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace attend

#endif  // ATTEND_CORE_BASE_SCRATCH_POOL_H_
