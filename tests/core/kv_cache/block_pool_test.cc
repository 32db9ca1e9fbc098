// LargeMemory (huge-page-advised mappings) and the KV-cache block pool built on it.
#include "core/kv_cache/block_pool.h"

#include <cstdint>
#include <cstring>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "core/base/large_memory.h"
#include "gtest/gtest.h"

namespace attend {
namespace {

bool AllZero(const char* p, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    if (p[i] != 0) return false;
  }
  return true;
}

// The smaps flag of the mapping that holds `address`: whether the kernel may back it with huge
// pages ("THPeligible: 1"). Empty when this kernel does not report it.
std::string ThpEligible(const void* address) {
  std::ifstream smaps("/proc/self/smaps");
  const auto target = reinterpret_cast<uintptr_t>(address);
  std::string line;
  bool inside = false;
  while (std::getline(smaps, line)) {
    uintptr_t begin = 0, end = 0;
    char dash = 0;
    std::istringstream header(line);
    if (header >> std::hex >> begin >> dash >> end && dash == '-') {
      inside = begin <= target && target < end;
      continue;
    }
    if (inside && line.rfind("THPeligible:", 0) == 0) return line.substr(line.size() - 1);
  }
  return "";
}

std::string ThpMode() {
  std::ifstream f("/sys/kernel/mm/transparent_hugepage/enabled");
  std::string mode;
  std::getline(f, mode);
  return mode;
}

TEST(LargeMemory, ReadsTheBracketedThpMode) {
  const std::string dir = ::testing::TempDir();
  const std::string path = dir + "/thp_enabled";
  std::ofstream(path) << "always defer defer+madvise [madvise] never\n";
  EXPECT_EQ(TransparentHugePageMode(path), "madvise");
  std::ofstream(path) << "always madvise [never]\n";
  EXPECT_EQ(TransparentHugePageMode(path), "never");
  std::ofstream(path) << "garbage\n";
  EXPECT_EQ(TransparentHugePageMode(path), "");
  EXPECT_EQ(TransparentHugePageMode(dir + "/does_not_exist"), "");
}

TEST(LargeMemory, RoundsUpToZeroedAlignedHugePages) {
  LargeMemory memory = LargeMemory::Map(3 * 1000 * 1000);
  ASSERT_TRUE(memory);
  EXPECT_EQ(memory.size(), 2 * kHugePageBytes);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(memory.data()) % kHugePageBytes, 0u);
  EXPECT_TRUE(AllZero(memory.data(), memory.size()));
  std::memset(memory.data(), 0x5a, static_cast<size_t>(memory.size()));  // all of it is writable
}

TEST(LargeMemory, EmptyForNoBytesAndImpossibleSizes) {
  EXPECT_FALSE(LargeMemory::Map(0));
  EXPECT_FALSE(LargeMemory::Map(-1));
  EXPECT_FALSE(LargeMemory::Map(INT64_MAX));
  EXPECT_EQ(LargeMemory::Map(0).size(), 0);
}

TEST(LargeMemory, MovesOwnership) {
  LargeMemory a = LargeMemory::Map(1);
  ASSERT_TRUE(a);
  char* data = a.data();
  LargeMemory b = std::move(a);
  EXPECT_FALSE(a);  // NOLINT(bugprone-use-after-move): the moved-from state is the contract
  EXPECT_EQ(b.data(), data);
  LargeMemory c = LargeMemory::Map(1);
  c = std::move(b);  // unmaps c's own mapping, takes b's
  EXPECT_EQ(c.data(), data);
  data[0] = 1;
}

TEST(LargeMemory, IsAHugePageCandidateWhereTheKernelAllowsIt) {
  const std::string mode = ThpMode();
  if (mode.empty() || mode.find("[never]") != std::string::npos) {
    GTEST_SKIP() << "transparent huge pages are off on this kernel: " << mode;
  }
  LargeMemory memory = LargeMemory::Map(4 * kHugePageBytes);
  ASSERT_TRUE(memory);
  const std::string eligible = ThpEligible(memory.data());
  if (eligible.empty()) GTEST_SKIP() << "this kernel's smaps has no THPeligible field";
  EXPECT_EQ(eligible, "1") << "THP mode " << mode;
}

TEST(LargeMemory, WithoutHugePagesIsNotACandidate) {
  LargeMemory memory = LargeMemory::Map(4 * kHugePageBytes, /*huge_pages=*/false);
  ASSERT_TRUE(memory);
  const std::string eligible = ThpEligible(memory.data());
  if (eligible.empty()) GTEST_SKIP() << "this kernel's smaps has no THPeligible field";
  // Under THP "always" every anonymous mapping is a candidate, advised or not.
  if (ThpMode().find("[always]") != std::string::npos) GTEST_SKIP() << "THP mode is always";
  EXPECT_EQ(eligible, "0");
}

TEST(BlockPool, BlocksFollowTheHugePagesOption) {
  const std::string mode = ThpMode();
  if (mode.empty() || mode.find("[madvise]") == std::string::npos) {
    GTEST_SKIP() << "needs THP mode madvise to tell the two apart: " << mode;
  }
  for (const bool huge : {true, false}) {
    kv::BlockPool pool(/*capacity_bytes=*/int64_t{64} << 20, /*block_bytes=*/1 << 20, huge);
    std::vector<kv::BlockRef> blocks;
    ASSERT_TRUE(pool.TryAllocate(3, &blocks));
    const std::string eligible = ThpEligible(blocks[0]->data);
    if (eligible.empty()) GTEST_SKIP() << "this kernel's smaps has no THPeligible field";
    EXPECT_EQ(eligible, huge ? "1" : "0") << "huge_pages " << huge;
  }
}

TEST(BlockPool, HandsOutDistinctAlignedZeroedBlocksWithinTheBudget) {
  const int64_t block = 192 * 1024;  // does not divide a huge page: blocks straddle them
  kv::BlockPool pool(/*capacity_bytes=*/100 * block + 5, block);
  ASSERT_EQ(pool.total_blocks(), 100);
  std::vector<kv::BlockRef> blocks;
  ASSERT_TRUE(pool.TryAllocate(60, &blocks));
  ASSERT_TRUE(pool.TryAllocate(40, &blocks));
  EXPECT_FALSE(pool.TryAllocate(1, &blocks));
  EXPECT_EQ(blocks.size(), 100u);
  EXPECT_EQ(pool.used_blocks(), 100);
  std::set<const char*> starts;
  for (const kv::BlockRef& b : blocks) {
    EXPECT_EQ(reinterpret_cast<uintptr_t>(b->data) % 64, 0u);
    EXPECT_TRUE(AllZero(b->data, block));
    starts.insert(b->data);
  }
  ASSERT_EQ(starts.size(), 100u);
  // No two blocks overlap: sorted starts are at least a block apart.
  const char* previous = nullptr;
  for (const char* s : starts) {
    if (previous != nullptr) {
      EXPECT_GE(s - previous, block);
    }
    previous = s;
  }
  for (const kv::BlockRef& b : blocks) std::memset(b->data, 0x7f, static_cast<size_t>(block));
}

TEST(BlockPool, ReusedBlocksAreZeroedAgain) {
  const int64_t block = 1 << 20;
  kv::BlockPool pool(/*capacity_bytes=*/4 * block, block);
  std::vector<kv::BlockRef> blocks;
  ASSERT_TRUE(pool.TryAllocate(4, &blocks));
  for (const kv::BlockRef& b : blocks) std::memset(b->data, 0x33, static_cast<size_t>(block));
  blocks.erase(blocks.begin(), blocks.begin() + 3);  // three go back to the pool
  EXPECT_EQ(pool.used_blocks(), 1);
  EXPECT_EQ(pool.free_blocks(), 3);
  std::vector<kv::BlockRef> again;
  ASSERT_TRUE(pool.TryAllocate(3, &again));
  for (const kv::BlockRef& b : again) {
    EXPECT_NE(b->data, blocks[0]->data);
    EXPECT_TRUE(AllZero(b->data, block));
  }
  EXPECT_FALSE(pool.TryAllocate(1, &again));
  EXPECT_EQ(again.size(), 3u);  // a refused request appends nothing
}

// The error a caller builds from a refusal must describe the pool when it refused, not later:
// another thread may return blocks in between.
TEST(BlockPool, ARefusalSaysHowManyBlocksWereFreeWhenItWasRefused) {
  const int64_t block = 64 * 1024;
  kv::BlockPool pool(/*capacity_bytes=*/8 * block, block);
  std::vector<kv::BlockRef> blocks;
  ASSERT_TRUE(pool.TryAllocate(7, &blocks));
  kv::BlockPool::Refusal refusal;
  EXPECT_FALSE(pool.TryAllocate(2, &blocks, &refusal));
  EXPECT_EQ(refusal.free_blocks, 1);
  EXPECT_FALSE(refusal.out_of_memory);
  blocks.clear();  // returned after the refusal: the refusal's account does not change
  EXPECT_EQ(refusal.free_blocks, 1);
  EXPECT_EQ(pool.free_blocks(), 8);
}

// Returned blocks are handed out again before never-used ones, so that a cache whose use comes
// and goes holds about its peak in memory, not its whole budget.
TEST(BlockPool, ReusesReturnedBlocksBeforeTouchingNewOnes) {
  const int64_t block = 64 * 1024;
  kv::BlockPool pool(/*capacity_bytes=*/1000 * block, block);
  std::set<const char*> first;
  {
    std::vector<kv::BlockRef> blocks;
    ASSERT_TRUE(pool.TryAllocate(5, &blocks));
    for (const kv::BlockRef& b : blocks) first.insert(b->data);
  }
  for (int round = 0; round < 3; ++round) {
    std::vector<kv::BlockRef> blocks;
    ASSERT_TRUE(pool.TryAllocate(5, &blocks));
    for (const kv::BlockRef& b : blocks) EXPECT_EQ(first.count(b->data), 1u) << "round " << round;
  }
}

TEST(BlockPool, AnEmptyBudgetRefusesEverythingButZero) {
  kv::BlockPool pool(/*capacity_bytes=*/100, /*block_bytes=*/4096);
  std::vector<kv::BlockRef> blocks;
  EXPECT_TRUE(pool.TryAllocate(0, &blocks));
  EXPECT_FALSE(pool.TryAllocate(1, &blocks));
  EXPECT_TRUE(blocks.empty());
  EXPECT_EQ(pool.total_blocks(), 0);
}

}  // namespace
}  // namespace attend
