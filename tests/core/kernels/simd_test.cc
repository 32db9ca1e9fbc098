// The vector kernels against plain double-precision loops, on both the CPU's best kernels and
// the portable scalar ones, with sizes that are not multiples of the vector width.
#include "core/kernels/simd.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <random>
#include <string>

#include "absl/base/casts.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/half.h"
#include "core/kernels/simd_avx512.h"
#include "core/kernels/simd_internal.h"
#include "tests/test_util.h"

namespace attend::simd {
namespace {

// Every kernel set this CPU runs (scalar, AVX2, the AVX-512 sets), each against plain loops.
class Kernels : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override { ASSERT_TRUE(testing::UseKernels(GetParam())); }
  void TearDown() override { testing::UseScalarKernels(false); }  // back to the chosen sets
};

TEST_P(Kernels, ExpShiftSumMatchesStdExp) {
  std::vector<float> x;
  for (float v = -100.0f; v <= 0.0f; v += 0.0137f) x.push_back(v);
  std::vector<float> y(x.size());
  const float sum = ExpShiftSum(x.data(), 0.5f, y.data(), static_cast<int64_t>(x.size()));
  double expected_sum = 0.0;
  for (size_t i = 0; i < x.size(); ++i) {
    // The kernel subtracts in float; its exp is then within a few 1e-7 of exact.
    const double e = std::exp(static_cast<double>(x[i] - 0.5f));
    expected_sum += e < 1e-38 ? 0.0 : e;
    if (x[i] - 0.5f < -87.0f) {
      ASSERT_EQ(y[i], 0.0f) << x[i];
    } else {
      ASSERT_NEAR(y[i], e, 4e-7 * e) << x[i];
    }
  }
  EXPECT_NEAR(sum, expected_sum, 1e-5 * expected_sum);
}

TEST_P(Kernels, MaxAndScaleAdd) {
  std::vector<float> x = {3, -1, 7.5f, 2, 9, 0, -4, 8.25f, 1, 11.5f, -2};
  EXPECT_EQ(Max(x.data(), 11), 11.5f);
  EXPECT_EQ(Max(x.data(), 7), 9.0f);
  EXPECT_EQ(Max(x.data(), 0), -std::numeric_limits<float>::infinity());
  // A NaN score (an overflowed q.k) is left out of the maximum, wherever it falls, rather than
  // dropping the lane's earlier values: ExpShiftSum's shift must be at least every other score.
  for (size_t at = 0; at < 40; ++at) {
    std::vector<float> y(40, 1.0f);
    y[3] = 100.0f;
    y[at] = std::numeric_limits<float>::quiet_NaN();
    const float expected = at == 3 ? 1.0f : 100.0f;
    for (int64_t n : {int64_t{40}, int64_t{33}, int64_t{17}}) {
      if (static_cast<int64_t>(at) < n) {
        EXPECT_EQ(Max(y.data(), n), expected) << at << " " << n;
      }
    }
  }
  std::vector<float> dst(11, 2.0f);
  ScaleAdd(dst.data(), 0.5f, x.data(), 11);
  for (size_t i = 0; i < 11; ++i) EXPECT_EQ(dst[i], 1.0f + x[i]);
}

TEST_P(Kernels, RoundToBf16MatchesTheScalarConversion) {
  std::mt19937_64 rng(1);
  std::vector<float> x = ::attend::testing::RandomFloats(rng, 1003, 100.0f);
  x.push_back(1.0f + 0x1p-8f);  // a tie: rounds to even
  std::vector<float> y = x;
  RoundToBf16(y.data(), static_cast<int64_t>(y.size()));
  for (size_t i = 0; i < x.size(); ++i) ASSERT_EQ(y[i], Bf16ToFloat(FloatToBf16(x[i]))) << x[i];
}

TEST_P(Kernels, ToBf16MatchesTheScalarConversion) {
  std::mt19937_64 rng(2);
  for (int64_t n : {0, 1, 7, 15, 16, 17, 31, 32, 33, 100, 1003}) {
    std::vector<float> x = ::attend::testing::RandomFloats(rng, n, 100.0f);
    if (n > 3) {
      x[1] = 1.0f + 0x1p-8f;  // ties: to even, down and up
      x[2] = 1.0f + 0x3p-8f;
      x[3] = -0.0f;
    }
    std::vector<uint16_t> out(static_cast<size_t>(n) + 1, 0xabcd);
    ToBf16(x.data(), n, out.data());
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(out[i], FloatToBf16(x[i])) << n << " " << x[i];
    EXPECT_EQ(out[n], 0xabcd) << "wrote past n = " << n;
  }
}

TEST_P(Kernels, ScaleMaxScalesAndFindsTheMaxOrReportsNonFinite) {
  std::mt19937_64 rng(3);
  for (int trial = 0; trial < 300; ++trial) {
    const int64_t n = static_cast<int64_t>(rng() % 70);
    const float scale =
        trial % 3 == 0 ? 1.0f : std::ldexp(1.0f, static_cast<int>(rng() % 7) - 3) * 1.1f;
    std::vector<float> x = ::attend::testing::RandomFloats(rng, n + 1, 50.0f);
    x[static_cast<size_t>(n)] = 12345.0f;  // past n: neither scaled nor counted
    // A third of the cases hold a NaN, an infinity, or a value the scale takes past float's range.
    const int bad = n > 0 && trial % 3 == 1 ? static_cast<int>(rng() % 4) : -1;
    if (bad >= 0) {
      const float values[] = {std::nanf(""), INFINITY, -INFINITY, 3e38f};
      x[rng() % n] = values[bad];
    }
    const std::vector<float> before = x;
    const float got = ScaleMax(x.data(), n, scale);
    bool finite = true;
    float want = -INFINITY;
    for (int64_t i = 0; i < n; ++i) {
      const float scaled = before[i] * scale;
      ASSERT_TRUE(std::isnan(scaled) ? std::isnan(x[i]) : x[i] == scaled) << i;
      finite &= std::isfinite(scaled);
      want = std::max(want, scaled);
    }
    EXPECT_EQ(x[static_cast<size_t>(n)], 12345.0f);
    if (!finite) {
      EXPECT_TRUE(std::isnan(got)) << "n " << n << " bad " << bad << " got " << got;
    } else {
      EXPECT_EQ(got, want) << "n " << n << " scale " << scale;
    }
  }
}

// The vector sets compute exp to the bit as the AVX2 kernel (the same fused steps; the AVX-512
// sets build 2^n with vscalefps and mask off lanes below -87 instead of clamping them), and
// within an ulp of the scalar ExpScalar (which rounds the products of the range reduction
// separately), which also computes every set's tail: dense sweeps across the -87 cut-off and
// near the bottom of float's exponents, values far below it (where the AVX-512 sets compute
// nonsense that the mask drops), and every length's tail.
TEST_P(Kernels, ExpShiftSumGivesTheAvx2Bits) {
  std::vector<float> x;
  for (float v = -90.0f; v <= -84.0f; v += 0.00390625f) x.push_back(v);
  for (float v = -1.0f; v <= 0.0f; v += 0.0009765625f) x.push_back(v);
  for (float v : {-87.0f, std::nextafter(-87.0f, 0.0f), std::nextafter(-87.0f, -100.0f), -0.0f,
                  -1e-30f, -1e-45f, -88.7f, -103.3f, -150.0f, -1e4f, -1e30f, -3.4e38f}) {
    x.push_back(v);
  }
  std::mt19937_64 rng(41);
  std::uniform_real_distribution<float> wide(-200.0f, 0.0f);
  for (int i = 0; i < 4000; ++i) x.push_back(wide(rng));
  while (x.size() % 16 != 0) x.push_back(-0.5f);  // no tails: every value in a vector
  const int64_t n = static_cast<int64_t>(x.size());
  std::vector<float> y(x.size()), avx2(x.size());
  ExpShiftSum(x.data(), 0.0f, y.data(), n);
  const bool vector = GetParam() != "scalar";
  if (vector) internal::Avx2Kernels().exp_shift_sum(x.data(), 0.0f, avx2.data(), n);
  for (size_t i = 0; i < x.size(); ++i) {
    const float scalar = internal::ExpScalar(x[i]);
    if (vector) {
      ASSERT_EQ(absl::bit_cast<uint32_t>(y[i]), absl::bit_cast<uint32_t>(avx2[i]))
          << "exp(" << x[i] << "): " << y[i] << " against the AVX2 kernel's " << avx2[i];
    }
    ASSERT_LE(std::abs(static_cast<int64_t>(absl::bit_cast<uint32_t>(y[i])) -
                       static_cast<int64_t>(absl::bit_cast<uint32_t>(scalar))),
              1)
        << "exp(" << x[i] << "): " << y[i] << " against ExpScalar's " << scalar;
  }
  // Every length, shifted: the tails and the sums.
  for (int64_t len = 0; len <= 70; ++len) {
    std::vector<float> row(static_cast<size_t>(len) + 1, 7.0f), out(row.size(), -1.0f);
    for (int64_t i = 0; i < len; ++i) row[i] = wide(rng) * 0.5f + 3.0f;
    const float sum = ExpShiftSum(row.data(), 3.0f, out.data(), len);
    double want = 0.0;
    for (int64_t i = 0; i < len; ++i) {
      const float e = internal::ExpScalar(row[i] - 3.0f);
      ASSERT_NEAR(out[i], e, 0x1p-23f * e) << len << " " << i;
      want += e;
    }
    EXPECT_EQ(out[len], -1.0f) << "wrote past n = " << len;
    EXPECT_NEAR(sum, want, 1e-6 * want + 1e-30) << len;
  }
}

// The attention output's last pass: scaled copies, and whether any value is not finite (a NaN,
// an infinity, or a product past float's range), wherever in the row, tails included.
TEST_P(Kernels, ScaleCopyScalesAndReportsNonFinite) {
  std::mt19937_64 rng(43);
  int flagged = 0;
  for (int trial = 0; trial < 400; ++trial) {
    const int64_t n = static_cast<int64_t>(rng() % 150);
    const float factor =
        trial % 5 == 0 ? 1.0f : std::ldexp(1.0f, static_cast<int>(rng() % 9) - 4) * 1.3f;
    std::vector<float> src = ::attend::testing::RandomFloats(rng, n, 50.0f);
    const int bad = n > 0 && trial % 2 == 1 ? static_cast<int>(rng() % 5) : -1;
    if (bad >= 0) {
      const float values[] = {std::nanf(""), INFINITY, -INFINITY, 3e38f, -3.3e38f};
      src[rng() % n] = values[bad];
    }
    std::vector<float> dst(static_cast<size_t>(n) + 1, 12345.0f);
    const bool finite = ScaleCopy(src.data(), factor, dst.data(), n);
    bool want = true;
    for (int64_t i = 0; i < n; ++i) {
      const float scaled = src[i] * factor;
      ASSERT_TRUE(std::isnan(scaled) ? std::isnan(dst[i]) : dst[i] == scaled)
          << "n " << n << " i " << i << ": " << dst[i] << " against " << scaled;
      want &= std::isfinite(scaled);
    }
    EXPECT_EQ(dst[n], 12345.0f) << "wrote past n = " << n;
    EXPECT_EQ(finite, want) << "n " << n << " factor " << factor << " bad " << bad;
    flagged += want ? 0 : 1;
  }
  EXPECT_GT(flagged, 100);  // the cases do reach the flag
}

struct RowsCase {
  int64_t m, d, rows, stride;
  DType dtype;
  bool bf16_operands = false;    // q and p hold bf16 values
  bool zero_row = false;         // q's first row is all zeros
  bool negative_weight = false;  // one of p's weights is negative (AccumulateRows takes any p)
};

// RowToFloat, DotRows and AccumulateRows on case `c` against double-precision loops.
void CheckRowsCase(const RowsCase& c, std::mt19937_64& rng) {
  SCOPED_TRACE(::testing::Message()
               << "m " << c.m << " d " << c.d << " rows " << c.rows << " stride " << c.stride << " "
               << DTypeName(c.dtype) << (c.bf16_operands ? " bf16 operands" : "")
               << (c.zero_row ? " zero row" : ""));
  std::vector<float> q = ::attend::testing::RandomFloats(rng, c.m * c.d);
  // bf16 values (as bf16 arithmetic gives the kernels) take the dot kernels' one-part path.
  if (c.bf16_operands) {
    for (float& x : q) x = Bf16ToFloat(FloatToBf16(x));
  }
  if (c.zero_row) std::fill(q.begin(), q.begin() + c.d, 0.0f);
  // `keys` holds the exact values the storage represents.
  std::vector<float> keys = ::attend::testing::RandomFloats(rng, c.rows * c.stride);
  std::vector<uint16_t> keys_bf16(keys.size());
  std::vector<int8_t> keys_int8(keys.size());
  std::vector<float> scales(c.rows);
  for (int64_t t = 0; t < c.rows; ++t) {
    scales[t] = 0.01f + 0.002f * t;
    for (int64_t x = 0; x < c.stride; ++x) {
      const size_t i = t * c.stride + x;
      keys_bf16[i] = FloatToBf16(keys[i]);
      keys_int8[i] = static_cast<int8_t>(static_cast<int>(rng() % 255) - 127);
      if (c.dtype == DType::kBFloat16) keys[i] = Bf16ToFloat(keys_bf16[i]);
      if (c.dtype == DType::kInt8) keys[i] = keys_int8[i] * scales[t];
    }
  }
  Rows k{keys.data(), c.dtype, c.stride, nullptr};
  // bf16-valued operands are what native bf16 arithmetic gives the kernels: the bf16 sets' dot
  // product instructions run then (the random values are normal, so nothing is flushed).
  k.native_bf16 = c.bf16_operands;
  if (c.dtype == DType::kBFloat16) k.data = keys_bf16.data();
  if (c.dtype == DType::kInt8) {
    k.data = keys_int8.data();
    k.scales = scales.data();
  }
  // Each row widened (and dequantized) to float: exactly the values it stores.
  std::vector<float> row(c.d);
  for (int64_t t = 0; t < c.rows; ++t) {
    RowToFloat(k, t, c.d, row.data());
    for (int64_t x = 0; x < c.d; ++x) ASSERT_EQ(row[x], keys[t * c.stride + x]) << t << "," << x;
  }
  const int64_t ld = c.rows + 3;
  std::vector<float> scores(c.m * ld, -1.0f);
  DotRows(q.data(), c.m, c.d, k, c.rows, scores.data(), ld);
  for (int64_t j = 0; j < c.m; ++j) {
    double q_absmax = 0.0;
    for (int64_t x = 0; x < c.d; ++x)
      q_absmax = std::max<double>(q_absmax, std::abs(q[j * c.d + x]));
    for (int64_t t = 0; t < c.rows; ++t) {
      double dot = 0.0, k_abs = 0.0;
      for (int64_t x = 0; x < c.d; ++x) {
        dot += q[j * c.d + x] * keys[t * c.stride + x];
        k_abs += std::abs(keys[t * c.stride + x]);
      }
      // DotRows may carry q in two int8 parts against int8 rows (simd.h): each q value within
      // 1/65024 of the row's largest (an outside tester measured 1.00767 x 2^-16, past the
      // 2^-16 this once said). bf16 rows get the same allowance.
      const double q_bound = c.dtype == DType::kFloat32 ? 0.0 : q_absmax / 65024.0 * k_abs;
      ASSERT_NEAR(scores[j * ld + t], dot, 1e-4 * (1 + std::abs(dot)) + q_bound);
    }
  }
  // Probabilities with some zeros (masked) and the keys as values.
  std::vector<float> p(c.m * ld, 0.0f);
  for (int64_t i = 0; i < c.m * ld; ++i) p[i] = (i % 5 == 0) ? 0.0f : std::abs(scores[i]) * 0.01f;
  if (c.bf16_operands) {
    for (float& x : p) x = Bf16ToFloat(FloatToBf16(x));
  }
  if (c.negative_weight) p[(c.m - 1) * ld + c.rows / 2] = -0.25f;
  std::vector<float> acc(c.m * c.d, 0.5f);
  AccumulateRows(p.data(), ld, c.m, k, c.rows, c.d, acc.data());
  for (int64_t j = 0; j < c.m; ++j) {
    // AccumulateRows may carry the weights p * scale in int16 against int8 rows (simd.h): each
    // within 1/65534 of its block's largest, at most the row's largest.
    double w_absmax = 0.0;
    for (int64_t t = 0; t < c.rows; ++t) {
      w_absmax = std::max<double>(
          w_absmax, std::abs(p[j * ld + t] * (c.dtype == DType::kInt8 ? scales[t] : 1.0f)));
    }
    for (int64_t x = 0; x < c.d; ++x) {
      double expected = 0.5, stored_abs = 0.0;
      for (int64_t t = 0; t < c.rows; ++t) {
        expected += p[j * ld + t] * keys[t * c.stride + x];
        if (c.dtype == DType::kInt8) stored_abs += std::abs(keys_int8[t * c.stride + x]);
      }
      const double w_bound = w_absmax / 65534.0 * stored_abs;
      ASSERT_NEAR(acc[j * c.d + x], expected, 1e-4 * (1 + std::abs(expected)) + w_bound)
          << "row " << j << " column " << x;
    }
  }
}

TEST_P(Kernels, RowToFloatDotRowsAndAccumulateRowsMatchLoops) {
  std::mt19937_64 rng(2);
  for (const RowsCase& c :
       {RowsCase{4, 128, 37, 1024, DType::kFloat32}, RowsCase{4, 128, 256, 128, DType::kBFloat16},
        RowsCase{4, 128, 131, 128, DType::kInt8}, RowsCase{1, 3, 9, 5, DType::kFloat32},
        RowsCase{7, 20, 17, 24, DType::kBFloat16}, RowsCase{3, 24, 6, 40, DType::kInt8},
        RowsCase{2, 64, 8, 64, DType::kFloat32}, RowsCase{5, 8, 1, 8, DType::kBFloat16},
        RowsCase{3, 32, 19, 40, DType::kBFloat16}, RowsCase{1, 16, 21, 16, DType::kBFloat16},
        RowsCase{6, 48, 5, 48, DType::kBFloat16},
        // The serving head sizes 64 and 128 through every query-row block (4, 2, 1), with a
        // key-row tail in each.
        RowsCase{3, 128, 13, 128, DType::kInt8}, RowsCase{7, 128, 11, 136, DType::kFloat32},
        RowsCase{6, 64, 11, 64, DType::kBFloat16}, RowsCase{1, 64, 10, 72, DType::kInt8},
        RowsCase{5, 64, 9, 64, DType::kFloat32}}) {
    CheckRowsCase(c, rng);
    if (HasFatalFailure()) return;
  }
}

// Generated shapes: head sizes past every vector width and the int8 dot kernels' limit (512),
// row counts past every block, bf16-valued operands, all-zero query rows.
TEST_P(Kernels, GeneratedRowsMatchLoops) {
  std::mt19937_64 rng(7);
  const DType dtypes[] = {DType::kFloat32, DType::kBFloat16, DType::kInt8};
  for (int i = 0; i < 120; ++i) {
    RowsCase c{};
    c.m = 1 + static_cast<int64_t>(rng() % 9);
    c.d = 1 + static_cast<int64_t>(rng() % (i % 10 == 0 ? 700 : 160));
    c.rows = 1 + static_cast<int64_t>(rng() % 90);
    c.stride = c.d + static_cast<int64_t>(rng() % 3) * 8;
    c.dtype = dtypes[i % 3];
    c.bf16_operands = rng() % 2 == 0;
    c.zero_row = rng() % 7 == 0;
    CheckRowsCase(c, rng);
    if (HasFatalFailure()) return;
  }
}

// bf16 rows at head sizes around the 16-column steps of the AVX2 bf16 kernels (a multiple of
// 16, 8 past one, other tails) and their stack limit of 512 columns (past it the in-order
// kernels run), through every query-row block (4, 2, 1) and key-row counts below and past every
// stream split.
TEST_P(Kernels, GeneratedBf16RowsAroundSixteenColumnSteps) {
  std::mt19937_64 rng(11);
  const int64_t sizes[] = {16, 24, 32, 48, 64, 80, 96, 112, 120, 128, 136, 256, 504, 512, 520, 528};
  for (int i = 0; i < 64; ++i) {
    RowsCase c{};
    c.dtype = DType::kBFloat16;
    c.m = 1 + static_cast<int64_t>(rng() % 9);
    c.d = sizes[static_cast<size_t>(i) % std::size(sizes)];
    c.rows = 1 + static_cast<int64_t>(rng() % (i % 4 == 0 ? 9 : 70));
    c.stride = c.d + static_cast<int64_t>(rng() % 3) * 8;
    c.bf16_operands = rng() % 2 == 0;
    c.zero_row = rng() % 7 == 0;
    CheckRowsCase(c, rng);
    if (HasFatalFailure()) return;
  }
}

// int8 rows at head sizes around the 64-column steps of the vpdpbusd p.v kernel and its
// blocks of 128 rows (row counts below, at and past them, and not multiples of its 4-row steps),
// through every query-row block, with a negative weight now and then (the widening kernel).
TEST_P(Kernels, GeneratedInt8RowsAroundSixtyFourColumnSteps) {
  std::mt19937_64 rng(13);
  const int64_t sizes[] = {1, 15, 16, 17, 63, 64, 65, 96, 100, 128, 129, 192, 256, 520};
  const int64_t counts[] = {1, 3, 4, 5, 127, 128, 129, 131, 255, 256, 257, 700};
  for (int i = 0; i < 48; ++i) {
    RowsCase c{};
    c.dtype = DType::kInt8;
    c.m = 1 + static_cast<int64_t>(rng() % 9);
    c.d = sizes[static_cast<size_t>(i) % std::size(sizes)];
    c.rows = counts[static_cast<size_t>(rng() % std::size(counts))];
    c.stride = c.d + static_cast<int64_t>(rng() % 3) * 8;
    c.zero_row = rng() % 7 == 0;
    c.negative_weight = rng() % 6 == 0;
    CheckRowsCase(c, rng);
    if (HasFatalFailure()) return;
  }
}

// int8 q.k's pipelined kernel (whole blocks of 16 key rows at head sizes of whole 64-column
// steps, the next block loaded while the current one is multiplied) and the kernel of the rows
// after them: row counts around multiples of 16, every query-row group (4, 2, 1) and their
// mixes up to 9 rows (a second group reads the rows again), padded strides, and head sizes past
// one 64-column step and off it.
TEST_P(Kernels, GeneratedInt8ScoresAroundSixteenRowBlocks) {
  std::mt19937_64 rng(17);
  const int64_t sizes[] = {64, 128, 192, 256, 512, 80, 144};
  const int64_t counts[] = {15, 16, 17, 31, 32, 33, 47, 48, 64, 65, 111, 112, 113, 496};
  for (int i = 0; i < 56; ++i) {
    RowsCase c{};
    c.dtype = DType::kInt8;
    c.m = 1 + static_cast<int64_t>(rng() % 9);
    c.d = sizes[static_cast<size_t>(i) % std::size(sizes)];
    c.rows = counts[static_cast<size_t>(rng() % std::size(counts))];
    c.stride = c.d + static_cast<int64_t>(rng() % 3) * 16;
    c.zero_row = rng() % 7 == 0;
    CheckRowsCase(c, rng);
    if (HasFatalFailure()) return;
  }
}

// Decode calls DotRows once per tile with the same q, and the int8 kernels keep q's quantised
// parts between calls: a q changed in place (one value, or only its sign, or only its last bit),
// a q of another shape at the same address, and the same values at another address each give
// exactly the scores a first call with that q gives. Rows::next (the rows the caller reads next)
// changes nothing in the results.
TEST_P(Kernels, Int8ScoresFollowEveryChangeOfQ) {
  constexpr int64_t kD = 128, kRows = 80, kMaxM = 8;
  std::mt19937_64 rng(23);
  std::vector<int8_t> keys(kRows * kD);
  for (int8_t& x : keys) x = static_cast<int8_t>(static_cast<int>(rng() % 255) - 127);
  std::vector<float> scales(kRows);
  for (int64_t t = 0; t < kRows; ++t) scales[t] = 0.01f + 0.001f * t;
  const std::vector<float> values = ::attend::testing::RandomFloats(rng, kRows * kD);
  Rows k{keys.data(), DType::kInt8, kD, scales.data()};
  Rows k_next = k;
  k_next.next = values.data();
  k_next.next_bytes = static_cast<int64_t>(values.size() * sizeof(float));
  // The scores of `q` ([m, kD]) from a fresh copy of it, after a call with unrelated q.
  auto fresh = [&](const std::vector<float>& q, int64_t m) {
    std::vector<float> other = ::attend::testing::RandomFloats(rng, kMaxM * kD);
    std::vector<float> scores(kMaxM * kRows);
    DotRows(other.data(), kMaxM, kD, k, kRows, scores.data(), kRows);
    const std::vector<float> copy = q;
    scores.assign(m * kRows, 0.0f);
    DotRows(copy.data(), m, kD, k, kRows, scores.data(), kRows);
    return scores;
  };
  std::vector<float> q = ::attend::testing::RandomFloats(rng, kMaxM * kD);
  std::vector<float> scores(kMaxM * kRows);
  int64_t m = 4;
  DotRows(q.data(), m, kD, k, kRows, scores.data(), kRows);
  for (int change = 0; change < 5; ++change) {
    SCOPED_TRACE(change);
    const size_t at = static_cast<size_t>(rng() % (m * kD));
    if (change == 0) q[at] *= 3.0f;  // the largest |q| of its row may move
    if (change == 1) q[at] = -q[at];
    if (change == 2) q[at] = std::nextafter(q[at], 1e30f);
    if (change == 3) m = 7;  // more rows at the same address
    if (change == 4) m = 2;  // fewer
    std::vector<float> again(m * kRows);
    DotRows(q.data(), m, kD, change % 2 == 0 ? k : k_next, kRows, again.data(), kRows);
    std::vector<float> expected = fresh(std::vector<float>(q.begin(), q.begin() + m * kD), m);
    EXPECT_EQ(again, expected);
    // The same q at once again, now from the kept parts.
    DotRows(q.data(), m, kD, k_next, kRows, again.data(), kRows);
    EXPECT_EQ(again, expected);
  }
}

// Rows::next only asks for memory: with it set (to another buffer, as decode sets it to the
// tile's values or the next tile's keys), DotRows and AccumulateRows give the same bits as
// without, for every storage type, query-row count and row count around the kernels' steps.
TEST_P(Kernels, NextRowsChangeNoResult) {
  std::mt19937_64 rng(29);
  const DType dtypes[] = {DType::kFloat32, DType::kBFloat16, DType::kInt8};
  const std::vector<float> elsewhere = ::attend::testing::RandomFloats(rng, 1 << 16);
  for (int i = 0; i < 36; ++i) {
    const DType dtype = dtypes[i % 3];
    const int64_t m = 1 + static_cast<int64_t>(rng() % 9);
    const int64_t d = i % 2 ? 128 : 64 + static_cast<int64_t>(rng() % 3) * 32;
    const int64_t rows = 1 + static_cast<int64_t>(rng() % 300);
    SCOPED_TRACE(::testing::Message()
                 << DTypeName(dtype) << " m " << m << " d " << d << " rows " << rows);
    std::vector<float> q = ::attend::testing::RandomFloats(rng, m * d);
    std::vector<float> p = ::attend::testing::RandomFloats(rng, m * rows);
    for (float& x : q) x = Bf16ToFloat(FloatToBf16(x));
    for (float& x : p) x = Bf16ToFloat(FloatToBf16(std::abs(x) / static_cast<float>(rows)));
    const std::vector<float> values = ::attend::testing::RandomFloats(rng, rows * d);
    std::vector<uint16_t> bf16(values.size());
    std::vector<int8_t> int8(values.size());
    for (size_t x = 0; x < values.size(); ++x) {
      bf16[x] = FloatToBf16(values[x]);
      int8[x] = static_cast<int8_t>(std::clamp(std::lround(values[x] * 40), -127L, 127L));
    }
    const std::vector<float> scales(rows, 1.0f / 40);
    Rows plain{dtype == DType::kFloat32    ? static_cast<const void*>(values.data())
               : dtype == DType::kBFloat16 ? static_cast<const void*>(bf16.data())
                                           : static_cast<const void*>(int8.data()),
               dtype, d, scales.data(), /*native_bf16=*/true};
    Rows with_next = plain;
    with_next.next = elsewhere.data();
    with_next.next_bytes = static_cast<int64_t>(elsewhere.size() * sizeof(float));
    std::vector<float> s0(m * rows), s1(m * rows), a0(m * d, 0.5f), a1(m * d, 0.5f);
    DotRows(q.data(), m, d, plain, rows, s0.data(), rows);
    DotRows(q.data(), m, d, with_next, rows, s1.data(), rows);
    EXPECT_EQ(s0, s1);
    AccumulateRows(p.data(), rows, m, plain, rows, d, a0.data());
    AccumulateRows(p.data(), rows, m, with_next, rows, d, a1.data());
    EXPECT_EQ(a0, a1);
  }
}

// bf16 q.k under native bf16 arithmetic where the dot product instruction's flushing would show:
// a subnormal q component against keys near float's top (each product about 1, as an outside
// tester found: vdpbf16ps counted q as zero and gave uniform weights), and a q large enough
// that subnormal keys' products count. Every set computes these within the sums' rounding.
TEST_P(Kernels, NativeBf16ScoresKeepSubnormalOperands) {
  constexpr int64_t kM = 4, kRows = 21;
  std::mt19937_64 rng(19);
  // (q magnitude, key magnitude): products near 1 either way.
  const std::pair<float, float> cases[] = {{2e-39f, 2e38f}, {1e-40f, 3e38f}, {3e37f, 5e-39f}};
  for (const int64_t d : {64, 128, 96}) {
    for (const auto& [q_size, k_size] : cases) {
      SCOPED_TRACE(::testing::Message()
                   << "d " << d << ", q of " << q_size << ", keys of " << k_size);
      std::vector<float> q(kM * d), keys(kRows * d);
      std::vector<uint16_t> stored(keys.size());
      for (float& x : q) {
        x = Bf16ToFloat(FloatToBf16(q_size * (rng() % 2 ? 1.0f : -1.0f) *
                                    static_cast<float>(1 + rng() % 4) / 4.0f));
      }
      for (size_t i = 0; i < keys.size(); ++i) {
        stored[i] = FloatToBf16((rng() % 2 ? 1.0f : -1.0f) * (k_size / 4.0f) *
                                static_cast<float>(1 + rng() % 4));
        keys[i] = Bf16ToFloat(stored[i]);
      }
      Rows rows{stored.data(), DType::kBFloat16, d};
      rows.native_bf16 = true;
      std::vector<float> scores(kM * kRows);
      DotRows(q.data(), kM, d, rows, kRows, scores.data(), kRows);
      for (int64_t j = 0; j < kM; ++j) {
        for (int64_t t = 0; t < kRows; ++t) {
          double want = 0, magnitude = 0;
          for (int64_t x = 0; x < d; ++x) {
            const double product = static_cast<double>(q[j * d + x]) * keys[t * d + x];
            want += product;
            magnitude += std::abs(product);
          }
          ASSERT_GT(magnitude, 1e-3);
          ASSERT_NEAR(scores[j * kRows + t], want, 1e-5 * magnitude) << "row " << j << " key " << t;
        }
      }
    }
  }
}

// int8 rows whose scales are subnormal floats, or subnormal q: the VNNI kernels scale q and the
// weights p * scale to integers, and must not lose such values to an overflowed reciprocal (the
// fuzzer's corpus found p.v returning 0 for values of 1e-40). Checked relative to the sums'
// magnitude: the other tests' absolute tolerance would pass a zero.
TEST_P(Kernels, Int8RowsWithSubnormalScalesAndQueries) {
  std::mt19937_64 rng(17);
  constexpr int64_t kM = 4, kD = 128, kRows = 37;
  // (scale, q) magnitudes: subnormal scales under ordinary q, then subnormal q against ordinary
  // scales.
  const std::pair<float, float> cases[] = {
      {1e-40f, 1.0f}, {3e-39f, 0.5f}, {1e-30f, 1.0f}, {0.01f, 1e-40f}, {0.02f, 3e-39f}};
  for (const auto& [tiny, q_size] : cases) {
    SCOPED_TRACE(::testing::Message() << "scales of " << tiny << ", q of " << q_size);
    std::vector<int8_t> values(kRows * kD);
    std::vector<float> scales(kRows), exact(kRows * kD);
    for (int64_t t = 0; t < kRows; ++t) {
      scales[t] = tiny * static_cast<float>(1 + t % 3);
      for (int64_t x = 0; x < kD; ++x) {
        values[t * kD + x] = static_cast<int8_t>(static_cast<int>(rng() % 255) - 127);
        exact[t * kD + x] = values[t * kD + x] * scales[t];
      }
    }
    const Rows rows{values.data(), DType::kInt8, kD, scales.data()};
    std::vector<float> q(kM * kD), p(kM * kRows);
    for (float& x : q) x = q_size * static_cast<float>(static_cast<int>(rng() % 201) - 100) / 100;
    for (float& x : p) x = static_cast<float>(rng() % 1000) / 1000.0f;
    std::vector<float> scores(kM * kRows), acc(kM * kD, 0.0f);
    DotRows(q.data(), kM, kD, rows, kRows, scores.data(), kRows);
    AccumulateRows(p.data(), kRows, kM, rows, kRows, kD, acc.data());
    for (int64_t j = 0; j < kM; ++j) {
      for (int64_t t = 0; t < kRows; ++t) {
        double dot = 0, magnitude = 0;
        for (int64_t x = 0; x < kD; ++x) {
          dot += double{q[j * kD + x]} * exact[t * kD + x];
          magnitude += std::abs(double{q[j * kD + x]} * exact[t * kD + x]);
        }
        ASSERT_GT(magnitude, 0.0);
        ASSERT_NEAR(scores[j * kRows + t], dot, 1e-3 * magnitude) << "score " << j << "," << t;
      }
      for (int64_t x = 0; x < kD; ++x) {
        double sum = 0, magnitude = 0;
        for (int64_t t = 0; t < kRows; ++t) {
          sum += double{p[j * kRows + t]} * exact[t * kD + x];
          magnitude += std::abs(double{p[j * kRows + t]} * exact[t * kD + x]);
        }
        ASSERT_GT(magnitude, 0.0);
        ASSERT_NEAR(acc[j * kD + x], sum, 1e-3 * magnitude) << "output " << j << "," << x;
      }
    }
  }
}

// One large weight and a long tail of small ones, each a step or two of a 16-bit scale on the
// largest, all rounded the same way: the outside tester's case (an attention sink and 1,500 keys
// 10 below it) where the int16 weights moved an average of values that all equal 5 by 1.4%.
// Whatever the kernels carry the weights in, the rounding must not move such a sum by more than
// 2^-12 of it.
TEST_P(Kernels, Int8LongTailOfSmallWeightsKeepsItsMass) {
  constexpr int64_t kD = 16;
  for (const int64_t rows : {40, 200, 496, 1500}) {
    for (const float tail : {4.5e-5f, 1.7e-5f, 3e-4f}) {
      SCOPED_TRACE(::testing::Message() << rows << " rows, tail weights " << tail);
      std::vector<int8_t> values(rows * kD, 127);
      std::vector<float> scales(rows, 5.0f / 127.0f);  // every value exactly 5
      const Rows v{values.data(), DType::kInt8, kD, scales.data()};
      std::vector<float> p(rows, tail);
      p[rows / 3] = 1.0f;
      double mass = 0;
      for (float x : p) mass += x;
      std::vector<float> acc(kD, 0.0f);
      AccumulateRows(p.data(), rows, 1, v, rows, kD, acc.data());
      for (int64_t x = 0; x < kD; ++x) {
        ASSERT_NEAR(acc[x] / mass, 5.0, 5.0 * std::ldexp(1.0, -12)) << "column " << x;
      }
    }
  }
}

// Rows of softmax weights exp(s - max s), s drawn with standard deviation `sigma`: sharp ones
// (sigma 2 and up, as attention often is) spread over more than the 2^16 steps of an int16 in
// a few dozen rows.
std::vector<float> SoftmaxRows(std::mt19937_64& rng, int64_t m, int64_t rows, double sigma) {
  std::normal_distribution<double> normal(0.0, sigma);
  std::vector<float> p(static_cast<size_t>(m * rows));
  for (int64_t j = 0; j < m; ++j) {
    std::vector<double> s(static_cast<size_t>(rows));
    for (double& x : s) x = normal(rng);
    const double top = *std::max_element(s.begin(), s.end());
    for (int64_t t = 0; t < rows; ++t) p[j * rows + t] = static_cast<float>(std::exp(s[t] - top));
  }
  return p;
}

// p.v over int8 rows with softmax weights of every sharpness: however a set carries the weights,
// an output stays within 2^-12 of its largest |value| (relative to the weights' sum) of the sum
// over the stored values, as docs/api.md says.
TEST_P(Kernels, Int8SoftmaxWeightsOfAnySharpnessKeepTheirBound) {
  std::mt19937_64 rng(29);
  constexpr int64_t kD = 128;
  for (const double sigma : {0.5, 2.0, 3.0, 5.0, 8.0}) {
    // Rows around the weights' blocks (32 and 128 keys, pairs) and query rows through every
    // group size the kernels take (4, 2, 1).
    for (const int64_t rows : {1, 2, 31, 33, 63, 127, 128, 129, 200, 257, 496}) {
      for (const int64_t m : {1, 2, 3, 4, 5, 7}) {
        SCOPED_TRACE(::testing::Message()
                     << "sigma " << sigma << ", " << rows << " rows, " << m << " query rows");
        std::vector<int8_t> values(rows * kD);
        std::vector<float> scales(rows);
        for (int64_t t = 0; t < rows; ++t) {
          scales[t] = static_cast<float>(0.5 + (rng() % 1000) / 1000.0) / 127.0f;
          for (int64_t x = 0; x < kD; ++x) {
            values[t * kD + x] = static_cast<int8_t>(static_cast<int>(rng() % 255) - 127);
          }
        }
        const Rows v{values.data(), DType::kInt8, kD, scales.data()};
        const std::vector<float> p = SoftmaxRows(rng, m, rows, sigma);
        std::vector<float> acc(m * kD, 0.0f);
        AccumulateRows(p.data(), rows, m, v, rows, kD, acc.data());
        for (int64_t j = 0; j < m; ++j) {
          double mass = 0, largest = 0;
          for (int64_t t = 0; t < rows; ++t) {
            mass += p[j * rows + t];
            largest = std::max(largest, 127.0 * scales[t]);
          }
          for (int64_t x = 0; x < kD; ++x) {
            double exact = 0, magnitude = 0;
            for (int64_t t = 0; t < rows; ++t) {
              const double term = double{p[j * rows + t]} * values[t * kD + x] * scales[t];
              exact += term;
              magnitude += std::abs(term);
            }
            ASSERT_NEAR(acc[j * kD + x] / mass, exact / mass,
                        std::ldexp(largest, -12) + 1e-5 * magnitude / mass)
                << "row " << j << " column " << x;
          }
        }
      }
    }
  }
}

// int8 rows whose values are subnormal floats (scales below 2^-100, all of a tile's): p times a
// row's scale is then subnormal too, with fewer bits than the output bound needs. An outside
// tester found outputs off by 4.6 times the bound at values of 1e-40 and 25 times at 1e-41, where
// the same values stored as f32 kept it. The output stays within 2^-12 of the largest |value|
// (relative to the weights' sum) on every set, as f32 storage does; what f32 itself cannot
// hold (half its smallest step, per output) is allowed for.
TEST_P(Kernels, Int8SubnormalValuesKeepTheOutputBound) {
  std::mt19937_64 rng(37);
  constexpr int64_t kD = 64;
  for (const float size : {1e-37f, 3e-39f, 1e-40f, 1e-41f, 3e-42f}) {
    for (const int64_t rows : {7, 300}) {
      SCOPED_TRACE(::testing::Message() << "values of " << size << ", " << rows << " rows");
      constexpr int64_t kM = 2;
      std::vector<int8_t> values(rows * kD);
      std::vector<float> scales(rows);
      double largest = 0;
      for (int64_t t = 0; t < rows; ++t) {
        scales[t] = size * static_cast<float>(1 + t % 3) / 127.0f;
        largest = std::max(largest, 127.0 * scales[t]);
        for (int64_t x = 0; x < kD; ++x) {
          values[t * kD + x] = static_cast<int8_t>(static_cast<int>(rng() % 255) - 127);
        }
      }
      const Rows v{values.data(), DType::kInt8, kD, scales.data()};
      const std::vector<float> p = SoftmaxRows(rng, kM, rows, 1.0);
      std::vector<float> acc(kM * kD, 0.0f);
      AccumulateRows(p.data(), rows, kM, v, rows, kD, acc.data());
      for (int64_t j = 0; j < kM; ++j) {
        double mass = 0;
        for (int64_t t = 0; t < rows; ++t) mass += p[j * rows + t];
        for (int64_t x = 0; x < kD; ++x) {
          double exact = 0;
          for (int64_t t = 0; t < rows; ++t) {
            exact += double{p[j * rows + t]} * values[t * kD + x] * double{scales[t]};
          }
          ASSERT_NEAR(acc[j * kD + x] / mass, exact / mass,
                      std::ldexp(largest, -12) + std::ldexp(1.0, -150) / mass)
              << "row " << j << " column " << x;
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Simd, Kernels, ::testing::ValuesIn(testing::RunnableKernels()),
                         [](const auto& test_param) { return test_param.param; });

bool HasAvx512() {
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
}

// The VNNI sets' int16 weights of p.v: sharp softmax rows stay on vpdpwssd, each weight within
// half a step of its block, the step its block's largest / 32767. With one step per 128 rows
// (or per tile, before) most such rows were refused and p.v ran on the widening kernel, 15% of
// an int8 decode step over the cache on a Zen 4.
TEST(SimdKernels, QuantizeInt8WeightsCarriesSharpSoftmaxRows) {
  if (!HasAvx512()) GTEST_SKIP() << "no AVX-512 here";
  std::mt19937_64 rng(31);
  for (const double sigma : {0.5, 2.0, 3.0, 4.0, 8.0}) {
    for (const int64_t rows : {31, 200, 496, 1023}) {
      SCOPED_TRACE(::testing::Message() << "sigma " << sigma << ", " << rows << " rows");
      constexpr int64_t kM = 4;
      const std::vector<float> p = SoftmaxRows(rng, kM, rows, sigma);
      std::vector<float> scales(rows);
      for (float& x : scales) x = static_cast<float>(0.5 + (rng() % 1000) / 1000.0) / 127.0f;
      internal::Int8Weights w;
      ASSERT_TRUE(internal::QuantizeInt8Weights(p.data(), rows, kM, scales.data(), rows, &w));
      ASSERT_EQ(w.width, (rows + 1) / 2 * 2);
      // Flat rows keep the coarse blocks, whose int32 sums are converted less often.
      if (sigma < 1) {
        EXPECT_EQ(w.block, internal::kBlockRows);
      }
      for (int64_t j = 0; j < kM; ++j) {
        for (int64_t b = 0; b * w.block < rows; ++b) {
          const float step = w.step[b * kM + j];
          float largest = 0;
          for (int64_t t = b * w.block; t < std::min(rows, (b + 1) * w.block); ++t) {
            largest = std::max(largest, p[j * rows + t] * scales[t]);
          }
          EXPECT_NEAR(step * 32767.0f, largest, 1e-6f * largest) << "row " << j << " block " << b;
          for (int64_t t = b * w.block; t < std::min(rows, (b + 1) * w.block); ++t) {
            const double weight = double{p[j * rows + t]} * scales[t];
            ASSERT_LE(std::abs(w.values[j * w.width + t] * double{step} - weight),
                      0.5001 * step + 1e-6 * weight)
                << "row " << j << " weight " << t;
          }
        }
        for (int64_t t = rows; t < w.width; ++t) EXPECT_EQ(w.values[j * w.width + t], 0);
      }
    }
  }
}

// An attention sink with a long tail of weights a step or so each, all rounded alike (the outside
// tester's case): the sink's block of 32 is summed exactly and the rest stays in int16. Negative
// or non-finite weights go to the widening kernel whole.
TEST(SimdKernels, QuantizeInt8WeightsSumsASinksBlockExactly) {
  if (!HasAvx512()) GTEST_SKIP() << "no AVX-512 here";
  constexpr int64_t kRows = 496;
  const std::vector<float> scales(kRows, 1.0f / 127.0f);
  internal::Int8Weights w;
  for (const int64_t sink : {0, 100, 300}) {
    SCOPED_TRACE(::testing::Message() << "sink at " << sink);
    std::vector<float> p(kRows, 4.5e-5f);
    p[sink] = 1.0f;
    ASSERT_TRUE(internal::QuantizeInt8Weights(p.data(), kRows, 1, scales.data(), kRows, &w));
    ASSERT_EQ(w.block, internal::kFineBlockRows);
    for (int64_t b = 0; b * w.block < kRows; ++b) {
      EXPECT_EQ(w.exact[b], b == sink / w.block ? 1 : 0) << "block " << b;
    }
  }
  std::vector<float> tail(kRows, 4.5e-5f);  // the same tail without the sink: exact enough
  ASSERT_TRUE(internal::QuantizeInt8Weights(tail.data(), kRows, 1, scales.data(), kRows, &w));
  for (uint8_t e : w.exact) EXPECT_EQ(e, 0);
  // A sink in every block: a block's tail rounds off by at most 31 half steps, under twice the
  // bound, so about half the blocks are summed exactly, never more.
  std::vector<float> sinks(kRows, 4.5e-5f);
  for (int64_t t = 0; t < kRows; t += internal::kFineBlockRows) sinks[t] = 1.0f;
  ASSERT_TRUE(internal::QuantizeInt8Weights(sinks.data(), kRows, 1, scales.data(), kRows, &w));
  int64_t exact = 0;
  for (uint8_t e : w.exact) exact += e;
  EXPECT_GE(exact, 1);
  EXPECT_LE(2 * exact, static_cast<int64_t>(w.exact.size()));
  for (const float bad :
       {-0.25f, std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN()}) {
    std::vector<float> q(kRows, 0.5f);
    q[kRows - 1] = bad;
    EXPECT_FALSE(internal::QuantizeInt8Weights(q.data(), kRows, 1, scales.data(), kRows, &w))
        << bad;
  }
  // Weights far below 2^-100 carry no step; alone in a row they are refused (their whole mass
  // would be lost), next to ordinary blocks they are within the bound.
  std::vector<float> tiny(kRows, 1e-35f);
  EXPECT_FALSE(internal::QuantizeInt8Weights(tiny.data(), kRows, 1, scales.data(), kRows, &w));
  std::vector<float> mixed(kRows, 0.5f);
  for (int64_t t = 0; t < 128; ++t) mixed[t] = 1e-35f;
  ASSERT_TRUE(internal::QuantizeInt8Weights(mixed.data(), kRows, 1, scales.data(), kRows, &w));
  EXPECT_EQ(w.step[0], 0.0f);
  EXPECT_EQ(w.values[0], 0);
}

TEST(SimdKernels, NameSaysWhichKernelsRun) {
  const std::vector<std::string> runnable = testing::RunnableKernels();
  ASSERT_FALSE(runnable.empty());
  EXPECT_EQ(runnable.front(), "scalar");
  EXPECT_FALSE(testing::UseKernels("no-such-kernels"));
  // One name when every storage type chose the same set, else each type's.
  const std::string f32 = KernelName({DType::kFloat32}), bf16 = KernelName({DType::kBFloat16}),
                    int8 = KernelName({DType::kInt8});
  for (const std::string& name : {f32, bf16, int8}) {
    EXPECT_NE(std::find(runnable.begin(), runnable.end(), name), runnable.end()) << name;
  }
  if (f32 == bf16 && bf16 == int8) {
    EXPECT_EQ(KernelName(), f32);
  } else {
    EXPECT_EQ(KernelName(), "f32:" + f32 + ",bf16:" + bf16 + ",int8:" + int8);
  }
  // float16 is converted to f32 before the kernels read it.
  EXPECT_EQ(KernelName({DType::kFloat16}), f32);
  EXPECT_EQ(KernelName({DType::kInt8, DType::kInt8}), int8);
}

// --simd_kernels and the snapshot directory's KERNELS record are read by ParseKernels: each
// mistake is named (the missing types, an unknown type or set, a type given twice, an empty
// item), spaces around the parts are ignored, and names are lowercase.
TEST(SimdKernels, ParseNamesTheWrongPart) {
  const struct {
    const char* text;
    const char* words;
  } wrong[] = {
      {"f32:avx2", "names no set for bf16, int8"},
      {"int8:avx2,f32:scalar", "names no set for bf16"},
      {"f32:avx2,bf16:avx2,int4:avx2", "'int4' is no storage type (f32, bf16, int8)"},
      {"f32:avx2,bf16:avx2,int8:avx2,f32:scalar", "names f32 twice"},
      {"AVX2", "names are lowercase: 'avx2'"},
      {"F32:avx2,bf16:avx2,int8:avx2", "names are lowercase: 'f32'"},
      {"avx2,", "item 2 of 2 is empty"},
      {",avx2", "item 1 of 2 is empty"},
      {"f32:avx2,,bf16:avx2,int8:avx2", "item 2 of 4 is empty"},
      {"", "names no kernel set"},
      {"  ", "names no kernel set"},
      {"avx9000", "'avx9000' is no kernel set (scalar, avx2, avx512"},
      {"f32:avx2,bf16:avx9000,int8:avx2", "bf16: 'avx9000' is no kernel set"},
      {"f32:avx2,bf16,int8:avx2", "item 'bf16' is not TYPE:SET"},
      {"f32:,bf16:avx2,int8:avx2", "item 'f32:' names no set"},
      {"avx2:f32", "'avx2' is no storage type"},
  };
  for (const auto& c : wrong) {
    const absl::StatusOr<KernelSets> parsed = ParseKernels(c.text);
    ASSERT_FALSE(parsed.ok()) << "'" << c.text << "' read as " << (*parsed)[0];
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument) << c.text;
    EXPECT_THAT(std::string(parsed.status().message()), ::testing::HasSubstr(c.words)) << c.text;
  }
  const struct {
    const char* text;
    KernelSets sets;
  } right[] = {
      {"avx2", {"avx2", "avx2", "avx2"}},
      {" scalar\t", {"scalar", "scalar", "scalar"}},
      {"avx512", {"avx512", "avx512", "avx512"}},  // a set of this build, whatever the CPU
      {"int8:scalar, f32 : avx2 ,bf16:avx512_bf16", {"avx2", "avx512_bf16", "scalar"}},
  };
  for (const auto& c : right) {
    const absl::StatusOr<KernelSets> parsed = ParseKernels(c.text);
    ASSERT_TRUE(parsed.ok()) << c.text << ": " << parsed.status();
    EXPECT_EQ(*parsed, c.sets) << c.text;
  }
}

// SetKernels applies what ParseKernels reads, and names a set this CPU cannot run, with those it
// can; nothing changes when it refuses.
TEST(SimdKernels, SetKernelsNamesASetThisCpuCannotRun) {
  ChooseKernels();
  const std::string before = KernelName();
  const std::vector<std::string> runnable = testing::RunnableKernels();
  const std::string runs = absl::StrJoin(runnable, ", ");
  for (const char* set : {"avx512", "avx512_vnni", "avx512_bf16"}) {
    if (std::find(runnable.begin(), runnable.end(), set) != runnable.end()) continue;
    const absl::Status whole = SetKernels(set);
    EXPECT_EQ(whole.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(
        std::string(whole.message()),
        ::testing::HasSubstr(absl::StrCat("this CPU cannot run ", set, " (it runs ", runs, ")")));
    const absl::Status per_type = SetKernels(absl::StrCat("f32:scalar,bf16:", set, ",int8:scalar"));
    EXPECT_THAT(std::string(per_type.message()),
                ::testing::HasSubstr(absl::StrCat("bf16: this CPU cannot run ", set)));
    EXPECT_EQ(KernelName(), before);
  }
  // An uppercase name's lowercase form is suggested only where this CPU runs it; else the
  // message says that it cannot, with the sets it can, rather than suggest another refusal.
  for (const char* set : {"avx2", "avx512", "avx512_vnni", "avx512_bf16"}) {
    const std::string upper = absl::AsciiStrToUpper(set);
    const bool runs_it = std::find(runnable.begin(), runnable.end(), set) != runnable.end();
    const std::string expected =
        runs_it ? absl::StrCat("'", upper, "' is no kernel set: names are lowercase: '", set, "'")
                : absl::StrCat("'", upper, "' is no kernel set: names are lowercase, but this CPU ",
                               "cannot run ", set, " (it runs ", runs, ")");
    EXPECT_EQ(std::string(ParseKernels(upper).status().message()), expected);
    EXPECT_EQ(std::string(SetKernels(upper).message()), expected);
    EXPECT_EQ(
        std::string(SetKernels(absl::StrCat("f32:", upper, ",bf16:scalar,int8:scalar")).message()),
        absl::StrCat("f32: ", expected));
    EXPECT_EQ(KernelName(), before);
  }
  EXPECT_THAT(std::string(SetKernels("f32:avx2").message()),
              ::testing::HasSubstr("names no set for bf16, int8"));
  EXPECT_EQ(KernelName(), before);
  {
    const testing::ScopedKernels scoped(" scalar ");
    ASSERT_TRUE(scoped.ok());
    EXPECT_EQ(KernelName(), "scalar");
  }
  EXPECT_EQ(KernelName(), before);
}

// The default, kept unless the measurement finds a clearly faster set, follows the CPU: on an AMD
// CPU with AVX512-BF16 the bf16 kernels, not skipped by a wrong feature test; on an Intel CPU with
// AVX-512 the 16-lane set, whatever else it has (vdpbf16ps runs at half the FMAs' rate there).
TEST(SimdKernels, DefaultFollowsTheCpu) {
  __builtin_cpu_init();
  const bool avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
  const std::string name = testing::RunnableKernels().back();
  if (avx512 && __builtin_cpu_is("intel")) {
    EXPECT_EQ(name, "avx512");
  } else if (avx512 && __builtin_cpu_supports("avx512bf16") &&
             __builtin_cpu_supports("avx512vnni")) {
    EXPECT_EQ(name, "avx512_bf16");
  } else if (avx512 && __builtin_cpu_supports("avx512vnni")) {
    EXPECT_EQ(name, "avx512_vnni");
  } else if (avx512) {
    EXPECT_EQ(name, "avx512");
  } else if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
    EXPECT_EQ(name, "avx2");
  } else {
    EXPECT_EQ(name, "scalar");
  }
}

// The measurement chooses a set the CPU runs for every storage type, a vector one where there is
// any, within its budget. simd.h promises 50 ms; the bound here is 10x that, as the test shares
// a noisy machine with other builds (the figure is printed: 13-35 ms on a shared 2-vCPU Xeon).
TEST(SimdKernels, MeasurementChoosesRunnableSetsWithinItsBudget) {
  const std::vector<std::string> runnable = testing::RunnableKernels();
  const testing::Measurement m = testing::MeasureKernels();
  std::printf("kernel choice measured in %.1f ms: f32 %s, bf16 %s, int8 %s\n", m.seconds * 1e3,
              m.f32.c_str(), m.bf16.c_str(), m.int8.c_str());
  for (const std::string& name : {m.f32, m.bf16, m.int8}) {
    EXPECT_NE(std::find(runnable.begin(), runnable.end(), name), runnable.end()) << name;
    if (runnable.size() > 1) {
      EXPECT_NE(name, "scalar");
    }
  }
  EXPECT_GT(m.seconds, 0.0);
  EXPECT_LT(m.seconds, 0.5);
}

// The decision: the default unless another set is faster by kClearMargin in both its best and
// its median sample (one lucky sample, or a 4% lead, keeps the default).
TEST(SimdKernels, ChoiceKeepsTheDefaultUnlessAnotherIsClearlyFaster) {
  using internal::ChooseSet;
  using internal::SetTimes;
  // Set 1 is the default throughout.
  EXPECT_EQ(ChooseSet({{1.0, 1.1}, {1.0, 1.1}, {1.0, 1.1}}, 1), 1u);
  EXPECT_EQ(ChooseSet({{0.96, 1.05}, {1.0, 1.1}, {1.0, 1.1}}, 1), 1u);  // 4% ahead
  EXPECT_EQ(ChooseSet({{0.9, 1.1}, {1.0, 1.1}}, 1), 1u);                // by the best only
  EXPECT_EQ(ChooseSet({{1.0, 0.9}, {1.0, 1.1}}, 1), 1u);                // by the median only
  EXPECT_EQ(ChooseSet({{0.9, 1.0}, {1.0, 1.1}}, 1), 0u);                // 10% ahead in both
  // Of two clearly faster sets, the lower median; the default itself may be the fastest.
  EXPECT_EQ(ChooseSet({{0.8, 0.95}, {1.0, 1.1}, {0.85, 0.9}}, 1), 2u);
  EXPECT_EQ(ChooseSet({{1.2, 1.3}, {1.0, 1.1}}, 1), 1u);
}

// UseKernels (the server's --simd_kernels) wins over the measurement for every storage type, and
// ChooseKernels keeps it; the per-type form pins each type's set; ScopedKernels restores.
TEST(SimdKernels, NamedSetsWinForEveryType) {
  ChooseKernels();
  const std::string chosen = KernelName();
  // What KernelName() prints, UseKernels takes back.
  ASSERT_TRUE(testing::UseKernels(chosen)) << chosen;
  EXPECT_EQ(KernelName(), chosen);
  {
    const testing::ScopedKernels scoped("scalar");
    ASSERT_TRUE(scoped.ok());
    ChooseKernels();
    EXPECT_EQ(KernelName(), "scalar");
    for (DType t : {DType::kFloat32, DType::kBFloat16, DType::kInt8}) {
      EXPECT_EQ(KernelName({t}), "scalar");
    }
  }
  EXPECT_EQ(KernelName(), chosen);
  const std::string last = testing::RunnableKernels().back();
  {
    const testing::ScopedKernels scoped("int8:scalar,f32:" + last + ",bf16:scalar");
    ASSERT_TRUE(scoped.ok());
    EXPECT_EQ(KernelName({DType::kFloat32}), last);
    EXPECT_EQ(KernelName({DType::kBFloat16, DType::kInt8}), "scalar");
    if (last != "scalar") {
      EXPECT_EQ(KernelName(), "f32:" + last + ",bf16:scalar,int8:scalar");
      EXPECT_EQ(KernelName({DType::kInt8, DType::kFloat32}), "f32:" + last + ",int8:scalar");
    }
  }
  EXPECT_EQ(KernelName(), chosen);
  for (const char* bad :
       {"f32:scalar", "f32:scalar,bf16:scalar", "f32:scalar,bf16:scalar,int8:scalar,f32:scalar",
        "f32:scalar,bf16:no-such,int8:scalar", "f16:scalar,bf16:scalar,int8:scalar",
        "f32:scalar,bf16:scalar,int8", "f32:scalar,bf16:scalar,,int8:scalar", ":", ""}) {
    const testing::ScopedKernels scoped(bad);
    EXPECT_FALSE(scoped.ok()) << bad;
    EXPECT_EQ(KernelName(), chosen) << bad;
  }
}

// The row kernels dispatch on the rows' dtype: with a different set for each storage type, each
// type's results are bit for bit those of its own set (whose arithmetic differs from the others':
// vdpbf16ps, vpdpbusd, 16 or 8 lanes, or scalar sums).
TEST(SimdKernels, RowKernelsUseTheirStorageTypesSet) {
  const std::vector<std::string> runnable = testing::RunnableKernels();
  const std::string sets[3] = {runnable.front(), runnable.back(),
                               runnable[runnable.size() > 2 ? 1 : 0]};
  const DType types[3] = {DType::kFloat32, DType::kBFloat16, DType::kInt8};
  constexpr int64_t kM = 4, kD = 128, kRows = 64;
  std::mt19937_64 rng(11);
  std::vector<float> q = ::attend::testing::RandomFloats(rng, kM * kD);
  std::vector<float> p = ::attend::testing::RandomFloats(rng, kM * kRows);
  // bf16 values, as under bf16 arithmetic: the bf16 dot product set's instruction runs.
  for (float& x : q) x = Bf16ToFloat(FloatToBf16(x));
  for (float& x : p) x = Bf16ToFloat(FloatToBf16(std::abs(x) / kRows));
  const std::vector<float> values = ::attend::testing::RandomFloats(rng, kRows * kD);
  std::vector<float> f32 = values, scales(kRows, 1.0f / 64);
  std::vector<uint16_t> bf16(values.size());
  std::vector<int8_t> int8(values.size());
  for (size_t i = 0; i < values.size(); ++i) {
    bf16[i] = FloatToBf16(values[i]);
    int8[i] = static_cast<int8_t>(std::clamp(std::lround(values[i] * 64), -127L, 127L));
  }
  const void* data[3] = {f32.data(), bf16.data(), int8.data()};
  struct Results {
    std::vector<float> scores = std::vector<float>(kM * kRows);
    std::vector<float> acc = std::vector<float>(kM * kD, 0.25f);
    std::vector<float> row = std::vector<float>(kD);
  };
  auto run = [&](int type) {
    Results r;
    const Rows rows{data[type], types[type], kD, scales.data(), /*native_bf16=*/true};
    DotRows(q.data(), kM, kD, rows, kRows, r.scores.data(), kRows);
    AccumulateRows(p.data(), kRows, kM, rows, kRows, kD, r.acc.data());
    RowToFloat(rows, 5, kD, r.row.data());
    return r;
  };
  Results alone[3];
  for (int type = 0; type < 3; ++type) {
    const testing::ScopedKernels scoped(sets[type]);
    ASSERT_TRUE(scoped.ok());
    alone[type] = run(type);
  }
  const testing::ScopedKernels mixed("f32:" + sets[0] + ",bf16:" + sets[1] + ",int8:" + sets[2]);
  ASSERT_TRUE(mixed.ok());
  for (int type = 0; type < 3; ++type) {
    SCOPED_TRACE(sets[type]);
    const Results r = run(type);
    EXPECT_EQ(r.scores, alone[type].scores);
    EXPECT_EQ(r.acc, alone[type].acc);
    EXPECT_EQ(r.row, alone[type].row);
  }
}

}  // namespace
}  // namespace attend::simd
