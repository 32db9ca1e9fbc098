#include "core/lessons/multi_head_attention.h"

#include <random>

#include "core/attention/testing/reference_attention.h"
#include "tests/test_util.h"

namespace attend {
namespace {

using ::attend::testing::RandomFloats;
using ::attend::testing::StatusIs;

// Lesson 3, Example 10: Llama 3 8B's attention projections per layer.
TEST(CountParameters, Llama3EightBPerLayer) {
  const ParameterCounts c = CountParameters(4096, 32, 8, 128, 128, 4096);
  EXPECT_EQ(c.wq, 16777216);
  EXPECT_EQ(c.wk, 4194304);
  EXPECT_EQ(c.wv, 4194304);
  EXPECT_EQ(c.wo, 16777216);
  EXPECT_EQ(c.kv, 8388608);
  EXPECT_EQ(c.total, 41943040);
}

TEST(CountParameters, MultiHeadLayerHasFourDModelSquared) {
  EXPECT_EQ(CountParameters(4096, 32, 32, 128, 128, 4096).total, 4LL * 4096 * 4096);
}

TensorView Matrix(const std::vector<float>& m, int64_t rows, int64_t cols) {
  return TensorView{DType::kFloat32, {rows, cols}, m.data()};
}

// The layer equals projections computed by hand followed by the reference attention.
TEST(MultiHeadAttention, EqualsProjectionsThenReferenceAttention) {
  const int64_t n = 5, d_model = 12, n_head = 4, n_head_kv = 2, head_dim = 3, d_out = 7;
  std::mt19937_64 rng(3);
  const auto x = RandomFloats(rng, n * d_model);
  const auto wq = RandomFloats(rng, d_model * n_head * head_dim);
  const auto wk = RandomFloats(rng, d_model * n_head_kv * head_dim);
  const auto wv = RandomFloats(rng, d_model * n_head_kv * head_dim);
  const auto wo = RandomFloats(rng, n_head * head_dim * d_out);
  auto layer = MultiHeadAttention::Create(
      Matrix(wq, d_model, n_head * head_dim), Matrix(wk, d_model, n_head_kv * head_dim),
      Matrix(wv, d_model, n_head_kv * head_dim), Matrix(wo, n_head * head_dim, d_out), n_head,
      n_head_kv, AttentionLimits{});
  ASSERT_TRUE(layer.ok()) << layer.status();
  EXPECT_EQ(layer->kv_params(), 2 * d_model * n_head_kv * head_dim);

  AttentionOptions options;
  options.mask.causal = true;
  auto out = layer->Forward(Matrix(x, n, d_model), options, true, true, AttentionEngine(), {});
  ASSERT_TRUE(out.ok()) << out.status();

  auto project = [&](const std::vector<float>& w, int64_t cols) {
    std::vector<float> r(n * cols, 0.0f);
    for (int64_t i = 0; i < n; ++i)
      for (int64_t c = 0; c < cols; ++c)
        for (int64_t m = 0; m < d_model; ++m)
          r[i * cols + c] += x[i * d_model + m] * w[m * cols + c];
    return r;
  };
  const auto q = project(wq, n_head * head_dim);
  const auto k = project(wk, n_head_kv * head_dim);
  const auto v = project(wv, n_head_kv * head_dim);
  for (size_t i = 0; i < q.size(); ++i) EXPECT_NEAR(out->q[i], q[i], 1e-4);
  auto heads =
      ReferenceAttention(TensorView{DType::kFloat32, {n, n_head, head_dim}, q.data()},
                         TensorView{DType::kFloat32, {n, n_head_kv, head_dim}, k.data()},
                         TensorView{DType::kFloat32, {n, n_head_kv, head_dim}, v.data()}, options);
  ASSERT_TRUE(heads.ok());
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t c = 0; c < d_out; ++c) {
      double expected = 0.0;
      for (int64_t m = 0; m < n_head * head_dim; ++m) {
        expected += heads->output[i * n_head * head_dim + m] * wo[m * d_out + c];
      }
      EXPECT_NEAR(out->output[i * d_out + c], expected, 1e-4);
    }
  }
}

class MultiHeadAttentionErrors : public ::testing::Test {
 protected:
  std::vector<float> data_ = std::vector<float>(4096, 0.1f);
  TensorView M(int64_t r, int64_t c) { return Matrix(data_, r, c); }
};

TEST_F(MultiHeadAttentionErrors, RejectsHeadsThatDoNotDivide) {
  EXPECT_THAT(MultiHeadAttention::Create(M(8, 8), M(8, 4), M(8, 4), std::nullopt, 4, 3, {}),
              StatusIs(absl::StatusCode::kInvalidArgument, {"n_head_kv: 3", "n_head 4"}));
}

TEST_F(MultiHeadAttentionErrors, RejectsWqColumnsNotAMultipleOfHeads) {
  EXPECT_THAT(MultiHeadAttention::Create(M(8, 9), M(8, 4), M(8, 4), std::nullopt, 2, 1, {}),
              StatusIs(absl::StatusCode::kInvalidArgument, {"wq.shape[1] = 9", "n_head 2"}));
}

TEST_F(MultiHeadAttentionErrors, RejectsWkThatDoesNotMatchTheHeads) {
  EXPECT_THAT(MultiHeadAttention::Create(M(8, 8), M(8, 6), M(8, 4), std::nullopt, 2, 1, {}),
              StatusIs(absl::StatusCode::kInvalidArgument, {"wk.shape[1] = 6", "1 x 4"}));
}

TEST_F(MultiHeadAttentionErrors, RejectsMismatchedModelWidth) {
  EXPECT_THAT(MultiHeadAttention::Create(M(8, 8), M(7, 4), M(8, 4), std::nullopt, 2, 1, {}),
              StatusIs(absl::StatusCode::kInvalidArgument, {"d_model", "wk [7, 4]"}));
}

TEST_F(MultiHeadAttentionErrors, RejectsWoRowsThatDoNotMatch) {
  EXPECT_THAT(MultiHeadAttention::Create(M(8, 8), M(8, 4), M(8, 4), M(5, 8), 2, 1, {}),
              StatusIs(absl::StatusCode::kInvalidArgument, {"wo.shape[0] = 5"}));
}

TEST_F(MultiHeadAttentionErrors, RejectsInputOfTheWrongWidth) {
  auto layer = MultiHeadAttention::Create(M(8, 8), M(8, 4), M(8, 4), std::nullopt, 2, 1, {});
  ASSERT_TRUE(layer.ok());
  EXPECT_THAT(layer->Forward(M(3, 7), {}, false, false, AttentionEngine(), {}),
              StatusIs(absl::StatusCode::kInvalidArgument, {"x.shape [3, 7]", "d_model = 8"}));
}

TEST_F(MultiHeadAttentionErrors, BoundsIntermediatesBeforeAllocating) {
  auto layer = MultiHeadAttention::Create(M(1, 64), M(1, 64), M(1, 64), std::nullopt, 1, 1, {});
  ASSERT_TRUE(layer.ok());
  AttentionLimits limits;
  limits.max_tensor_elements = 1000;
  EXPECT_THAT(layer->Forward(M(100, 1), {}, false, false, AttentionEngine(), limits),
              StatusIs(absl::StatusCode::kResourceExhausted, {"q projection", "[100, 64]"}));
}

}  // namespace
}  // namespace attend
