// The KV cache: cached attention equals one-shot attention, forks share blocks copy-on-write,
// the byte budget is exact, eviction picks the right sequence, and bad input changes nothing.
#include "core/kv_cache/kv_cache.h"

#include <cmath>
#include <limits>
#include <random>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/half.h"
#include "core/attention/testing/reference_attention.h"
#include "core/attention/tile_attention.h"
#include "core/kernels/onednn.h"
#include "core/kernels/simd.h"
#include "tests/test_util.h"

namespace attend::kv {
namespace {

using ::attend::testing::RandomFloats;
using ::attend::testing::StatusIs;

struct Shape {
  int64_t n_head, n_head_kv, head_dim;
};

// A whole sequence's q/k/v, for feeding a cache in pieces and for the reference.
struct Tokens {
  int64_t n;
  Shape shape;
  std::vector<float> q, k, v;

  TensorView Q(int64_t from, int64_t count) const {
    return {DType::kFloat32,
            {count, shape.n_head, shape.head_dim},
            q.data() + from * shape.n_head * shape.head_dim};
  }
  TensorView K(int64_t from, int64_t count) const {
    return {DType::kFloat32,
            {count, shape.n_head_kv, shape.head_dim},
            k.data() + from * shape.n_head_kv * shape.head_dim};
  }
  TensorView V(int64_t from, int64_t count) const {
    return {DType::kFloat32,
            {count, shape.n_head_kv, shape.head_dim},
            v.data() + from * shape.n_head_kv * shape.head_dim};
  }
  AppendInput Input(const std::string& id, int64_t from, int64_t count, bool with_q = true) const {
    AppendInput in;
    in.id = id;
    if (with_q) in.q = Q(from, count);
    in.k = K(from, count);
    in.v = V(from, count);
    return in;
  }
};

Tokens MakeTokens(int64_t n, Shape shape, uint64_t seed) {
  std::mt19937_64 rng(seed);
  Tokens t{n, shape, {}, {}, {}};
  t.q = RandomFloats(rng, n * shape.n_head * shape.head_dim);
  t.k = RandomFloats(rng, n * shape.n_head_kv * shape.head_dim);
  t.v = RandomFloats(rng, n * shape.n_head_kv * shape.head_dim);
  return t;
}

std::vector<float> Rounded(std::vector<float> x) {
  for (float& e : x) e = Bf16ToFloat(FloatToBf16(e));
  return x;
}

// Causal reference over the first `n` tokens (k/v rounded to bf16 when stored as bf16).
// (int8 storage is compared with the exact values: its error is what the tolerance allows.)
std::vector<double> ReferenceOutput(const Tokens& t, int64_t n, DType storage, int64_t window = 0) {
  const bool bf16 = storage == DType::kBFloat16;
  std::vector<float> q = bf16 ? Rounded(t.q) : t.q, k = bf16 ? Rounded(t.k) : t.k,
                     v = bf16 ? Rounded(t.v) : t.v;
  AttentionOptions options;
  options.mask.causal = true;
  options.mask.window = window;
  const Shape& s = t.shape;
  auto result =
      ReferenceAttention({DType::kFloat32, {n, s.n_head, s.head_dim}, q.data()},
                         {DType::kFloat32, {n, s.n_head_kv, s.head_dim}, k.data()},
                         {DType::kFloat32, {n, s.n_head_kv, s.head_dim}, v.data()}, options);
  EXPECT_TRUE(result.ok()) << result.status();
  return result->output;
}

KvCacheOptions SmallCache(int64_t capacity = int64_t{64} << 20, int64_t block_bytes = 8192) {
  KvCacheOptions options;
  options.capacity_bytes = capacity;
  options.block_bytes = block_bytes;
  return options;
}

SequenceConfig Config(Shape s, DType dtype, int64_t layers = 2, int64_t window = 0) {
  SequenceConfig c;
  c.layers = layers;
  c.n_head = s.n_head;
  c.n_head_kv = s.n_head_kv;
  c.head_dim = s.head_dim;
  c.kv_dtype = dtype;
  c.window = window;
  return c;
}

// Feeds `t` into layer 1 of a fresh sequence in chunks and checks every chunk's output against
// the reference rows of its positions.
void CheckChunks(Shape shape, DType dtype, const std::vector<int64_t>& chunks, int64_t window = 0) {
  int64_t total = 0;
  for (int64_t c : chunks) total += c;
  const Tokens t = MakeTokens(total, shape, 42 + total);
  const std::vector<double> expected = ReferenceOutput(t, total, dtype, window);
  KvCache cache(SmallCache());
  auto created = cache.Create(Config(shape, dtype, 2, window), "s", 0);
  ASSERT_TRUE(created.ok()) << created.status();
  // int8: each stored value is off by up to max|row| / 254 (about 1.5% of a row's largest).
  const double tolerance = dtype == DType::kInt8 ? 6e-2 : (dtype == DType::kBFloat16 ? 2e-2 : 2e-5);
  int64_t from = 0;
  for (int64_t count : chunks) {
    auto result = cache.Append(1, t.Input("s", from, count), Precision::kAuto, false, nullptr);
    ASSERT_TRUE(result.ok()) << result.status();
    EXPECT_EQ(result->first_position, from);
    EXPECT_EQ(result->layer_tokens, from + count);
    const int64_t row = shape.n_head * shape.head_dim;
    for (int64_t i = 0; i < count * row; ++i) {
      ASSERT_NEAR(result->output[i], expected[from * row + i], tolerance)
          << "token " << from + i / row << " of chunk starting at " << from;
    }
    from += count;
  }
  auto info = cache.Get("s");
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->layer_tokens, (std::vector<int64_t>{0, total}));
}

class CachedEqualsOneShot : public ::testing::TestWithParam<std::tuple<Shape, DType>> {};

TEST_P(CachedEqualsOneShot, PrefillInOneAppend) {
  const auto [shape, dtype] = GetParam();
  CheckChunks(shape, dtype, {150});
}

TEST_P(CachedEqualsOneShot, TokenByTokenDecode) {
  const auto [shape, dtype] = GetParam();
  CheckChunks(shape, dtype, std::vector<int64_t>(70, 1));
}

TEST_P(CachedEqualsOneShot, RandomChunks) {
  const auto [shape, dtype] = GetParam();
  std::mt19937_64 rng(static_cast<uint64_t>(shape.n_head * 131 + shape.n_head_kv));
  std::vector<int64_t> chunks;
  for (int i = 0; i < 12; ++i) chunks.push_back(1 + static_cast<int64_t>(rng() % 40));
  CheckChunks(shape, dtype, chunks);
}

// Long appends: a first prefill of several key tiles, one over an existing context, then short
// appends (the matmul path over many blocks, including partial ones).
TEST_P(CachedEqualsOneShot, LongPrefills) {
  const auto [shape, dtype] = GetParam();
  CheckChunks(shape, dtype, {300, 700, 20, 1});
}

INSTANTIATE_TEST_SUITE_P(KvCache, CachedEqualsOneShot,
                         ::testing::Combine(::testing::Values(Shape{4, 4, 16},  // MHA
                                                              Shape{8, 2, 32},  // GQA
                                                              Shape{4, 1, 8}),  // MQA
                                            ::testing::Values(DType::kFloat32, DType::kBFloat16,
                                                              DType::kInt8)),
                         [](const auto& test_param) {
                           const Shape s = std::get<0>(test_param.param);
                           return absl::StrCat("h", s.n_head, "_kv", s.n_head_kv, "_d", s.head_dim,
                                               "_", DTypeName(std::get<1>(test_param.param)));
                         });

// The first sequence of a shape creates the primitives its prefills use, so that no Append
// (of any length, in any chunks) creates one: that would cost ~0.3 ms each on the request path.
// n_head_kv left 0 (a client that leaves the proto field unset) means multi-head attention: one
// key/value head per query head, as the proto documents; the shape checks then hold for that.
TEST(KvCache, UnsetKeyValueHeadsMeansOnePerQueryHead) {
  KvCache cache(SmallCache(int64_t{64} << 20, int64_t{256} << 10));
  auto created = cache.Create(Config(Shape{4, 0, 32}, DType::kFloat32, 1), "mha", 0);
  ASSERT_OK(created);
  EXPECT_EQ(created->config.n_head_kv, 4);
  const Tokens t = MakeTokens(3, Shape{4, 4, 32}, 5);
  EXPECT_OK(cache.Append(0, t.Input("mha", 0, 3), Precision::kAuto, false, nullptr));
}

TEST(KvCache, CreateWarmsUpThePrefillPrimitives) {
  const Shape shape{8, 2, 64};
  for (DType dtype : {DType::kFloat32, DType::kBFloat16, DType::kInt8}) {
    SCOPED_TRACE(DTypeName(dtype));
    KvCache cache(SmallCache(int64_t{64} << 20, int64_t{256} << 10));
    ASSERT_OK(cache.Create(Config(shape, dtype, 1), "s", 0));
    const int64_t created = onednn::MatmulCreations();
    const Tokens t = MakeTokens(900, shape, 7);
    int64_t from = 0;
    for (int64_t count : {1, 5, 17, 64, 100, 300, 13, 400}) {
      ASSERT_OK(cache.Append(0, t.Input("s", from, count), Precision::kAuto, false, nullptr));
      from += count;
    }
    EXPECT_EQ(onednn::MatmulCreations(), created);
  }
}

TEST(KvCache, SlidingWindowMatchesTheReference) {
  CheckChunks({4, 2, 16}, DType::kFloat32, {30, 1, 1, 50, 7}, /*window=*/24);
  // Long appends after the window has released the blocks behind it.
  CheckChunks({4, 2, 16}, DType::kFloat32, {300, 40, 600, 3}, /*window=*/100);
  CheckChunks({4, 2, 16}, DType::kInt8, {500, 300}, /*window=*/700);
}

// A sliding window releases the blocks no later query can see, so memory stays bounded, and the
// answers still match the reference.
TEST(KvCache, SlidingWindowReleasesBlocksBehindIt) {
  const Shape shape{1, 1, 16};  // 128 bytes a token: 32 tokens per 4096-byte block
  KvCache cache(SmallCache(int64_t{1} << 20, 4096));
  ASSERT_OK(cache.Create(Config(shape, DType::kFloat32, 1, /*window=*/40), "w", 0));
  const Tokens t = MakeTokens(300, shape, 21);
  const std::vector<double> expected = ReferenceOutput(t, 300, DType::kFloat32, 40);
  int64_t from = 0;
  while (from < 300) {
    const int64_t n = std::min<int64_t>(7, 300 - from);
    auto result = cache.Append(0, t.Input("w", from, n), Precision::kAuto, false, nullptr);
    ASSERT_TRUE(result.ok()) << result.status();
    for (int64_t i = 0; i < n * 16; ++i)
      ASSERT_NEAR(result->output[i], expected[from * 16 + i], 2e-5);
    from += n;
    // The window (40) plus a partial block on each side: never more than 3 blocks.
    EXPECT_LE(cache.Get("w")->blocks, 3) << "after " << from << " tokens";
  }
  EXPECT_EQ(cache.Stats().blocks_used, cache.Get("w")->blocks);
  // Keys before token 256 are gone: a length that would need them is refused.
  EXPECT_THAT(cache.Truncate("w", 294), StatusIs(absl::StatusCode::kOutOfRange,
                                                 {"released the keys before token 256", "295"}));
  EXPECT_THAT(cache.Fork("w", "f", 100), StatusIs(absl::StatusCode::kOutOfRange, {"fork at 100"}));
  // A negative length is bad input, whatever the source holds.
  EXPECT_THAT(cache.Fork("w", "f", -1),
              StatusIs(absl::StatusCode::kInvalidArgument, {"tokens: -1", ">= 0"}));
  EXPECT_OK(cache.Truncate("w", 295));
}

// Appends `first` tokens, then the rest of `total` with weights, and checks the second append's
// weights and outputs against the reference over all `total` keys.
void CheckWeightsOfASecondAppend(int64_t total, int64_t first, uint64_t seed) {
  const Shape shape{4, 2, 8};
  const Tokens t = MakeTokens(total, shape, seed);
  KvCache cache(SmallCache());
  ASSERT_OK(cache.Create(Config(shape, DType::kFloat32), "s", 0));
  ASSERT_OK(cache.Append(0, t.Input("s", 0, first), Precision::kAuto, false, nullptr));
  auto result =
      cache.Append(0, t.Input("s", first, total - first), Precision::kAuto, true, nullptr);
  ASSERT_TRUE(result.ok()) << result.status();
  AttentionOptions options;
  options.mask.causal = true;
  auto reference =
      ReferenceAttention(t.Q(first, total - first), t.K(0, total), t.V(0, total), options);
  ASSERT_TRUE(reference.ok());
  ASSERT_EQ(result->weights.size(), reference->weights.size());
  for (size_t i = 0; i < result->weights.size(); ++i) {
    ASSERT_NEAR(result->weights[i], reference->weights[i], 1e-5) << i;
  }
  for (size_t i = 0; i < result->output.size(); ++i) {
    ASSERT_NEAR(result->output[i], reference->output[i], 2e-5) << i;
  }
}

TEST(KvCache, WeightsMatchTheReference) { CheckWeightsOfASecondAppend(20, 12, 3); }

// A long append over an existing context (the matmul path over many blocks).
TEST(KvCache, WeightsOfALongAppendMatchTheReference) { CheckWeightsOfASecondAppend(900, 300, 5); }

// int8 storage rounds each value / scale half to even: with one cached token, the output is that
// token's dequantized values exactly. Row max 127 gives scale 1, so 63.5 -> 64, 0.5 -> 0,
// 1.5 -> 2, -2.5 -> -2 (half away from zero would give 1, -3; truncation 63, 1, -2).
TEST(KvCache, Int8StorageRoundsHalfToEven) {
  const Shape shape{1, 1, 8};
  KvCache cache(SmallCache());
  ASSERT_OK(cache.Create(Config(shape, DType::kInt8, 1), "s", 0));
  const std::vector<float> q(8, 0.0f);
  const std::vector<float> k = {1, 2, 3, 4, 5, 6, 7, 8};
  const std::vector<float> v = {127.0f, 63.5f, 0.5f, 1.5f, -2.5f, -0.5f, 3.25f, -127.0f};
  AppendInput in;
  in.id = "s";
  in.q = TensorView{DType::kFloat32, {1, 1, 8}, q.data()};
  in.k = {DType::kFloat32, {1, 1, 8}, k.data()};
  in.v = {DType::kFloat32, {1, 1, 8}, v.data()};
  auto result = cache.Append(0, in, Precision::kAuto, false, nullptr);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->output, (std::vector<float>{127, 64, 0, 2, -2, 0, 3, -127}));
}

// What an Append accepts can be read back: a key or value row whose largest |value| is near
// FLT_MAX (found from outside: v = [FLT_MAX, 1, -2, 0.5] was stored in int8 with a scale whose
// 127 multiple overflows, so every later step on the layer failed "not finite"). For each storage
// dtype and each extreme value, either the Append is refused, or it and every later step (an
// Append and a DecodeBatch of ordinary tokens) succeed with finite outputs; float32 storage, which
// stores the values as given, must accept all of them.
TEST(KvCache, WhatAnAppendAcceptsCanBeReadBack) {
  const float big = std::numeric_limits<float>::max();
  const std::vector<float> extremes = {
      big, -big, std::nextafter(big, 0.0f), 3.0e38f, 0x1p127f, 1.0e38f, -2.9e38f};
  const std::vector<float> q = {0.1f, -0.2f, 0.3f, 0.05f, -0.7f, 0.4f, 0.2f, -0.1f};
  const std::vector<float> plain = {0.1f, 0.2f, 0.3f, 0.4f};
  for (const Shape& shape : {Shape{1, 1, 4}, Shape{2, 1, 4}}) {
    for (DType dtype : {DType::kFloat32, DType::kBFloat16, DType::kInt8}) {
      for (float x : extremes) {
        for (bool in_key : {false, true}) {
          for (bool first_with_q : {false, true}) {
            SCOPED_TRACE(absl::StrCat(shape.n_head, " heads, ", DTypeName(dtype), ", ",
                                      in_key ? "k" : "v", " holds ", x,
                                      first_with_q ? ", with q" : ", no q"));
            KvCache cache(SmallCache());
            ASSERT_OK(cache.Create(Config(shape, dtype, 1), "s", 0));
            const std::vector<float> extreme = {x, 1.0f, -2.0f, 0.5f};
            AppendInput in;
            in.id = "s";
            if (first_with_q) in.q = TensorView{DType::kFloat32, {1, shape.n_head, 4}, q.data()};
            in.k = {DType::kFloat32, {1, 1, 4}, in_key ? extreme.data() : plain.data()};
            in.v = {DType::kFloat32, {1, 1, 4}, in_key ? plain.data() : extreme.data()};
            auto first = cache.Append(0, in, Precision::kAuto, false, nullptr);
            if (!first.ok()) {
              EXPECT_NE(dtype, DType::kFloat32) << first.status();
              EXPECT_EQ(first.status().code(), absl::StatusCode::kInvalidArgument)
                  << first.status();
              continue;
            }
            for (float o : first->output) EXPECT_TRUE(std::isfinite(o)) << o;
            in.q = TensorView{DType::kFloat32, {1, shape.n_head, 4}, q.data()};
            in.k = {DType::kFloat32, {1, 1, 4}, plain.data()};
            in.v = {DType::kFloat32, {1, 1, 4}, plain.data()};
            auto second = cache.Append(0, in, Precision::kAuto, false, nullptr);
            ASSERT_TRUE(second.ok()) << second.status();
            auto step = cache.DecodeBatch(0, {in}, Precision::kAuto, nullptr);
            ASSERT_TRUE(step.ok()) << step.status();
            for (float o : (*step)[0].output) EXPECT_TRUE(std::isfinite(o)) << o;
          }
        }
      }
    }
  }
}

TEST(KvCache, DecodeBatchEqualsSeparateAppends) {
  const Shape shape{8, 2, 16};
  KvCache batched(SmallCache()), separate(SmallCache());
  std::vector<Tokens> tokens;
  std::vector<std::string> ids;
  for (int s = 0; s < 5; ++s) {
    tokens.push_back(MakeTokens(40, shape, 100 + s));
    ids.push_back(absl::StrCat("seq", s));
    for (KvCache* cache : {&batched, &separate}) {
      ASSERT_OK(
          cache->Create(Config(shape, s % 2 ? DType::kBFloat16 : DType::kFloat32), ids[s], 0));
      ASSERT_OK(cache->Append(0, tokens[s].Input(ids[s], 0, 10 + 5 * s), Precision::kAuto, false,
                              nullptr));
    }
  }
  std::vector<AppendInput> step;
  for (int s = 0; s < 5; ++s) step.push_back(tokens[s].Input(ids[s], 10 + 5 * s, 1));
  AttentionStats stats;
  auto results = batched.DecodeBatch(0, step, Precision::kAuto, &stats);
  ASSERT_TRUE(results.ok()) << results.status();
  for (int s = 0; s < 5; ++s) {
    auto single = separate.Append(0, step[s], Precision::kAuto, false, nullptr);
    ASSERT_TRUE(single.ok());
    EXPECT_EQ((*results)[s].layer_tokens, 11 + 5 * s);
    for (size_t i = 0; i < single->output.size(); ++i) {
      EXPECT_NEAR((*results)[s].output[i], single->output[i], 1e-6);
    }
  }
  EXPECT_EQ(stats.attended_pairs, 8 * (11 + 16 + 21 + 26 + 31));
  // f32 and bf16 sequences in one batch: the engine names both arithmetics.
  EXPECT_EQ(stats.engine.rfind("onednn-paged/f32,bf16", 0), 0u) << stats.engine;
}

// The engine names the kernel set of each storage type a decode step read: one name where they
// agree, each type's where they differ (here pinned to differ).
TEST(KvCache, DecodeBatchNamesTheKernelSetOfEachStorageType) {
  const std::string last = simd::testing::RunnableKernels().back();
  const simd::testing::ScopedKernels kernels("f32:scalar,bf16:" + last + ",int8:" + last);
  ASSERT_TRUE(kernels.ok());
  const Shape shape{8, 2, 16};
  KvCache cache(SmallCache());
  std::vector<Tokens> tokens;
  const DType storage[] = {DType::kFloat32, DType::kBFloat16, DType::kInt8};
  const std::string ids[] = {"f32", "bf16", "int8"};
  for (int s = 0; s < 3; ++s) {
    tokens.push_back(MakeTokens(20, shape, 200 + s));
    ASSERT_OK(cache.Create(Config(shape, storage[s]), ids[s], 0));
    ASSERT_OK(cache.Append(0, tokens[s].Input(ids[s], 0, 10), Precision::kAuto, false, nullptr));
  }
  auto engine = [&](std::vector<int> sequences, int64_t token) {
    std::vector<AppendInput> step;
    for (int s : sequences) step.push_back(tokens[s].Input(ids[s], token, 1));
    AttentionStats stats;
    EXPECT_TRUE(cache.DecodeBatch(0, step, Precision::kAuto, &stats).ok());
    return stats.engine;
  };
  const std::string bf16_int8 = engine({1, 2}, 10);
  EXPECT_TRUE(absl::EndsWith(bf16_int8, "+" + last)) << bf16_int8;
  const std::string all = engine({0, 1, 2}, 11);
  if (last != "scalar") {
    EXPECT_TRUE(absl::EndsWith(all, "+f32:scalar,bf16:" + last + ",int8:" + last)) << all;
  }
  const std::string f32 = engine({0}, 12);
  EXPECT_TRUE(absl::EndsWith(f32, "+scalar")) << f32;
}

// AppendBatch over ragged token counts (prompts, decode steps, only-appends, f32/bf16/int8
// storage) gives each sequence what its own Append would: generated rounds of random counts.
TEST(KvCache, AppendBatchEqualsSeparateAppends) {
  const Shape shape{4, 2, 16};
  std::mt19937_64 rng(77);
  for (int round = 0; round < 6; ++round) {
    SCOPED_TRACE(absl::StrCat("round ", round));
    KvCache batched(SmallCache()), separate(SmallCache());
    const int count = 1 + static_cast<int>(rng() % 6);
    std::vector<Tokens> tokens;
    std::vector<std::string> ids;
    std::vector<int64_t> cached, fresh;
    for (int s = 0; s < count; ++s) {
      cached.push_back(static_cast<int64_t>(rng() % 40));
      fresh.push_back(1 + static_cast<int64_t>(rng() % (rng() % 2 ? 1 : 300)));
      tokens.push_back(MakeTokens(cached[s] + fresh[s], shape, 1000 * round + s));
      ids.push_back(absl::StrCat("seq", s));
      const DType dtype = s % 3 == 0   ? DType::kFloat32
                          : s % 3 == 1 ? DType::kBFloat16
                                       : DType::kInt8;
      for (KvCache* cache : {&batched, &separate}) {
        ASSERT_OK(cache->Create(Config(shape, dtype, 2), ids[s], 0));
        if (cached[s] > 0) {
          ASSERT_OK(cache->Append(1, tokens[s].Input(ids[s], 0, cached[s]), Precision::kAuto, false,
                                  nullptr));
        }
      }
    }
    std::vector<AppendInput> batch;
    for (int s = 0; s < count; ++s) {
      // Every third only appends (no queries, no output).
      batch.push_back(tokens[s].Input(ids[s], cached[s], fresh[s], /*with_q=*/s % 3 != 2));
    }
    auto results = batched.AppendBatch(1, batch, Precision::kAuto, nullptr);
    ASSERT_TRUE(results.ok()) << results.status();
    for (int s = 0; s < count; ++s) {
      auto single = separate.Append(1, batch[s], Precision::kAuto, false, nullptr);
      ASSERT_TRUE(single.ok()) << single.status();
      const AppendResult& r = (*results)[static_cast<size_t>(s)];
      EXPECT_EQ(r.first_position, cached[s]);
      EXPECT_EQ(r.layer_tokens, cached[s] + fresh[s]);
      ASSERT_EQ(r.output.size(), single->output.size());
      for (size_t i = 0; i < r.output.size(); ++i) {
        ASSERT_NEAR(r.output[i], single->output[i], 1e-5 * (1 + std::abs(single->output[i])))
            << "sequence " << s << ", element " << i;
      }
    }
    ASSERT_OK(batched.CheckConsistency());
  }
}

// A bad batch changes nothing: a sequence twice, an unknown id, a shape that does not match one
// sequence, a layer out of range; the error names the input.
TEST(KvCache, AppendBatchIsAllOrNothing) {
  const Shape shape{4, 2, 16};
  KvCache cache(SmallCache());
  const Tokens t = MakeTokens(20, shape, 5);
  ASSERT_OK(cache.Create(Config(shape, DType::kFloat32, 2), "a", 0));
  ASSERT_OK(cache.Create(Config(shape, DType::kFloat32, 2), "b", 0));
  ASSERT_OK(cache.Create(Config({4, 4, 16}, DType::kFloat32, 2), "wide", 0));
  const int64_t used = cache.Stats().used_bytes;
  const auto unchanged = [&] {
    for (const char* id : {"a", "b", "wide"}) {
      auto info = cache.Get(id);
      ASSERT_TRUE(info.ok());
      EXPECT_EQ(info->tokens, 0) << id;
    }
    EXPECT_EQ(cache.Stats().used_bytes, used);
  };
  EXPECT_THAT(
      cache.AppendBatch(0, {t.Input("a", 0, 5), t.Input("a", 5, 3)}, Precision::kAuto, nullptr),
      StatusIs(absl::StatusCode::kInvalidArgument,
               {"sequence_ids[1]", "appears twice", "sequence_ids[0]"}));
  unchanged();
  EXPECT_THAT(cache.AppendBatch(0, {t.Input("a", 0, 5), t.Input("nobody", 5, 3)}, Precision::kAuto,
                                nullptr),
              StatusIs(absl::StatusCode::kNotFound, {"sequence_ids[1]", "'nobody'"}));
  unchanged();
  EXPECT_THAT(
      cache.AppendBatch(0, {t.Input("a", 0, 5), t.Input("wide", 5, 3)}, Precision::kAuto, nullptr),
      StatusIs(absl::StatusCode::kInvalidArgument, {"sequence_ids[1]", "'wide'"}));
  unchanged();
  EXPECT_THAT(
      cache.AppendBatch(2, {t.Input("a", 0, 5), t.Input("b", 5, 3)}, Precision::kAuto, nullptr),
      StatusIs(absl::StatusCode::kInvalidArgument, {"sequence_ids[0]", "layer 2"}));
  unchanged();
  EXPECT_THAT(cache.AppendBatch(0, {}, Precision::kAuto, nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument, {"sequence_ids: empty"}));
  ASSERT_OK(
      cache.AppendBatch(0, {t.Input("a", 0, 5), t.Input("b", 5, 3)}, Precision::kAuto, nullptr));
  EXPECT_EQ(cache.Get("a")->layer_tokens[0], 5);
  EXPECT_EQ(cache.Get("b")->layer_tokens[0], 3);
}

TEST(KvCache, DecodeReadBytesIsWhatAStepOfTheSequencesReads) {
  const Shape shape{8, 2, 16};
  KvCache cache(SmallCache());
  const Tokens t = MakeTokens(40, shape, 7);
  ASSERT_OK(cache.Create(Config(shape, DType::kFloat32), "f32", 0));
  ASSERT_OK(cache.Create(Config(shape, DType::kInt8), "int8", 0));
  for (int64_t layer : {0, 1}) {
    ASSERT_OK(cache.Append(layer, t.Input("f32", 0, 30), Precision::kAuto, false, nullptr));
    ASSERT_OK(cache.Append(layer, t.Input("int8", 0, 12), Precision::kAuto, false, nullptr));
  }
  // Per token and layer: 2 heads x (16 + 16) values, int8 with a float scale for k and for v.
  const int64_t f32 = 30 * 2 * 32 * 4, int8 = 12 * 2 * (32 + 8);
  const std::vector<absl::string_view> both = {"f32", "int8"};
  EXPECT_EQ(cache.DecodeReadBytes(both), f32 + int8);
  const std::vector<absl::string_view> unknown = {"f32", "nobody", "f32"};
  EXPECT_EQ(cache.DecodeReadBytes(unknown), 2 * f32);  // unknown ids count nothing
  ASSERT_OK(cache.Release("int8"));
  const std::vector<absl::string_view> released = {"int8"};
  EXPECT_EQ(cache.DecodeReadBytes(released), 0);
}

TEST(KvCache, DecodeRunsOnCallingThreadBelowTheEnginesSerialThreshold) {
  // One layer of 8 f32 heads of 128 + 128 values: 8 KiB per token, so the threshold is a whole
  // number of tokens (128 at 1 MiB).
  const Shape shape{8, 8, 128};
  const int64_t token_bytes = 8 * (128 + 128) * 4;
  ASSERT_EQ(tile::kSerialDecodeBytes % token_bytes, 0);
  const int64_t limit = tile::kSerialDecodeBytes / token_bytes;
  KvCache cache(SmallCache());
  const Tokens t = MakeTokens(limit, shape, 3);
  ASSERT_OK(cache.Create(Config(shape, DType::kFloat32, 1), "a", 0));
  ASSERT_OK(cache.Create(Config(shape, DType::kFloat32, 1), "b", 0));
  const std::vector<absl::string_view> a = {"a"}, both = {"a", "b"};
  const std::vector<absl::string_view> none = {}, unknown = {"nobody"};
  EXPECT_TRUE(cache.DecodeRunsOnCallingThread(none));
  EXPECT_TRUE(cache.DecodeRunsOnCallingThread(unknown));  // nothing to read
  EXPECT_TRUE(cache.DecodeRunsOnCallingThread(a));        // empty

  ASSERT_OK(cache.Append(0, t.Input("a", 0, limit - 1), Precision::kAuto, false, nullptr));
  EXPECT_EQ(cache.DecodeReadBytes(a), tile::kSerialDecodeBytes - token_bytes);
  EXPECT_TRUE(cache.DecodeRunsOnCallingThread(a));
  // At the threshold the engine takes its threads: the comparison is strict, as tile::Run's.
  ASSERT_OK(cache.Append(0, t.Input("a", limit - 1, 1), Precision::kAuto, false, nullptr));
  EXPECT_FALSE(cache.DecodeRunsOnCallingThread(a));

  // The sequences of a step count together: two halves are one whole.
  ASSERT_OK(cache.Truncate("a", limit / 2));
  ASSERT_OK(cache.Append(0, t.Input("b", 0, limit / 2), Precision::kAuto, false, nullptr));
  EXPECT_TRUE(cache.DecodeRunsOnCallingThread(a));
  EXPECT_FALSE(cache.DecodeRunsOnCallingThread(both));
  ASSERT_OK(cache.Release("b"));
  EXPECT_TRUE(cache.DecodeRunsOnCallingThread(both));  // released ids read nothing
}

TEST(KvCache, ForkSharesBlocksUntilTheBranchesDiverge) {
  const Shape shape{2, 1, 16};
  KvCache cache(SmallCache(int64_t{1} << 20, 4096));  // 4096 / (1 x 32 x 2) = 64 tokens per block
  const Tokens t = MakeTokens(300, shape, 5);
  ASSERT_OK(cache.Create(Config(shape, DType::kBFloat16, 1), "a", 0));
  ASSERT_OK(cache.Append(0, t.Input("a", 0, 100), Precision::kAuto, false, nullptr));  // 2 blocks
  const int64_t used_before = cache.Stats().blocks_used;
  auto fork = cache.Fork("a", "b", std::nullopt);
  ASSERT_TRUE(fork.ok()) << fork.status();
  EXPECT_EQ(fork->tokens, 100);
  EXPECT_EQ(fork->blocks, 2);
  EXPECT_EQ(fork->shared_blocks, 2);
  EXPECT_EQ(fork->forked_from, "a");
  EXPECT_EQ(cache.Stats().blocks_used, used_before);  // nothing copied yet

  // Each branch writes into the shared partial block: each gets its own copy.
  const Tokens other = MakeTokens(300, shape, 6);
  auto a_next = cache.Append(0, t.Input("a", 100, 1), Precision::kAuto, false, nullptr);
  auto b_next = cache.Append(0, other.Input("b", 100, 1), Precision::kAuto, false, nullptr);
  ASSERT_TRUE(a_next.ok() && b_next.ok());
  auto a = cache.Get("a");
  auto b = cache.Get("b");
  EXPECT_EQ(a->shared_blocks, 1);  // the full first block is still shared
  EXPECT_EQ(b->shared_blocks, 1);
  EXPECT_EQ(cache.Stats().blocks_used, used_before + 1);

  // The branches continue independently: b's token 100 differs from a's, and each branch's
  // attention matches a one-shot computation over its own history.
  Tokens b_tokens = t;
  for (int64_t i = 0; i < shape.n_head * shape.head_dim; ++i)
    b_tokens.q[100 * shape.n_head * shape.head_dim + i] =
        other.q[100 * shape.n_head * shape.head_dim + i];
  for (int64_t i = 0; i < shape.n_head_kv * shape.head_dim; ++i) {
    b_tokens.k[100 * shape.head_dim + i] = other.k[100 * shape.head_dim + i];
    b_tokens.v[100 * shape.head_dim + i] = other.v[100 * shape.head_dim + i];
  }
  const std::vector<double> expected_a = ReferenceOutput(t, 101, DType::kBFloat16);
  const std::vector<double> expected_b = ReferenceOutput(b_tokens, 101, DType::kBFloat16);
  const int64_t row = shape.n_head * shape.head_dim;
  for (int64_t i = 0; i < row; ++i) {
    EXPECT_NEAR(a_next->output[i], expected_a[100 * row + i], 2e-2);
    EXPECT_NEAR(b_next->output[i], expected_b[100 * row + i], 2e-2);
  }
  EXPECT_GT(std::abs(a_next->output[0] - b_next->output[0]), 1e-4);

  // Releasing a frees only what b does not share.
  auto freed = cache.Release("a");
  ASSERT_TRUE(freed.ok());
  EXPECT_EQ(*freed, 4096);  // a's private copy of block 1
  auto b_after = cache.Get("b");
  EXPECT_EQ(b_after->shared_blocks, 0);
}

TEST(KvCache, ForkAtAPrefix) {
  const Shape shape{2, 2, 8};
  KvCache cache(SmallCache());
  const Tokens t = MakeTokens(50, shape, 8);
  ASSERT_OK(cache.Create(Config(shape, DType::kFloat32, 1), "a", 0));
  ASSERT_OK(cache.Append(0, t.Input("a", 0, 50), Precision::kAuto, false, nullptr));
  auto fork = cache.Fork("a", "", 20);
  ASSERT_TRUE(fork.ok());
  EXPECT_EQ(fork->tokens, 20);
  // A generated fork id routes by its source's key (common/sequence_key.h): "a/<16 hex>".
  EXPECT_EQ(fork->id.rfind("a/", 0), 0u) << fork->id;
  EXPECT_EQ(fork->id.size(), 18u) << fork->id;
  // Continuing the fork at 20 gives the same as the original had at 20.
  auto again = cache.Append(0, t.Input(fork->id, 20, 5), Precision::kAuto, false, nullptr);
  ASSERT_TRUE(again.ok());
  const std::vector<double> expected = ReferenceOutput(t, 25, DType::kFloat32);
  for (size_t i = 0; i < again->output.size(); ++i) {
    EXPECT_NEAR(again->output[i], expected[20 * shape.n_head * shape.head_dim + i], 2e-5);
  }
  EXPECT_THAT(cache.Fork("a", "c", 51),
              StatusIs(absl::StatusCode::kOutOfRange, {"51", "holds 50"}));
  EXPECT_THAT(cache.Fork("a", "a", 10), StatusIs(absl::StatusCode::kAlreadyExists, {"'a'"}));
}

TEST(KvCache, TruncateThenAppendRecomputesTheSuffix) {
  const Shape shape{4, 2, 8};
  KvCache cache(SmallCache());
  const Tokens t = MakeTokens(60, shape, 9);
  ASSERT_OK(cache.Create(Config(shape, DType::kFloat32, 1), "s", 0));
  ASSERT_OK(cache.Append(0, MakeTokens(60, shape, 99).Input("s", 0, 60), Precision::kAuto, false,
                         nullptr));
  EXPECT_THAT(cache.Truncate("s", 61),
              StatusIs(absl::StatusCode::kOutOfRange, {"61", "holds only 60"}));
  auto truncated = cache.Truncate("s", 0);
  ASSERT_TRUE(truncated.ok());
  EXPECT_EQ(truncated->tokens, 0);
  EXPECT_EQ(truncated->blocks, 0);
  auto result = cache.Append(0, t.Input("s", 0, 60), Precision::kAuto, false, nullptr);
  ASSERT_TRUE(result.ok());
  const std::vector<double> expected = ReferenceOutput(t, 60, DType::kFloat32);
  for (size_t i = 0; i < result->output.size(); ++i)
    EXPECT_NEAR(result->output[i], expected[i], 2e-5);
}

TEST(KvCache, BudgetIsExactToTheBlock) {
  // 4 blocks of 4096 bytes; a token of this shape takes 2 x 16 x 4 = 128 bytes: 32 per block.
  const Shape shape{1, 1, 16};
  KvCache cache(SmallCache(4 * 4096, 4096));
  auto created = cache.Create(Config(shape, DType::kFloat32, 1), "s", 0);
  ASSERT_TRUE(created.ok());
  EXPECT_EQ(created->tokens_per_block, 32);
  const Tokens t = MakeTokens(200, shape, 10);
  ASSERT_OK(cache.Append(0, t.Input("s", 0, 128, false), Precision::kAuto, false, nullptr));
  CacheStats stats = cache.Stats();
  EXPECT_EQ(stats.blocks_used, 4);
  EXPECT_EQ(stats.blocks_free, 0);
  EXPECT_EQ(stats.used_bytes, stats.capacity_bytes);
  EXPECT_DOUBLE_EQ(static_cast<double>(stats.used_bytes) / stats.capacity_bytes, 1.0);

  // One more token does not fit; the sequence is exactly as it was.
  EXPECT_THAT(cache.Append(0, t.Input("s", 128, 1), Precision::kAuto, false, nullptr),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       {"appending 1 tokens to layer 0", "0 of 4 blocks"}));
  auto info = cache.Get("s");
  EXPECT_EQ(info->tokens, 128);
  EXPECT_EQ(cache.Stats().rejections, 1);
  EXPECT_EQ(cache.Stats().tokens, 128);

  // Release frees exactly what it held.
  auto freed = cache.Release("s");
  ASSERT_TRUE(freed.ok());
  EXPECT_EQ(*freed, 4 * 4096);
  EXPECT_EQ(cache.Stats().blocks_free, 4);
  EXPECT_EQ(cache.Stats().tokens, 0);
  EXPECT_THAT(cache.Get("s"), StatusIs(absl::StatusCode::kNotFound, {"'s' was released"}));
}

TEST(KvCache, ReservationsAreTakenUpFrontAndProtectAppends) {
  const Shape shape{1, 1, 16};
  KvCache cache(SmallCache(4 * 4096, 4096));
  EXPECT_THAT(cache.Create(Config(shape, DType::kFloat32, 2), "big", 96),  // 2 layers x 3 blocks
              StatusIs(absl::StatusCode::kResourceExhausted,
                       {"reserving 96 tokens in 2 layers", "6 blocks"}));
  ASSERT_OK(cache.Create(Config(shape, DType::kFloat32, 2), "s", 64));  // 2 x 2 blocks
  EXPECT_EQ(cache.Stats().blocks_free, 0);
  const Tokens t = MakeTokens(64, shape, 11);
  for (int layer = 0; layer < 2; ++layer) {
    ASSERT_OK(cache.Append(layer, t.Input("s", 0, 64), Precision::kAuto, false, nullptr));
  }
  EXPECT_EQ(cache.Get("s")->tokens, 64);
}

TEST(KvCache, LruEvictsTheLeastRecentlyUsedIdleSequence) {
  const Shape shape{1, 1, 16};
  int64_t now = 1000;
  KvCacheOptions options = SmallCache(3 * 4096, 4096);
  options.eviction = EvictionPolicy::kLru;
  options.clock = [&now] { return now; };
  KvCache cache(options);
  const Tokens t = MakeTokens(40, shape, 12);
  for (const char* id : {"old", "newer", "newest"}) {
    ASSERT_OK(cache.Create(Config(shape, DType::kFloat32, 1), id, 0));
    ASSERT_OK(cache.Append(0, t.Input(id, 0, 1), Precision::kAuto, false, nullptr));
    now += 10;
  }
  // "old" is touched again, so "newer" is now the least recently used.
  ASSERT_OK(cache.Append(0, t.Input("old", 1, 1), Precision::kAuto, false, nullptr));
  now += 10;
  ASSERT_OK(cache.Create(Config(shape, DType::kFloat32, 1), "incoming", 0));
  ASSERT_OK(cache.Append(0, t.Input("incoming", 0, 1), Precision::kAuto, false, nullptr));
  EXPECT_THAT(cache.Get("newer"), StatusIs(absl::StatusCode::kNotFound,
                                           {"'newer' was evicted", "least recently used"}));
  EXPECT_OK(cache.Get("old"));
  EXPECT_OK(cache.Get("newest"));
  EXPECT_EQ(cache.Stats().evictions, 1);
  EXPECT_THAT(cache.Append(0, t.Input("newer", 1, 1), Precision::kAuto, false, nullptr),
              StatusIs(absl::StatusCode::kNotFound, {"evicted"}));
}

TEST(KvCache, ASequenceInUseIsNeverEvicted) {
  // The only sequence needs more room for itself: LRU must not evict it to make that room.
  const Shape shape{1, 1, 16};
  KvCacheOptions options = SmallCache(2 * 4096, 4096);
  options.eviction = EvictionPolicy::kLru;
  KvCache cache(options);
  const Tokens t = MakeTokens(100, shape, 13);
  ASSERT_OK(cache.Create(Config(shape, DType::kFloat32, 1), "s", 0));
  ASSERT_OK(cache.Append(0, t.Input("s", 0, 64), Precision::kAuto, false, nullptr));
  EXPECT_THAT(cache.Append(0, t.Input("s", 64, 1), Precision::kAuto, false, nullptr),
              StatusIs(absl::StatusCode::kResourceExhausted, {"eviction policy lru"}));
  EXPECT_OK(cache.Get("s"));
  EXPECT_EQ(cache.Stats().evictions, 0);
}

TEST(KvCache, TtlEvictsOnlyExpiredSequences) {
  const Shape shape{1, 1, 16};
  int64_t now = 0;
  KvCacheOptions options = SmallCache();
  options.eviction = EvictionPolicy::kTtl;
  options.idle_ttl_ms = 1000;
  options.clock = [&now] { return now; };
  KvCache cache(options);
  ASSERT_OK(cache.Create(Config(shape, DType::kFloat32, 1), "idle", 0));
  now = 600;
  ASSERT_OK(cache.Create(Config(shape, DType::kFloat32, 1), "busy", 0));
  now = 1200;
  EXPECT_EQ(cache.EvictExpired(), 1);
  EXPECT_THAT(cache.Get("idle"),
              StatusIs(absl::StatusCode::kNotFound, {"was evicted after 1.2 s idle", "TTL 1 s"}));
  EXPECT_OK(cache.Get("busy"));
  now = 1700;
  EXPECT_EQ(cache.EvictExpired(), 1);
}

TEST(KvCache, RejectsBadInputWithoutChangingAnything) {
  const Shape shape{4, 2, 8};
  KvCache cache(SmallCache());
  ASSERT_OK(cache.Create(Config(shape, DType::kFloat32, 2), "s", 0));
  const Tokens t = MakeTokens(10, shape, 14);
  ASSERT_OK(cache.Append(0, t.Input("s", 0, 3), Precision::kAuto, false, nullptr));
  const Tokens wrong_heads = MakeTokens(2, {4, 4, 8}, 15);
  const Tokens wrong_dim = MakeTokens(2, {4, 2, 16}, 16);
  EXPECT_THAT(cache.Append(0, t.Input("nope", 0, 1), Precision::kAuto, false, nullptr),
              StatusIs(absl::StatusCode::kNotFound, {"no sequence 'nope'"}));
  EXPECT_THAT(
      cache.Append(2, t.Input("s", 3, 1), Precision::kAuto, false, nullptr),
      StatusIs(absl::StatusCode::kInvalidArgument, {"layer 2 is out of range", "2 layers"}));
  EXPECT_THAT(cache.Append(0, wrong_heads.Input("s", 0, 1), Precision::kAuto, false, nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument, {"k.shape is [1, 4, 8]", "[1, 2, 8]"}));
  EXPECT_THAT(cache.Append(0, wrong_dim.Input("s", 0, 1), Precision::kAuto, false, nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument, {"k.shape is [1, 2, 16]"}));
  AppendInput q_mismatch = t.Input("s", 3, 2);
  q_mismatch.q = t.Q(3, 1);
  EXPECT_THAT(cache.Append(0, q_mismatch, Precision::kAuto, false, nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument, {"q.shape is [1, 4, 8]", "[2, 4, 8]"}));
  std::vector<float> nan_k(t.k.begin(), t.k.begin() + 16);
  nan_k[5] = std::nanf("");
  AppendInput poisoned = t.Input("s", 3, 1);
  poisoned.k = {DType::kFloat32, {1, 2, 8}, nan_k.data()};
  EXPECT_THAT(cache.Append(0, poisoned, Precision::kAuto, false, nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument, {"k holds a non-finite value (NaN)"}));
  std::vector<AppendInput> twice = {t.Input("s", 3, 1), t.Input("s", 4, 1)};
  EXPECT_THAT(cache.DecodeBatch(0, twice, Precision::kAuto, nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument, {"steps[1]", "appears twice"}));
  std::vector<AppendInput> two_tokens = {t.Input("s", 3, 2)};
  EXPECT_THAT(
      cache.DecodeBatch(0, two_tokens, Precision::kAuto, nullptr),
      StatusIs(absl::StatusCode::kInvalidArgument, {"steps[0]", "decode step appends 1 token"}));
  std::vector<AppendInput> missing = {t.Input("s", 3, 1), t.Input("ghost", 0, 1)};
  EXPECT_THAT(cache.DecodeBatch(0, missing, Precision::kAuto, nullptr),
              StatusIs(absl::StatusCode::kNotFound, {"steps[1]", "'ghost'"}));
  // Nothing above changed the sequence.
  auto info = cache.Get("s");
  EXPECT_EQ(info->layer_tokens, (std::vector<int64_t>{3, 0}));
  EXPECT_EQ(cache.Stats().tokens, 3);
}

TEST(KvCache, RejectsBadConfigsAndIds) {
  KvCache cache(SmallCache(int64_t{1} << 20, 4096));
  SequenceConfig c = Config({6, 4, 8}, DType::kFloat32);
  EXPECT_THAT(cache.Create(c, "", 0), StatusIs(absl::StatusCode::kInvalidArgument,
                                               {"n_head_kv: 4 does not divide n_head 6"}));
  c = Config({4, 4, 8}, DType::kFloat16);
  EXPECT_THAT(cache.Create(c, "", 0),
              StatusIs(absl::StatusCode::kInvalidArgument, {"kv_dtype", "float16"}));
  c = Config({4, 4, 0}, DType::kFloat32);
  EXPECT_THAT(cache.Create(c, "", 0),
              StatusIs(absl::StatusCode::kInvalidArgument, {"config.head_dim: 0"}));
  c = Config({64, 64, 128}, DType::kFloat32);  // 64 KiB per token: more than a 4 KiB block
  EXPECT_THAT(cache.Create(c, "", 0),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       {"one token of one layer needs 65536 bytes", "--kv_block_bytes"}));
  c = Config({4, 4, 8}, DType::kFloat32);
  EXPECT_THAT(cache.Create(c, "bad id!", 0),
              StatusIs(absl::StatusCode::kInvalidArgument, {"sequence_id", "[A-Za-z0-9._:/-]"}));
  EXPECT_THAT(cache.Create(c, std::string(129, 'a'), 0),
              StatusIs(absl::StatusCode::kInvalidArgument, {"length 129"}));
  // '/' separates an id's routing key from the rest; no part is empty, "." or "..".
  for (const char* bad : {"/x", "x/", "a//b", "./x", "x/..", "..", "a/./b"}) {
    EXPECT_THAT(cache.Create(c, bad, 0),
                StatusIs(absl::StatusCode::kInvalidArgument, {"sequence_id", "part"}))
        << bad;
  }
  for (const char* good : {"chat-1/alt", "a/b/c", "x/.hidden", "v1.2/..x"}) {
    ASSERT_OK(cache.Create(c, good, 0));
  }
  // Generated ids route by the given key; a key that cannot start an id is refused.
  auto generated = cache.Create(c, "", 0, "user-7");
  ASSERT_OK(generated);
  EXPECT_EQ(generated->id.rfind("user-7/", 0), 0u) << generated->id;
  EXPECT_EQ(generated->id.size(), 7u + 16u);
  EXPECT_THAT(cache.Create(c, "", 0, "a/b"),
              StatusIs(absl::StatusCode::kInvalidArgument, {"routing key"}));
  EXPECT_THAT(cache.Create(c, "", 0, std::string(112, 'k')),
              StatusIs(absl::StatusCode::kInvalidArgument, {"routing key", "111"}));
  ASSERT_OK(cache.Create(c, "x", 0));
  EXPECT_THAT(cache.Create(c, "x", 0),
              StatusIs(absl::StatusCode::kAlreadyExists, {"'x' already exists"}));
  EXPECT_THAT(cache.Create(c, "y", -1),
              StatusIs(absl::StatusCode::kInvalidArgument, {"reserve_tokens"}));
}

TEST(KvCache, ListPagesInIdOrder) {
  KvCache cache(SmallCache());
  for (int i = 0; i < 7; ++i)
    ASSERT_OK(cache.Create(Config({2, 2, 4}, DType::kFloat32, 1), absl::StrCat("s", i), 0));
  auto first = cache.List(3, "");
  ASSERT_TRUE(first.ok());
  ASSERT_EQ(first->sequences.size(), 3u);
  EXPECT_EQ(first->sequences[0].id, "s0");
  EXPECT_EQ(first->next_page_token, "s2");
  auto second = cache.List(3, first->next_page_token);
  EXPECT_EQ(second->sequences[0].id, "s3");
  auto last = cache.List(3, second->next_page_token);
  EXPECT_EQ(last->sequences.size(), 1u);
  EXPECT_EQ(last->next_page_token, "");
  EXPECT_THAT(cache.List(5000, ""), StatusIs(absl::StatusCode::kInvalidArgument, {"page_size"}));
  // Tokens are ids: anything else was not returned by the cache.
  for (const std::string& token :
       {std::string("\0garbage", 8), std::string("a b"), std::string(200, 'z')}) {
    EXPECT_THAT(cache.List(3, token), StatusIs(absl::StatusCode::kInvalidArgument, {"page_token"}));
  }
}

TEST(KvCache, SequenceLimit) {
  KvCacheOptions options = SmallCache();
  options.max_sequences = 2;
  KvCache cache(options);
  ASSERT_OK(cache.Create(Config({2, 2, 4}, DType::kFloat32, 1), "a", 0));
  ASSERT_OK(cache.Create(Config({2, 2, 4}, DType::kFloat32, 1), "b", 0));
  EXPECT_THAT(cache.Create(Config({2, 2, 4}, DType::kFloat32, 1), "c", 0),
              StatusIs(absl::StatusCode::kResourceExhausted, {"--max_sequences"}));
}

// Many threads appending to many sequences: every result is right, nothing is lost. Also run
// under ThreadSanitizer (ctest label tsan).
TEST(KvCacheConcurrency, ManyThreadsManySequences) {
  const Shape shape{4, 2, 16};
  KvCacheOptions options = SmallCache(int64_t{256} << 20, 16384);
  options.compute_threads = 1;
  KvCache cache(options);
  const int kThreads = 8, kSequences = 16, kSteps = 24;
  std::vector<Tokens> tokens;
  for (int s = 0; s < kSequences; ++s) {
    tokens.push_back(MakeTokens(kSteps, shape, 500 + s));
    ASSERT_OK(cache.Create(Config(shape, s % 2 ? DType::kBFloat16 : DType::kFloat32, 2),
                           absl::StrCat("s", s), 0));
  }
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int th = 0; th < kThreads; ++th) {
    threads.emplace_back([&, th] {
      // Thread th owns sequences th and th + kThreads; it interleaves appends, gets and batches.
      for (int step = 0; step < kSteps; ++step) {
        for (int s : {th, th + kThreads}) {
          const std::string id = absl::StrCat("s", s);
          for (int layer = 0; layer < 2; ++layer) {
            if (!cache.Append(layer, tokens[s].Input(id, step, 1), Precision::kAuto, false, nullptr)
                     .ok())
              failures++;
          }
        }
        if (!cache.Get(absl::StrCat("s", (th + 1) % kSequences)).ok()) failures++;
        if (!cache.List(10, "").ok()) failures++;
        (void)cache.Stats();
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_EQ(cache.Stats().tokens, kSequences * kSteps * 2);
  // Every sequence's last output equals the one-shot reference.
  for (int s = 0; s < kSequences; ++s) {
    const DType dtype = s % 2 ? DType::kBFloat16 : DType::kFloat32;
    auto fork = cache.Fork(absl::StrCat("s", s), absl::StrCat("check", s), kSteps - 1);
    ASSERT_TRUE(fork.ok()) << fork.status();
    auto last =
        cache.Append(0, tokens[s].Input(fork->id, kSteps - 1, 1), Precision::kAuto, false, nullptr);
    ASSERT_TRUE(last.ok());
    const std::vector<double> expected = ReferenceOutput(tokens[s], kSteps, dtype);
    const int64_t row = shape.n_head * shape.head_dim;
    for (int64_t i = 0; i < row; ++i) {
      EXPECT_NEAR(last->output[i], expected[(kSteps - 1) * row + i],
                  dtype == DType::kBFloat16 ? 2e-2 : 2e-5);
    }
  }
}

}  // namespace
}  // namespace attend::kv
