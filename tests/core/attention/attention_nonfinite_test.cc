// Non-finite inputs and overflowing scores: whatever path a call takes (the decode kernels of
// every set this CPU runs, or the matmuls of a prefill), a NaN or infinity anywhere in q, k or v
// is INVALID_ARGUMENT naming the tensor and the element, and scores that overflow float32 in
// either direction are reported rather than dropped.
#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/half.h"
#include "core/attention/attention_engine.h"
#include "core/attention/testing/reference_attention.h"
#include "core/attention/tile_attention.h"
#include "core/kernels/simd.h"
#include "tests/test_util.h"

namespace attend {
namespace {

using ::attend::simd::testing::ScopedKernels;
using ::attend::testing::StatusIs;

constexpr float kInf = std::numeric_limits<float>::infinity();

absl::Status Attend(const std::vector<float>& q, Shape q_shape, const std::vector<float>& k,
                    const std::vector<float>& v, Shape kv_shape, const AttentionOptions& options,
                    bool weights) {
  const TensorView qv{DType::kFloat32, q_shape, q.data()};
  const TensorView kv{DType::kFloat32, kv_shape, k.data()};
  const TensorView vv{DType::kFloat32, kv_shape, v.data()};
  std::vector<float> out(static_cast<size_t>(q_shape[0] * q_shape[1] * kv_shape[2]));
  std::vector<float> w(weights ? static_cast<size_t>(q_shape[1] * q_shape[0] * kv_shape[0]) : 0);
  return AttentionEngine().Compute(qv, kv, vv, options, {}, absl::MakeSpan(out), absl::MakeSpan(w),
                                   nullptr);
}

// One large score in a row of small ones overflows to -inf when q and k point opposite ways:
// exp(-inf) is 0, so unless it is caught that key silently drops out of the softmax.
TEST(NonFinite, ScoresThatOverflowToMinusInfinityAreReported) {
  for (const std::string& set : simd::testing::RunnableKernels()) {
    const ScopedKernels kernels(set);
    ASSERT_TRUE(kernels.ok()) << set;
    for (const int64_t n_q : {1, 32}) {  // the decode kernels, then the matmul path
      SCOPED_TRACE(absl::StrCat(set, " n_q ", n_q));
      const int64_t n_kv = 40, d = 4;
      std::vector<float> q(static_cast<size_t>(n_q * d), 1e20f);
      std::vector<float> k(static_cast<size_t>(n_kv * d), 1e-21f), v(k.size(), 1.0f);
      for (int64_t c = 0; c < d; ++c) k[static_cast<size_t>(7 * d + c)] = -1e20f;
      EXPECT_EQ(tile::UsesKernels(n_q, 1), n_q == 1);
      EXPECT_THAT(Attend(q, {n_q, 1, d}, k, v, {n_kv, 1, d}, {}, false),
                  StatusIs(absl::StatusCode::kInvalidArgument, {"overflowed float32"}));
    }
  }
}

// Finite scores are answered even when an intermediate would not be finite or normal: under
// f32 arithmetic q is scaled before the product, and q * scale may overflow where q.k * scale
// does not; a native bf16 product flushes subnormal products to zero, which a huge scale would
// make matter. Against attention in double over the same (bf16-rounded, for bf16) inputs.
TEST(NonFinite, FiniteScoresWithExtremeIntermediatesAreAnswered) {
  struct Case {
    float q_size, k_size, scale;
    Precision precision;
  };
  const Case cases[] = {{3e37f, 1e-37f, 100.0f, Precision::kFloat32},
                        {1e-19f, 1e-19f, 3e38f, Precision::kBFloat16}};
  for (const std::string& set : simd::testing::RunnableKernels()) {
    const ScopedKernels kernels(set);
    ASSERT_TRUE(kernels.ok()) << set;
    for (const Case& c : cases) {
      for (const int64_t n_q : {1, 32}) {  // the decode kernels, then the matmul path
        SCOPED_TRACE(
            absl::StrCat(set, " n_q ", n_q, " q ", c.q_size, " k ", c.k_size, " scale ", c.scale));
        const int64_t n_kv = 24, d = 8;
        std::mt19937_64 rng(static_cast<uint64_t>(n_q));
        std::vector<float> q = ::attend::testing::RandomFloats(rng, n_q * d, c.q_size);
        std::vector<float> k = ::attend::testing::RandomFloats(rng, n_kv * d, c.k_size);
        std::vector<float> v = ::attend::testing::RandomFloats(rng, n_kv * d);
        if (c.precision == Precision::kBFloat16) {
          for (std::vector<float>* x : {&q, &k, &v}) {
            for (float& e : *x) e = Bf16ToFloat(FloatToBf16(e));
          }
        }
        AttentionOptions options;
        options.scale = c.scale;
        options.precision = c.precision;
        const TensorView qv{DType::kFloat32, {n_q, 1, d}, q.data()};
        const TensorView kv{DType::kFloat32, {n_kv, 1, d}, k.data()};
        const TensorView vv{DType::kFloat32, {n_kv, 1, d}, v.data()};
        auto want = ReferenceAttention(qv, kv, vv, options);
        ASSERT_OK(want.status());
        // The same values as f32 tensors and, under bf16, as bf16 ones, which the decode kernels
        // read in place (and the bf16 sets multiply with their dot product instructions).
        const std::vector<float>* values[] = {&q, &k, &v};
        std::vector<uint16_t> half[3];
        for (int i = 0; i < 3; ++i) {
          for (float e : *values[i]) half[i].push_back(FloatToBf16(e));
        }
        for (const bool bf16_tensors : {false, true}) {
          if (bf16_tensors && c.precision != Precision::kBFloat16) continue;
          SCOPED_TRACE(bf16_tensors ? "bf16 tensors" : "f32 tensors");
          const DType dtype = bf16_tensors ? DType::kBFloat16 : DType::kFloat32;
          const TensorView qt{dtype, qv.shape, bf16_tensors ? half[0].data() : qv.data};
          const TensorView kt{dtype, kv.shape, bf16_tensors ? half[1].data() : kv.data};
          const TensorView vt{dtype, vv.shape, bf16_tensors ? half[2].data() : vv.data};
          std::vector<float> out(static_cast<size_t>(n_q * d));
          ASSERT_OK(
              AttentionEngine().Compute(qt, kt, vt, options, {}, absl::MakeSpan(out), {}, nullptr));
          // bf16 rounds the probabilities: about 2^-8 of the output's scale (|v| up to ~4).
          const double tolerance = c.precision == Precision::kBFloat16 ? 3e-2 : 1e-4;
          for (size_t i = 0; i < out.size(); ++i)
            ASSERT_NEAR(out[i], want->output[i], tolerance) << i;
        }
      }
    }
  }
}

// The error names the first output element that is not finite: in the head whose score
// overflowed, not in the other heads of its group.
TEST(NonFinite, OverflowNamesTheOutputOfTheHeadThatOverflowed) {
  for (const std::string& set : simd::testing::RunnableKernels()) {
    const ScopedKernels kernels(set);
    ASSERT_TRUE(kernels.ok()) << set;
    for (const int64_t n_q : {1, 32}) {
      for (const float sign : {1.0f, -1.0f}) {
        for (int64_t head = 0; head < 4; ++head) {
          SCOPED_TRACE(absl::StrCat(set, " n_q ", n_q, " sign ", sign, " head ", head));
          const int64_t n_kv = 3, d = 2, heads = 4;
          std::vector<float> q(static_cast<size_t>(n_q * heads * d), 1.0f);
          std::vector<float> k(static_cast<size_t>(n_kv * d), 1.0f), v(k.size(), 1.0f);
          q[static_cast<size_t>(head * d)] = 2e19f;
          q[static_cast<size_t>(head * d + 1)] = 0.0f;
          k[static_cast<size_t>(d)] = sign * 2e19f;
          k[static_cast<size_t>(d + 1)] = 0.0f;
          AttentionOptions options;
          options.scale = 1.0f;
          EXPECT_THAT(Attend(q, {n_q, heads, d}, k, v, {n_kv, 1, d}, options, false),
                      StatusIs(absl::StatusCode::kInvalidArgument,
                               {absl::StrCat("output element ", head * d, " is not finite")}));
        }
      }
    }
  }
}

// Generated cases: decode- and prefill-sized calls, GQA groups, masks that hide keys from every
// query (a sliding window) or none, with and without weights; one NaN, +inf or -inf at a random
// element of q, k or v, where queries see it or not.
TEST(NonFinite, EveryNonFiniteInputIsNamedWithItsElement) {
  std::mt19937 rng(20261201);
  const std::vector<std::string> sets = simd::testing::RunnableKernels();
  const char* const kFields[] = {"q", "k", "v"};
  const float kBad[] = {std::numeric_limits<float>::quiet_NaN(), kInf, -kInf};
  const char* const kBadNames[] = {"NaN", "+inf", "-inf"};
  for (int c = 0; c < 600; ++c) {
    const ScopedKernels kernels(sets[static_cast<size_t>(c) % sets.size()]);
    ASSERT_TRUE(kernels.ok());
    const int64_t n_head_kv = 1 + rng() % 3, group = 1 + rng() % 4, d = 1 + rng() % 40;
    const int64_t n_q = rng() % 4 == 0 ? 17 + rng() % 20 : 1 + rng() % 3;
    const int64_t n_kv = n_q + rng() % 700;
    AttentionOptions options;
    options.mask.causal = rng() % 2 == 0;
    if (rng() % 3 == 0) options.mask.window = 1 + rng() % 50;
    const int field = static_cast<int>(rng() % 3), bad = static_cast<int>(rng() % 3);
    const Shape q_shape{n_q, n_head_kv * group, d}, kv_shape{n_kv, n_head_kv, d};
    std::normal_distribution<float> normal;
    std::vector<float> inputs[3];
    inputs[0].resize(static_cast<size_t>(n_q * n_head_kv * group * d));
    inputs[1].resize(static_cast<size_t>(n_kv * n_head_kv * d));
    inputs[2].resize(inputs[1].size());
    for (auto& x : inputs) {
      for (float& e : x) e = normal(rng);
    }
    const size_t element = rng() % inputs[field].size();
    inputs[field][element] = kBad[bad];
    SCOPED_TRACE(absl::StrCat("case ", c, " ", simd::KernelName(), ": n_q ", n_q, " n_kv ", n_kv,
                              " heads ", n_head_kv, "x", group, " d ", d, " causal ",
                              options.mask.causal, " window ", options.mask.window, "; ",
                              kFields[field], "[", element, "] = ", kBadNames[bad]));
    EXPECT_THAT(Attend(inputs[0], q_shape, inputs[1], inputs[2], kv_shape, options, c % 2 == 0),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         {absl::StrCat(kFields[field], " holds a non-finite value (",
                                       kBadNames[bad], ") at element ", element, " of ")}));
  }
}

}  // namespace
}  // namespace attend
