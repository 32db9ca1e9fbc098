#include "core/lessons/softmax.h"

#include <cmath>
#include <limits>
#include <numeric>

#include "tests/test_util.h"

namespace attend {
namespace {

using ::attend::testing::StatusIs;
constexpr double kInf = std::numeric_limits<double>::infinity();

// The lesson's "it" example: scores 2, 1, 0.5 for animal, tired, street.
TEST(Softmax, LessonSharesForTheItExample) {
  auto result = Softmax({2.0, 1.0, 0.5});
  ASSERT_TRUE(result.ok());
  const auto& p = result->probabilities;
  EXPECT_NEAR(p[0], 0.63, 0.005);
  EXPECT_NEAR(p[1], 0.23, 0.005);
  EXPECT_NEAR(p[2], 0.14, 0.005);
  EXPECT_NEAR(p[0] + p[1] + p[2], 1.0, 1e-15);
  // The lesson's total of the exponentials: 7.39 + 2.72 + 1.65 = 11.76.
  EXPECT_NEAR(std::exp(result->log_sum_exp), 11.76, 0.005);
}

TEST(Softmax, AddingAConstantChangesNothing) {
  auto a = Softmax({2.0, 1.0, 0.5});
  auto b = Softmax({1002.0, 1001.0, 1000.5});
  ASSERT_TRUE(a.ok() && b.ok());
  for (int i = 0; i < 3; ++i) EXPECT_NEAR(a->probabilities[i], b->probabilities[i], 1e-12);
}

TEST(Softmax, HugeScoresDoNotOverflow) {
  auto result = Softmax({1000.0, 999.0, -1000.0});
  ASSERT_TRUE(result.ok());
  EXPECT_NEAR(result->probabilities[0], 1.0 / (1.0 + std::exp(-1.0)), 1e-12);
  EXPECT_TRUE(std::isfinite(result->log_sum_exp));
}

TEST(Softmax, MinusInfinityGetsExactlyZero) {
  auto result = Softmax({1.0, -kInf, 1.0});
  ASSERT_TRUE(result.ok());
  EXPECT_EQ(result->probabilities[1], 0.0);
  EXPECT_DOUBLE_EQ(result->probabilities[0], 0.5);
}

TEST(Softmax, AllMinusInfinityIsAllZero) {
  auto result = Softmax({-kInf, -kInf});
  ASSERT_TRUE(result.ok());
  EXPECT_EQ(result->probabilities, (std::vector<double>{0.0, 0.0}));
  EXPECT_EQ(result->log_sum_exp, -kInf);
  EXPECT_EQ(result->entropy_nats, 0.0);
}

TEST(Softmax, EntropyIsLogNForUniform) {
  auto result = Softmax({3.0, 3.0, 3.0, 3.0});
  ASSERT_TRUE(result.ok());
  EXPECT_NEAR(result->entropy_nats, std::log(4.0), 1e-12);
}

TEST(Softmax, TemperatureDividesLogits) {
  auto hot = Softmax({2.0, 1.0}, 2.0);
  auto plain = Softmax({1.0, 0.5});
  ASSERT_TRUE(hot.ok() && plain.ok());
  EXPECT_NEAR(hot->probabilities[0], plain->probabilities[0], 1e-15);
}

TEST(Softmax, RejectsBadInput) {
  EXPECT_THAT(Softmax({}), StatusIs(absl::StatusCode::kInvalidArgument, {"logits", "empty"}));
  EXPECT_THAT(Softmax({1.0, std::nan("")}),
              StatusIs(absl::StatusCode::kInvalidArgument, {"logits[1]"}));
  EXPECT_THAT(Softmax({kInf}), StatusIs(absl::StatusCode::kInvalidArgument, {"logits[0]"}));
  EXPECT_THAT(Softmax({1.0}, 0.0), StatusIs(absl::StatusCode::kInvalidArgument, {"temperature"}));
  EXPECT_THAT(Softmax({1.0}, -1.0), StatusIs(absl::StatusCode::kInvalidArgument, {"temperature"}));
}

// Temperatures so small that logits / temperature leave double's range: never NaN. The
// probabilities are the limit (all of the weight on the largest logit) when the log-sum-exp is
// still a number; when it is not, the request is refused naming the temperature.
TEST(Softmax, TinyTemperaturesNeverGiveNaN) {
  for (double t : {1e-300, 1e-308, 1e-310, 5e-324}) {
    for (const std::vector<double>& logits :
         {std::vector<double>{1, 2}, {3, 1}, {1e308, -1e308}, {-1, -2, -0.5}, {0, 0}}) {
      absl::StatusOr<SoftmaxResult> r = Softmax(logits, t);
      if (!r.ok()) {
        EXPECT_THAT(r, ::attend::testing::StatusIs(absl::StatusCode::kInvalidArgument,
                                                   {"temperature", "overflow"}));
        continue;
      }
      double sum = 0.0;
      for (double p : r->probabilities) {
        ASSERT_TRUE(std::isfinite(p)) << "t " << t;
        sum += p;
      }
      EXPECT_NEAR(sum, 1.0, 1e-12);
      EXPECT_TRUE(std::isfinite(r->log_sum_exp));
      EXPECT_TRUE(std::isfinite(r->entropy_nats));
    }
  }
  // Where the limit is representable, it is the one-hot of the largest logit.
  absl::StatusOr<SoftmaxResult> r = Softmax({-1, -2, -0.5}, 1e-300);
  ASSERT_OK(r);
  EXPECT_EQ(r->probabilities[0], 0.0);
  EXPECT_EQ(r->probabilities[1], 0.0);
  EXPECT_EQ(r->probabilities[2], 1.0);
  // Equal largest logits share the weight.
  r = Softmax({0, 0}, 5e-324);
  ASSERT_OK(r);
  EXPECT_EQ(r->probabilities[0], 0.5);
}

TEST(SoftmaxJacobian, IsDiagMinusOuterProduct) {
  const std::vector<double> p = {0.5, 0.3, 0.2};
  const std::vector<double> j = SoftmaxJacobian(p);
  ASSERT_EQ(j.size(), 9u);
  EXPECT_DOUBLE_EQ(j[0], 0.5 - 0.25);
  EXPECT_DOUBLE_EQ(j[1], -0.15);
  EXPECT_DOUBLE_EQ(j[4], 0.3 - 0.09);
  EXPECT_DOUBLE_EQ(j[5], j[7]);  // symmetric
}

TEST(SoftmaxJacobian, RowsSumToZero) {
  auto result = Softmax({2.0, 1.0, 0.5, -3.0});
  ASSERT_TRUE(result.ok());
  const auto j = SoftmaxJacobian(result->probabilities);
  for (int r = 0; r < 4; ++r) {
    double sum = 0.0;
    for (int c = 0; c < 4; ++c) sum += j[r * 4 + c];
    EXPECT_NEAR(sum, 0.0, 1e-15) << "row " << r;
  }
}

// Saturation: as one share approaches 1, every entry of the Jacobian approaches 0.
TEST(SoftmaxJacobian, VanishesAsOneShareApproachesOne) {
  double previous = kInf;
  for (double gap : {0.0, 2.0, 5.0, 10.0, 20.0, 40.0}) {
    auto result = Softmax({gap, 0.0, 0.0});
    ASSERT_TRUE(result.ok());
    const auto j = SoftmaxJacobian(result->probabilities);
    double largest = 0.0;
    for (double x : j) largest = std::max(largest, std::abs(x));
    EXPECT_LT(largest, previous) << "gap " << gap;
    previous = largest;
  }
  EXPECT_LT(previous, 1e-16);
}

TEST(SoftmaxInPlace, MatchesDoubleSoftmaxAndZeroesMaskedEntries) {
  float row[] = {4.0f, -std::numeric_limits<float>::infinity(), 0.0f, 2.0f};
  SoftmaxInPlace(row, 4, 0.5f);
  auto expected = Softmax({2.0, -kInf, 0.0, 1.0});
  ASSERT_TRUE(expected.ok());
  for (int i = 0; i < 4; ++i) EXPECT_NEAR(row[i], expected->probabilities[i], 1e-6);
  EXPECT_EQ(row[1], 0.0f);
  float empty[] = {-std::numeric_limits<float>::infinity()};
  SoftmaxInPlace(empty, 1, 1.0f);
  EXPECT_EQ(empty[0], 0.0f);
}

}  // namespace
}  // namespace attend
