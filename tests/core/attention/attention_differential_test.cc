// Differential test: the oneDNN engine against the reference attention on random cases from a
// fixed seed, over every combination of q, k and v dtypes, compute precision and output dtype,
// every mask kind, default and explicit scales, MHA/GQA/MQA groupings, and sizes on both sides of
// every point where the engine switches code path.
//
// Environment: ATTEND_DIFF_CASES=N runs N cases (default kDefaultCases), ATTEND_DIFF_SEED=S
// changes the seed, ATTEND_DIFF_CASE=I runs only case I (what a failure message says to set).
//
// Where the engine switches path (core/attention/tile_attention.{h,cc}, attention_engine.cc):
//   - tile::UsesKernels / RunTileJob: a job of m folded query rows (tokens x group) runs the
//     vector kernels when m < tile::kMatmulRows (16), oneDNN matmuls otherwise. The call-level
//     choice (UsesKernels) also picks the K/V operand form, so a matmul call whose last job has
//     fewer than kMatmulRows rows runs kernels over the matmul operands.
//   - Group folding / query tiles: a job holds max(1, tile::kQueryTileRows / group) tokens (64
//     folded rows); a group of kQueryTileRows or more makes one-token jobs of `group` rows, padded
//     to a multiple of kQueryTileRows; a group that does not divide 64 leaves ragged jobs.
//   - Key tiles: AttentionEngine::kKernelKeyTile (256) keys per tile on the kernel path,
//     AttentionEngine::kKeyTile (512) on the matmul path, whose last tile is cut to a multiple of
//     64 columns.
//   - Key splits (tile::Run): with fewer than 2 x threads jobs, the keys are split across threads
//     (at most one split per key tile) and the partial softmaxes merged. Depends on
//     EngineOptions::threads, which the cases vary; threads == 1 (or one task) runs serially.
//   - Operand copies: matmul calls copy K and V head-major, on several threads from 2^16
//     elements, from the scratch pool from 1 MiB ("large" cases reach both).
//   - simd kernels: AVX2 or the portable scalar code (simd::testing::UseScalarKernels).
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <map>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/half.h"
#include "core/attention/attention_engine.h"
#include "core/attention/testing/reference_attention.h"
#include "core/attention/tile_attention.h"
#include "core/kernels/simd.h"
#include "tests/core/attention/attention_error_bound.h"
#include "tests/core/attention/encoded_input.h"
#include "tests/test_util.h"

namespace attend {
namespace {

using ::attend::testing::EncodedInput;
using ::attend::testing::EncodeInput;
using ::attend::testing::RandomFloats;
using ::attend::testing::StatusIs;

// Covers all 3 x 3 x 3 x 3 x 3 = 243 combinations of q, k, v dtype, precision and output dtype.
constexpr int64_t kDefaultCases = 300;
constexpr uint64_t kDefaultSeed = 0x5eed2024;
// Multiply-adds the reference may spend on one case ("large" cases get 4 times as much): keeps the
// default run well under a minute in Release, and affordable under ASan.
constexpr int64_t kReferenceBudget = int64_t{3} << 20;

constexpr DType kDtypes[] = {DType::kFloat32, DType::kBFloat16, DType::kFloat16};
constexpr Precision kPrecisions[] = {Precision::kAuto, Precision::kFloat32, Precision::kBFloat16};

int64_t EnvInt(const char* name, int64_t fallback) {
  const char* value = std::getenv(name);
  return value != nullptr && *value != '\0' ? std::strtoll(value, nullptr, 0) : fallback;
}

struct Case {
  uint64_t seed = 0;
  int64_t index = 0;
  std::string focus;  // the threshold the case was generated around
  int64_t n_q = 1, n_kv = 1, n_head = 1, n_head_kv = 1, head_dim = 1, head_dim_v = 1;
  DType q_dtype = DType::kFloat32, k_dtype = DType::kFloat32, v_dtype = DType::kFloat32;
  DType out_dtype = DType::kFloat32;
  Precision precision = Precision::kAuto;
  MaskSpec mask;
  std::optional<float> scale;
  int threads = 0;
  std::string kernels;  // the simd kernel set (simd::testing::RunnableKernels())
  bool want_weights = false;
  float q_std = 1.0f;

  int64_t group() const { return n_head / n_head_kv; }
  std::string ToString() const {
    return absl::StrCat("case ", index, " (reproduce: ATTEND_DIFF_SEED=", seed,
                        " ATTEND_DIFF_CASE=", index, "), focus ", focus, ": n_q ", n_q, ", n_kv ",
                        n_kv, ", n_head ", n_head, ", n_head_kv ", n_head_kv, ", head_dim ",
                        head_dim, ", head_dim_v ", head_dim_v, ", q ", DTypeName(q_dtype), ", k ",
                        DTypeName(k_dtype), ", v ", DTypeName(v_dtype), ", precision ",
                        PrecisionName(precision), ", output ", DTypeName(out_dtype), ", causal ",
                        mask.causal, ", window ", mask.window, ", scale ",
                        scale ? absl::StrCat(*scale) : "default", ", threads ", threads,
                        ", kernels ", kernels, ", weights ", want_weights, ", q stddev ", q_std);
  }
};

// --- The engine's geometry, from its constants (for generating and tallying cases) ---

int64_t TokensPerJob(int64_t group) { return std::max<int64_t>(1, tile::kQueryTileRows / group); }
// Folded rows of a call's first job.
int64_t FirstJobRows(const Case& c) { return std::min(c.n_q, TokensPerJob(c.group())) * c.group(); }
int64_t KeyTileWidth(const Case& c) {
  return tile::UsesKernels(c.n_q, c.group()) ? AttentionEngine::kKernelKeyTile
                                             : AttentionEngine::kKeyTile;
}
// Mirrors the split rule of tile::Run; only used to tally what the cases cover.
int64_t KeySplits(const Case& c) {
  const int64_t threads = c.threads > 0 ? c.threads : omp_get_max_threads();
  const int64_t per_job = TokensPerJob(c.group());
  const int64_t jobs = c.n_head_kv * ((c.n_q + per_job - 1) / per_job);
  const int64_t key_tiles = (c.n_kv + KeyTileWidth(c) - 1) / KeyTileWidth(c);
  if (jobs >= 2 * threads) return 1;
  return std::clamp<int64_t>((2 * threads + jobs - 1) / jobs, 1, key_tiles);
}
int64_t ReferenceCost(const Case& c) {
  return c.n_head * c.n_q * c.n_kv * (c.head_dim + c.head_dim_v);
}

// The sides of each path switch a case is on (see the top of the file).
std::vector<std::string> Coverage(const Case& c) {
  const bool kernels = tile::UsesKernels(c.n_q, c.group());
  const int64_t per_job = TokensPerJob(c.group()), width = KeyTileWidth(c);
  const int64_t last_job_rows = (c.n_q - (c.n_q - 1) / per_job * per_job) * c.group();
  std::vector<std::string> out = {
      kernels ? "call on the vector kernels" : "call on the matmuls",
      c.n_q > per_job ? "several query jobs per head" : "one query job per head",
      c.group() >= tile::kQueryTileRows
          ? "one-token jobs (group >= kQueryTileRows)"
          : (tile::kQueryTileRows % c.group() != 0 ? "ragged group" : "group divides 64"),
      c.n_kv < width ? "n_kv below one key tile"
                     : (c.n_kv % width == 0 ? "n_kv a multiple of the key tile"
                                            : "n_kv past a key tile multiple"),
      KeySplits(c) > 1 ? "keys split across threads" : "keys not split",
      c.threads == 1 ? "one thread" : "several threads",
      kernels ? absl::StrCat("vector kernels ", c.kernels) : "no vector kernels",
      c.mask.causal ? (c.mask.window ? "causal + window" : "causal")
                    : (c.mask.window ? "window" : "no mask"),
      c.scale ? "explicit scale" : "default scale",
      c.n_head_kv == c.n_head ? "MHA" : (c.n_head_kv == 1 ? "MQA" : "GQA"),
  };
  if (!kernels && last_job_rows < tile::kMatmulRows) out.push_back("matmul call, kernel last job");
  if (FirstJobRows(c) == tile::kMatmulRows - 1) out.push_back("m == kMatmulRows - 1");
  if (FirstJobRows(c) == tile::kMatmulRows) out.push_back("m == kMatmulRows");
  if (c.mask.causal && c.n_q > c.n_kv) out.push_back("queries before every key");
  if (!kernels && c.n_head_kv * c.n_kv * c.head_dim * 4 >= (int64_t{1} << 20)) {
    out.push_back("K copy of 1 MiB or more");
  }
  const int64_t tiles = (c.n_kv + width - 1) / width;
  if ((tiles + KeySplits(c) - 1) / KeySplits(c) >= 3) out.push_back("3+ key tiles per split");
  if (c.want_weights) out.push_back("weights");
  // tile::RunKernelJobs: the heads of a span read together, f32 tiles in pieces of
  // kInterleavedRows rows (kernels keep bf16 in place only when k and v both are bf16).
  const bool f32_tiles = !(c.k_dtype == DType::kBFloat16 && c.v_dtype == DType::kBFloat16);
  if (kernels && c.n_head_kv > 1 && f32_tiles) {
    out.push_back(c.n_kv % tile::kInterleavedRows != 0 ? "interleaved heads, ragged last piece"
                                                       : "interleaved heads, whole pieces");
    if (c.n_kv > width) out.push_back("interleaved heads, several spans");
  }
  return out;
}

// --- Generating cases ---

int64_t Uniform(std::mt19937_64& rng, int64_t lo, int64_t hi) {  // [lo, hi]
  return std::uniform_int_distribution<int64_t>(lo, std::max(lo, hi))(rng);
}
template <typename T>
T Pick(std::mt19937_64& rng, std::initializer_list<T> values) {
  return values.begin()[Uniform(rng, 0, static_cast<int64_t>(values.size()) - 1)];
}

// Query counts around the kernel / matmul switch and the query-tile edges for `group`.
int64_t EdgeQueries(std::mt19937_64& rng, int64_t group) {
  const int64_t tiles = TokensPerJob(group);
  const int64_t first_matmul = (tile::kMatmulRows + group - 1) / group;  // smallest matmul n_q
  return std::max<int64_t>(
      1, Pick(rng, {first_matmul - 1, first_matmul, first_matmul + 1, tiles - 1, tiles, tiles + 1,
                    2 * tiles, 2 * tiles + 1, tiles + std::max<int64_t>(1, first_matmul - 1)}));
}

// Key counts around the key tile edges of the path the case takes.
int64_t EdgeKeys(std::mt19937_64& rng, const Case& c) {
  const int64_t w = KeyTileWidth(c);
  return Pick(
      rng, {w - 1, w, w + 1, 2 * w, 2 * w + 1, w + 63, w + 64, w + 65, int64_t{64}, int64_t{65}});
}

// Shapes and the rest for one focus; dtypes and precision are set by the caller.
void Shape(std::mt19937_64& rng, Case& c) {
  const int64_t dims[] = {1, 2, 3, 8, 16, 17, 32, 64, 80, 128, 256};
  c.focus = Pick<const char*>(
      rng, {"decode", "kernel/matmul switch", "query tiles", "group folding", "key tiles",
            "key splits", "queries before keys", "large", "long decode", "random"});
  c.n_head_kv = Uniform(rng, 1, 3);
  int64_t group = Pick<int64_t>(rng, {1, 1, 2, 3, 4, 5, 8, 16, 17});
  if (c.focus == "group folding") group = Pick<int64_t>(rng, {3, 5, 7, 21, 48, 63, 64, 65, 96});
  if (c.focus == "large") group = 1, c.n_head_kv = 2;
  c.n_head = c.n_head_kv * group;
  c.threads = Pick(rng, {0, 1, 2, 3, 4});
  c.n_q = Uniform(rng, 1, 80);
  c.n_kv = Uniform(rng, 1, 600);
  if (c.focus == "decode") {
    c.n_q = std::max<int64_t>(1, Uniform(rng, 1, (tile::kMatmulRows - 1) / group));
  } else if (c.focus == "kernel/matmul switch" || c.focus == "query tiles" ||
             c.focus == "group folding") {
    c.n_q = EdgeQueries(rng, group);
  } else if (c.focus == "key tiles") {
    c.n_q = Pick<int64_t>(rng, {1, 2, 5, 16, 40, 70});
    c.n_kv = EdgeKeys(rng, c);
  } else if (c.focus == "key splits") {
    c.n_head_kv = 1;
    c.n_head = group;
    c.threads = Pick(rng, {2, 3, 4});
    c.n_q = Uniform(rng, 1, TokensPerJob(group));
    c.n_kv = Uniform(rng, KeyTileWidth(c) + 1, 4 * KeyTileWidth(c));
  } else if (c.focus == "long decode") {  // many key tiles per job and per split
    c.n_q = std::max<int64_t>(1, Uniform(rng, 1, (tile::kMatmulRows - 1) / group));
    c.n_kv =
        Uniform(rng, 3 * AttentionEngine::kKernelKeyTile, 12 * AttentionEngine::kKernelKeyTile);
  } else if (c.focus == "queries before keys") {
    c.n_kv = Uniform(rng, 1, 40);
    c.n_q = c.n_kv + Uniform(rng, 1, 70);
  } else if (c.focus == "large") {
    c.n_q = tile::kMatmulRows;
    c.n_kv = Uniform(rng, 2049, 2600);
  }
  if (c.focus == "key tiles" || c.focus == "random") c.n_kv = std::max<int64_t>(1, c.n_kv);
  if (c.focus != "key tiles" && c.focus != "key splits" && Uniform(rng, 0, 3) == 0) {
    c.n_kv = EdgeKeys(rng, c);  // the key tile edges under other foci too
  }
  c.head_dim = dims[Uniform(rng, 0, 10)];
  c.head_dim_v = Uniform(rng, 0, 3) == 0 ? dims[Uniform(rng, 0, 10)] : c.head_dim;
  if (c.focus == "large") c.head_dim = c.head_dim_v = 64;
  // Within the budget: smaller heads first (they are not what the focus is about).
  const int64_t budget = kReferenceBudget * (c.focus == "large" ? 4 : 1);
  while (ReferenceCost(c) > budget && (c.head_dim > 1 || c.head_dim_v > 1)) {
    c.head_dim = std::max<int64_t>(1, c.head_dim / 2);
    c.head_dim_v = std::max<int64_t>(1, c.head_dim_v / 2);
  }
  while (ReferenceCost(c) > budget && c.n_q > 1) c.n_q /= 2;
}

void MaskAndScale(std::mt19937_64& rng, Case& c) {
  const int kind = static_cast<int>(Uniform(rng, 0, 3));  // none, causal, window, causal+window
  c.mask.causal = kind == 1 || kind == 3;
  if (kind >= 2) {
    c.mask.window = Pick<int64_t>(
        rng, {1, 2, Uniform(rng, 1, c.n_kv + 2), c.n_kv, c.n_q + c.n_kv, int64_t{1} << 40});
  }
  if (Uniform(rng, 0, 1) == 0) {
    const float d = static_cast<float>(c.head_dim);
    c.scale = Pick<float>(rng, {0.0f, 0.05f, 0.3f, 1.0f, -0.5f, 2.0f / std::sqrt(d)});
  }
}

Case MakeCase(uint64_t seed, int64_t index) {
  std::seed_seq seq{seed, static_cast<uint64_t>(index)};
  std::mt19937_64 rng(seq);
  Case c;
  c.seed = seed;
  c.index = index;
  // Every (q, k, v, precision, output) combination once per 243 consecutive cases.
  int64_t combo = index % 243;
  c.q_dtype = kDtypes[combo % 3];
  c.k_dtype = kDtypes[combo / 3 % 3];
  c.v_dtype = kDtypes[combo / 9 % 3];
  c.precision = kPrecisions[combo / 27 % 3];
  c.out_dtype = kDtypes[combo / 81 % 3];
  Shape(rng, c);
  MaskAndScale(rng, c);
  // Every kernel set this CPU runs (scalar, AVX2, the AVX-512 sets), each as likely.
  const std::vector<std::string> sets = simd::testing::RunnableKernels();
  c.kernels = sets[static_cast<size_t>(Uniform(rng, 0, static_cast<int64_t>(sets.size()) - 1))];
  c.want_weights = Uniform(rng, 0, 1) == 0;
  c.q_std = Pick(rng, {1.0f, 1.0f, 3.0f});
  return c;
}

// --- Running one case ---

std::vector<float> Bf16Rounded(std::vector<float> x, bool round) {
  if (round) {
    for (float& e : x) e = Bf16ToFloat(FloatToBf16(e));
  }
  return x;
}

// The output as the caller receives it: encoded in `dtype` and decoded.
std::vector<float> Encoded(const std::vector<float>& output, DType dtype) {
  std::string bytes;
  AppendEncoded(output, dtype, &bytes);
  std::vector<float> out(output.size());
  for (size_t i = 0; i < out.size(); ++i) {
    if (dtype == DType::kFloat32) {
      std::memcpy(&out[i], bytes.data() + 4 * i, 4);
      continue;
    }
    uint16_t h;
    std::memcpy(&h, bytes.data() + 2 * i, 2);
    out[i] = dtype == DType::kBFloat16 ? Bf16ToFloat(h) : HalfToFloat(h);
  }
  return out;
}

// The largest error / tolerance ratio seen, by what was compared.
using Margins = std::map<std::string, double>;

// Runs case `c` through the engine and the reference; a failure names the case and the first
// element out of bounds.
// `engine` receives the engine's name for its path (stats.engine).
void CheckCase(const Case& c, Margins* margins, std::string* engine_name) {
  std::seed_seq seq{c.seed, static_cast<uint64_t>(c.index), uint64_t{1}};
  std::mt19937_64 rng(seq);
  const EncodedInput q = EncodeInput(RandomFloats(rng, c.n_q * c.n_head * c.head_dim, c.q_std),
                                     {c.n_q, c.n_head, c.head_dim}, c.q_dtype);
  const EncodedInput k = EncodeInput(RandomFloats(rng, c.n_kv * c.n_head_kv * c.head_dim),
                                     {c.n_kv, c.n_head_kv, c.head_dim}, c.k_dtype);
  const EncodedInput v = EncodeInput(RandomFloats(rng, c.n_kv * c.n_head_kv * c.head_dim_v),
                                     {c.n_kv, c.n_head_kv, c.head_dim_v}, c.v_dtype);
  AttentionOptions options;
  options.mask = c.mask;
  options.scale = c.scale;
  options.precision = c.precision;
  auto shape = ValidateAttention(q.view, k.view, v.view, options, AttentionLimits{});
  ASSERT_TRUE(shape.ok()) << c.ToString() << ": " << shape.status();

  std::vector<float> output(static_cast<size_t>(shape->output_elements()));
  std::vector<float> weights(c.want_weights ? static_cast<size_t>(shape->weight_elements()) : 0);
  AttentionStats stats;
  {
    const simd::testing::ScopedKernels kernels(c.kernels);
    EXPECT_TRUE(kernels.ok()) << c.kernels;
    const AttentionEngine engine(EngineOptions{c.threads});
    const absl::Status status =
        engine.Compute(q.view, k.view, v.view, options, AttentionLimits{}, absl::MakeSpan(output),
                       absl::MakeSpan(weights), &stats);
    ASSERT_TRUE(status.ok()) << c.ToString() << ": " << status;
  }
  *engine_name = stats.engine;
  ASSERT_TRUE(CheckFitsDType(output, c.out_dtype, "output").ok()) << c.ToString();

  // The reference gets the operands the engine's arithmetic starts from: the decoded inputs,
  // rounded to bf16 when the products run in bf16.
  const bool bf16 = ResolvePrecision(c.precision, q.view, k.view, v.view) == Precision::kBFloat16;
  const std::vector<float> rq = Bf16Rounded(q.exact, bf16), rk = Bf16Rounded(k.exact, bf16),
                           rv = Bf16Rounded(v.exact, bf16);
  auto reference =
      ReferenceAttention(TensorView{DType::kFloat32, q.view.shape, rq.data()},
                         TensorView{DType::kFloat32, k.view.shape, rk.data()},
                         TensorView{DType::kFloat32, v.view.shape, rv.data()}, options);
  ASSERT_TRUE(reference.ok()) << c.ToString() << ": " << reference.status();

  testing::Operands operands;
  operands.shape = *shape;
  operands.mask = c.mask;
  operands.scale = EffectiveScale(options, *shape);
  operands.q = rq.data();
  operands.k = rk.data();
  operands.v = rv.data();
  operands.bf16_probabilities = bf16;
  const testing::ErrorBound bound(operands);
  const testing::Mismatches out = testing::CompareOutput(
      Encoded(output, c.out_dtype), reference->output, bound, *shape, c.out_dtype);
  const std::string kind =
      absl::StrCat(bf16 ? "bf16" : "f32", " precision, ", DTypeName(c.out_dtype), " output");
  double& worst_output = (*margins)[absl::StrCat("output, ", kind)];
  worst_output = std::max(worst_output, out.worst);
  EXPECT_EQ(out.count, 0) << c.ToString() << "\n  " << out.count << " output elements out of "
                          << "bounds; first: " << out.first;
  if (c.want_weights) {
    const testing::Mismatches w =
        testing::CompareWeights(weights, reference->weights, bound, *shape, c.mask);
    double& worst_weight = (*margins)[absl::StrCat("weights, ", bf16 ? "bf16" : "f32")];
    worst_weight = std::max(worst_weight, w.worst);
    EXPECT_EQ(w.count, 0) << c.ToString() << "\n  " << w.count
                          << " weights out of bounds; first: " << w.first;
  }
  EXPECT_EQ(stats.attended_pairs, VisiblePairs(c.mask, c.n_q, c.n_kv) * c.n_head) << c.ToString();
  EXPECT_EQ(stats.engine.rfind(bf16 ? "onednn/bf16" : "onednn/f32", 0), 0u)
      << c.ToString() << ": engine " << stats.engine;
}

// Assertion results recorded so far in the running test (each failure adds one).
int TestParts() {
  return ::testing::UnitTest::GetInstance()->current_test_info()->result()->total_part_count();
}

TEST(AttentionDifferential, EngineMatchesReference) {
  const uint64_t seed = static_cast<uint64_t>(EnvInt("ATTEND_DIFF_SEED", kDefaultSeed));
  const int64_t only = EnvInt("ATTEND_DIFF_CASE", -1);
  const int64_t cases = EnvInt("ATTEND_DIFF_CASES", kDefaultCases);
  std::map<std::string, int64_t> covered;
  Margins margins;
  int64_t failed_cases = 0;
  for (int64_t i = only >= 0 ? only : 0; i < (only >= 0 ? only + 1 : cases); ++i) {
    const Case c = MakeCase(seed, i);
    for (const std::string& side : Coverage(c)) ++covered[side];
    const int parts_before = TestParts();
    std::string engine;
    CheckCase(c, &margins, &engine);
    ++covered[absl::StrCat("engine ", engine)];
    failed_cases += TestParts() > parts_before;
    if (failed_cases >= 10) {
      ADD_FAILURE() << "stopping after 10 failing cases";
      break;
    }
  }
  std::string tally;
  for (const auto& [side, count] : covered) absl::StrAppend(&tally, "\n  ", side, ": ", count);
  std::cout << "[ coverage ] seed " << seed << ", cases by side of each path switch:" << tally
            << "\n";
  std::string margin;
  for (const auto& [what, worst] : margins) absl::StrAppend(&margin, "\n  ", what, ": ", worst);
  std::cout << "[ margins  ] largest error / tolerance:" << margin << "\n";
  // The default cases reach both sides of every switch (a new seed or count may not).
  if (only < 0 && seed == kDefaultSeed && cases >= kDefaultCases) {
    for (const char* side : {"call on the vector kernels",
                             "call on the matmuls",
                             "several query jobs per head",
                             "one query job per head",
                             "one-token jobs (group >= kQueryTileRows)",
                             "ragged group",
                             "group divides 64",
                             "n_kv below one key tile",
                             "n_kv a multiple of the key tile",
                             "n_kv past a key tile multiple",
                             "keys split across threads",
                             "keys not split",
                             "one thread",
                             "several threads",
                             "no mask",
                             "causal",
                             "window",
                             "causal + window",
                             "explicit scale",
                             "default scale",
                             "MHA",
                             "GQA",
                             "MQA",
                             "matmul call, kernel last job",
                             "m == kMatmulRows - 1",
                             "m == kMatmulRows",
                             "queries before every key",
                             "K copy of 1 MiB or more",
                             "weights",
                             "interleaved heads, ragged last piece",
                             "interleaved heads, whole pieces",
                             "interleaved heads, several spans"}) {
      EXPECT_GT(covered[side], 0) << "no default case covers: " << side;
    }
    for (const std::string& set : simd::testing::RunnableKernels()) {
      EXPECT_GT(covered["vector kernels " + set], 0) << "no default case runs kernels " << set;
    }
  }
}

// Head groupings the API does not allow (n_head not a multiple of n_head_kv, which includes
// fewer query heads than key/value heads) are refused by validation, the engine and the
// reference alike, with a message that names both counts.
TEST(AttentionDifferential, RejectsHeadGroupingsThatDoNotDivide) {
  std::mt19937_64 rng(static_cast<uint64_t>(EnvInt("ATTEND_DIFF_SEED", kDefaultSeed)));
  for (int n = 0; n < 30; ++n) {
    const int64_t n_head_kv = Uniform(rng, 2, 9);
    int64_t n_head = Uniform(rng, 1, 40);
    if (n_head % n_head_kv == 0) ++n_head;
    const std::vector<float> x(static_cast<size_t>(3 * n_head * 4 + 3 * n_head_kv * 4), 0.5f);
    const TensorView q{DType::kFloat32, {3, n_head, 4}, x.data()};
    const TensorView kv{DType::kFloat32, {3, n_head_kv, 4}, x.data()};
    const std::vector<std::string> names = {absl::StrCat("n_head ", n_head),
                                            absl::StrCat("n_head_kv ", n_head_kv)};
    SCOPED_TRACE(absl::StrCat("n_head ", n_head, ", n_head_kv ", n_head_kv));
    EXPECT_THAT(ValidateAttention(q, kv, kv, {}, {}),
                StatusIs(absl::StatusCode::kInvalidArgument, names));
    std::vector<float> out(static_cast<size_t>(3 * n_head * 4));
    EXPECT_THAT(AttentionEngine().Compute(q, kv, kv, {}, {}, absl::MakeSpan(out), {}, nullptr),
                StatusIs(absl::StatusCode::kInvalidArgument, names));
    EXPECT_THAT(ReferenceAttention(q, kv, kv, {}),
                StatusIs(absl::StatusCode::kInvalidArgument, names));
  }
}

}  // namespace
}  // namespace attend
