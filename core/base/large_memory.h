// Memory for large arrays that are read as streams: KV-cache blocks and the bandwidth probe's
// buffer.
//
// Why not the allocator: on Linux, transparent huge pages are often enabled only for memory
// that asks for them (`madvise` mode, the Debian default). Streaming a buffer held in 4 KiB pages
// costs a TLB miss every 4 KiB and restarts the hardware prefetchers at each page; measured on
// the development machine, two threads summing 256 MiB read 15-19% more bytes per second from
// 2 MiB pages. So this memory is mapped 2 MiB-aligned, in whole 2 MiB units, and advised as a
// huge-page candidate. Where the kernel has huge pages off (or no THP at all) the advice is
// ignored and the memory is ordinary, still zeroed and aligned. The cost: with the kernel's
// default defrag setting ("madvise"), the first write to a 2 MiB page of advised memory may
// compact memory to find one, a stall some latency-bound deployments prefer to avoid; hence the
// `huge_pages` switch.
//
// Thread-safety: LargeMemory objects are not shared between threads while being moved or
// destroyed; the memory itself is plain memory.
#ifndef ATTEND_CORE_BASE_LARGE_MEMORY_H_
#define ATTEND_CORE_BASE_LARGE_MEMORY_H_

#include <cstdint>
#include <string>

namespace attend {

// The unit and alignment of LargeMemory: the x86-64 transparent huge page.
inline constexpr int64_t kHugePageBytes = int64_t{2} << 20;

// The kernel's transparent-huge-page mode, the bracketed word of `enabled_path` ("always",
// "madvise" or "never"); empty when the file is missing or unreadable (no THP support).
std::string TransparentHugePageMode(
    const std::string& enabled_path = "/sys/kernel/mm/transparent_hugepage/enabled");

class LargeMemory {
 public:
  LargeMemory() = default;
  // Maps at least `bytes` (rounded up to kHugePageBytes) of zeroed, kHugePageBytes-aligned
  // memory, advised as a huge-page candidate when `huge_pages`. The result is empty
  // (data() == nullptr) when bytes <= 0 or the mapping fails.
  static LargeMemory Map(int64_t bytes, bool huge_pages = true);

  LargeMemory(LargeMemory&& other) noexcept;
  LargeMemory& operator=(LargeMemory&& other) noexcept;
  LargeMemory(const LargeMemory&) = delete;
  LargeMemory& operator=(const LargeMemory&) = delete;
  ~LargeMemory();  // unmaps

  char* data() const { return data_; }
  int64_t size() const { return size_; }  // the mapped size, a multiple of kHugePageBytes
  explicit operator bool() const { return data_ != nullptr; }

 private:
  LargeMemory(char* data, int64_t size) : data_(data), size_(size) {}
  void Release();

  char* data_ = nullptr;
  int64_t size_ = 0;
};

}  // namespace attend

#endif  // ATTEND_CORE_BASE_LARGE_MEMORY_H_
