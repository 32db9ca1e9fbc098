// The KV cache's lifecycle under concurrency and pressure: an operation that waited for a
// sequence that was released meanwhile finds it gone, eviction only happens when it makes room,
// ids are echoed bounded and escaped, and no block is ever owned by nothing. Also run under
// ThreadSanitizer (ctest label tsan).
#include <atomic>
#include <chrono>
#include <functional>
#include <random>
#include <thread>

#include "absl/strings/str_cat.h"
#include "core/kv_cache/kv_cache.h"
#include "tests/test_util.h"

namespace attend::kv {
namespace {

using ::attend::testing::RandomFloats;
using ::attend::testing::StatusIs;

struct Input {
  std::vector<float> q, k, v;
  AppendInput Make(const std::string& id, int64_t n, int64_t n_head, int64_t n_head_kv, int64_t d,
                   bool with_q = true) const {
    AppendInput in;
    in.id = id;
    if (with_q) in.q = TensorView{DType::kFloat32, {n, n_head, d}, q.data()};
    in.k = TensorView{DType::kFloat32, {n, n_head_kv, d}, k.data()};
    in.v = TensorView{DType::kFloat32, {n, n_head_kv, d}, v.data()};
    return in;
  }
};

Input RandomInput(int64_t n, int64_t n_head, int64_t n_head_kv, int64_t d, uint64_t seed) {
  std::mt19937_64 rng(seed);
  return {RandomFloats(rng, n * n_head * d), RandomFloats(rng, n * n_head_kv * d),
          RandomFloats(rng, n * n_head_kv * d)};
}

SequenceConfig Config(int64_t layers, int64_t n_head, int64_t n_head_kv, int64_t d, DType dtype,
                      int64_t window = 0) {
  SequenceConfig c;
  c.layers = layers;
  c.n_head = n_head;
  c.n_head_kv = n_head_kv;
  c.head_dim = d;
  c.kv_dtype = dtype;
  c.window = window;
  return c;
}

KvCacheOptions Options(int64_t capacity, int64_t block_bytes,
                       EvictionPolicy policy = EvictionPolicy::kNone) {
  KvCacheOptions options;
  options.capacity_bytes = capacity;
  options.block_bytes = block_bytes;
  options.eviction = policy;
  options.compute_threads = 1;
  return options;
}

// Releases every sequence; afterwards no block may be in use.
void ReleaseAll(KvCache& cache) {
  while (true) {
    auto page = cache.List(1000, "");
    ASSERT_TRUE(page.ok()) << page.status();
    if (page->sequences.empty()) break;
    for (const SequenceInfo& info : page->sequences) (void)cache.Release(info.id);
  }
}

// A long Append holds the sequence while a Release and then a Fork (or another Append) queue up
// behind it. Whichever order they get the lock in, a Fork that succeeds holds every layer of
// its source, an operation that comes after the Release answers NOT_FOUND, and when everything
// is released no block is left in use.
void RaceReleaseAgainst(bool fork) {
  const int64_t n_head = 8, d = 128, context = 4096, queries = 256;
  KvCache cache(Options(int64_t{256} << 20, int64_t{1} << 20));
  const Input prompt = RandomInput(context, n_head, n_head, d, 1);
  const Input step = RandomInput(queries, n_head, n_head, d, 2);
  for (int round = 0; round < 4; ++round) {
    const std::string id = absl::StrCat("s", round);
    ASSERT_OK(cache.Create(Config(1, n_head, n_head, d, DType::kFloat32), id, 0));
    ASSERT_OK(cache.Append(0, prompt.Make(id, context, n_head, n_head, d, /*with_q=*/false),
                           Precision::kAuto, false, nullptr));
    std::atomic<bool> started{false};
    std::thread slow([&] {
      started = true;
      (void)cache.Append(0, step.Make(id, queries, n_head, n_head, d), Precision::kAuto, false,
                         nullptr);
    });
    while (!started) std::this_thread::yield();
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    absl::Status released;
    std::thread release([&] { released = cache.Release(id).status(); });
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    const std::string fork_id = absl::StrCat("f", round);
    absl::StatusOr<SequenceInfo> forked = absl::UnknownError("not run");
    absl::Status appended;
    if (fork) {
      forked = cache.Fork(id, fork_id, std::nullopt);
    } else {
      appended =
          cache.Append(0, step.Make(id, 1, n_head, n_head, d), Precision::kAuto, false, nullptr)
              .status();
    }
    slow.join();
    release.join();
    EXPECT_OK(released);
    if (fork) {
      if (forked.ok()) {
        // It got the lock before the Release: a whole copy of the source.
        ASSERT_EQ(forked->layer_tokens.size(), 1u);
        EXPECT_GE(forked->layer_tokens[0], context);
        EXPECT_OK(cache.Append(0, step.Make(fork_id, 1, n_head, n_head, d), Precision::kAuto, false,
                               nullptr));
      } else {
        EXPECT_THAT(forked, StatusIs(absl::StatusCode::kNotFound, {"was released"}));
      }
    } else if (!appended.ok()) {
      EXPECT_THAT(appended, StatusIs(absl::StatusCode::kNotFound, {"was released"}));
    }
    ReleaseAll(cache);
    EXPECT_EQ(cache.Stats().used_bytes, 0) << "round " << round;
    EXPECT_EQ(cache.Stats().sequences, 0);
  }
}

TEST(KvCacheLifecycle, ForkQueuedBehindAReleaseFindsTheSequenceGone) {
  RaceReleaseAgainst(/*fork=*/true);
}

TEST(KvCacheLifecycle, AppendQueuedBehindAReleaseFindsTheSequenceGone) {
  RaceReleaseAgainst(/*fork=*/false);
}

// Many threads run every kind of operation on a few shared ids, in random orders. Every result
// is one of the codes a client must handle (never INTERNAL or a crash), a successful Fork or
// Append describes every layer, and once everything is released no block is in use.
void Stress(EvictionPolicy policy, uint64_t seed) {
  const int64_t layers = 2, n_head = 2, n_head_kv = 1, d = 8;
  // A token of one layer takes 2 x 8 x 4 = 64 bytes in f32: 16 per 1 KiB block. 96 blocks in
  // all, so appends and reservations run out now and then.
  KvCache cache(Options(96 * 1024, 1024, policy));
  const Input input = RandomInput(24, n_head, n_head_kv, d, seed);
  const std::vector<std::string> ids = {"a", "b", "c", "d", "e"};
  const int kThreads = 6, kOps = 1500;
  std::atomic<int> unexpected{0};
  // Successes by operation (Create, Append, DecodeBatch, Fork, Truncate, Release): each kind
  // must have succeeded often enough for the run to have tested it.
  std::atomic<int> succeeded[6] = {};
  std::vector<std::thread> threads;
  for (int th = 0; th < kThreads; ++th) {
    threads.emplace_back([&, th] {
      std::mt19937_64 rng(seed * 100 + th);
      auto pick = [&](size_t n) { return static_cast<size_t>(rng() % n); };
      auto check = [&](const absl::Status& status, const char* op, int kind = -1) {
        if (status.ok() && kind >= 0) succeeded[kind]++;
        switch (status.code()) {
          case absl::StatusCode::kOk:
          case absl::StatusCode::kNotFound:
          case absl::StatusCode::kAlreadyExists:
          case absl::StatusCode::kOutOfRange:
          case absl::StatusCode::kResourceExhausted:
            return;
          default:
            ADD_FAILURE() << op << ": " << status;
            unexpected++;
        }
      };
      for (int op = 0; op < kOps; ++op) {
        const std::string& id = ids[pick(ids.size())];
        const int64_t layer = static_cast<int64_t>(pick(layers));
        switch (pick(9)) {
          case 0: {
            const DType dtypes[] = {DType::kFloat32, DType::kBFloat16, DType::kInt8};
            check(cache
                      .Create(Config(layers, n_head, n_head_kv, d, dtypes[pick(3)],
                                     pick(4) == 0 ? 20 : 0),
                              id, static_cast<int64_t>(pick(40)))
                      .status(),
                  "Create", 0);
            break;
          }
          case 1:
          case 2: {
            const int64_t n = 1 + static_cast<int64_t>(pick(24));
            auto result = cache.Append(layer, input.Make(id, n, n_head, n_head_kv, d, pick(2)),
                                       Precision::kAuto, pick(4) == 0, nullptr);
            check(result.status(), "Append", 1);
            if (result.ok() && result->output.empty() == false) {
              EXPECT_EQ(result->output.size(), static_cast<size_t>(n * n_head * d));
            }
            break;
          }
          case 3: {
            std::vector<AppendInput> steps;
            for (size_t i = pick(ids.size()), count = 1 + pick(3); count > 0; --count) {
              steps.push_back(input.Make(ids[i], 1, n_head, n_head_kv, d));
              i = (i + 1) % ids.size();
            }
            check(cache.DecodeBatch(layer, steps, Precision::kAuto, nullptr).status(),
                  "DecodeBatch", 2);
            break;
          }
          case 4: {
            std::optional<int64_t> tokens;
            if (pick(2)) tokens = static_cast<int64_t>(pick(30));
            auto forked = cache.Fork(id, ids[pick(ids.size())], tokens);
            check(forked.status(), "Fork", 3);
            if (forked.ok()) {
              EXPECT_EQ(forked->layer_tokens.size(), static_cast<size_t>(layers));
            }
            break;
          }
          case 5:
            check(cache.Truncate(id, static_cast<int64_t>(pick(30))).status(), "Truncate", 4);
            break;
          case 6:
            check(cache.Release(id).status(), "Release", 5);
            break;
          case 7: {
            auto info = cache.Get(id);
            check(info.status(), "Get");
            if (info.ok()) {
              EXPECT_EQ(info->layer_tokens.size(), static_cast<size_t>(layers));
            }
            break;
          }
          default:
            check(cache.List(3, "").status(), "List");
            (void)cache.Stats();
            break;
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(unexpected.load(), 0);
  for (int kind = 0; kind < 6; ++kind) EXPECT_GE(succeeded[kind].load(), 20) << "kind " << kind;
  ASSERT_OK(cache.CheckConsistency());
  ReleaseAll(cache);
  const CacheStats stats = cache.Stats();
  EXPECT_EQ(stats.sequences, 0);
  EXPECT_EQ(stats.used_bytes, 0);
  EXPECT_EQ(stats.tokens, 0);
  ASSERT_OK(cache.CheckConsistency());
}

TEST(KvCacheLifecycle, StressEveryOperationOnSharedIds) {
  for (uint64_t seed : {1, 2, 3}) Stress(EvictionPolicy::kNone, seed);
}

TEST(KvCacheLifecycle, StressWithLruEviction) {
  for (uint64_t seed : {4, 5, 6}) Stress(EvictionPolicy::kLru, seed);
}

// LRU eviction only starts when evicting idle sequences makes the request fit: a request that
// can never fit evicts nothing, and one that fits evicts only as many as it needs.
TEST(KvCacheLifecycle, LruEvictsOnlyWhenThatMakesTheRequestFit) {
  int64_t now = 1000;
  KvCacheOptions options = Options(8 * 1024, 1024, EvictionPolicy::kLru);
  options.clock = [&now] { return now; };
  KvCache cache(options);  // 8 blocks of 1 KiB; 16 tokens per block of this shape
  for (const char* id : {"a", "b", "c", "d"}) {
    ASSERT_OK(cache.Create(Config(1, 2, 1, 8, DType::kFloat32), id, 32));  // 2 blocks each
    now += 10;
  }
  EXPECT_EQ(cache.Stats().blocks_free, 0);
  EXPECT_THAT(cache.Create(Config(1, 2, 1, 8, DType::kFloat32), "huge", 200 * 16),
              StatusIs(absl::StatusCode::kResourceExhausted, {"200 blocks"}));
  EXPECT_EQ(cache.Stats().sequences, 4);
  EXPECT_EQ(cache.Stats().evictions, 0);
  for (const char* id : {"a", "b", "c", "d"}) EXPECT_OK(cache.Get(id));

  // "a" is used again, so "b" and "c" are the two least recently used.
  ASSERT_OK(cache.Truncate("a", 0));
  now += 10;
  ASSERT_OK(cache.Create(Config(1, 2, 1, 8, DType::kFloat32), "new", 4 * 16));
  EXPECT_EQ(cache.Stats().evictions, 2);
  EXPECT_THAT(cache.Get("b"), StatusIs(absl::StatusCode::kNotFound, {"evicted"}));
  EXPECT_THAT(cache.Get("c"), StatusIs(absl::StatusCode::kNotFound, {"evicted"}));
  EXPECT_OK(cache.Get("a"));
  EXPECT_OK(cache.Get("d"));
  EXPECT_OK(cache.Get("new"));
  ASSERT_OK(cache.CheckConsistency());
}

// Evicting one of two forks frees none of the blocks they share: eviction goes on to the next
// sequence until the request fits, and stops there.
TEST(KvCacheLifecycle, LruCountsSharedBlocksOnce) {
  int64_t now = 1000;
  KvCacheOptions options = Options(8 * 1024, 1024, EvictionPolicy::kLru);
  options.clock = [&now] { return now; };
  KvCache cache(options);
  const Input input = RandomInput(64, 2, 1, 8, 3);
  ASSERT_OK(cache.Create(Config(1, 2, 1, 8, DType::kFloat32), "base", 0));
  ASSERT_OK(cache.Append(0, input.Make("base", 64, 2, 1, 8, false), Precision::kAuto, false,
                         nullptr));  // 4 blocks
  now += 10;
  ASSERT_OK(cache.Fork("base", "fork", std::nullopt));  // shares the 4
  now += 10;
  ASSERT_OK(cache.Create(Config(1, 2, 1, 8, DType::kFloat32), "other", 64));  // 4 more
  now += 10;
  EXPECT_EQ(cache.Stats().blocks_free, 0);
  ASSERT_OK(cache.Create(Config(1, 2, 1, 8, DType::kFloat32), "new", 64));
  EXPECT_EQ(cache.Stats().evictions, 2);
  EXPECT_THAT(cache.Get("base"), StatusIs(absl::StatusCode::kNotFound, {"evicted"}));
  EXPECT_THAT(cache.Get("fork"), StatusIs(absl::StatusCode::kNotFound, {"evicted"}));
  EXPECT_OK(cache.Get("other"));
  ASSERT_OK(cache.CheckConsistency());
}

// A fork appending into the block it shares with its idle source needs a copy of that block;
// evicting the source alone takes the need away, so only the source goes.
TEST(KvCacheLifecycle, LruEvictsTheSourceAForkWouldCopyFromAndNothingMore) {
  int64_t now = 1000;
  KvCacheOptions options = Options(16 * 1024, 1024, EvictionPolicy::kLru);
  options.clock = [&now] { return now; };
  KvCache cache(options);  // 16 tokens per block of this shape
  const Input input = RandomInput(128, 2, 1, 8, 4);
  ASSERT_OK(cache.Create(Config(1, 2, 1, 8, DType::kFloat32), "a", 0));
  ASSERT_OK(cache.Append(0, input.Make("a", 113, 2, 1, 8, false), Precision::kAuto, false,
                         nullptr));  // 8 blocks, the last one partly filled
  now += 10;
  ASSERT_OK(cache.Fork("a", "f", std::nullopt));  // shares all 8
  now += 10;
  ASSERT_OK(cache.Create(Config(1, 2, 1, 8, DType::kFloat32), "b", 0));
  ASSERT_OK(cache.Append(0, input.Make("b", 128, 2, 1, 8, false), Precision::kAuto, false,
                         nullptr));  // 8 more: the cache is full
  now += 10;
  ASSERT_EQ(cache.Stats().blocks_free, 0);
  ASSERT_OK(cache.Append(0, input.Make("f", 1, 2, 1, 8), Precision::kAuto, false, nullptr));
  EXPECT_EQ(cache.Stats().evictions, 1);
  EXPECT_THAT(cache.Get("a"), StatusIs(absl::StatusCode::kNotFound, {"evicted"}));
  EXPECT_OK(cache.Get("b"));
  EXPECT_EQ(cache.Get("f")->tokens, 114);
  ASSERT_OK(cache.CheckConsistency());
}

// Evicting a sequence whose blocks a fork in use still holds frees nothing: eviction passes it
// over and takes the next one that makes room.
TEST(KvCacheLifecycle, LruPassesOverSequencesWhoseEvictionFreesNothing) {
  int64_t now = 1000;
  KvCacheOptions options = Options(16 * 1024, 1024, EvictionPolicy::kLru);
  options.clock = [&now] { return now; };
  KvCache cache(options);
  const Input input = RandomInput(128, 2, 1, 8, 5);
  ASSERT_OK(cache.Create(Config(1, 2, 1, 8, DType::kFloat32), "a", 0));
  ASSERT_OK(cache.Append(0, input.Make("a", 128, 2, 1, 8, false), Precision::kAuto, false,
                         nullptr));  // 8 full blocks
  now += 10;
  ASSERT_OK(cache.Fork("a", "f", std::nullopt));
  now += 10;
  ASSERT_OK(cache.Create(Config(1, 2, 1, 8, DType::kFloat32), "b", 0));
  ASSERT_OK(
      cache.Append(0, input.Make("b", 128, 2, 1, 8, false), Precision::kAuto, false, nullptr));
  now += 10;
  ASSERT_EQ(cache.Stats().blocks_free, 0);
  // f needs one new block; evicting a would free none of the 8 it shares with f.
  ASSERT_OK(cache.Append(0, input.Make("f", 1, 2, 1, 8), Precision::kAuto, false, nullptr));
  EXPECT_EQ(cache.Stats().evictions, 1);
  EXPECT_OK(cache.Get("a"));
  EXPECT_THAT(cache.Get("b"), StatusIs(absl::StatusCode::kNotFound, {"evicted"}));
  ASSERT_OK(cache.CheckConsistency());
}

TEST(KvCacheLifecycle, UnknownIdsAreEchoedBoundedAndEscaped) {
  KvCache cache(Options(1 << 20, 1024));
  const std::string long_id(5000, 'x');
  const std::string hostile = "a\nb\x1b[31mc";
  for (const std::string& id : {long_id, hostile, std::string(20000, 'y')}) {
    for (const absl::Status& status :
         {cache.Get(id).status(), cache.Release(id).status(), cache.Truncate(id, 0).status(),
          cache.Fork(id, "", std::nullopt).status()}) {
      EXPECT_EQ(status.code(), absl::StatusCode::kNotFound) << status;
      EXPECT_LT(status.message().size(), 300u) << status;
      EXPECT_EQ(status.message().find('\n'), absl::string_view::npos) << status;
      EXPECT_EQ(status.message().find('\x1b'), absl::string_view::npos) << status;
    }
  }
  EXPECT_THAT(cache.Get(hostile), StatusIs(absl::StatusCode::kNotFound, {"a\\nb\\x1b[31mc"}));
  EXPECT_THAT(cache.Get(long_id), StatusIs(absl::StatusCode::kNotFound, {"5000 bytes"}));
  // Ids that can exist are echoed as they are.
  EXPECT_THAT(cache.Get("chat-1"), StatusIs(absl::StatusCode::kNotFound, {"'chat-1'"}));
}

TEST(KvCacheLifecycle, HugeReservationsSayHowMuchTheyWouldNeed) {
  KvCache cache(Options(1 << 20, 1 << 20));
  // 4 KV heads x (16384 + 16384) x 4 bytes = 512 KiB per token and layer: 2 tokens per block,
  // 2^39 blocks per layer for 2^40 tokens, 2^51 blocks (2^71 bytes) over 4096 layers.
  SequenceConfig config = Config(4096, 8, 4, 16384, DType::kFloat32);
  auto created = cache.Create(config, "big", int64_t{1} << 40);
  EXPECT_THAT(created,
              StatusIs(absl::StatusCode::kResourceExhausted, {"2251799813685248 blocks", "ZiB"}));
  EXPECT_EQ(created.status().message().find("(0 bytes)"), absl::string_view::npos)
      << created.status();
}

// The shapes that made a fork race with a sibling's release (found from outside): 4096 layers of
// one 64-byte block per 2 tokens, a reservation covering the fork point's partly written block,
// and that block shared with a sibling S by an earlier fork and a truncate. A fork that decided
// per layer from the blocks' reference counts, read twice, took too few copies when S dropped its
// references in between, and crashed (SIGSEGV) popping from an empty vector.
constexpr int64_t kRaceLayers = 4096;

// P holds 61 tokens in every layer, reserves 64, shares its block at token 59 with its fork S.
void MakeSharedPartialBlock(KvCache& cache, const Input& input) {
  SequenceConfig config = Config(kRaceLayers, 2, 1, 4, DType::kFloat32);
  ASSERT_TRUE(cache.Create(config, "P", 64).ok());
  for (int64_t l = 0; l < kRaceLayers; ++l) {
    ASSERT_TRUE(cache
                    .Append(l, input.Make("P", 61, 2, 1, 4, /*with_q=*/false), Precision::kFloat32,
                            false, nullptr)
                    .ok());
  }
  ASSERT_TRUE(cache.Fork("P", "S", std::nullopt).ok());
  ASSERT_TRUE(cache.Truncate("P", 59).ok());
}

// Runs `a` and `b` at the same moment (as near as two threads can).
void AtOnce(const std::function<void()>& a, const std::function<void()>& b) {
  std::atomic<int> ready{0};
  auto start = [&](const std::function<void()>& f) {
    return std::thread([&ready, &f] {
      ready++;
      while (ready.load() < 2) {
      }
      f();
    });
  };
  std::thread ta = start(a), tb = start(b);
  ta.join();
  tb.join();
}

TEST(KvCacheLifecycle, ForkRacingASiblingsReleaseKeepsEveryBlockAccounted) {
  const Input input = RandomInput(61, 2, 1, 4, 41);
  for (int variant = 0; variant < 2; ++variant) {
    for (int round = 0; round < 4; ++round) {
      SCOPED_TRACE(absl::StrCat(variant == 0 ? "Release(S)" : "Truncate(S, 0)", ", round ", round));
      KvCache cache(Options(int64_t{64} << 20, 64));
      MakeSharedPartialBlock(cache, input);
      absl::StatusOr<SequenceInfo> fork;
      AtOnce([&] { fork = cache.Fork("P", "F", std::nullopt); },
             [&] {
               if (variant == 0) {
                 ASSERT_TRUE(cache.Release("S").ok());
               } else {
                 ASSERT_TRUE(cache.Truncate("S", 0).ok());
               }
             });
      ASSERT_TRUE(fork.ok()) << fork.status();
      EXPECT_EQ(fork->tokens, 59);
      ASSERT_TRUE(cache.CheckConsistency().ok()) << cache.CheckConsistency();
      ASSERT_TRUE(cache.Release("F").ok());
    }
  }
}

TEST(KvCacheLifecycle, ForkRacingTtlEvictionOfASibling) {
  const Input input = RandomInput(61, 2, 1, 4, 43);
  std::atomic<int64_t> now{0};
  KvCacheOptions options = Options(int64_t{64} << 20, 64, EvictionPolicy::kTtl);
  options.idle_ttl_ms = 100;
  options.clock = [&now] { return now.load(); };
  for (int round = 0; round < 4; ++round) {
    SCOPED_TRACE(absl::StrCat("round ", round));
    KvCache cache(options);
    MakeSharedPartialBlock(cache, input);
    // S is idle past the TTL; P was just used.
    now += 1000;
    ASSERT_TRUE(cache.Truncate("P", 59).ok());
    absl::StatusOr<SequenceInfo> fork;
    int64_t evicted = 0;
    AtOnce([&] { fork = cache.Fork("P", "F", std::nullopt); },
           [&] { evicted = cache.EvictExpired(); });
    ASSERT_TRUE(fork.ok()) << fork.status();
    EXPECT_EQ(evicted, 1);
    ASSERT_TRUE(cache.CheckConsistency().ok()) << cache.CheckConsistency();
  }
}

// Release says how many bytes went back to the pool. Two sequences sharing most of their blocks,
// released at the same moment, free between them exactly what both held: each shared block is
// counted by whichever release dropped it last, never by both and never by neither.
TEST(KvCacheLifecycle, ConcurrentReleasesCountEveryFreedBlockOnce) {
  const Input input = RandomInput(61, 2, 1, 4, 47);
  for (int round = 0; round < 8; ++round) {
    SCOPED_TRACE(absl::StrCat("round ", round));
    KvCache cache(Options(int64_t{64} << 20, 64));
    MakeSharedPartialBlock(cache, input);
    const int64_t used = cache.Stats().used_bytes;
    absl::StatusOr<int64_t> freed_p, freed_s;
    AtOnce([&] { freed_p = cache.Release("P"); }, [&] { freed_s = cache.Release("S"); });
    ASSERT_TRUE(freed_p.ok() && freed_s.ok());
    EXPECT_EQ(*freed_p + *freed_s, used);
    EXPECT_EQ(cache.Stats().used_bytes, 0);
  }
}

}  // namespace
}  // namespace attend::kv
