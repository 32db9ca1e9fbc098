// ScratchPool: reuse, best fit, the cache's cap, and concurrent use.
#include "core/base/scratch_pool.h"

#include <cstdint>
#include <cstring>
#include <thread>
#include <utility>
#include <vector>

#include "gtest/gtest.h"

namespace attend {
namespace {

constexpr int64_t kMiB = int64_t{1} << 20;

TEST(ScratchPool, TakesAtLeastTheBytesAskedForAndNothingForNone) {
  ScratchPool pool(64 * kMiB);
  const LargeMemory m = pool.Take(3 * kMiB + 1);
  ASSERT_TRUE(m);
  EXPECT_GE(m.size(), 3 * kMiB + 1);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(m.data()) % kHugePageBytes, 0u);
  EXPECT_FALSE(pool.Take(0));
  EXPECT_FALSE(pool.Take(-5));
}

TEST(ScratchPool, GivenBuffersComeBackWithTheirContents) {
  ScratchPool pool(64 * kMiB);
  LargeMemory m = pool.Take(4 * kMiB);
  ASSERT_TRUE(m);
  char* const address = m.data();
  std::memset(address, 0x5a, 4 * kMiB);
  pool.Give(std::move(m));
  EXPECT_EQ(pool.cached_bytes(), 4 * kMiB);

  const LargeMemory again = pool.Take(3 * kMiB);
  EXPECT_EQ(again.data(), address);  // reused, not mapped anew
  EXPECT_EQ(again.data()[0], 0x5a);  // and not cleared: takers write before they read
  EXPECT_EQ(pool.cached_bytes(), 0);
}

TEST(ScratchPool, TakesTheSmallestCachedBufferThatFits) {
  ScratchPool pool(64 * kMiB);
  LargeMemory big = pool.Take(16 * kMiB), small = pool.Take(4 * kMiB);
  char* const big_address = big.data();
  char* const small_address = small.data();
  pool.Give(std::move(big));
  pool.Give(std::move(small));
  EXPECT_EQ(pool.Take(3 * kMiB).data(), small_address);
  EXPECT_EQ(pool.Take(3 * kMiB).data(), big_address);  // the only one left that fits
  EXPECT_EQ(pool.cached_bytes(), 0);
}

TEST(ScratchPool, MapsAnewWhenNothingCachedIsLargeEnough) {
  ScratchPool pool(64 * kMiB);
  LargeMemory small = pool.Take(2 * kMiB);
  char* const small_address = small.data();
  pool.Give(std::move(small));
  const LargeMemory big = pool.Take(8 * kMiB);
  ASSERT_TRUE(big);
  EXPECT_NE(big.data(), small_address);
  EXPECT_EQ(pool.cached_bytes(), 2 * kMiB);  // the small one stays cached
}

TEST(ScratchPool, KeepsWithinItsCapByEvictingTheSmallest) {
  ScratchPool pool(8 * kMiB);
  pool.Give(pool.Take(16 * kMiB));  // larger than the cap: unmapped, not cached
  EXPECT_EQ(pool.cached_bytes(), 0);

  LargeMemory a = pool.Take(2 * kMiB), b = pool.Take(4 * kMiB), c = pool.Take(4 * kMiB);
  char* const b_address = b.data();
  char* const c_address = c.data();
  pool.Give(std::move(a));
  pool.Give(std::move(b));
  EXPECT_EQ(pool.cached_bytes(), 6 * kMiB);
  pool.Give(std::move(c));  // 10 MiB would exceed 8: the 2 MiB buffer goes
  EXPECT_EQ(pool.cached_bytes(), 8 * kMiB);
  const LargeMemory first = pool.Take(kMiB), second = pool.Take(kMiB);
  EXPECT_TRUE((first.data() == b_address && second.data() == c_address) ||
              (first.data() == c_address && second.data() == b_address));
  EXPECT_EQ(pool.cached_bytes(), 0);
}

TEST(ScratchPool, IgnoresEmptyMemory) {
  ScratchPool pool(8 * kMiB);
  pool.Give(LargeMemory());
  EXPECT_EQ(pool.cached_bytes(), 0);
}

// Each thread writes its own pattern over whatever buffer it holds, then checks it is intact
// before giving it back: a buffer handed to two holders at once would fail the check (and, under
// ThreadSanitizer, race).
TEST(ScratchPool, ConcurrentTakersNeverShareABuffer) {
  ScratchPool pool(16 * kMiB);
  constexpr int kThreads = 4, kRounds = 200;
  std::vector<int> failures(kThreads, 0);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&pool, &failures, t] {
      for (int round = 0; round < kRounds; ++round) {
        const int64_t bytes = (1 + (t + round) % 4) * kMiB;
        LargeMemory m = pool.Take(bytes);
        if (!m) {
          ++failures[t];
          continue;
        }
        const char pattern = static_cast<char>(t + 1);
        for (int64_t i = 0; i < bytes; i += 4096) m.data()[i] = pattern;
        for (int64_t i = 0; i < bytes; i += 4096) {
          if (m.data()[i] != pattern) {
            ++failures[t];
            break;
          }
        }
        pool.Give(std::move(m));
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  for (int t = 0; t < kThreads; ++t) EXPECT_EQ(failures[t], 0) << "thread " << t;
  EXPECT_LE(pool.cached_bytes(), 16 * kMiB);
}

}  // namespace
}  // namespace attend
