// Attention engine benchmarks, reported against this machine's limits measured in the same run:
//   prefill: useful FLOP/s (4 x head_dim per attended pair) / oneDNN matmul FLOP/s
//   decode:  K/V bytes read per second / streaming read bandwidth
//   cache prefill: the same FLOP/s for a prefill appended to a KV-cache sequence
//   prefill tile matmuls: one tile's q.k or p.v on one thread, weights plain or packed, against
//   one core's share of the matmul probe
// `ratio` uses the median iteration, `ratio_best` the fastest (bench/step_times.h says why).
//
//   build/bench/attention_bench [--benchmark_filter=Prefill]
#include <benchmark/benchmark.h>
#include <omp.h>

#include <chrono>
#include <random>
#include <string>
#include <vector>

#include "bench/machine_limits.h"
#include "bench/step_times.h"
#include "common/half.h"
#include "core/attention/attention_engine.h"
#include "core/kernels/cpu_features.h"
#include "core/kernels/onednn.h"
#include "core/kv_cache/kv_cache.h"

namespace attend::bench {
namespace {

struct Inputs {
  std::vector<float> q, k, v;
  std::vector<uint16_t> qb, kb, vb;
  TensorView qv, kv, vv;
};

Inputs MakeInputs(int64_t n_q, int64_t n_kv, int64_t heads, int64_t kv_heads, int64_t d,
                  bool bf16) {
  Inputs in;
  std::mt19937 rng(1);
  std::normal_distribution<float> normal;
  auto fill = [&](std::vector<float>& x, int64_t n) {
    x.resize(static_cast<size_t>(n));
    for (float& e : x) e = normal(rng);
  };
  fill(in.q, n_q * heads * d);
  fill(in.k, n_kv * kv_heads * d);
  fill(in.v, n_kv * kv_heads * d);
  if (bf16) {
    for (auto [src, dst] : {std::pair{&in.q, &in.qb}, {&in.k, &in.kb}, {&in.v, &in.vb}}) {
      dst->resize(src->size());
      for (size_t i = 0; i < src->size(); ++i) (*dst)[i] = FloatToBf16((*src)[i]);
    }
    in.qv = {DType::kBFloat16, {n_q, heads, d}, in.qb.data()};
    in.kv = {DType::kBFloat16, {n_kv, kv_heads, d}, in.kb.data()};
    in.vv = {DType::kBFloat16, {n_kv, kv_heads, d}, in.vb.data()};
  } else {
    in.qv = {DType::kFloat32, {n_q, heads, d}, in.q.data()};
    in.kv = {DType::kFloat32, {n_kv, kv_heads, d}, in.k.data()};
    in.vv = {DType::kFloat32, {n_kv, kv_heads, d}, in.v.data()};
  }
  return in;
}

// args: n, heads, kv_heads, head_dim, bf16, threads (0 = all), packed (EngineOptions::tile_packing:
// 0 none, 1 the default, 2 all).
// Ratios are against the limits measured with the same number of threads.
void BM_CausalPrefill(benchmark::State& state) {
  const int64_t n = state.range(0), heads = state.range(1), kv_heads = state.range(2),
                d = state.range(3);
  const bool bf16 = state.range(4) != 0;
  const int threads = static_cast<int>(state.range(5));
  const int64_t packed = state.range(6);
  MeasureMachineLimits();
  // A case limited to `threads` measures its limits with as many (oneDNN follows this thread's
  // OpenMP setting, in the probes as in the engine), so its ratio compares like with like.
  const onednn::ScopedThreadLimit thread_limit(threads);
  Inputs in = MakeInputs(n, n, heads, kv_heads, d, bf16);
  AttentionOptions options;
  options.mask.causal = true;
  std::vector<float> out(static_cast<size_t>(n * heads * d));
  EngineOptions engine_options;
  engine_options.threads = threads;
  engine_options.tile_packing = packed == 0   ? tile::TilePacking::kNone
                                : packed == 2 ? tile::TilePacking::kAll
                                              : tile::TilePacking::kBf16;
  AttentionEngine engine(engine_options);
  AttentionStats stats;
  StepTimes times;
  const MachineLimits before = MeasureLimitsNow();
  for (auto _ : state) {
    const auto start = std::chrono::steady_clock::now();
    if (!engine.Compute(in.qv, in.kv, in.vv, options, {}, absl::MakeSpan(out), {}, &stats).ok()) {
      state.SkipWithError("compute failed");
      return;
    }
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    state.SetIterationTime(seconds);
    times.Add(seconds);
  }
  const double flops = static_cast<double>(stats.attention_flops);
  const MachineLimits limits = BetterOf(before, MeasureLimitsNow());
  // Against the matmul the engine ran: bf16 emulated on f32 kernels (UseBf16Matmul) is judged
  // by the f32 matmul's rate.
  const double peak = bf16 && UseBf16Matmul() && limits.matmul_bf16_flops > 0
                          ? limits.matmul_bf16_flops
                          : limits.matmul_f32_flops;
  state.counters["useful_GFLOPs"] = flops / times.Median() / 1e9;
  state.counters["matmul_GFLOPs"] = peak / 1e9;
  state.counters["ratio"] = flops / times.Median() / peak;
  state.counters["ratio_best"] = flops / times.Best() / peak;
  state.SetLabel(stats.engine);
}

// Prefill through the KV cache, as serving does it: one Append of n tokens (q, k, v) to a new
// sequence, which stores k/v in the cache's dtype and attends causally over its blocks.
// args: n, storage (0 f32, 1 bf16, 2 int8); 8 query and 8 KV heads, head_dim 128, all threads.
// Against the f32 matmul probe: on machines without a bf16 matmul, every storage computes in f32.
void BM_CachePrefill(benchmark::State& state) {
  const int64_t n = state.range(0), heads = 8, d = 128;
  const DType storage = state.range(1) == 0   ? DType::kFloat32
                        : state.range(1) == 1 ? DType::kBFloat16
                                              : DType::kInt8;
  MeasureMachineLimits();
  Inputs in = MakeInputs(n, n, heads, heads, d, /*bf16=*/false);
  kv::KvCacheOptions options;
  options.capacity_bytes = int64_t{4} << 30;
  kv::KvCache cache(options);
  kv::SequenceConfig config;
  config.layers = 1;
  config.n_head = heads;
  config.n_head_kv = heads;
  config.head_dim = d;
  config.kv_dtype = storage;
  kv::AppendInput input;
  input.id = "prefill";
  input.q = in.qv;
  input.k = in.kv;
  input.v = in.vv;
  AttentionStats stats;
  StepTimes times;
  const MachineLimits before = MeasureLimitsNow();
  for (auto _ : state) {
    if (!cache.Create(config, input.id, n).ok()) {
      state.SkipWithError("create failed");
      return;
    }
    stats = {};  // Append adds to it
    const auto start = std::chrono::steady_clock::now();
    const bool ok = cache.Append(0, input, Precision::kAuto, false, &stats).ok();
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (!ok || !cache.Release(input.id).ok()) {
      state.SkipWithError("append failed");
      return;
    }
    state.SetIterationTime(seconds);
    times.Add(seconds);
  }
  const double flops = static_cast<double>(stats.attention_flops);
  const MachineLimits limits = BetterOf(before, MeasureLimitsNow());
  state.counters["useful_GFLOPs"] = flops / times.Median() / 1e9;
  state.counters["matmul_GFLOPs"] = limits.matmul_f32_flops / 1e9;
  state.counters["ratio"] = flops / times.Median() / limits.matmul_f32_flops;
  state.counters["ratio_best"] = flops / times.Best() / limits.matmul_f32_flops;
  state.SetLabel(stats.engine);
}

// The fixed cost of one engine matmul call (onednn::RunMatmul) on the calling thread, on a
// 16 x 16 x 16 product whose arithmetic takes well under a microsecond: what every tile pays
// on top of its FLOPs, twice per tile.
void BM_MatmulCallOverhead(benchmark::State& state) {
  const onednn::ScopedThreadLimit one_thread(1);
  onednn::MatmulSpec spec;
  spec.src = {16, 16, 16, 1, DType::kFloat32};
  spec.weights = {16, 16, 16, 1, DType::kFloat32};
  spec.dst = {16, 16, 16, 1, DType::kFloat32};
  std::vector<float> a(256, 1.0f), b(256, 0.5f), c(256);
  for (auto _ : state) {
    if (!onednn::RunMatmul(spec, a.data(), b.data(), c.data()).ok()) {
      state.SkipWithError("matmul failed");
      return;
    }
    benchmark::DoNotOptimize(c.data());
  }
}

// One prefill tile's matmul on one thread, as tile::RunTileJob runs it inside its parallel
// region: q.k, 64 query rows x d 128 against a tile of 512 keys (the keys read through a
// transposed view of their [512, 128] rows), or p.v, 64 x 512 probabilities against the tile's
// [512, 128] values. Weights plain (what prefill passes today: oneDNN copies them into its own
// layout on every call) or packed once (onednn::PackWeights; pack_us is that one-time cost).
// GFLOPs_one_core against ratio's per-core share of the matmul probe (all threads' rate over the
// thread count) says how much of the machine's matmul rate a tile gets, and so which primitive
// falls short where prefill does. args: bf16, part (0 q.k, 1 p.v), packed.
void BM_PrefillTileMatmul(benchmark::State& state) {
  const bool bf16 = state.range(0) != 0, pv = state.range(1) != 0, packed = state.range(2) != 0;
  const int64_t kRows = state.range(3);  // query rows: the engine's tile is 64
  const MachineLimits& limits = MeasureMachineLimits();
  const DType type = bf16 ? DType::kBFloat16 : DType::kFloat32;
  if (bf16 && !HasBf16Matmul()) {
    state.SkipWithError("no bf16 matmul on this CPU");
    return;
  }
  const int threads = omp_get_max_threads();
  const onednn::ScopedThreadLimit one_thread(1);
  constexpr int64_t kDim = 128, kKeys = 512;
  const int64_t k = pv ? kKeys : kDim, n = pv ? kDim : kKeys;
  onednn::MatmulSpec spec;
  spec.src = {kRows, k, k, 1, type};
  spec.weights = pv ? onednn::Operand{k, n, n, 1, type} : onednn::Operand{k, n, 1, k, type};
  spec.dst = {kRows, n, n, 1, DType::kFloat32};
  const size_t bytes = bf16 ? 2 : 4;
  std::mt19937 rng(3);
  std::normal_distribution<float> normal;
  std::vector<char> a(static_cast<size_t>(kRows * k) * bytes),
      b(static_cast<size_t>(k * n) * bytes);
  for (auto* buffer : {&a, &b}) {
    for (size_t i = 0; i < buffer->size() / bytes; ++i) {
      if (bf16) {
        reinterpret_cast<uint16_t*>(buffer->data())[i] = FloatToBf16(normal(rng));
      } else {
        reinterpret_cast<float*>(buffer->data())[i] = normal(rng);
      }
    }
  }
  std::vector<float> c(static_cast<size_t>(kRows * n));
  std::vector<char> packed_b;
  onednn::MatmulSpec run = spec;
  const void* weights = b.data();
  double pack_seconds = 0;
  if (packed) {
    run.weights.packed = true;
    const absl::StatusOr<int64_t> size = onednn::PackedWeightsBytes(run);
    if (!size.ok()) {
      state.SkipWithError(std::string(size.status().message()).c_str());
      return;
    }
    packed_b.resize(static_cast<size_t>(*size));
    constexpr int kPacks = 20;
    for (int i = 0; i <= kPacks; ++i) {
      const auto start = std::chrono::steady_clock::now();
      if (!onednn::PackWeights(run, spec.weights, b.data(), packed_b.data()).ok()) {
        state.SkipWithError("pack failed");
        return;
      }
      // The first call creates the reorder; the rest time the copy alone.
      if (i > 0) {
        pack_seconds +=
            std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      }
    }
    pack_seconds /= kPacks;
    weights = packed_b.data();
  }
  constexpr int kCalls = 64;
  StepTimes times;
  for (auto _ : state) {
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < kCalls; ++i) {
      if (!onednn::RunMatmul(run, a.data(), weights, c.data()).ok()) {
        state.SkipWithError("matmul failed");
        return;
      }
    }
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    state.SetIterationTime(seconds);
    times.Add(seconds);
    benchmark::DoNotOptimize(c.data());
  }
  const double flops = 2.0 * kRows * k * n * kCalls;
  const double probe = bf16 ? limits.matmul_bf16_flops : limits.matmul_f32_flops;
  state.counters["GFLOPs_one_core"] = flops / times.Median() / 1e9;
  state.counters["ratio"] = flops / times.Median() / (probe / threads);
  state.counters["us_per_call"] = times.Median() / kCalls * 1e6;
  if (packed) state.counters["pack_us"] = pack_seconds * 1e6;
}

// Stateless decode over the caller's [context, 8, 128] K and V (rows a head stride apart), read
// from memory as BM_DecodeBatch reads the cache's (caches evicted before each step), so that
// the two compare. args: context, batch (sequences), bf16. 32 query heads, 8 KV heads.
void BM_Decode(benchmark::State& state) {
  const int64_t context = state.range(0), batch = state.range(1);
  const bool bf16 = state.range(2) != 0;
  const int64_t heads = 32, kv_heads = 8, d = 128;
  MeasureMachineLimits();
  std::vector<Inputs> seqs;
  for (int64_t b = 0; b < batch; ++b)
    seqs.push_back(MakeInputs(1, context, heads, kv_heads, d, bf16));
  std::vector<float> out(static_cast<size_t>(heads * d));
  AttentionEngine engine;
  AttentionStats stats;
  StepTimes times;
  const MachineLimits before = MeasureLimitsNow();
  for (auto _ : state) {
    benchmark::DoNotOptimize(EvictCaches());
    const auto start = std::chrono::steady_clock::now();
    for (Inputs& in : seqs) {
      if (!engine.Compute(in.qv, in.kv, in.vv, {}, {}, absl::MakeSpan(out), {}, &stats).ok()) {
        state.SkipWithError("compute failed");
        return;
      }
    }
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    state.SetIterationTime(seconds);
    times.Add(seconds);
  }
  const double kv_bytes = 2.0 * context * kv_heads * d * (bf16 ? 2 : 4) * batch;
  const double bandwidth = BetterOf(before, MeasureLimitsNow()).read_bytes_per_second;
  state.counters["KV_GBs"] = kv_bytes / times.Median() / 1e9;
  state.counters["read_bw_GBs"] = bandwidth / 1e9;
  state.counters["ratio"] = kv_bytes / times.Median() / bandwidth;
  state.counters["ratio_best"] = kv_bytes / times.Best() / bandwidth;
  state.SetLabel(stats.engine);
}

// packed:0 (none) and packed:2 (f32 too) beside packed:1 (the default, bf16): what packing the
// shared key and value tiles once gains.
BENCHMARK(BM_CausalPrefill)
    ->ArgNames({"n", "heads", "kv_heads", "d", "bf16", "threads", "packed"})
    ->Args({2048, 8, 8, 128, 0, 0, 1})
    ->Args({2048, 8, 8, 128, 1, 0, 1})
    ->Args({2048, 32, 8, 128, 0, 0, 1})
    ->Args({2048, 32, 8, 128, 1, 0, 1})
    ->Args({2048, 8, 8, 64, 0, 0, 1})
    ->Args({2048, 8, 8, 64, 1, 0, 1})
    ->Args({2048, 8, 8, 128, 0, 1, 1})
    ->Args({512, 8, 8, 128, 0, 0, 1})
    ->Args({512, 8, 8, 128, 1, 0, 1})
    ->Args({2048, 8, 8, 128, 0, 0, 2})
    ->Args({2048, 8, 8, 128, 1, 0, 0})
    ->Unit(benchmark::kMillisecond)
    ->UseManualTime()
    ->MinTime(1.0);

// About 1.5 s per iteration here: a fixed count, so that best and median have several to pick.
// f32 and bf16 (bf16 at this length is where a bf16 matmul, AMX's, has the most to give).
BENCHMARK(BM_CausalPrefill)
    ->ArgNames({"n", "heads", "kv_heads", "d", "bf16", "threads", "packed"})
    ->Args({8192, 8, 8, 128, 0, 0, 1})
    ->Args({8192, 8, 8, 128, 1, 0, 1})
    ->Args({8192, 8, 8, 128, 1, 0, 0})
    ->Unit(benchmark::kMillisecond)
    ->UseManualTime()
    ->Iterations(3);

BENCHMARK(BM_CachePrefill)
    ->ArgNames({"n", "storage"})
    ->ArgsProduct({{2048}, {0, 1, 2}})
    ->Unit(benchmark::kMillisecond)
    ->UseManualTime()
    ->MinTime(1.0);

BENCHMARK(BM_MatmulCallOverhead)->Unit(benchmark::kMicrosecond);

// rows:256, bf16 only: whether a taller query tile would run the primitive closer to the probe
// (on AMX, whose tiles are 16 rows tall and whose brgemm kernels amortise their set-up over M).
BENCHMARK(BM_PrefillTileMatmul)
    ->ArgNames({"bf16", "part", "packed", "rows"})
    ->ArgsProduct({{0, 1}, {0, 1}, {0, 1}, {64}})
    ->ArgsProduct({{1}, {0, 1}, {0, 1}, {256}})
    ->Unit(benchmark::kMicrosecond)
    ->UseManualTime();

// 64 and 1024 tokens: what a call costs besides its bytes (a line through 4096 and 16384 alone
// read as a fixed millisecond).
BENCHMARK(BM_Decode)
    ->ArgNames({"context", "batch", "bf16"})
    ->Args({64, 1, 0})
    ->Args({1024, 1, 0})
    ->Args({4096, 1, 0})
    ->Args({4096, 1, 1})
    ->Args({16384, 1, 0})
    ->Args({16384, 1, 1})
    ->Args({4096, 8, 0})
    ->Unit(benchmark::kMillisecond)
    ->UseManualTime()
    ->MinTime(1.0);

}  // namespace
}  // namespace attend::bench

BENCHMARK_MAIN();
