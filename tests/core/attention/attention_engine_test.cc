// The oneDNN engine against the reference on random shapes, masks, head groupings and dtypes.
#include "core/attention/attention_engine.h"

#include <omp.h>
#include <time.h>

#include <cmath>
#include <limits>
#include <optional>
#include <random>
#include <string>

#include "absl/base/casts.h"
#include "absl/strings/str_cat.h"
#include "common/half.h"
#include "core/attention/testing/reference_attention.h"
#include "core/attention/tile_operands.h"
#include "core/kernels/cpu_features.h"
#include "core/kernels/onednn.h"
#include "tests/test_util.h"

namespace attend {
namespace {

using ::attend::testing::RandomFloats;
using ::attend::testing::StatusIs;

struct Case {
  int64_t n_q, n_kv, n_head, n_head_kv, head_dim, head_dim_v;
  MaskSpec mask;
  Precision precision;
  DType input_dtype;
  bool want_weights;

  std::string Name() const {
    return absl::StrCat("nq", n_q, "_nkv", n_kv, "_h", n_head, "_kv", n_head_kv, "_d", head_dim,
                        "_dv", head_dim_v, mask.causal ? "_causal" : "", "_w", mask.window, "_",
                        PrecisionName(precision), "_", DTypeName(input_dtype));
  }
};

// Encodes floats in `dtype` and returns the values the encoding holds (what both sides see).
struct Input {
  std::vector<float> exact;    // the decoded values
  std::vector<uint16_t> half;  // storage for 16-bit dtypes
  TensorView view;
};

Input MakeInput(std::vector<float> values, Shape shape, DType dtype) {
  Input in;
  in.exact = std::move(values);
  if (dtype == DType::kFloat32) {
    in.view = TensorView{dtype, shape, in.exact.data()};
    return in;
  }
  in.half.resize(in.exact.size());
  for (size_t i = 0; i < in.exact.size(); ++i) {
    in.half[i] = dtype == DType::kBFloat16 ? FloatToBf16(in.exact[i]) : FloatToHalf(in.exact[i]);
    in.exact[i] = dtype == DType::kBFloat16 ? Bf16ToFloat(in.half[i]) : HalfToFloat(in.half[i]);
  }
  in.view = TensorView{dtype, shape, in.half.data()};
  return in;
}

std::vector<float> RoundToBf16(std::vector<float> v) {
  for (float& x : v) x = Bf16ToFloat(FloatToBf16(x));
  return v;
}

// Runs the case on `engine` (a fresh one when null) and compares with the reference. k and v
// take c.input_dtype unless `k_dtype` / `v_dtype` say otherwise.
void CheckAgainstReference(const Case& c, uint64_t seed, const AttentionEngine* engine = nullptr,
                           std::optional<DType> k_dtype = std::nullopt,
                           std::optional<DType> v_dtype = std::nullopt) {
  SCOPED_TRACE(absl::StrCat(c.Name(), " k ", DTypeName(k_dtype.value_or(c.input_dtype)), " v ",
                            DTypeName(v_dtype.value_or(c.input_dtype))));
  const AttentionEngine fresh;
  if (engine == nullptr) engine = &fresh;
  std::mt19937_64 rng(seed);
  Input q = MakeInput(RandomFloats(rng, c.n_q * c.n_head * c.head_dim),
                      {c.n_q, c.n_head, c.head_dim}, c.input_dtype);
  Input k = MakeInput(RandomFloats(rng, c.n_kv * c.n_head_kv * c.head_dim),
                      {c.n_kv, c.n_head_kv, c.head_dim}, k_dtype.value_or(c.input_dtype));
  Input v = MakeInput(RandomFloats(rng, c.n_kv * c.n_head_kv * c.head_dim_v),
                      {c.n_kv, c.n_head_kv, c.head_dim_v}, v_dtype.value_or(c.input_dtype));

  AttentionOptions options;
  options.mask = c.mask;
  options.precision = c.precision;
  AttentionShape shape;
  {
    auto s = ValidateAttention(q.view, k.view, v.view, options, AttentionLimits{});
    ASSERT_TRUE(s.ok()) << s.status();
    shape = *s;
  }
  std::vector<float> output(shape.output_elements());
  std::vector<float> weights(c.want_weights ? shape.weight_elements() : 0);
  AttentionStats stats;
  ASSERT_OK(engine->Compute(q.view, k.view, v.view, options, AttentionLimits{},
                            absl::MakeSpan(output), absl::MakeSpan(weights), &stats));

  // The reference sees exactly the values the engine's arithmetic starts from: the decoded
  // inputs, rounded to bf16 when the products run in bf16.
  const bool bf16 = ResolvePrecision(c.precision, q.view, k.view, v.view) == Precision::kBFloat16;
  std::vector<float> rq = bf16 ? RoundToBf16(q.exact) : q.exact;
  std::vector<float> rk = bf16 ? RoundToBf16(k.exact) : k.exact;
  std::vector<float> rv = bf16 ? RoundToBf16(v.exact) : v.exact;
  auto reference =
      ReferenceAttention(TensorView{DType::kFloat32, q.view.shape, rq.data()},
                         TensorView{DType::kFloat32, k.view.shape, rk.data()},
                         TensorView{DType::kFloat32, v.view.shape, rv.data()}, options);
  ASSERT_TRUE(reference.ok()) << reference.status();

  // f32: accumulation-order differences only. bf16: the probabilities are rounded to bf16
  // (relative 2^-9) before they weigh values of magnitude up to ~4.
  const double output_tolerance = bf16 ? 2e-2 : 2e-5;
  double worst = 0.0;
  for (size_t i = 0; i < output.size(); ++i) {
    worst = std::max(worst, std::abs(output[i] - reference->output[i]));
  }
  EXPECT_LE(worst, output_tolerance);
  if (c.want_weights) {
    double worst_weight = 0.0;
    for (size_t i = 0; i < weights.size(); ++i) {
      worst_weight = std::max(worst_weight, std::abs(weights[i] - reference->weights[i]));
      if (reference->weights[i] == 0.0) {
        ASSERT_EQ(weights[i], 0.0f) << "masked weight " << i;
      }
    }
    EXPECT_LE(worst_weight, 2e-5);
  }
  EXPECT_EQ(stats.attended_pairs, VisiblePairs(c.mask, c.n_q, c.n_kv) * c.n_head);
  EXPECT_EQ(stats.engine.rfind(bf16 ? "onednn/bf16" : "onednn/f32", 0), 0u) << stats.engine;
  // bf16 says whether it ran on oneDNN's bf16 matmul (the random cases' scales are ordinary).
  if (bf16) {
    EXPECT_EQ(stats.engine.find("bf16-emulated") != std::string::npos, !UseBf16Matmul())
        << stats.engine;
  }
}

class RandomCases : public ::testing::TestWithParam<int> {};

Case RandomCase(std::mt19937_64& rng) {
  const int64_t dims[] = {1, 2, 3, 8, 16, 32, 64, 80, 128, 256};
  const int64_t groups[] = {1, 2, 4, 8};
  Case c;
  c.n_head_kv = 1 + rng() % 3;
  c.n_head = c.n_head_kv * groups[rng() % 4];  // MHA (group 1), GQA, MQA (n_head_kv 1)
  c.head_dim = dims[rng() % 10];
  c.head_dim_v = rng() % 4 == 0 ? dims[rng() % 10] : c.head_dim;
  // Keep the reference affordable: about 2^23 multiply-adds.
  const int64_t budget = int64_t{1} << 23;
  const int64_t max_tokens = std::max<int64_t>(
      4, static_cast<int64_t>(std::sqrt(budget / (c.n_head * (c.head_dim + c.head_dim_v)))));
  c.n_kv = 1 + rng() % std::min<int64_t>(max_tokens, 300);
  switch (rng() % 3) {
    case 0:
      c.n_q = c.n_kv;
      break;  // prefill
    case 1:
      c.n_q = 1;
      break;  // decode
    default:
      c.n_q = 1 + rng() % std::min<int64_t>(max_tokens, 200);  // anything, even > n_kv
  }
  c.mask.causal = rng() % 3 != 0;
  c.mask.window = rng() % 4 == 0 ? 1 + rng() % (c.n_kv + 2) : 0;
  c.precision = rng() % 2 ? Precision::kBFloat16 : Precision::kFloat32;
  const DType dtypes[] = {DType::kFloat32, DType::kBFloat16, DType::kFloat16};
  c.input_dtype = dtypes[rng() % 3];
  c.want_weights = rng() % 2;
  return c;
}

TEST_P(RandomCases, EngineMatchesReference) {
  std::mt19937_64 rng(1000 + GetParam());
  CheckAgainstReference(RandomCase(rng), GetParam());
}

INSTANTIATE_TEST_SUITE_P(Engine, RandomCases, ::testing::Range(0, 64));

// Tile edges: block boundaries (64 query rows), n not a multiple of the block, n_q != n_kv.
// Every combination of q, k and v dtypes under every precision, with query counts on the decode
// kernels' side of the switch (folded rows < tile::kMatmulRows) and on the matmuls' side.
TEST(Engine, EveryDtypeCombinationMatchesReference) {
  const DType dtypes[] = {DType::kFloat32, DType::kBFloat16, DType::kFloat16};
  const Precision precisions[] = {Precision::kAuto, Precision::kFloat32, Precision::kBFloat16};
  struct Size {
    int64_t n_q, n_kv;
  };
  // 3 x 2 = 6 folded rows (the kernels), one query over 300 keys (split across threads), and
  // 40 x 2 = 80 (the matmuls).
  const Size sizes[] = {{3, 6}, {1, 300}, {40, 70}};
  uint64_t seed = 900;
  for (DType q : dtypes) {
    for (DType k : dtypes) {
      for (DType v : dtypes) {
        for (Precision p : precisions) {
          for (const Size& size : sizes) {
            const Case c{size.n_q, size.n_kv, 2, 1, 5, 4, {true, 0}, p, q, size.n_q == 3};
            CheckAgainstReference(c, ++seed, nullptr, k, v);
          }
        }
      }
    }
  }
}

TEST(Engine, TileEdges) {
  int seed = 0;
  for (int64_t n_q : {63, 64, 65, 128, 130}) {
    for (int64_t extra : {0, 1, 37}) {
      for (bool causal : {true, false}) {
        CheckAgainstReference({n_q,
                               n_q + extra,
                               2,
                               1,
                               16,
                               16,
                               {causal, 0},
                               Precision::kFloat32,
                               DType::kFloat32,
                               true},
                              ++seed);
      }
    }
  }
}

TEST(Engine, SlidingWindowAcrossTiles) {
  CheckAgainstReference(
      {150, 150, 4, 2, 32, 32, {true, 40}, Precision::kFloat32, DType::kFloat32, true}, 1);
  CheckAgainstReference(
      {150, 150, 4, 2, 32, 32, {false, 40}, Precision::kFloat32, DType::kFloat32, true}, 2);
  CheckAgainstReference(
      {150, 150, 4, 2, 32, 32, {true, 40}, Precision::kBFloat16, DType::kFloat32, false}, 3);
}

// Key tiles of 256: n_kv just under, at and over tile multiples, with partial query tiles.
TEST(Engine, KeyTileEdges) {
  int seed = 100;
  for (int64_t n_kv : {255, 256, 257, 511, 513}) {
    CheckAgainstReference(
        {70, n_kv, 4, 2, 16, 16, {true, 0}, Precision::kFloat32, DType::kFloat32, true}, ++seed);
    CheckAgainstReference(
        {70, n_kv, 4, 2, 16, 16, {false, 0}, Precision::kBFloat16, DType::kFloat32, false}, ++seed);
  }
}

// Prefill copies K and V head-major and zero-pads them to whole key tiles with several threads
// once the copy is large (here 600 keys padded to 1024, x 2 heads x 32 = 64 Ki elements): every
// input dtype, converted, with the padding never seen as keys.
TEST(Engine, LargeConvertedOperandsMatchReference) {
  int seed = 300;
  for (DType in : {DType::kFloat32, DType::kBFloat16, DType::kFloat16}) {
    for (Precision p : {Precision::kFloat32, Precision::kBFloat16}) {
      CheckAgainstReference({600, 600, 4, 2, 32, 32, {true, 0}, p, in, false}, ++seed);
    }
  }
  CheckAgainstReference(
      {130, 600, 2, 2, 32, 32, {false, 0}, Precision::kFloat32, DType::kFloat16, true}, ++seed);
}

// Key and value tiles that enough query tiles read whole are packed once into the matmul's own
// layout and shared by the jobs of a call (tile_operands.h): by default on native bf16 matmuls,
// with kAll on f32 ones too (so that every machine runs the path). Every dtype and arithmetic,
// causal, unmasked and windowed, grouped heads (and a group too tall for the packed shapes,
// which reads the tiles plain): against the reference, packing must have happened exactly where
// the geometry and the setting call for it, and two-thread calls, whose jobs race to pack, must
// repeat to the bit.
TEST(Engine, PackedTilesMatchReferenceAndRepeat) {
  struct Packing {
    Case c;
    tile::TilePacking packing;
    bool geometry_packs;  // some tile is read whole by enough jobs
  };
  const MaskSpec causal{true, 0}, none{false, 0}, window{true, 700};
  const tile::TilePacking all = tile::TilePacking::kAll, bf16 = tile::TilePacking::kBf16,
                          off = tile::TilePacking::kNone;
  const Packing cases[] = {
      // 1100 tokens causal, 2/1 heads (32 tokens a job): tile 0 is read whole by 21 jobs.
      {{1100, 1100, 2, 1, 64, 64, causal, Precision::kFloat32, DType::kFloat32, false}, all, true},
      {{1100, 1100, 2, 1, 64, 64, causal, Precision::kFloat32, DType::kFloat32, false}, bf16, true},
      {{1100, 1100, 2, 1, 64, 64, causal, Precision::kBFloat16, DType::kBFloat16, false},
       bf16,
       true},
      {{1100, 1100, 2, 1, 64, 64, causal, Precision::kBFloat16, DType::kBFloat16, false},
       off,
       true},
      {{1100, 1100, 2, 1, 64, 64, causal, Precision::kBFloat16, DType::kFloat32, false}, all, true},
      {{1100, 1100, 2, 1, 64, 64, causal, Precision::kFloat32, DType::kFloat16, false}, all, true},
      // Unmasked: every job reads every whole tile; the last tile (76 keys) is never whole.
      {{400, 1100, 4, 4, 32, 48, none, Precision::kAuto, DType::kBFloat16, false}, bf16, true},
      // A window of 700 keys: tiles are read whole only while the window covers them.
      {{1300, 1300, 8, 2, 32, 32, window, Precision::kFloat32, DType::kFloat32, false}, all, true},
      {{1300, 1300, 8, 2, 32, 32, window, Precision::kBFloat16, DType::kFloat32, false},
       bf16,
       true},
      // 500 tokens: no tile is read whole by six jobs.
      {{500, 500, 2, 1, 64, 64, causal, Precision::kFloat32, DType::kFloat32, false}, all, false},
      // 96 query heads per key/value head: 96-row matmuls, read plain.
      {{40, 700, 96, 1, 16, 16, none, Precision::kFloat32, DType::kFloat32, false}, all, false},
  };
  uint64_t seed = 700;
  for (const Packing& p : cases) {
    EngineOptions options;
    options.tile_packing = p.packing;
    const AttentionEngine engine(options);
    // Whether the call's matmuls run in bf16 (ResolvePrecision: auto over bf16 inputs is bf16).
    const bool bf16_matmul =
        UseBf16Matmul() &&
        (p.c.precision == Precision::kBFloat16 ||
         (p.c.precision == Precision::kAuto && p.c.input_dtype == DType::kBFloat16));
    const bool want = p.geometry_packs && (p.packing == all || (p.packing == bf16 && bf16_matmul));
    const int64_t before = tile::ConvertedTiles::packed_tiles_made.load();
    CheckAgainstReference(p.c, ++seed, &engine);
    const int64_t made = tile::ConvertedTiles::packed_tiles_made.load() - before;
    EXPECT_EQ(made > 0, want) << p.c.Name() << ": " << made << " tiles packed";
  }
  // Repeats: the same call three times on two threads.
  std::mt19937_64 rng(77);
  const auto q = RandomFloats(rng, 1100 * 4 * 64);
  const auto k = RandomFloats(rng, 1100 * 1 * 64);
  const TensorView qv{DType::kFloat32, {1100, 4, 64}, q.data()};
  const TensorView kv{DType::kFloat32, {1100, 1, 64}, k.data()};
  AttentionOptions options;
  options.mask.causal = true;
  EngineOptions two_threads;
  two_threads.threads = 2;
  two_threads.tile_packing = tile::TilePacking::kAll;
  const AttentionEngine engine(two_threads);
  std::vector<float> first(q.size()), again(q.size());
  ASSERT_OK(engine.Compute(qv, kv, kv, options, {}, absl::MakeSpan(first), {}, nullptr));
  for (int repeat = 0; repeat < 2; ++repeat) {
    ASSERT_OK(engine.Compute(qv, kv, kv, options, {}, absl::MakeSpan(again), {}, nullptr));
    for (size_t i = 0; i < first.size(); ++i) {
      ASSERT_EQ(absl::bit_cast<uint32_t>(first[i]), absl::bit_cast<uint32_t>(again[i]))
          << "repeat " << repeat << " element " << i;
    }
  }
}

// Decode-sized work (few folded rows) runs the vector kernels; over few heads the keys are split
// across threads and merged.
// One engine reuses its K/V copy buffers from call to call (ScratchPool), holding the previous
// call's values, in another dtype, or data where this call has padding rows. Few queries over
// many keys keep the reference cheap; 32 query rows per head group take the matmul path, which
// copies.
TEST(Engine, ReusedCopyBuffersMatchReference) {
  const AttentionEngine engine;
  uint64_t seed = 900;
  // K/V copies of 3072 padded rows x 4 heads x 64 in f32: 3 MiB each, from the scratch pool.
  CheckAgainstReference(
      {16, 3000, 8, 4, 64, 64, {true, 0}, Precision::kFloat32, DType::kFloat32, false}, ++seed,
      &engine);
  EXPECT_GT(engine.scratch().cached_bytes(), 0);
  // Fewer keys: the reused buffers' rows past 1300 held keys above and are padding now.
  CheckAgainstReference(
      {16, 1300, 8, 4, 64, 64, {true, 0}, Precision::kFloat32, DType::kFloat32, true}, ++seed,
      &engine);
  CheckAgainstReference(
      {16, 2900, 8, 4, 64, 64, {false, 0}, Precision::kBFloat16, DType::kBFloat16, false}, ++seed,
      &engine);
  CheckAgainstReference(
      {20, 2000, 8, 4, 64, 64, {true, 300}, Precision::kFloat32, DType::kFloat16, false}, ++seed,
      &engine);
}

TEST(Engine, DecodeKernelsAndKeySplits) {
  int seed = 200;
  for (Precision p : {Precision::kFloat32, Precision::kBFloat16}) {
    for (DType in : {DType::kFloat32, DType::kBFloat16}) {
      CheckAgainstReference({1, 3000, 8, 1, 64, 64, {true, 0}, p, in, true}, ++seed);      // MQA
      CheckAgainstReference({1, 1000, 32, 8, 128, 128, {true, 0}, p, in, false}, ++seed);  // GQA
      CheckAgainstReference({3, 700, 4, 1, 32, 16, {true, 100}, p, in, true}, ++seed);     // m = 12
      CheckAgainstReference({4, 700, 4, 1, 32, 32, {false, 0}, p, in, false}, ++seed);     // m = 16
    }
  }
}

// After one call has created the primitives for a head configuration, calls of other lengths
// create none: prefill tiles have fixed shapes, and decode runs no matmul at all.
TEST(Engine, NoPrimitiveCreationAfterWarmUp) {
  std::mt19937_64 rng(5);
  auto run = [&](int64_t n_q, int64_t n_kv) {
    const auto q = RandomFloats(rng, n_q * 8 * 64);
    const auto k = RandomFloats(rng, n_kv * 2 * 64);
    AttentionOptions options;
    options.mask.causal = true;
    std::vector<float> out(n_q * 8 * 64);
    ASSERT_OK(AttentionEngine().Compute(
        {DType::kFloat32, {n_q, 8, 64}, q.data()}, {DType::kFloat32, {n_kv, 2, 64}, k.data()},
        {DType::kFloat32, {n_kv, 2, 64}, k.data()}, options, {}, absl::MakeSpan(out), {}, nullptr));
  };
  run(600, 600);  // warm-up: every last-tile width (64 to 512 columns)
  const int64_t created = onednn::MatmulCreations();
  for (int64_t n : {1, 2, 5, 16, 17, 33, 100, 257, 600}) run(n, n + 7);
  EXPECT_EQ(onednn::MatmulCreations(), created);
}

TEST(Engine, QueriesBeforeEveryKeyGetZeros) {
  CheckAgainstReference({10, 3, 2, 2, 8, 8, {true, 0}, Precision::kFloat32, DType::kFloat32, true},
                        5);
}

TEST(Engine, WeightsDoNotChangeTheOutput) {
  std::mt19937_64 rng(9);
  const auto q = RandomFloats(rng, 70 * 4 * 16);
  const auto k = RandomFloats(rng, 90 * 2 * 16);
  const auto v = RandomFloats(rng, 90 * 2 * 16);
  const TensorView qv{DType::kFloat32, {70, 4, 16}, q.data()};
  const TensorView kv{DType::kFloat32, {90, 2, 16}, k.data()};
  const TensorView vv{DType::kFloat32, {90, 2, 16}, v.data()};
  AttentionOptions options;
  options.mask.causal = true;
  std::vector<float> a(70 * 4 * 16), b(70 * 4 * 16), w(4 * 70 * 90);
  ASSERT_OK(AttentionEngine().Compute(qv, kv, vv, options, {}, absl::MakeSpan(a), {}, nullptr));
  ASSERT_OK(AttentionEngine().Compute(qv, kv, vv, options, {}, absl::MakeSpan(b), absl::MakeSpan(w),
                                      nullptr));
  EXPECT_EQ(a, b);
}

TEST(Engine, SingleThreadMatchesParallel) {
  std::mt19937_64 rng(11);
  const auto q = RandomFloats(rng, 100 * 8 * 32);
  const auto k = RandomFloats(rng, 100 * 2 * 32);
  const TensorView qv{DType::kFloat32, {100, 8, 32}, q.data()};
  const TensorView kv{DType::kFloat32, {100, 2, 32}, k.data()};
  AttentionOptions options;
  options.mask.causal = true;
  std::vector<float> one(100 * 8 * 32), many(100 * 8 * 32);
  ASSERT_OK(
      AttentionEngine({1}).Compute(qv, kv, kv, options, {}, absl::MakeSpan(one), {}, nullptr));
  ASSERT_OK(
      AttentionEngine({2}).Compute(qv, kv, kv, options, {}, absl::MakeSpan(many), {}, nullptr));
  // Summation order may differ between oneDNN's threaded and single-threaded kernels.
  for (size_t i = 0; i < one.size(); ++i) ASSERT_NEAR(one[i], many[i], 1e-6) << i;
}

// bf16 queries are read in place, each job converting its own rows: the output must be the bits
// the same values give as float32 queries, for decode-sized and matmul-sized calls, grouped
// heads, both arithmetics, and q * scale overflowing float32 (the rows are then packed unscaled).
TEST(Engine, Bf16QueriesGiveTheBitsOfTheirFloatValues) {
  struct Geometry {
    int64_t n_q, n_kv, n_head, n_head_kv, d;
  };
  const Geometry geometries[] = {{1, 300, 8, 2, 64}, {3, 40, 4, 4, 5},      {5, 70, 8, 2, 16},
                                 {70, 70, 2, 2, 32}, {130, 150, 8, 2, 128}, {64, 600, 4, 1, 8}};
  std::mt19937_64 rng(31);
  int cases = 0;
  for (const Geometry& g : geometries) {
    for (Precision precision : {Precision::kFloat32, Precision::kBFloat16}) {
      for (bool overflow : {false, true}) {
        SCOPED_TRACE(absl::StrCat("n_q ", g.n_q, " n_kv ", g.n_kv, " heads ", g.n_head, "/",
                                  g.n_head_kv, " d ", g.d, " ", PrecisionName(precision),
                                  overflow ? " q * scale overflows" : ""));
        std::vector<float> qf = RandomFloats(rng, g.n_q * g.n_head * g.d);
        // q * scale past float32 in one element, while q.k * scale stays finite: its key
        // column is zero.
        std::vector<float> kf = RandomFloats(rng, g.n_kv * g.n_head_kv * g.d);
        AttentionOptions options;
        options.mask.causal = true;
        options.precision = precision;
        if (overflow) {
          options.scale = 0x1p100f;
          for (float& x : qf) x *= 0x1p-110f;
          qf[qf.size() / 2] = 0x1p120f;
          for (int64_t t = 0; t < g.n_kv * g.n_head_kv; ++t)
            kf[t * g.d + (qf.size() / 2) % g.d] = 0;
        }
        Input q16 = MakeInput(qf, {g.n_q, g.n_head, g.d}, DType::kBFloat16);
        const TensorView q32{DType::kFloat32, {g.n_q, g.n_head, g.d}, q16.exact.data()};
        const TensorView k{DType::kFloat32, {g.n_kv, g.n_head_kv, g.d}, kf.data()};
        std::vector<float> from16(g.n_q * g.n_head * g.d), from32(from16.size());
        const AttentionEngine engine;
        AttentionStats stats;
        ASSERT_OK(engine.Compute(q16.view, k, k, options, {}, absl::MakeSpan(from16), {}, &stats));
        ASSERT_OK(engine.Compute(q32, k, k, options, {}, absl::MakeSpan(from32), {}, nullptr));
        for (size_t i = 0; i < from16.size(); ++i) {
          ASSERT_EQ(absl::bit_cast<uint32_t>(from16[i]), absl::bit_cast<uint32_t>(from32[i]))
              << "element " << i << ": " << from16[i] << " against " << from32[i];
        }
        ++cases;
      }
    }
  }
  EXPECT_EQ(cases, 24);
}

// A one-thread engine keeps oneDNN's matmuls on the calling thread too (they follow the calling
// thread's OpenMP setting, which is every CPU by default), and hands that setting back as it
// was. Told apart by CPU time: a causal prefill of about 2 GFLOP takes tens of milliseconds of
// CPU, and without the cap other threads do about as much of it as the calling thread.
TEST(Engine, OneThreadKeepsOneDnnOnTheCallingThread) {
  const int before = omp_get_max_threads();
  omp_set_num_threads(2);
  std::mt19937_64 rng(12);
  const auto x = RandomFloats(rng, 1024 * 8 * 128);
  const TensorView view{DType::kFloat32, {1024, 8, 128}, x.data()};
  std::vector<float> out(x.size());
  AttentionOptions options;
  options.mask.causal = true;
  AttentionEngine engine({1});
  ASSERT_OK(engine.Compute(view, view, view, options, {}, absl::MakeSpan(out), {}, nullptr));
  const double process_start = ::attend::testing::CpuSeconds(CLOCK_PROCESS_CPUTIME_ID);
  const double thread_start = ::attend::testing::CpuSeconds(CLOCK_THREAD_CPUTIME_ID);
  ASSERT_OK(engine.Compute(view, view, view, options, {}, absl::MakeSpan(out), {}, nullptr));
  const double own = ::attend::testing::CpuSeconds(CLOCK_THREAD_CPUTIME_ID) - thread_start;
  const double others =
      ::attend::testing::CpuSeconds(CLOCK_PROCESS_CPUTIME_ID) - process_start - own;
  EXPECT_LT(others, 0.25 * own) << "calling thread " << own << " s, other threads " << others;
  EXPECT_EQ(omp_get_max_threads(), 2);
  omp_set_num_threads(before);
}

class EngineErrors : public ::testing::Test {
 protected:
  absl::Status Run(Shape q_shape, Shape k_shape, Shape v_shape, AttentionOptions options = {},
                   AttentionLimits limits = {}) {
    auto count = [](const Shape& s) {
      int64_t n = 1;
      for (int64_t d : s) n *= std::max<int64_t>(d, 1);
      return n;
    };
    q_.assign(count(q_shape), 0.5f);
    k_.assign(count(k_shape), 0.5f);
    v_.assign(count(v_shape), 0.5f);
    auto shape =
        ValidateAttention(TensorView{DType::kFloat32, q_shape, q_.data()},
                          TensorView{DType::kFloat32, k_shape, k_.data()},
                          TensorView{DType::kFloat32, v_shape, v_.data()}, options, limits);
    if (!shape.ok()) return shape.status();
    std::vector<float> out(shape->output_elements());
    return AttentionEngine().Compute(TensorView{DType::kFloat32, q_shape, q_.data()},
                                     TensorView{DType::kFloat32, k_shape, k_.data()},
                                     TensorView{DType::kFloat32, v_shape, v_.data()}, options,
                                     limits, absl::MakeSpan(out), {}, nullptr);
  }
  std::vector<float> q_, k_, v_;
};

TEST_F(EngineErrors, RejectsWrongRank) {
  EXPECT_THAT(Run({2, 3}, {2, 1, 3}, {2, 1, 3}),
              StatusIs(absl::StatusCode::kInvalidArgument, {"q.shape", "[2, 3]", "rank 3"}));
}

TEST_F(EngineErrors, RejectsMismatchedHeadDims) {
  EXPECT_THAT(Run({2, 4, 8}, {3, 2, 16}, {3, 2, 8}),
              StatusIs(absl::StatusCode::kInvalidArgument, {"head_dim", "16", "8", "q [2, 4, 8]"}));
}

TEST_F(EngineErrors, RejectsHeadCountThatDoesNotDivide) {
  EXPECT_THAT(Run({2, 6, 8}, {3, 4, 8}, {3, 4, 8}),
              StatusIs(absl::StatusCode::kInvalidArgument, {"n_head 6", "n_head_kv 4"}));
}

TEST_F(EngineErrors, RejectsValueTokensThatDifferFromKeys) {
  EXPECT_THAT(Run({2, 4, 8}, {3, 2, 8}, {5, 2, 8}),
              StatusIs(absl::StatusCode::kInvalidArgument, {"v.shape", "k.shape", "[5, 2]"}));
}

TEST_F(EngineErrors, RejectsZeroDimension) {
  EXPECT_THAT(Run({0, 4, 8}, {3, 2, 8}, {3, 2, 8}),
              StatusIs(absl::StatusCode::kInvalidArgument, {"q.shape", "dimension 0 is 0"}));
}

TEST_F(EngineErrors, RejectsScoresOverTheLimit) {
  AttentionLimits limits;
  limits.max_score_elements = 100;
  EXPECT_THAT(Run({20, 1, 2}, {20, 1, 2}, {20, 1, 2}, {}, limits),
              StatusIs(absl::StatusCode::kResourceExhausted, {"score elements", "100"}));
}

TEST_F(EngineErrors, RejectsNegativeWindowAndNonFiniteScale) {
  AttentionOptions options;
  options.mask.window = -3;
  EXPECT_THAT(Run({2, 1, 2}, {2, 1, 2}, {2, 1, 2}, options),
              StatusIs(absl::StatusCode::kInvalidArgument, {"window_tokens"}));
  options = {};
  options.scale = std::numeric_limits<float>::infinity();
  EXPECT_THAT(Run({2, 1, 2}, {2, 1, 2}, {2, 1, 2}, options),
              StatusIs(absl::StatusCode::kInvalidArgument, {"scale"}));
}

TEST(Engine, RejectsOutputOfTheWrongSize) {
  const float x[8] = {};
  const TensorView t{DType::kFloat32, {2, 1, 4}, x};
  std::vector<float> out(7);
  EXPECT_THAT(AttentionEngine().Compute(t, t, t, {}, {}, absl::MakeSpan(out), {}, nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument, {"output holds 7"}));
}

TEST(Engine, ReportsScoresThatOverflowFloat32) {
  const float big[4] = {1e30f, 1e30f, 1e30f, 1e30f};
  const TensorView t{DType::kFloat32, {2, 1, 2}, big};
  std::vector<float> out(4);
  EXPECT_THAT(AttentionEngine().Compute(t, t, t, {}, {}, absl::MakeSpan(out), {}, nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument, {"overflowed float32"}));
}

// Small scores and huge values overflow in the weighted sum of v, which the message names
// (it used to blame q.k * scale alone).
TEST(Engine, ReportsValuesWhoseSumOverflowsFloat32) {
  const float ones[4] = {1, 1, 1, 1};
  const float huge[4] = {3e38f, 3e38f, 3e38f, 3e38f};
  const TensorView qk{DType::kFloat32, {2, 1, 2}, ones};
  const TensorView v{DType::kFloat32, {2, 1, 2}, huge};
  std::vector<float> out(4);
  AttentionOptions options;
  options.scale = 1.0f;
  // The softmax sums exp(s - max) x v before dividing by the weights' sum: 3e38 + 3e38 is more
  // than float32 holds, although the average would not be.
  EXPECT_THAT(AttentionEngine().Compute(qk, qk, v, options, {}, absl::MakeSpan(out), {}, nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument, {"weighted sum of v"}));
}

}  // namespace
}  // namespace attend
