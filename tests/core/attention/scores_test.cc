// ComputeScores against its definition: scale * q.k per (head, query, key), -inf exactly where
// IsVisible says the key is hidden, the key/value head of each query head, bf16 operands.
#include "core/attention/scores.h"

#include <cmath>
#include <limits>
#include <vector>

#include "common/half.h"
#include "core/attention/mask.h"
#include "tests/test_util.h"

namespace attend {
namespace {

using ::attend::testing::StatusIs;

TEST(Scores, MatchTheDefinitionUnderAWindowWithGqa) {
  const int64_t n_q = 3, n_kv = 5, n_head = 4, n_head_kv = 2, d = 3;
  std::vector<float> q(n_q * n_head * d), k(n_kv * n_head_kv * d), v(k.size(), 0.0f);
  for (size_t i = 0; i < q.size(); ++i) q[i] = 0.25f * static_cast<float>(i % 7) - 0.5f;
  for (size_t i = 0; i < k.size(); ++i) k[i] = 0.125f * static_cast<float>(i % 5) - 0.25f;
  AttentionOptions options;
  options.mask.causal = true;
  options.mask.window = 2;
  const TensorView qv{DType::kFloat32, {n_q, n_head, d}, q.data()};
  const TensorView kv{DType::kFloat32, {n_kv, n_head_kv, d}, k.data()};
  const TensorView vv{DType::kFloat32, {n_kv, n_head_kv, d}, v.data()};
  auto problem = PrepareAttention(qv, kv, vv, options, AttentionLimits{});
  ASSERT_TRUE(problem.ok()) << problem.status();
  std::vector<float> scores(n_head * n_q * n_kv), masked(scores.size());
  ASSERT_TRUE(ComputeScores(*problem, absl::MakeSpan(scores), absl::MakeSpan(masked)).ok());
  const double scale = 1.0 / std::sqrt(3.0);
  for (int64_t h = 0; h < n_head; ++h) {
    const int64_t g = h / (n_head / n_head_kv);
    for (int64_t i = 0; i < n_q; ++i) {
      for (int64_t j = 0; j < n_kv; ++j) {
        double dot = 0;
        for (int64_t c = 0; c < d; ++c) {
          dot += q[(i * n_head + h) * d + c] * k[(j * n_head_kv + g) * d + c];
        }
        const size_t at = (h * n_q + i) * n_kv + j;
        EXPECT_NEAR(scores[at], scale * dot, 1e-6) << h << " " << i << " " << j;
        if (IsVisible(options.mask, n_q, n_kv, i, j)) {
          EXPECT_EQ(masked[at], scores[at]);
        } else {
          EXPECT_EQ(masked[at], -std::numeric_limits<float>::infinity());
        }
      }
    }
  }
}

// Under bf16 precision the scores are of the bf16-rounded operands, as the weights are.
TEST(Scores, Bf16PrecisionRoundsTheOperands) {
  const float a = 1.00390625f;  // 1 + 2^-8: not a bfloat16, rounds to 1
  std::vector<float> q = {a}, k = {a}, v = {0.0f};
  AttentionOptions options;
  options.scale = 1.0f;
  options.precision = Precision::kBFloat16;
  const TensorView qv{DType::kFloat32, {1, 1, 1}, q.data()};
  const TensorView kv{DType::kFloat32, {1, 1, 1}, k.data()};
  const TensorView vv{DType::kFloat32, {1, 1, 1}, v.data()};
  auto problem = PrepareAttention(qv, kv, vv, options, AttentionLimits{});
  ASSERT_TRUE(problem.ok());
  std::vector<float> scores(1), masked(1);
  ASSERT_TRUE(ComputeScores(*problem, absl::MakeSpan(scores), absl::MakeSpan(masked)).ok());
  const float r = Bf16ToFloat(FloatToBf16(a));
  EXPECT_EQ(scores[0], r * r);
}

TEST(Scores, RejectsWrongSizesAndStopsWhenCancelled) {
  std::vector<float> x = {1, 2, 3, 4};
  const TensorView view{DType::kFloat32, {2, 1, 2}, x.data()};
  auto problem = PrepareAttention(view, view, view, {}, AttentionLimits{});
  ASSERT_TRUE(problem.ok());
  std::vector<float> four(4), three(3);
  EXPECT_THAT(ComputeScores(*problem, absl::MakeSpan(four), absl::MakeSpan(three)),
              StatusIs(absl::StatusCode::kInvalidArgument, {"n_head x n_q x n_kv = 4"}));
  Cancellation cancel;
  cancel.Cancel();
  std::vector<float> other(4);
  EXPECT_THAT(ComputeScores(*problem, absl::MakeSpan(four), absl::MakeSpan(other), &cancel),
              StatusIs(absl::StatusCode::kCancelled, {"computing the scores"}));
}

}  // namespace
}  // namespace attend
