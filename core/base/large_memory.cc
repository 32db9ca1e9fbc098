#include "core/base/large_memory.h"

#include <sys/mman.h>

#include <cstdint>
#include <fstream>
#include <string>
#include <utility>

namespace attend {

std::string TransparentHugePageMode(const std::string& enabled_path) {
  std::ifstream file(enabled_path);
  std::string line;
  if (!std::getline(file, line)) return "";
  const size_t open = line.find('['), close = line.find(']', open);
  if (open == std::string::npos || close == std::string::npos) return "";
  return line.substr(open + 1, close - open - 1);
}

LargeMemory LargeMemory::Map(int64_t bytes, bool huge_pages) {
  if (bytes <= 0 || bytes > INT64_MAX - 2 * kHugePageBytes) return LargeMemory();
  const int64_t size = (bytes + kHugePageBytes - 1) / kHugePageBytes * kHugePageBytes;
  // mmap aligns to pages only: map one huge page more and trim both ends to the alignment.
  const size_t mapped = static_cast<size_t>(size + kHugePageBytes);
  void* raw = mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (raw == MAP_FAILED) return LargeMemory();
  const uintptr_t start = reinterpret_cast<uintptr_t>(raw);
  const uintptr_t aligned = (start + kHugePageBytes - 1) / kHugePageBytes * kHugePageBytes;
  const size_t head = aligned - start;
  const size_t tail = mapped - head - static_cast<size_t>(size);
  if (head > 0) munmap(raw, head);
  if (tail > 0) munmap(reinterpret_cast<void*>(aligned + size), tail);
  // Advice only: EINVAL on kernels without THP leaves ordinary pages, which still work.
  if (huge_pages)
    madvise(reinterpret_cast<void*>(aligned), static_cast<size_t>(size), MADV_HUGEPAGE);
  return LargeMemory(reinterpret_cast<char*>(aligned), size);
}

LargeMemory::LargeMemory(LargeMemory&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)), size_(std::exchange(other.size_, 0)) {}

LargeMemory& LargeMemory::operator=(LargeMemory&& other) noexcept {
  if (this != &other) {
    Release();
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

LargeMemory::~LargeMemory() { Release(); }

void LargeMemory::Release() {
  if (data_ != nullptr) munmap(data_, static_cast<size_t>(size_));
  data_ = nullptr;
  size_ = 0;
}

}  // namespace attend
