#include "planner/cost.h"

#include <cmath>
#include <limits>
#include <optional>
#include <string>

#include "absl/strings/str_format.h"
#include "planner/catalog.h"
#include "tests/planner/planner_test_util.h"
#include "tests/test_util.h"

namespace attend::planner {
namespace {

using ::attend::planner::testing::Preset;
using ::attend::testing::StatusIs;

constexpr auto kInvalid = absl::StatusCode::kInvalidArgument;

// The lesson's shape (Example 10/12): 32 layers x 32 heads x 128, 8 KV heads.
ModelSpec LessonShape() {
  ModelSpec m;
  m.name = "lesson";
  m.layers = 32;
  m.n_head = 32;
  m.n_head_kv = 8;
  m.head_dim = 128;
  m.d_model = 4096;
  m.weights_dtype = "bfloat16";
  return m;
}

HardwareProfile TestHardware() {
  HardwareProfile h;
  h.name = "test";
  h.peak_flops_f32 = 1e12;
  h.peak_flops_bf16 = 1e15;
  h.peak_flops_fp8 = 2e15;
  h.memory_bandwidth_bytes_per_second = 1e12;
  h.memory_bytes = 80.0 * (1 << 30);
  return h;
}

CostEstimate Estimate(const ModelSpec& m, const CostRequest& r,
                      const HardwareProfile& h = TestHardware()) {
  absl::StatusOr<CostEstimate> e = EstimateCost(m, r, h);
  EXPECT_OK(e);
  return e.ok() ? *e : CostEstimate{};
}

std::string F1(double x) { return absl::StrFormat("%.1f", x); }

// Lesson 3, Example 12, the printed table (P = 8e9):
//       n   prefill attention   prefill weights   decode attention   decode weights
//    1024            0.3 TFLOP         16.4 TFLOP          0.5 GFLOP        16.0 GFLOP
//    8192           17.6 TFLOP        131.1 TFLOP          4.3 GFLOP        16.0 GFLOP
//   32768          281.5 TFLOP        524.3 TFLOP         17.2 GFLOP        16.0 GFLOP
//  131072         4503.6 TFLOP       2097.2 TFLOP         68.7 GFLOP        16.0 GFLOP
TEST(EstimateCost, LessonAttentionCostTable) {
  const struct {
    int64_t n;
    const char *prefill_attention, *prefill_weights, *decode_attention;
  } rows[] = {{1024, "0.3", "16.4", "0.5"},
              {8192, "17.6", "131.1", "4.3"},
              {32768, "281.5", "524.3", "17.2"},
              {131072, "4503.6", "2097.2", "68.7"}};
  for (const auto& row : rows) {
    SCOPED_TRACE(row.n);
    CostRequest r;
    r.prompt_tokens = row.n;
    r.parameters = 8000000000;
    const CostEstimate e = Estimate(LessonShape(), r);
    EXPECT_EQ(F1(e.prefill.attention_flops / 1e12), row.prefill_attention);
    EXPECT_EQ(F1(e.prefill.weight_flops / 1e12), row.prefill_weights);
    EXPECT_EQ(F1(e.decode.attention_flops / 1e9), row.decode_attention);
    EXPECT_EQ(F1(e.decode.weight_flops / 1e9), "16.0");
    // Exactly: 4 x 128 x 32 x 32 = 524,288 FLOPs per pair, n(n+1)/2 pairs (in int64 here).
    const int64_t pairs = row.n * (row.n + 1) / 2;
    EXPECT_EQ(e.prefill.attention_flops, static_cast<double>(524288 * pairs));
    EXPECT_EQ(e.decode.attention_flops, static_cast<double>(524288 * row.n));
    EXPECT_EQ(e.prefill.weight_flops, 16e9 * static_cast<double>(row.n));
    EXPECT_EQ(e.decode.weight_flops, 16e9);
  }
}

// Attention overtakes the weights in a prefill when 524288 x n(n+1)/2 > 2P x n, i.e. n + 1 >
// 4P / 524288 = 61035.16: n = 61035. In a decode step when 524288 x n > 2P: n > 30517.58.
TEST(EstimateCost, LessonCrossovers) {
  CostRequest r;
  r.prompt_tokens = 1024;
  r.parameters = 8000000000;
  const CostEstimate e = Estimate(LessonShape(), r);
  EXPECT_EQ(e.prefill_crossover_tokens, 61035);
  EXPECT_EQ(e.decode_crossover_tokens, 30518);
  const ModelSpec m = *CanonicalModel(LessonShape());
  EXPECT_GT(PrefillAttentionFlops(m, 61035, true), 16e9 * 61035);
  EXPECT_LE(PrefillAttentionFlops(m, 61034, true), 16e9 * 61034);
  EXPECT_GT(DecodeAttentionFlops(m, 30518), 16e9);
  EXPECT_LE(DecodeAttentionFlops(m, 30517), 16e9);
  // Non-causal prefill counts n^2 pairs: 524288 n^2 > 16e9 n from n = 30518 on.
  r.non_causal = true;
  const CostEstimate nc = Estimate(LessonShape(), r);
  EXPECT_EQ(nc.prefill.attention_flops, 524288.0 * 1024 * 1024);
  EXPECT_EQ(nc.prefill_crossover_tokens, 30518);
}

// Pair counts against a brute-force count of the (query, key) pairs each mask allows.
TEST(PrefillPairs, MatchBruteForce) {
  for (int64_t n : {1, 2, 7, 33, 100}) {
    for (int64_t w : {0, 1, 2, 5, 32, 100, 200}) {
      int64_t causal = 0, bidirectional = 0;
      for (int64_t i = 0; i < n; ++i) {
        for (int64_t j = 0; j < n; ++j) {
          const bool in_window = w == 0 || std::llabs(i - j) < w;
          if (j <= i && in_window) ++causal;
          if (in_window) ++bidirectional;
        }
      }
      EXPECT_EQ(PrefillPairs(n, w, true), static_cast<double>(causal)) << n << " " << w;
      EXPECT_EQ(PrefillPairs(n, w, false), static_cast<double>(bidirectional)) << n << " " << w;
    }
  }
}

// Gemma 2 9B by hand: per layer and pair 2 x (256 + 256) x 16 heads = 16384 FLOPs; 21 global
// layers see n(n+1)/2 pairs, 21 sliding layers 4096 x 4097 / 2 + (n - 4096) x 4096.
TEST(EstimateCost, Gemma2SlidingWindowByHand) {
  CostRequest r;
  r.prompt_tokens = 8192;
  const CostEstimate e = Estimate(Preset("gemma-2-9b"), r);
  const double global = 8192.0 * 8193 / 2;                   // 33,558,528
  const double sliding = 4096.0 * 4097 / 2 + 4096.0 * 4096;  // 25,167,872
  EXPECT_EQ(global, 33558528.0);
  EXPECT_EQ(sliding, 25167872.0);
  EXPECT_EQ(e.prefill.attention_flops, 16384.0 * 21 * (global + sliding));
  EXPECT_EQ(e.decode.attention_flops, 16384.0 * (21 * 8192 + 21 * 4096));
  EXPECT_EQ(e.prefill.weight_flops, 2.0 * 9241705984 * 8192);
  // The crossover is where the definition says.
  const ModelSpec m = Preset("gemma-2-9b");
  const int64_t n = e.prefill_crossover_tokens;
  ASSERT_GT(n, 1);
  EXPECT_GT(PrefillAttentionFlops(m, n, true), 2.0 * 9241705984 * static_cast<double>(n));
  EXPECT_LE(PrefillAttentionFlops(m, n - 1, true), 2.0 * 9241705984 * static_cast<double>(n - 1));
}

TEST(EstimateCost, WindowedEverywhereNeverCrossesOver) {
  CostRequest r;
  r.prompt_tokens = 32768;
  const CostEstimate e = Estimate(Preset("mistral-7b"), r);
  // At most 4096 keys per query: 16384 x 32 x 4096 = 2.1e9 < 2P = 1.4e10 per token.
  EXPECT_EQ(e.prefill_crossover_tokens, 0);
  EXPECT_EQ(e.decode_crossover_tokens, 0);
  EXPECT_EQ(e.decode.attention_flops, 16384.0 * 32 * 4096);
  // The decode step reads only the windows.
  EXPECT_EQ(e.decode.kv_bytes, 32.0 * 8 * 2 * 128 * 2 * 4096);
}

// Llama 3 8B on an H100 at 8192 tokens, by hand. Decode reads 2 x 8,030,261,248 bytes of
// weights and 1 GiB of cache at 3.35 TB/s (5.11 ms) against 20.4 GFLOP at 989.5 TFLOP/s
// (21 us): memory-bound, 195.5 tokens/s. Prefill is compute-bound.
TEST(EstimateCost, Llama3EightBOnH100ByHand) {
  CostRequest r;
  r.prompt_tokens = 8192;
  r.price_per_hour_usd = 3.0;
  const CostEstimate e = Estimate(Preset("llama-3-8b"), r, *FindHardware("h100"));
  const double weights = 2.0 * 8030261248;
  const double cache = 1073741824.0;
  const double decode_flops = 2.0 * 8030261248 + 524288.0 * 8192;
  EXPECT_DOUBLE_EQ(e.decode.weight_bytes, weights);
  EXPECT_DOUBLE_EQ(e.decode.kv_bytes, cache);
  EXPECT_DOUBLE_EQ(e.decode.bytes_moved, weights + cache);
  EXPECT_DOUBLE_EQ(e.decode.memory_seconds, (weights + cache) / 3.35e12);
  EXPECT_DOUBLE_EQ(e.decode.compute_seconds, decode_flops / 989.5e12);
  EXPECT_EQ(e.decode.bound, "memory");
  EXPECT_DOUBLE_EQ(e.decode.roofline_seconds, e.decode.memory_seconds);
  EXPECT_DOUBLE_EQ(e.decode.tokens_per_second, 3.35e12 / (weights + cache));
  EXPECT_EQ(absl::StrFormat("%.1f", e.decode.tokens_per_second), "195.5");
  EXPECT_DOUBLE_EQ(e.decode.arithmetic_intensity, decode_flops / (weights + cache));
  EXPECT_DOUBLE_EQ(e.decode.usd_per_million_tokens, 3.0 / 3600 * e.decode.roofline_seconds * 1e6);

  const double prefill_flops = 524288.0 * 8192 * 8193 / 2 + 2.0 * 8030261248 * 8192;
  EXPECT_DOUBLE_EQ(e.prefill.compute_seconds, prefill_flops / 989.5e12);
  EXPECT_DOUBLE_EQ(e.prefill.memory_seconds, (weights + cache) / 3.35e12);
  EXPECT_EQ(e.prefill.bound, "compute");
  EXPECT_DOUBLE_EQ(e.prefill.tokens_per_second, 8192 / e.prefill.compute_seconds);
  EXPECT_DOUBLE_EQ(e.prefill.usd_per_million_tokens,
                   3.0 / 3600 * e.prefill.roofline_seconds / 8192 * 1e6);
}

// Llama 3 70B in bfloat16 is 2 x 70,553,706,496 = 141.1 GB of weights: more than an H100's
// 80 GiB before any cache. On an H200 (141 GiB = 151.4 GB) it fits with 4096 tokens of f16 cache
// (80 layers x 8 KV heads x 128 x 2 (K and V) x 2 bytes = 327,680 bytes per token).
TEST(EstimateCost, FitsComparesWeightsAndCacheWithMemoryByHand) {
  CostRequest r;
  r.context_tokens = 4096;
  const double weights = 2.0 * 70553706496;
  const double cache = 327680.0 * 4096;
  CostEstimate e = Estimate(Preset("llama-3-70b"), r, *FindHardware("h100"));
  EXPECT_DOUBLE_EQ(e.weights_bytes, weights);
  EXPECT_DOUBLE_EQ(e.kv_cache_bytes, cache);
  EXPECT_EQ(e.fits, std::optional<bool>(false));
  e = Estimate(Preset("llama-3-70b"), r, *FindHardware("h200"));
  EXPECT_EQ(e.fits, std::optional<bool>(true));
  // The cache counts the whole batch: room for 32,768 tokens of it holds 4 x 8192, not 4 x 8193.
  HardwareProfile h = TestHardware();
  h.memory_bytes = weights + 32768 * 327680.0;
  r.context_tokens = 8192;
  r.batch = 4;
  e = Estimate(Preset("llama-3-70b"), r, h);
  EXPECT_DOUBLE_EQ(e.kv_cache_bytes, 4 * 8192 * 327680.0);
  EXPECT_EQ(e.fits, std::optional<bool>(true));
  r.context_tokens = 8193;
  r.batch = 4;
  EXPECT_EQ(Estimate(Preset("llama-3-70b"), r, h).fits, std::optional<bool>(false));
  // int8 weights and fp8 cache halve both.
  r.weights_dtype = "int8";
  r.kv_dtype = KvDType::kFp8;
  e = Estimate(Preset("llama-3-70b"), r, h);
  EXPECT_DOUBLE_EQ(e.weights_bytes, 70553706496.0);
  EXPECT_DOUBLE_EQ(e.kv_cache_bytes, 4 * 8193 * 163840.0);
  EXPECT_EQ(e.fits, std::optional<bool>(true));
  // Unknown memory: unknown fit.
  h.memory_bytes = 0;
  EXPECT_EQ(Estimate(Preset("llama-3-70b"), r, h).fits, std::nullopt);
}

// A mixture of experts keeps every expert resident even when a step reads only some.
TEST(EstimateCost, MixtureOfExpertsKeepsEveryExpertResident) {
  CostRequest r;
  r.context_tokens = 1000;
  const CostEstimate e = Estimate(Preset("mixtral-8x7b"), r);
  EXPECT_DOUBLE_EQ(e.decode.weight_bytes, 2.0 * 12879925248);
  EXPECT_DOUBLE_EQ(e.weights_bytes, 2.0 * 46702792704);
}

TEST(EstimateCost, BatchSharesTheWeightReads) {
  CostRequest r;
  r.prompt_tokens = 8192;
  r.batch = 64;
  const CostEstimate e = Estimate(Preset("llama-3-8b"), r);
  EXPECT_DOUBLE_EQ(e.decode.weight_bytes, 2.0 * 8030261248);
  EXPECT_DOUBLE_EQ(e.decode.kv_bytes, 64.0 * 1073741824);
  EXPECT_DOUBLE_EQ(e.decode.weight_flops, 64 * 2.0 * 8030261248);
  EXPECT_DOUBLE_EQ(e.decode.attention_flops, 64 * 524288.0 * 8192);
  EXPECT_DOUBLE_EQ(e.decode.tokens_per_second, 64 / e.decode.roofline_seconds);
  EXPECT_DOUBLE_EQ(e.prefill.kv_bytes, 64.0 * 1073741824);
  EXPECT_DOUBLE_EQ(e.prefill.weight_flops, 2.0 * 8030261248 * 8192 * 64);
}

TEST(EstimateCost, MixtureOfExpertsReadsTheExpertsItTouches) {
  const ModelSpec m = Preset("mixtral-8x7b");
  const double per_expert = (46702792704.0 - 12879925248.0) / 6;
  CostRequest r;
  r.context_tokens = 1000;
  r.batch = 1;
  CostEstimate e = Estimate(m, r);
  EXPECT_DOUBLE_EQ(e.decode.weight_bytes, 2.0 * 12879925248);
  EXPECT_DOUBLE_EQ(e.decode.weight_flops, 2.0 * 12879925248);
  EXPECT_EQ(e.prefill.bound, "");  // no prompt: no prefill phase
  EXPECT_EQ(e.prefill.tokens_per_second, 0.0);
  r.batch = 2;  // up to 4 distinct experts
  e = Estimate(m, r);
  EXPECT_DOUBLE_EQ(e.decode.weight_bytes, 2.0 * (12879925248 + 2 * per_expert));
  r.batch = 4;  // all 8
  e = Estimate(m, r);
  EXPECT_DOUBLE_EQ(e.decode.weight_bytes, 2.0 * 46702792704);
  // A given P is a dense model of that size.
  r.parameters = 1000;
  e = Estimate(m, r);
  EXPECT_DOUBLE_EQ(e.decode.weight_bytes, 2.0 * 1000);
}

TEST(EstimateCost, ComputeDTypePicksThePeak) {
  CostRequest r;
  r.prompt_tokens = 100;
  EXPECT_EQ(Estimate(Preset("tiny"), r).peak_flops, 1e15);
  EXPECT_EQ(Estimate(Preset("tiny"), r).compute_dtype, "bfloat16");
  r.compute_dtype = "float32";
  EXPECT_EQ(Estimate(Preset("tiny"), r).peak_flops, 1e12);
  r.compute_dtype = "fp8";
  EXPECT_EQ(Estimate(Preset("tiny"), r, *FindHardware("a100")).peak_flops, 624e12);
  r.compute_dtype = "float16";
  EXPECT_EQ(Estimate(Preset("tiny"), r, *FindHardware("h100")).peak_flops, 989.5e12);
  r.compute_dtype = "int8";
  HardwareProfile no_fp8 = TestHardware();
  no_fp8.peak_flops_fp8 = 0;
  EXPECT_THAT(EstimateCost(Preset("tiny"), r, no_fp8),
              StatusIs(kInvalid, {"hardware 'test' has no peak FLOP/s for compute_dtype int8"}));
  r.compute_dtype = "q8_0";
  EXPECT_THAT(EstimateCost(Preset("tiny"), r, TestHardware()),
              StatusIs(kInvalid, {"q8_0 is a storage format"}));
  r.compute_dtype = "float64";
  EXPECT_THAT(EstimateCost(Preset("tiny"), r, TestHardware()),
              StatusIs(kInvalid, {"compute_dtype: 'float64'"}));
}

TEST(EstimateCost, RejectsBadRequests) {
  const ModelSpec m = Preset("llama-3-8b");
  const HardwareProfile h = TestHardware();
  CostRequest r;
  EXPECT_THAT(EstimateCost(m, r, h), StatusIs(kInvalid, {"both 0"}));
  r.prompt_tokens = -1;
  EXPECT_THAT(EstimateCost(m, r, h), StatusIs(kInvalid, {"prompt_tokens: -1"}));
  r.prompt_tokens = 10;
  r.context_tokens = kMaxContextTokens + 1;
  EXPECT_THAT(EstimateCost(m, r, h), StatusIs(kInvalid, {"context_tokens"}));
  r.context_tokens = 0;
  r.batch = kMaxBatch + 1;
  EXPECT_THAT(EstimateCost(m, r, h), StatusIs(kInvalid, {"batch"}));
  r.batch = 1;
  r.price_per_hour_usd = -1;
  EXPECT_THAT(EstimateCost(m, r, h), StatusIs(kInvalid, {"price_per_hour_usd: -1"}));
  r.price_per_hour_usd = std::numeric_limits<double>::quiet_NaN();
  EXPECT_THAT(EstimateCost(m, r, h), StatusIs(kInvalid, {"price_per_hour_usd"}));
  r.price_per_hour_usd = 0;
  r.parameters = 0;
  EXPECT_THAT(EstimateCost(m, r, h), StatusIs(kInvalid, {"parameters: 0; must be >= 1"}));
  r.parameters.reset();
  r.weights_dtype = "float64";
  EXPECT_THAT(EstimateCost(m, r, h), StatusIs(kInvalid, {"weights_dtype: 'float64'"}));
  r.weights_dtype.clear();

  HardwareProfile bad = h;
  bad.memory_bandwidth_bytes_per_second = 0;
  EXPECT_THAT(EstimateCost(m, r, bad), StatusIs(kInvalid, {"memory_bandwidth"}));
  bad = h;
  bad.peak_flops_bf16 = std::numeric_limits<double>::infinity();
  EXPECT_THAT(EstimateCost(m, r, bad), StatusIs(kInvalid, {"hardware.peak_flops_bf16"}));

  ModelSpec bare = LessonShape();
  EXPECT_THAT(EstimateCost(bare, r, h), StatusIs(kInvalid, {"parameters: unknown for model"}));
  bare.weights_dtype.clear();
  r.parameters = 100;
  EXPECT_THAT(EstimateCost(bare, r, h), StatusIs(kInvalid, {"weights_dtype: unknown for model"}));
  bare.n_head_kv = 5;
  EXPECT_THAT(EstimateCost(bare, r, h), StatusIs(kInvalid, {"n_head_kv: 5 does not divide"}));
}

TEST(EstimateCost, HugeContextsStayFinite) {
  CostRequest r;
  r.prompt_tokens = kMaxContextTokens;
  r.batch = kMaxBatch;
  absl::StatusOr<CostEstimate> e = EstimateCost(Preset("tiny"), r, TestHardware());
  ASSERT_OK(e);
  EXPECT_TRUE(std::isfinite(e->prefill.attention_flops));
  EXPECT_TRUE(std::isfinite(e->prefill.roofline_seconds));
  // A cache that overflows int64 bytes is refused rather than wrapped: 2^47 bytes per token.
  ModelSpec huge;
  huge.name = "huge";
  huge.layers = kMaxLayers;
  huge.n_head = kMaxHeads;
  huge.head_dim = kMaxHeadDim;
  huge.weights_dtype = "bfloat16";
  r.parameters = 1000;
  r.kv_dtype = KvDType::kFloat32;
  EXPECT_THAT(EstimateCost(huge, r, TestHardware()), StatusIs(kInvalid, {"overflows int64"}));
}

// No OK answer carries an infinity: a price (or a size) whose costs overflow double is refused
// naming what overflowed.
TEST(EstimateCost, RefusesInputsWhoseCostsOverflow) {
  CostRequest r;
  r.prompt_tokens = 8192;
  for (double price : {1.797e308, 1e308}) {
    r.price_per_hour_usd = price;
    EXPECT_THAT(EstimateCost(Preset("llama-3-70b"), r, TestHardware()),
                StatusIs(kInvalid, {"price_per_hour_usd", "overflow"}));
  }
  r.price_per_hour_usd = 1e6;
  absl::StatusOr<CostEstimate> e = EstimateCost(Preset("llama-3-70b"), r, TestHardware());
  ASSERT_OK(e);
  EXPECT_TRUE(std::isfinite(e->decode.usd_per_million_tokens));
}

}  // namespace
}  // namespace attend::planner
