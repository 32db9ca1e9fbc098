#include "core/base/tensor.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/half.h"
#include "tests/test_util.h"

namespace attend {
namespace {

using ::attend::testing::StatusIs;

TEST(CheckedArithmetic, DetectsOverflow) {
  EXPECT_EQ(CheckedMul(3, 4), 12);
  EXPECT_EQ(CheckedMul(int64_t{1} << 40, int64_t{1} << 30), std::nullopt);
  EXPECT_EQ(CheckedAdd(std::numeric_limits<int64_t>::max(), 1), std::nullopt);
}

TEST(CheckedElementCount, CountsValidShapes) {
  EXPECT_EQ(*CheckedElementCount({2, 3, 4}, "q.shape", 100), 24);
  EXPECT_EQ(*CheckedElementCount({}, "scalar", 100), 1);
}

TEST(CheckedElementCount, RejectsZeroDimensionNamingFieldAndShape) {
  EXPECT_THAT(
      CheckedElementCount({4, 0, 8}, "q.shape", 1000),
      StatusIs(absl::StatusCode::kInvalidArgument, {"q.shape", "[4, 0, 8]", "dimension 1 is 0"}));
}

TEST(CheckedElementCount, RejectsNegativeDimension) {
  EXPECT_THAT(CheckedElementCount({4, -2}, "k.shape", 1000),
              StatusIs(absl::StatusCode::kInvalidArgument, {"k.shape", "dimension 1 is -2"}));
}

TEST(CheckedElementCount, RejectsOverflowBeforeAnyLimit) {
  const int64_t big = int64_t{1} << 32;
  EXPECT_THAT(CheckedElementCount({big, big, big}, "v.shape", std::numeric_limits<int64_t>::max()),
              StatusIs(absl::StatusCode::kInvalidArgument, {"v.shape", "overflows 64 bits"}));
}

TEST(CheckedElementCount, RejectsCountOverLimitAsResourceExhausted) {
  EXPECT_THAT(
      CheckedElementCount({1000, 1000}, "x.shape", 999999),
      StatusIs(absl::StatusCode::kResourceExhausted, {"x.shape", "1000000 elements", "999999"}));
}

TEST(Half, Bf16RoundsToNearestEven) {
  EXPECT_EQ(FloatToBf16(1.0f), 0x3f80);
  EXPECT_EQ(Bf16ToFloat(0x3f80), 1.0f);
  EXPECT_EQ(Bf16ToFloat(FloatToBf16(-2.5f)), -2.5f);
  // 1 + 2^-8 lies exactly between two bf16 values; ties go to the even mantissa (1.0).
  EXPECT_EQ(Bf16ToFloat(FloatToBf16(1.0f + 0x1p-8f)), 1.0f);
  EXPECT_EQ(Bf16ToFloat(FloatToBf16(1.0f + 0x1p-8f + 0x1p-12f)), 1.0f + 0x1p-7f);
  EXPECT_TRUE(std::isnan(Bf16ToFloat(FloatToBf16(std::nanf("")))));
  EXPECT_TRUE(std::isinf(Bf16ToFloat(FloatToBf16(std::numeric_limits<float>::infinity()))));
}

TEST(Half, Float16ConvertsNormalSubnormalAndSpecialValues) {
  EXPECT_EQ(FloatToHalf(1.0f), 0x3c00);
  EXPECT_EQ(HalfToFloat(0x3c00), 1.0f);
  EXPECT_EQ(HalfToFloat(0x7bff), 65504.0f);
  EXPECT_EQ(FloatToHalf(65504.0f), 0x7bff);
  EXPECT_EQ(FloatToHalf(70000.0f), 0x7c00);  // overflow -> inf
  EXPECT_EQ(HalfToFloat(0x0001), 0x1p-24f);  // smallest subnormal
  EXPECT_EQ(FloatToHalf(0x1p-24f), 0x0001);
  EXPECT_EQ(FloatToHalf(0x1p-26f), 0x0000);  // under half of it -> 0
  EXPECT_EQ(HalfToFloat(0x8000), -0.0f);
  EXPECT_TRUE(std::isnan(HalfToFloat(FloatToHalf(std::nanf("")))));
  // Every finite half survives a round trip through float.
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const uint16_t bits = static_cast<uint16_t>(h);
    if ((bits & 0x7c00) == 0x7c00) continue;
    ASSERT_EQ(FloatToHalf(HalfToFloat(bits)), bits) << std::hex << h;
  }
}

TEST(TensorView, ReadsEveryDType) {
  const float f[] = {1.5f, -2.0f};
  const uint16_t b[] = {FloatToBf16(1.5f), FloatToBf16(-2.0f)};
  const uint16_t h[] = {FloatToHalf(1.5f), FloatToHalf(-2.0f)};
  for (const TensorView& view :
       {TensorView{DType::kFloat32, {2}, f}, TensorView{DType::kBFloat16, {2}, b},
        TensorView{DType::kFloat16, {2}, h}}) {
    EXPECT_EQ(view.At(0), 1.5f);
    float out[2];
    ConvertToFloat(view, out);
    EXPECT_EQ(out[1], -2.0f);
  }
}

TEST(AppendEncoded, EncodesLittleEndian) {
  std::string bytes;
  AppendEncoded({1.0f}, DType::kBFloat16, &bytes);
  ASSERT_EQ(bytes.size(), 2u);
  EXPECT_EQ(static_cast<uint8_t>(bytes[0]), 0x80);
  EXPECT_EQ(static_cast<uint8_t>(bytes[1]), 0x3f);
}

TEST(CheckFinite, NamesFieldElementAndKind) {
  const float data[] = {1.0f, std::nanf(""), 2.0f};
  EXPECT_THAT(CheckFinite(TensorView{DType::kFloat32, {3}, data}, "k"),
              StatusIs(absl::StatusCode::kInvalidArgument, {"k", "NaN", "element 1", "[3]"}));
  const uint16_t halves[] = {FloatToHalf(1.0f), 0xfc00};  // -inf
  EXPECT_THAT(CheckFinite(TensorView{DType::kFloat16, {2}, halves}, "v"),
              StatusIs(absl::StatusCode::kInvalidArgument, {"v", "-inf", "element 1"}));
  const uint16_t ok[] = {FloatToBf16(3.0f)};
  EXPECT_TRUE(CheckFinite(TensorView{DType::kBFloat16, {1}, ok}, "q").ok());
}

// The scan goes chunk by chunk: the first bad element is found wherever it sits, including after
// an earlier chunk of finite values and next to a later bad one.
TEST(CheckFinite, FindsTheFirstBadElementOfALargeTensor) {
  std::vector<float> values(10000, 0.5f);
  EXPECT_TRUE(CheckFinite(TensorView{DType::kFloat32, {10000}, values.data()}, "q").ok());
  values[9999] = -std::numeric_limits<float>::infinity();
  EXPECT_THAT(CheckFinite(TensorView{DType::kFloat32, {100, 100}, values.data()}, "q"),
              StatusIs(absl::StatusCode::kInvalidArgument, {"-inf", "element 9999"}));
  values[5000] = std::nanf("");
  EXPECT_THAT(CheckFinite(TensorView{DType::kFloat32, {100, 100}, values.data()}, "q"),
              StatusIs(absl::StatusCode::kInvalidArgument, {"NaN", "element 5000"}));
  values[2047] = std::numeric_limits<float>::infinity();  // the last element of a chunk
  EXPECT_THAT(CheckFinite(TensorView{DType::kFloat32, {100, 100}, values.data()}, "q"),
              StatusIs(absl::StatusCode::kInvalidArgument, {"+inf", "element 2047"}));
  std::vector<uint16_t> bf16(4097, FloatToBf16(1.0f));
  bf16[4096] = 0x7fc0;  // NaN, alone in the third chunk
  EXPECT_THAT(CheckFinite(TensorView{DType::kBFloat16, {4097}, bf16.data()}, "k"),
              StatusIs(absl::StatusCode::kInvalidArgument, {"NaN", "element 4096"}));
  const float big = std::numeric_limits<float>::max();  // finite: exponent bits not all set
  EXPECT_TRUE(CheckFinite(TensorView{DType::kFloat32, {1}, &big}, "q").ok());
}

// Tensors of 2^18 elements or more are split among threads: the answer is still the first bad
// element overall, whichever thread's share holds it, and the same for any thread count.
TEST(CheckFinite, ManyThreadsFindTheSameFirstBadElement) {
  const int64_t n = int64_t{3} << 18;
  std::vector<float> values(static_cast<size_t>(n), 0.25f);
  std::vector<uint16_t> halves(static_cast<size_t>(n), FloatToHalf(0.25f));
  for (int threads : {1, 2, 3, 0}) {
    SCOPED_TRACE(threads);
    std::fill(values.begin(), values.end(), 0.25f);
    EXPECT_TRUE(CheckFinite(TensorView{DType::kFloat32, {n}, values.data()}, "k", threads).ok());
    values[static_cast<size_t>(n - 1)] = std::nanf("");  // in the last thread's share
    EXPECT_THAT(
        CheckFinite(TensorView{DType::kFloat32, {n}, values.data()}, "k", threads),
        StatusIs(absl::StatusCode::kInvalidArgument, {"NaN", absl::StrCat("element ", n - 1)}));
    values[static_cast<size_t>(n / 2 + 7)] = -std::numeric_limits<float>::infinity();
    values[static_cast<size_t>(n / 3 - 1)] = std::numeric_limits<float>::infinity();
    EXPECT_THAT(CheckFinite(TensorView{DType::kFloat32, {n}, values.data()}, "k", threads),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         {"+inf", absl::StrCat("element ", n / 3 - 1)}));
    std::fill(halves.begin(), halves.end(), FloatToHalf(0.25f));
    halves[static_cast<size_t>(n - 2)] = 0x7c00;  // float16 +inf
    halves[static_cast<size_t>(n - 3)] = 0x7e00;  // float16 NaN
    EXPECT_THAT(
        CheckFinite(TensorView{DType::kFloat16, {n}, halves.data()}, "v", threads),
        StatusIs(absl::StatusCode::kInvalidArgument, {"NaN", absl::StrCat("element ", n - 3)}));
  }
}

}  // namespace
}  // namespace attend
