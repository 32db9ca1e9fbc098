// What the KV cache promises at its limits: a value its storage dtype cannot hold is refused
// before it is stored, a reservation holds for the sequence's own appends after a Fork, and a
// refusal under LRU says how much eviction could make room for.
#include <cmath>
#include <limits>
#include <random>

#include "absl/strings/str_cat.h"
#include "core/kv_cache/block_pool.h"
#include "core/kv_cache/kv_cache.h"
#include "tests/test_util.h"

namespace attend::kv {
namespace {

using ::attend::testing::RandomFloats;
using ::attend::testing::StatusIs;

SequenceConfig Config(DType dtype) {
  SequenceConfig c;
  c.layers = 1;
  c.n_head = 2;
  c.n_head_kv = 1;
  c.head_dim = 8;
  c.kv_dtype = dtype;
  return c;
}

KvCacheOptions Options(int64_t blocks, EvictionPolicy policy = EvictionPolicy::kNone) {
  KvCacheOptions options;
  options.capacity_bytes = blocks * 1024;
  options.block_bytes = 1024;
  options.eviction = policy;
  options.compute_threads = 1;
  return options;
}

struct Tokens {
  std::vector<float> q, k, v;
  AppendInput Input(const std::string& id, int64_t n, bool with_q) const {
    AppendInput in;
    in.id = id;
    if (with_q) in.q = TensorView{DType::kFloat32, {n, 2, 8}, q.data()};
    in.k = TensorView{DType::kFloat32, {n, 1, 8}, k.data()};
    in.v = TensorView{DType::kFloat32, {n, 1, 8}, v.data()};
    return in;
  }
};

Tokens Random(int64_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  return {RandomFloats(rng, n * 16), RandomFloats(rng, n * 8), RandomFloats(rng, n * 8)};
}

// 3.4e38 is a finite float32 that bfloat16 rounds to +inf: stored, it broke every later decode
// of the sequence ("q.k * scale overflowed"). It is refused, and the sequence is unchanged.
TEST(KvCacheLimits, ValuesBeyondTheStorageDtypeAreRefused) {
  KvCache cache(Options(64));
  ASSERT_OK(cache.Create(Config(DType::kBFloat16), "bf16", 0));
  ASSERT_OK(cache.Create(Config(DType::kFloat32), "f32", 0));
  for (const bool in_v : {false, true}) {
    Tokens t = Random(4, 1);
    (in_v ? t.v : t.k)[13] = 3.4e38f;
    EXPECT_THAT(cache.Append(0, t.Input("bf16", 4, false), Precision::kAuto, false, nullptr),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         {in_v ? "v" : "k", "element 13", "bfloat16 storage"}));
    EXPECT_EQ(cache.Get("bf16")->tokens, 0);
    // float32 storage holds it.
    EXPECT_OK(cache.Append(0, t.Input("f32", 4, false), Precision::kAuto, false, nullptr));
  }
  // The largest value bfloat16 holds is accepted, and decodes stay finite.
  Tokens t = Random(4, 2);
  t.v[0] = 3.38e38f;
  ASSERT_OK(cache.Append(0, t.Input("bf16", 4, false), Precision::kAuto, false, nullptr));
  Tokens step = Random(1, 3);
  EXPECT_OK(cache.Append(0, step.Input("bf16", 1, true), Precision::kAuto, false, nullptr));
}

// int8 storage of a row whose largest magnitude is below 127 / FLT_MAX (about 3.7e-37): 127 / max
// overflows float, and quantizing by that +inf turned every nonzero value into +-127 and every
// zero into NaN (undefined behaviour when converted to int8). A query of zeros attends equally
// to the one token, so the output is the stored v as read back.
TEST(KvCacheLimits, Int8StoresRowsOfTinyValues) {
  KvCache cache(Options(64));
  ASSERT_OK(cache.Create(Config(DType::kInt8), "tiny", 0));
  const std::vector<float> row = {1e-38f, 5e-39f, 0.0f, -1e-38f, 2.5e-39f, 0.0f, 1e-45f, 7.5e-39f};
  Tokens t{std::vector<float>(16, 0.0f), row, row};
  auto result = cache.Append(0, t.Input("tiny", 1, true), Precision::kAuto, false, nullptr);
  ASSERT_OK(result);
  ASSERT_EQ(result->output.size(), 16u);
  for (size_t i = 0; i < 16; ++i) {
    // One int8 step of this row is 1e-38 / 127; half of it is the rounding error.
    EXPECT_NEAR(result->output[i], row[i % 8], 1e-38 / 254 * 1.01) << "element " << i;
  }
}

// int8 rows whose scale max / 127 is a subnormal float (max below about 1.5e-36): the scale keeps
// fewer bits, and values quantized against the exact 127 / max were read back off by the
// scale's rounding times up to 127, past the documented max / 254 (an outside tester's finding,
// through decode). Generated rows from 1e-36 down to 1e-43: each value read back is within
// max / 254 of the original, plus half of float's smallest step (what an f32 scale can hold).
TEST(KvCacheLimits, Int8RowsOfSubnormalScaleKeepTheirBound) {
  std::mt19937_64 rng(41);
  std::uniform_real_distribution<double> unit(-1.0, 1.0);
  KvCache cache(Options(64));
  int case_index = 0;
  for (const double size : {1e-36, 3e-37, 1e-38, 1e-40, 3e-42, 1e-43}) {
    for (int rep = 0; rep < 20; ++rep) {
      const std::string id = "tiny" + std::to_string(case_index++);
      ASSERT_OK(cache.Create(Config(DType::kInt8), id, 0));
      std::vector<float> row(8);
      for (float& x : row) x = static_cast<float>(size * unit(rng));
      Tokens t{std::vector<float>(16, 0.0f), row, row};
      auto result = cache.Append(0, t.Input(id, 1, true), Precision::kAuto, false, nullptr);
      ASSERT_OK(result);
      double max = 0;
      for (float x : row) max = std::max(max, std::abs(double{x}));
      for (size_t i = 0; i < 16; ++i) {
        EXPECT_LE(std::abs(result->output[i] - double{row[i % 8]}),
                  max / 254 * (1 + 1e-6) + std::ldexp(1.0, -150))
            << "values of " << size << ", element " << i << ": " << row[i % 8] << " read back as "
            << result->output[i];
      }
      ASSERT_OK(cache.Release(id));
    }
  }
}

// int8 values at and next to the midpoints between two steps, where float32's rounding of the
// scale, of 127 / max and of x * (127 / max) decides the side (an outside tester found values a
// step off round(x / s) there, 1.0000013 x max / 254 from the original): each value read back is
// within the documented max / 254 x (1 + 2^-14). The generated cases reach past max / 254 itself
// (checked), so they are the ones the bound is about.
TEST(KvCacheLimits, Int8ValuesNextToMidpointsKeepTheirBound) {
  std::mt19937_64 rng(43);
  std::uniform_real_distribution<double> size(0.5, 300.0);
  KvCache cache(Options(64));
  double worst = 0;  // the largest error over max / 254
  for (int case_index = 0; case_index < 60; ++case_index) {
    const std::string id = "ties" + std::to_string(case_index);
    ASSERT_OK(cache.Create(Config(DType::kInt8), id, 0));
    const float max = static_cast<float>(size(rng));
    const double step = double{max / 127.0f};
    std::vector<float> row(8);
    row[0] = case_index % 2 == 0 ? max : -max;
    for (size_t i = 1; i < row.size(); ++i) {
      // Midpoint k + 1/2 of a random step, moved by up to three float steps either way.
      const int k = static_cast<int>(rng() % 126);
      float x = static_cast<float>((k + 0.5) * step);
      for (int move = static_cast<int>(rng() % 7) - 3; move != 0; move += move > 0 ? -1 : 1) {
        x = std::nextafter(x, move > 0 ? 1e30f : 0.0f);
      }
      row[i] = rng() % 2 ? x : -x;
    }
    Tokens t{std::vector<float>(16, 0.0f), row, row};
    auto result = cache.Append(0, t.Input(id, 1, true), Precision::kAuto, false, nullptr);
    ASSERT_OK(result);
    for (size_t i = 0; i < 16; ++i) {
      const double error = std::abs(result->output[i] - double{row[i % 8]});
      worst = std::max(worst, error / (double{max} / 254));
      EXPECT_LE(error, double{max} / 254 * (1 + std::ldexp(1.0, -14)))
          << "max " << max << ", element " << i << ": " << row[i % 8] << " read back as "
          << result->output[i];
    }
    ASSERT_OK(cache.Release(id));
  }
  EXPECT_GT(worst, 1.0) << "no case reached past max / 254: the midpoints were missed";
}

// A reservation covers the sequence's own appends also after a Fork shares its partly written
// last block: the fork takes its own copy of that block at once, so the source never has to copy
// it, however full the cache is by then.
TEST(KvCacheLimits, AReservationHoldsAfterAFork) {
  KvCache cache(Options(8));                                  // 16 tokens per block of this shape
  ASSERT_OK(cache.Create(Config(DType::kFloat32), "r", 64));  // 4 blocks
  const Tokens t = Random(64, 4);
  ASSERT_OK(cache.Append(0, t.Input("r", 50, false), Precision::kAuto, false, nullptr));
  ASSERT_OK(cache.Fork("r", "fork", std::nullopt));
  ASSERT_OK(cache.Create(Config(DType::kFloat32), "other", 0));
  const int64_t free = cache.Stats().blocks_free;
  const Tokens fill = Random(16 * free, 5);
  ASSERT_OK(
      cache.Append(0, fill.Input("other", 16 * free, false), Precision::kAuto, false, nullptr));
  ASSERT_EQ(cache.Stats().blocks_free, 0);
  for (int i = 50; i < 64; ++i) {
    ASSERT_OK(cache.Append(0, t.Input("r", 1, true), Precision::kAuto, false, nullptr))
        << "token " << i;
  }
  ASSERT_OK(cache.CheckConsistency());
}

// Under LRU, a refusal's "how much fits" counts what evicting idle sequences would free.
TEST(KvCacheLimits, LruRefusalsCountWhatEvictionWouldFree) {
  KvCache cache(Options(8, EvictionPolicy::kLru));
  const Tokens t = Random(200, 6);
  ASSERT_OK(cache.Create(Config(DType::kFloat32), "idle", 0));
  ASSERT_OK(cache.Append(0, t.Input("idle", 128, false), Precision::kAuto, false, nullptr));
  ASSERT_OK(cache.Create(Config(DType::kFloat32), "s", 0));
  EXPECT_THAT(cache.Append(0, t.Input("s", 200, false), Precision::kAuto, false, nullptr),
              StatusIs(absl::StatusCode::kResourceExhausted, {"at most about 128 more tokens"}));
  ASSERT_OK(cache.Append(0, t.Input("s", 128, false), Precision::kAuto, false, nullptr));
}

// Each sequence's bookkeeping (its layers' block tables, outside the blocks themselves) counts
// against a limit of its own (found from outside: with a 64 MiB cache, 3,000 empty sequences of
// 4,096 layers took 379 MiB of memory while the cache reported 0 bytes used). Sequences are
// created until one is refused; the refusal names the limit, nothing was half-created, and the
// bookkeeping the cache reports never passes it. Then forks of a sequence with many blocks per
// layer (each fork copies the block tables, sharing every block) meet the same limit.
TEST(KvCacheLimits, BookkeepingPerSequenceIsBounded) {
  KvCacheOptions options;
  options.capacity_bytes = int64_t{64} << 20;
  options.block_bytes = 64;
  options.max_bookkeeping_bytes = int64_t{8} << 20;
  options.compute_threads = 1;
  KvCache cache(options);
  SequenceConfig config = Config(DType::kFloat32);
  config.layers = 4096;
  config.n_head = 2;
  config.n_head_kv = 1;
  config.head_dim = 4;
  int64_t created = 0;
  absl::Status refused;
  for (; created < 3000; ++created) {
    auto made = cache.Create(config, absl::StrCat("empty-", created), 0);
    if (!made.ok()) {
      refused = made.status();
      break;
    }
    ASSERT_LE(cache.Stats().bookkeeping_bytes, options.max_bookkeeping_bytes);
  }
  EXPECT_THAT(refused,
              StatusIs(absl::StatusCode::kResourceExhausted,
                       {"bookkeeping", "4096 layers", "--kv_bookkeeping_bytes", "8.00 MiB"}));
  // Each sequence of 4096 layers needs at least 4096 block tables.
  EXPECT_LE(created * 4096 * int64_t{24}, options.max_bookkeeping_bytes);
  EXPECT_GT(created, 0);
  EXPECT_EQ(cache.Stats().sequences, created);
  ASSERT_TRUE(cache.CheckConsistency().ok());
  // Releasing gives the room back.
  for (int64_t i = 0; i < created; ++i) ASSERT_TRUE(cache.Release(absl::StrCat("empty-", i)).ok());
  EXPECT_EQ(cache.Stats().bookkeeping_bytes, 0);

  // One sequence of 4 layers holding 8192 blocks per layer, then forks of it: every fork shares
  // all of them, but its tables take 16 bytes a block.
  SequenceConfig wide = config;
  wide.layers = 4;
  ASSERT_TRUE(cache.Create(wide, "wide", 0).ok());
  const std::vector<float> zeros(16384 * 4, 0.0f);
  AppendInput in;
  in.id = "wide";
  in.k = TensorView{DType::kFloat32, {16384, 1, 4}, zeros.data()};
  in.v = in.k;
  const int64_t empty_wide = cache.Stats().bookkeeping_bytes;
  for (int64_t l = 0; l < wide.layers; ++l) {
    ASSERT_TRUE(cache.Append(l, in, Precision::kFloat32, false, nullptr).ok());
  }
  // Appended blocks are counted (16 bytes a reference; 2 tokens a 64-byte block here), though
  // an append is never refused for them.
  EXPECT_EQ(cache.Stats().bookkeeping_bytes - empty_wide,
            wide.layers * 8192 * static_cast<int64_t>(sizeof(BlockRef)));
  int64_t forks = 0;
  absl::Status fork_refused;
  for (; forks < 1000; ++forks) {
    auto fork = cache.Fork("wide", absl::StrCat("fork-", forks), std::nullopt);
    if (!fork.ok()) {
      fork_refused = fork.status();
      break;
    }
  }
  EXPECT_THAT(fork_refused, StatusIs(absl::StatusCode::kResourceExhausted,
                                     {"bookkeeping", "--kv_bookkeeping_bytes"}));
  EXPECT_LE(cache.Stats().bookkeeping_bytes, options.max_bookkeeping_bytes);
  EXPECT_LE(forks * 4 * 8192 * int64_t{16}, options.max_bookkeeping_bytes);
  ASSERT_TRUE(cache.CheckConsistency().ok());
  // A truncate gives its tables' room back; releasing everything leaves nothing charged.
  const int64_t before_truncate = cache.Stats().bookkeeping_bytes;
  ASSERT_TRUE(cache.Truncate("fork-0", 0).ok());
  EXPECT_EQ(before_truncate - cache.Stats().bookkeeping_bytes,
            wide.layers * 8192 * static_cast<int64_t>(sizeof(BlockRef)));
  ASSERT_TRUE(cache.Release("wide").ok());
  for (int64_t i = 0; i < forks; ++i) ASSERT_TRUE(cache.Release(absl::StrCat("fork-", i)).ok());
  EXPECT_EQ(cache.Stats().bookkeeping_bytes, 0);
}

}  // namespace
}  // namespace attend::kv
