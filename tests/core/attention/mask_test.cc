#include "core/attention/mask.h"

#include <limits>
#include <random>

#include "tests/test_util.h"

namespace attend {
namespace {

TEST(Mask, CausalSquareIsLowerTriangle) {
  const std::vector<uint8_t> table = MaskTable({/*causal=*/true, 0}, 4, 4);
  const std::vector<uint8_t> expected = {1, 0, 0, 0,  //
                                         1, 1, 0, 0,  //
                                         1, 1, 1, 0,  //
                                         1, 1, 1, 1};
  EXPECT_EQ(table, expected);
}

TEST(Mask, QueriesAlignToTheEndOfTheKeys) {
  // Two new queries over five keys: positions 3 and 4.
  const std::vector<uint8_t> table = MaskTable({true, 0}, 2, 5);
  const std::vector<uint8_t> expected = {1, 1, 1, 1, 0,  //
                                         1, 1, 1, 1, 1};
  EXPECT_EQ(table, expected);
  // A single decode query sees every cached key.
  EXPECT_EQ(VisibleKeys({true, 0}, 1, 7, 0).size(), 7);
}

TEST(Mask, QueriesBeforeEveryKeySeeNothing) {
  // Four queries over two keys: positions -2, -1, 0, 1.
  EXPECT_EQ(VisibleKeys({true, 0}, 4, 2, 0).size(), 0);
  EXPECT_EQ(VisibleKeys({true, 0}, 4, 2, 1).size(), 0);
  EXPECT_EQ(VisibleKeys({true, 0}, 4, 2, 2).size(), 1);
  EXPECT_EQ(VisibleKeys({true, 0}, 4, 2, 3).size(), 2);
}

TEST(Mask, CausalSlidingWindowKeepsTheLastWindowKeys) {
  const std::vector<uint8_t> table = MaskTable({true, 2}, 4, 4);
  const std::vector<uint8_t> expected = {1, 0, 0, 0,  //
                                         1, 1, 0, 0,  //
                                         0, 1, 1, 0,  //
                                         0, 0, 1, 1};
  EXPECT_EQ(table, expected);
}

TEST(Mask, NonCausalWindowIsSymmetric) {
  const std::vector<uint8_t> table = MaskTable({false, 2}, 4, 4);
  const std::vector<uint8_t> expected = {1, 1, 0, 0,  //
                                         1, 1, 1, 0,  //
                                         0, 1, 1, 1,  //
                                         0, 0, 1, 1};
  EXPECT_EQ(table, expected);
}

TEST(Mask, NoMaskSeesEverything) { EXPECT_EQ(VisiblePairs({false, 0}, 3, 5), 15); }

TEST(Mask, CausalPrefillHasTriangularPairCount) {
  EXPECT_EQ(VisiblePairs({true, 0}, 1024, 1024), 1024 * 1025 / 2);
}

TEST(Mask, RejectsNegativeWindow) {
  EXPECT_THAT(
      ValidateMask({true, -1}),
      ::attend::testing::StatusIs(absl::StatusCode::kInvalidArgument, {"window_tokens", "-1"}));
}

// VisibleKeys is the contiguous form of IsVisible for every shape and mask.
TEST(Mask, VisibleKeysAgreesWithIsVisible) {
  std::mt19937_64 rng(7);
  for (int trial = 0; trial < 300; ++trial) {
    const int64_t n_q = 1 + rng() % 9;
    const int64_t n_kv = 1 + rng() % 9;
    const MaskSpec mask{static_cast<bool>(rng() % 2), static_cast<int64_t>(rng() % 5)};
    for (int64_t i = 0; i < n_q; ++i) {
      const KeyRange range = VisibleKeys(mask, n_q, n_kv, i);
      for (int64_t j = 0; j < n_kv; ++j) {
        const bool in_range = j >= range.begin && j < range.end;
        ASSERT_EQ(in_range, IsVisible(mask, n_q, n_kv, i, j))
            << "n_q " << n_q << " n_kv " << n_kv << " causal " << mask.causal << " window "
            << mask.window << " i " << i << " j " << j;
      }
    }
  }
}

// A window longer than every distance between a query and a key hides nothing, up to the
// largest value the API accepts (2^63 - 1 once overflowed in the non-causal range's end).
TEST(Mask, HugeWindowsHideNothing) {
  const int64_t huge[] = {
      int64_t{1} << 40, (int64_t{1} << 62), std::numeric_limits<int64_t>::max() - 8,
      std::numeric_limits<int64_t>::max() - 1, std::numeric_limits<int64_t>::max()};
  for (const bool causal : {false, true}) {
    for (const auto& [n_q, n_kv] : {std::pair<int64_t, int64_t>{5, 7}, {7, 5}, {1, 9}, {9, 1}}) {
      const int64_t unmasked = VisiblePairs({causal, 0}, n_q, n_kv);
      for (int64_t window : huge) {
        EXPECT_EQ(VisiblePairs({causal, window}, n_q, n_kv), unmasked)
            << "causal " << causal << " n_q " << n_q << " n_kv " << n_kv << " window " << window;
        for (int64_t i = 0; i < n_q; ++i) {
          for (int64_t j = 0; j < n_kv; ++j) {
            ASSERT_EQ(IsVisible({causal, window}, n_q, n_kv, i, j),
                      IsVisible({causal, 0}, n_q, n_kv, i, j));
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace attend
