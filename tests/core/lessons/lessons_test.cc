// The worked examples of the two attention lessons, reproduced by the reference and the oneDNN
// engine. Expected numbers are the ones the lessons print.
#include <cmath>
#include <vector>

#include "core/attention/attention_engine.h"
#include "core/attention/testing/reference_attention.h"
#include "core/lessons/java_random.h"
#include "core/lessons/multi_head_attention.h"
#include "tests/test_util.h"

namespace attend {
namespace {

struct Result {
  std::vector<float> output;
  std::vector<float> weights;
};

// Runs the engine, checks it against the reference (loop form vs matrix form), returns the
// engine's.
Result Attend(const std::vector<float>& q, Shape q_shape, const std::vector<float>& k,
              Shape k_shape, const std::vector<float>& v, Shape v_shape, AttentionOptions options) {
  const TensorView qv{DType::kFloat32, q_shape, q.data()};
  const TensorView kv{DType::kFloat32, k_shape, k.data()};
  const TensorView vv{DType::kFloat32, v_shape, v.data()};
  auto reference = ReferenceAttention(qv, kv, vv, options);
  EXPECT_TRUE(reference.ok()) << reference.status();
  Result r;
  r.output.resize(reference->output.size());
  r.weights.resize(reference->weights.size());
  AttentionEngine engine;
  const absl::Status status =
      engine.Compute(qv, kv, vv, options, AttentionLimits{}, absl::MakeSpan(r.output),
                     absl::MakeSpan(r.weights), nullptr);
  EXPECT_TRUE(status.ok()) << status;
  for (size_t i = 0; i < r.output.size(); ++i) EXPECT_NEAR(r.output[i], reference->output[i], 1e-6);
  for (size_t i = 0; i < r.weights.size(); ++i)
    EXPECT_NEAR(r.weights[i], reference->weights[i], 1e-6);
  return r;
}

void ExpectRow(const std::vector<float>& values, size_t offset, std::vector<double> expected,
               double tolerance) {
  for (size_t i = 0; i < expected.size(); ++i) {
    EXPECT_NEAR(values[offset + i], expected[i], tolerance) << "element " << offset + i;
  }
}

// Lesson 1: "it" compares itself with animal, tired, street; scores 2, 1, 0.5 after / sqrt(4).
TEST(Lessons, ItBlendsMostlyAnimal) {
  Result r = Attend({1, 1, 1, 1}, {1, 1, 4}, {1, 1, 1, 1, 1, 1, 0, 0, 1, 0, 0, 0}, {3, 1, 4},
                    {1, 0, 0, 1, 1, 1}, {3, 1, 2}, {});
  ExpectRow(r.weights, 0, {0.63, 0.23, 0.14}, 0.005);
  ExpectRow(r.output, 0, {0.77, 0.37}, 0.005);
}

// Example 2: with every score equal (scale 0) causal attention is the running average.
TEST(Lessons, EqualScoresGiveTheUniformRunningAverage) {
  const std::vector<float> x = {1, 0, 0, 1, 1, 1, 2, 0};
  AttentionOptions options;
  options.mask.causal = true;
  options.scale = 0.0f;
  Result r = Attend(x, {4, 1, 2}, x, {4, 1, 2}, x, {4, 1, 2}, options);
  ExpectRow(r.output, 0, {1.0, 0.0, 0.5, 0.5, 2.0 / 3, 2.0 / 3, 1.0, 0.5}, 1e-6);
}

// Example 3: dot-product scores of the last vector (2, 0) against all four, softmax, mix.
TEST(Lessons, DotProductScoresWeightTheAverage) {
  const std::vector<float> x = {1, 0, 0, 1, 1, 1, 2, 0};
  AttentionOptions options;
  options.mask.causal = true;
  options.scale = 1.0f;
  Result r = Attend(x, {4, 1, 2}, x, {4, 1, 2}, x, {4, 1, 2}, options);
  ExpectRow(r.weights, 12, {0.105, 0.014, 0.105, 0.776}, 0.0005);
  ExpectRow(r.output, 6, {1.7615942, 0.11920292}, 1e-6);
}

// Example 6: the causal mask on the score table 1 + 0.5 * ((3i + 5j) mod 4). One-hot queries
// and keys holding the table's columns make q_i . k_j equal the table entry.
TEST(Lessons, CausalMaskWeightTable) {
  std::vector<float> q(16, 0.0f), k(16);
  for (int i = 0; i < 4; ++i) q[i * 4 + i] = 1.0f;
  for (int j = 0; j < 4; ++j) {
    for (int c = 0; c < 4; ++c) k[j * 4 + c] = 1.0f + 0.5f * ((c * 3 + j * 5) % 4);
  }
  AttentionOptions options;
  options.mask.causal = true;
  options.scale = 1.0f;
  Result r = Attend(q, {4, 1, 4}, k, {4, 1, 4}, k, {4, 1, 4}, options);
  ExpectRow(r.weights, 0, {1.000, 0.000, 0.000, 0.000}, 0.0005);
  ExpectRow(r.weights, 4, {0.818, 0.182, 0.000, 0.000}, 0.0005);
  ExpectRow(r.weights, 8, {0.331, 0.547, 0.122, 0.000}, 0.0005);
  ExpectRow(r.weights, 12, {0.167, 0.276, 0.455, 0.102}, 0.0005);
  // Hidden entries are exactly zero, not merely small.
  for (int i = 0; i < 4; ++i) {
    for (int j = i + 1; j < 4; ++j) EXPECT_EQ(r.weights[i * 4 + j], 0.0f);
  }
}

// The lessons' seeded matrices: java.util.Random gaussians times 0.5, as float.
std::vector<float> LessonRandom(JavaRandom& random, int rows, int cols) {
  std::vector<float> m(static_cast<size_t>(rows * cols));
  for (float& x : m) x = static_cast<float>(random.NextGaussian() * 0.5);
  return m;
}

TensorView Matrix(const std::vector<float>& m, int64_t rows, int64_t cols) {
  return TensorView{DType::kFloat32, {rows, cols}, m.data()};
}

// Examples 4, 7 and 8: Random(1) projects four 4-number inputs to 2-number q, k, v; causal
// attention gives the lesson's weights and outputs, and the matrix form equals the loop form.
TEST(Lessons, SeededFullAttentionOfFourTokens) {
  JavaRandom random(1);
  const auto x = LessonRandom(random, 4, 4);
  const auto wq = LessonRandom(random, 4, 2);
  const auto wk = LessonRandom(random, 4, 2);
  const auto wv = LessonRandom(random, 4, 2);
  auto layer = MultiHeadAttention::Create(Matrix(wq, 4, 2), Matrix(wk, 4, 2), Matrix(wv, 4, 2),
                                          std::nullopt, 1, 1, AttentionLimits{});
  ASSERT_TRUE(layer.ok()) << layer.status();
  AttentionOptions options;
  options.mask.causal = true;
  auto out = layer->Forward(Matrix(x, 4, 4), options, /*want_weights=*/true,
                            /*keep_projections=*/true, AttentionEngine(), AttentionLimits{});
  ASSERT_TRUE(out.ok()) << out.status();

  // Example 4's projections.
  ExpectRow(out->q, 0, {0.12, -0.46, 0.43, -1.10, -0.16, 0.59, -0.18, 0.26}, 0.005);
  ExpectRow(out->k, 0, {0.57, 0.12, 0.64, 0.86, -0.10, 0.34, 0.12, -0.51}, 0.005);
  ExpectRow(out->v, 0, {1.44, 0.91, 1.07, -0.33, 0.05, -0.07, -0.68, -0.49}, 0.005);
  // Scores are not symmetric: q2.k1 = 0.407, q1.k2 = -0.417.
  EXPECT_NEAR(out->q[4] * out->k[2] + out->q[5] * out->k[3], 0.407, 0.0005);
  EXPECT_NEAR(out->q[2] * out->k[4] + out->q[3] * out->k[5], -0.417, 0.0005);

  // Example 7's weights and outputs.
  ExpectRow(out->weights, 0, {1.000, 0.000, 0.000, 0.000}, 0.0005);
  ExpectRow(out->weights, 4, {0.635, 0.365, 0.000, 0.000}, 0.0005);
  ExpectRow(out->weights, 8, {0.282, 0.383, 0.335, 0.000}, 0.0005);
  ExpectRow(out->weights, 12, {0.237, 0.270, 0.269, 0.224}, 0.0005);
  ExpectRow(out->output, 0, {1.438, 0.907, 1.305, 0.457, 0.833, 0.108, 0.490, 0.000}, 0.0006);

  // Example 8: the matrix form (engine) equals the loop form (reference) below 1e-6.
  const TensorView q{DType::kFloat32, {4, 1, 2}, out->q.data()};
  const TensorView k{DType::kFloat32, {4, 1, 2}, out->k.data()};
  const TensorView v{DType::kFloat32, {4, 1, 2}, out->v.data()};
  auto loop = ReferenceAttention(q, k, v, options);
  ASSERT_TRUE(loop.ok());
  for (size_t i = 0; i < out->output.size(); ++i) {
    EXPECT_LT(std::abs(out->output[i] - loop->output[i]), 1e-6);
  }
}

// Example 9: two heads over d_model = 8 with Random(3); each head weighs the last position
// differently, and the layer has 4 x 8 x 8 = 256 parameters.
TEST(Lessons, TwoHeadsWeighTheLastPositionDifferently) {
  JavaRandom random(3);
  const auto x = LessonRandom(random, 4, 8);
  const auto wq = LessonRandom(random, 8, 8);
  const auto wk = LessonRandom(random, 8, 8);
  const auto wv = LessonRandom(random, 8, 8);
  const auto wo = LessonRandom(random, 8, 8);
  auto layer = MultiHeadAttention::Create(Matrix(wq, 8, 8), Matrix(wk, 8, 8), Matrix(wv, 8, 8),
                                          Matrix(wo, 8, 8), 2, 2, AttentionLimits{});
  ASSERT_TRUE(layer.ok()) << layer.status();
  EXPECT_EQ(layer->parameter_counts().total, 256);
  AttentionOptions options;
  options.mask.causal = true;
  auto out =
      layer->Forward(Matrix(x, 4, 8), options, true, false, AttentionEngine(), AttentionLimits{});
  ASSERT_TRUE(out.ok()) << out.status();
  // weights [head, query, key]: the last query is row 3 of each head.
  ExpectRow(out->weights, 0 * 16 + 12, {0.322, 0.268, 0.056, 0.355}, 0.0005);
  ExpectRow(out->weights, 1 * 16 + 12, {0.137, 0.140, 0.217, 0.507}, 0.0005);
  EXPECT_EQ(out->output.size(), 32u);  // 4 x 8 after Wo
}

// Example 10: with 8 query heads and 2 key/value heads, query head h reads key/value head h / 4.
TEST(Lessons, GroupedQueryHeadMapping) {
  const int n_head = 8, n_head_kv = 2, d = 4, n = 3;
  std::mt19937_64 rng(10);
  const auto q = ::attend::testing::RandomFloats(rng, n * n_head * d);
  const auto k = ::attend::testing::RandomFloats(rng, n * n_head_kv * d);
  // Every value of key/value head g is g + 1, so each output names the head it read.
  std::vector<float> v(n * n_head_kv * d);
  for (int t = 0; t < n; ++t) {
    for (int g = 0; g < n_head_kv; ++g) {
      for (int c = 0; c < d; ++c) v[(t * n_head_kv + g) * d + c] = static_cast<float>(g + 1);
    }
  }
  AttentionOptions options;
  options.mask.causal = true;
  Result r = Attend(q, {n, n_head, d}, k, {n, n_head_kv, d}, v, {n, n_head_kv, d}, options);
  for (int t = 0; t < n; ++t) {
    for (int h = 0; h < n_head; ++h) {
      EXPECT_NEAR(r.output[(t * n_head + h) * d], h / (n_head / n_head_kv) + 1, 1e-5)
          << "query head " << h;
    }
  }
}

// Example 13: a hand-built head that attends to the previous token.
TEST(Lessons, HandBuiltPreviousTokenHead) {
  const float content[4][2] = {{1, 0}, {0, 1}, {1, 1}, {2, 0}};
  std::vector<float> x(4 * 6, 0.0f), wq(6 * 4, 0.0f), wk(6 * 4, 0.0f), wv(6 * 2, 0.0f);
  for (int i = 0; i < 4; ++i) {
    x[i * 6 + i] = 1;
    x[i * 6 + 4] = content[i][0];
    x[i * 6 + 5] = content[i][1];
  }
  for (int p = 0; p < 4; ++p) wk[p * 4 + p] = 1;
  for (int p = 1; p < 4; ++p) wq[p * 4 + p - 1] = 10;
  wq[0] = 10;
  wv[4 * 2 + 0] = 1;
  wv[5 * 2 + 1] = 1;
  auto layer = MultiHeadAttention::Create(Matrix(wq, 6, 4), Matrix(wk, 6, 4), Matrix(wv, 6, 2),
                                          std::nullopt, 1, 1, AttentionLimits{});
  ASSERT_TRUE(layer.ok()) << layer.status();
  AttentionOptions options;
  options.mask.causal = true;
  auto out =
      layer->Forward(Matrix(x, 4, 6), options, true, false, AttentionEngine(), AttentionLimits{});
  ASSERT_TRUE(out.ok()) << out.status();
  ExpectRow(out->weights, 0, {1.000, 0.000, 0.000, 0.000}, 0.0005);
  ExpectRow(out->weights, 4, {0.993, 0.007, 0.000, 0.000}, 0.0005);
  ExpectRow(out->weights, 8, {0.007, 0.987, 0.007, 0.000}, 0.0005);
  ExpectRow(out->weights, 12, {0.007, 0.007, 0.980, 0.007}, 0.0005);
  ExpectRow(out->output, 0, {1.00, 0.00, 0.99, 0.01, 0.01, 0.99, 1.00, 0.99}, 0.005);
}

}  // namespace
}  // namespace attend
