// The vector kernels against plain double-precision loops, on both the CPU's best kernels and
// the portable scalar ones, with sizes that are not multiples of the vector width.
#include "core/kernels/simd.h"

#include <cmath>
#include <random>
#include <string>

#include "common/half.h"
#include "tests/test_util.h"

namespace attend::simd {
namespace {

class Kernels : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override { testing::UseScalarKernels(GetParam()); }
  void TearDown() override { testing::UseScalarKernels(false); }
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

struct RowsCase {
  int64_t m, d, rows, stride;
  DType dtype;
};

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
    SCOPED_TRACE(::testing::Message() << "m " << c.m << " d " << c.d << " rows " << c.rows
                                      << " stride " << c.stride << " " << DTypeName(c.dtype));
    const std::vector<float> q = ::attend::testing::RandomFloats(rng, c.m * c.d);
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
      for (int64_t t = 0; t < c.rows; ++t) {
        double dot = 0.0;
        for (int64_t x = 0; x < c.d; ++x) dot += q[j * c.d + x] * keys[t * c.stride + x];
        ASSERT_NEAR(scores[j * ld + t], dot, 1e-4 * (1 + std::abs(dot)));
      }
    }
    // Probabilities with some zeros (masked) and the keys as values.
    std::vector<float> p(c.m * ld, 0.0f);
    for (int64_t i = 0; i < c.m * ld; ++i) p[i] = (i % 5 == 0) ? 0.0f : std::abs(scores[i]) * 0.01f;
    std::vector<float> acc(c.m * c.d, 0.5f);
    AccumulateRows(p.data(), ld, c.m, k, c.rows, c.d, acc.data());
    for (int64_t j = 0; j < c.m; ++j) {
      for (int64_t x = 0; x < c.d; ++x) {
        double expected = 0.5;
        for (int64_t t = 0; t < c.rows; ++t) expected += p[j * ld + t] * keys[t * c.stride + x];
        ASSERT_NEAR(acc[j * c.d + x], expected, 1e-4 * (1 + std::abs(expected)));
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Simd, Kernels, ::testing::Values(false, true),
                         [](const auto& info) { return info.param ? "scalar" : "best"; });

TEST(SimdKernels, NameSaysWhichKernelsRun) {
  const std::string name = KernelName();
  EXPECT_TRUE(name == "avx2" || name == "scalar") << name;
}

}  // namespace
}  // namespace attend::simd
