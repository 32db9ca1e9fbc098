// Decode over the paged KV cache: one new token for each of `batch` sequences (32 query heads,
// 8 key/value heads, head_dim 128), computed as one DecodeBatch, reported as K/V bytes read per
// second against this machine's read bandwidth measured in the same run (`ratio` for the median
// step, `ratio_best` for the fastest; bench/step_times.h says why). For bf16 and int8
// storage it also reports the step's error against f32 storage of the same data (max_abs_err,
// and rel_rms_err: the RMS of the difference over the RMS of the f32 output).
//
// BM_DecodeKernel measures the kernels alone on one core, with K and V already in the L2 cache:
// their arithmetic ceiling, against the core's FMA throughput. Two cores at that rate are what
// decode could reach if memory were free; below the read bandwidth, decode is compute-bound.
//
// BM_DecodeKernelPart is q.k or p.v of that step alone: which of the two holds a storage type
// (and at heads of 64 and 256 columns besides 128). p.v runs with uniform weights, with sharp
// ones (sharp:1, a softmax of scores of standard deviation 2, as attention often is), and with
// an attention sink among a tail of weights 10 below it (sharp:2).
//
// BM_KernelChoice checks the kernel sets chosen at start-up (simd::ChooseKernels, per storage
// type) against a longer measurement of every set in the same run: whether the chosen set is
// within 5% of the fastest.
//
// BM_DecodeLayout runs the same kernels over a 128 MiB sequence in memory in three layouts and
// orders, nothing of the engine around them: what the layout alone costs.
//
// BM_ReadWithFmas is the read bandwidth probe's loop with arithmetic added: F 8-lane FMAs on
// every 32 bytes read, the density of the decode kernels (a GQA group of 4 query heads: f32
// storage 4, bf16 8, int8 16), with no widening and no other work. It is what a perfect kernel
// of that density could read here: memory and arithmetic overlap only so far on one core.
//
// BM_InstructionRate is the core's rate of the instructions the kernel sets are built on (8- and
// 16-lane FMAs, vdpbf16ps, vpdpbusd, vpdpwssd): register operands, 24 independent chains, one
// core; and vpdpbusd as int8 q.k mixes it, with broadcasts from memory and with shuffles. Which
// set decodes fastest follows from these rates as much as from the instructions a CPU has.
//
// BM_DecodeScaling (only with --scaling_threads) is BM_DecodeBatch again over a list of thread
// counts, for how decode scales with cores on a bigger machine; its ratio is against the read
// bandwidth measured with all threads:
//   --scaling_threads=1,2,4,8,16  registers the cases (none without it)
//   --scaling_contexts=4096  --scaling_batches=1,2,16  --scaling_storages=0,1,2  (the defaults)
// Each list is comma-separated; the cases are every combination, 20 steps each, caches evicted.
//
//   build/bench/decode_bench [--benchmark_filter=...] [--scaling_threads=1,2,4 ...]
#include <benchmark/benchmark.h>
#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "bench/instruction_chains.h"
#include "bench/kernel_step.h"
#include "bench/machine_limits.h"
#include "bench/step_times.h"
#include "core/base/large_memory.h"
#include "core/kernels/simd.h"
#include "core/kv_cache/kv_cache.h"
#include "planner/hardware.h"

namespace attend::bench {
namespace {

constexpr int64_t kHeads = 32, kKvHeads = 8, kDim = 128;
static_assert(kHeads / kKvHeads == KernelStep::kGroup, "the kernel step is one KV head's group");

DType StorageOf(int64_t arg) {
  return arg == 0 ? DType::kFloat32 : (arg == 1 ? DType::kBFloat16 : DType::kInt8);
}

// The read bandwidth probe (best of 2 reads of 256 MiB, as MeasureLimitsNow) on `threads`
// OpenMP threads: what a decode step on that many threads is measured against when thread
// counts are compared (scaling tracks the probe, or it does not).
double ReadBandwidthOn(int threads) {
  const int all = omp_get_max_threads();
  omp_set_num_threads(threads);
  const double bytes_per_second =
      planner::MeasureReadBandwidth(int64_t{256} << 20, 2).value_or(0.0);
  omp_set_num_threads(all);
  return bytes_per_second;
}

// args: context, batch, storage (0 f32, 1 bf16, 2 int8), threads (0 = all; ratios are against
// the bandwidth measured with all threads), and idle: 0 evicts the
// caches before each step; n > 0 instead sleeps n microseconds, untimed, as a server does between
// steps: the caches stay warm and idle OpenMP threads fall asleep.
void BM_DecodeBatch(benchmark::State& state) {
  const int64_t context = state.range(0), batch = state.range(1);
  const DType storage = StorageOf(state.range(2));
  const int threads = static_cast<int>(state.range(3));
  const int64_t idle_us = state.range(4);
  MeasureMachineLimits();

  kv::KvCacheOptions options;
  options.capacity_bytes = int64_t{12} << 30;
  options.compute_threads = threads;
  if (const char* block = std::getenv("ATTEND_KV_BLOCK_BYTES"))
    options.block_bytes = std::atoll(block);
  kv::KvCache cache(options);
  kv::SequenceConfig config;
  config.layers = 1;
  config.n_head = kHeads;
  config.n_head_kv = kKvHeads;
  config.head_dim = kDim;
  config.kv_dtype = storage;

  // Fill each sequence's cache with context - 1 tokens in chunks (k/v only: no attention needed
  // to fill); each timed step appends the context-th token and is truncated away again. The
  // contexts are whole blocks, so that token lands in the last block, already open, as it does
  // in all but one step per block when serving; appending token context + 1 instead would take
  // and zero a block in every timed step.
  const int64_t chunk = 1024, filled_tokens = context - 1;
  const std::vector<float> kv = RandomNormal(chunk * kKvHeads * kDim, 1);
  std::vector<std::string> ids;
  // For the accuracy figure: an f32 twin of the first sequence (same tokens).
  const bool twin = storage != DType::kFloat32;
  for (int64_t b = 0; b < batch + (twin ? 1 : 0); ++b) {
    ids.push_back(b == batch ? "f32-twin" : absl::StrCat("s", b));
    kv::SequenceConfig sequence_config = config;
    if (b == batch) sequence_config.kv_dtype = DType::kFloat32;
    if (!cache.Create(sequence_config, ids.back(), context).ok()) {
      state.SkipWithError("create failed (memory?)");
      return;
    }
    for (int64_t filled = 0; filled < filled_tokens; filled += chunk) {
      const int64_t n = std::min(chunk, filled_tokens - filled);
      kv::AppendInput in;
      in.id = ids.back();
      in.k = {DType::kFloat32, {n, kKvHeads, kDim}, kv.data()};
      in.v = in.k;
      if (!cache.Append(0, in, Precision::kAuto, false, nullptr).ok()) {
        state.SkipWithError("fill failed");
        return;
      }
    }
  }
  const std::vector<float> q = RandomNormal(kHeads * kDim, 2), k = RandomNormal(kKvHeads * kDim, 3);
  if (twin) {
    // One step on the sequence and its f32 twin, compared, then both put back.
    std::vector<kv::AppendInput> pair(2);
    for (int i = 0; i < 2; ++i) {
      pair[i].id = i == 0 ? ids[0] : ids.back();
      pair[i].q = TensorView{DType::kFloat32, {1, kHeads, kDim}, q.data()};
      pair[i].k = {DType::kFloat32, {1, kKvHeads, kDim}, k.data()};
      pair[i].v = pair[i].k;
    }
    auto results = cache.DecodeBatch(0, pair, Precision::kAuto, nullptr);
    if (!results.ok()) {
      state.SkipWithError("accuracy step failed");
      return;
    }
    double max_err = 0, diff2 = 0, ref2 = 0;
    for (size_t i = 0; i < (*results)[0].output.size(); ++i) {
      const double ref = (*results)[1].output[i], err = (*results)[0].output[i] - ref;
      max_err = std::max(max_err, std::abs(err));
      diff2 += err * err;
      ref2 += ref * ref;
    }
    state.counters["max_abs_err"] = max_err;
    state.counters["rel_rms_err"] = std::sqrt(diff2 / ref2);
    (void)cache.Release(ids.back());
    ids.pop_back();
    (void)cache.Truncate(ids[0], filled_tokens);
  }
  std::vector<kv::AppendInput> steps(static_cast<size_t>(batch));
  for (int64_t b = 0; b < batch; ++b) {
    steps[b].id = ids[b];
    steps[b].q = TensorView{DType::kFloat32, {1, kHeads, kDim}, q.data()};
    steps[b].k = {DType::kFloat32, {1, kKvHeads, kDim}, k.data()};
    steps[b].v = steps[b].k;
  }

  AttentionStats stats;
  StepTimes times;
  const MachineLimits before = MeasureLimitsNow();
  const double threads_read_before = threads > 0 ? ReadBandwidthOn(threads) : 0.0;
  for (auto _ : state) {
    if (idle_us > 0) {
      std::this_thread::sleep_for(std::chrono::microseconds(idle_us));
    } else {
      benchmark::DoNotOptimize(EvictCaches());
    }
    const auto start = std::chrono::steady_clock::now();
    auto results = cache.DecodeBatch(0, steps, Precision::kAuto, &stats);
    const double elapsed =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    state.SetIterationTime(elapsed);
    times.Add(elapsed);
    if (!results.ok()) {
      state.SkipWithError(std::string(results.status().message()).c_str());
      return;
    }
    for (const std::string& id : ids) (void)cache.Truncate(id, filled_tokens);  // undo the step
  }
  // Bytes a step reads: keys and values, and for int8 one float scale per token, head and K/V.
  const double per_token_head = 2.0 * kDim * DTypeSize(storage) + (storage == DType::kInt8 ? 8 : 0);
  const double bytes = static_cast<double>(batch) * context * kKvHeads * per_token_head;
  const MachineLimits limits = BetterOf(before, MeasureLimitsNow());
  state.counters["KV_GBs"] = bytes / times.Median() / 1e9;
  state.counters["read_bw_GBs"] = limits.read_bytes_per_second / 1e9;
  state.counters["ratio"] = bytes / times.Median() / limits.read_bytes_per_second;
  state.counters["ratio_best"] = bytes / times.Best() / limits.read_bytes_per_second;
  state.counters["us_per_step"] = times.Median() * 1e6;
  if (threads > 0) {
    // The probe on the step's own threads, and the step against it: scaling from 1 to N threads
    // tracks the probe where ratio_threads stays the same.
    const double threads_read = std::max(threads_read_before, ReadBandwidthOn(threads));
    state.counters["read_bw_threads_GBs"] = threads_read / 1e9;
    state.counters["ratio_threads"] =
        threads_read > 0 ? bytes / times.Median() / threads_read : 0.0;
  }
  state.SetLabel(stats.engine);
}

// The decode kernels (KernelStep) on the calling thread; args: storage, kernel set (an index into
// the sets this CPU runs, simd::testing::RunnableKernels(); -1 = the one decode uses: the one
// measured at start-up for the storage type, or ATTEND_SIMD_KERNELS).
void BM_DecodeKernel(benchmark::State& state) {
  const DType storage = StorageOf(state.range(0));
  MeasureMachineLimits();  // first: it applies ATTEND_SIMD_KERNELS
  const std::string decode_set = simd::KernelName();
  const std::vector<std::string> sets = simd::RunnableKernels();
  if (state.range(1) >= static_cast<int64_t>(sets.size())) {
    state.SkipWithError("kernel set not runnable on this CPU");
    return;
  }
  if (state.range(1) >= 0) simd::UseKernels(sets[static_cast<size_t>(state.range(1))]);
  KernelStep step(storage, kDim);
  double seconds = 0;
  const MachineLimits before = MeasureLimitsNow();
  for (auto _ : state) {
    const auto start = std::chrono::steady_clock::now();
    step.Run(64);
    seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }
  const double steps = 64.0 * state.iterations();
  const double bytes = steps * step.Bytes();
  // 8-lane FMAs of q.k and p.v.
  const double fma8 = steps * 2 * KernelStep::kGroup * KernelStep::kRows * kDim / 8.0;
  const MachineLimits limits = BetterOf(before, MeasureLimitsNow());
  state.counters["KV_GBs_one_core"] = bytes / seconds / 1e9;
  state.counters["fma_use"] =
      limits.fma8_per_second_per_core > 0 ? fma8 / seconds / limits.fma8_per_second_per_core : 0.0;
  state.counters["two_cores_vs_read_bw"] = 2 * bytes / seconds / limits.read_bytes_per_second;
  state.SetLabel(simd::KernelName({storage}));
  simd::UseKernels(decode_set);  // back to the sets the other cases measure
}

// One of the decode kernels alone, on the set decode uses, one core, K or V in L2: which of q.k
// and p.v holds a storage type's step. Reports the K (q.k) or V (p.v) bytes read per second.
// args: storage, part (0 q.k, DotRows; 1 p.v, AccumulateRows), head size, weights (0 uniform,
// 1 sharp, 2 a sink), query heads per KV head (the GQA group: the kernels block 4 query rows at
// a time, then 2, then 1, so groups of 1 and 2 run other code than the default 4).
void BM_DecodeKernelPart(benchmark::State& state) {
  const DType storage = StorageOf(state.range(0));
  MeasureMachineLimits();  // first: it applies ATTEND_SIMD_KERNELS
  KernelStep step(storage, state.range(2), state.range(4));
  step.SetWeights(state.range(3) == 0   ? KernelStep::Weights::kUniform
                  : state.range(3) == 1 ? KernelStep::Weights::kSharp
                                        : KernelStep::Weights::kSink);
  const auto part = state.range(1) == 0 ? KernelStep::Part::kDot : KernelStep::Part::kAccumulate;
  double seconds = 0;
  for (auto _ : state) {
    const auto start = std::chrono::steady_clock::now();
    step.Run(64, part);
    seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }
  state.counters["GBs_one_core"] = 64.0 * state.iterations() * step.Bytes() / 2 / seconds / 1e9;
  state.SetLabel(simd::KernelName({storage}));
}

// The start-up choice (simd::ChooseKernels) checked against a longer measurement in the same
// run: BM_DecodeKernel's step on every vector set the CPU runs (and the chosen set, were it the
// scalar one), interleaved, one sample of 16 steps per set per iteration. Reports each set's K/V
// rate (GBs_<set>, median sample), and chosen_vs_fastest: the chosen set's rate over the fastest
// one's; the label says whether the choice is within 5% of the fastest (the measurement keeps
// the default unless another set is 5% faster, simd::kClearMargin). arg: storage.
void BM_KernelChoice(benchmark::State& state) {
  const DType storage = StorageOf(state.range(0));
  MeasureMachineLimits();  // first: it applies ATTEND_SIMD_KERNELS
  const std::string decode_set = simd::KernelName();
  const std::string chosen = simd::KernelName({storage});
  std::vector<std::string> sets = simd::RunnableKernels();
  if (sets.size() > 1) sets.erase(sets.begin());  // as the measurement: the vector sets
  if (std::find(sets.begin(), sets.end(), chosen) == sets.end()) sets.push_back(chosen);
  KernelStep step(storage, kDim);
  std::vector<StepTimes> times(sets.size());
  constexpr int kSteps = 16;
  size_t round = 0;
  for (auto _ : state) {
    for (size_t i = 0; i < sets.size(); ++i) {
      const size_t set = (i + round) % sets.size();
      simd::UseKernels(sets[set]);
      const auto start = std::chrono::steady_clock::now();
      step.Run(kSteps);
      times[set].Add(
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    }
    ++round;
  }
  simd::UseKernels(decode_set);
  size_t fastest = 0, chosen_index = 0;
  std::vector<double> rate(sets.size());
  for (size_t i = 0; i < sets.size(); ++i) {
    rate[i] = kSteps * step.Bytes() / times[i].Median();
    state.counters["GBs_" + sets[i]] = rate[i] / 1e9;
    if (rate[i] > rate[fastest]) fastest = i;
    if (sets[i] == chosen) chosen_index = i;
  }
  const double ratio = rate[chosen_index] / rate[fastest];
  state.counters["chosen_vs_fastest"] = ratio;
  state.SetLabel(absl::StrCat("chosen ", chosen, ", fastest ", sets[fastest],
                              ratio >= 0.95 ? ": within 5%" : ": NOT within 5%"));
}

// Reads floats [begin, end) of `data` as kStreams sequential streams (four as the probe does;
// one as a kernel walking one head's rows does), eight vectors a step into eight accumulators,
// with kFmas FMAs on each 32-byte vector: the decode kernels' eight independent FMA chains.
// kFmas == 0 adds each vector instead (the probe's loop).
template <int kFmas, int kStreams = 4>
__attribute__((target("avx2,fma"))) float ReadWithFmas(const float* data, int64_t n) {
  static_assert(8 % kStreams == 0);
  constexpr int kPerStream = 8 / kStreams;  // vectors of each stream per step
  __m256 acc[8];
#pragma GCC unroll 8
  for (int i = 0; i < 8; ++i) acc[i] = _mm256_setzero_ps();
  const __m256 w = _mm256_set1_ps(0.999f);
  const int64_t span = n / 64 * 64 / kStreams;  // whole steps of 64 floats
  const float* stream[kStreams];
  for (int s = 0; s < kStreams; ++s) stream[s] = data + s * span;
  for (int64_t i = 0; i < span; i += 8 * kPerStream) {
#pragma GCC unroll 8
    for (int s = 0; s < kStreams; ++s) {
#pragma GCC unroll 8
      for (int u = 0; u < kPerStream; ++u) {
        const __m256 v = _mm256_loadu_ps(stream[s] + i + 8 * u);
        __m256& a = acc[kPerStream * s + u];
        if constexpr (kFmas == 0) {
          a = _mm256_add_ps(a, v);
        } else {
#pragma GCC unroll 16
          for (int f = 0; f < kFmas; ++f) a = _mm256_fmadd_ps(v, w, a);
        }
      }
    }
  }
  __m256 sum = acc[0];
  for (int i = 1; i < 8; ++i) sum = _mm256_add_ps(sum, acc[i]);
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, sum);
  return lanes[0];
}

// arg: 0 = 8-lane FMA, 1 = 16-lane FMA, 2 = vdpbf16ps, 3 = vpdpbusd, 4 = vpdpbusd with an
// embedded broadcast, 5 = vpdpbusd with a shuffle per two, 6 = vpdpwssd (all 512-bit but the
// first). Reports dot product instructions per second (shuffles not counted) and multiply-adds
// per second (8, 16, 32, 64 and 32 per instruction), on one core.
void BM_InstructionRate(benchmark::State& state) {
  const int which = static_cast<int>(state.range(0));
  __builtin_cpu_init();
  const bool avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw");
  const bool vnni = avx512 && __builtin_cpu_supports("avx512vnni");
  const struct {
    const char* name;
    bool runs;
    float (*loop)();
    double products;
  } kinds[] = {
      {"fma 8-lane", __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"), Fma8Chains,
       8},
      {"fma 16-lane", avx512, Fma16Chains, 16},
      {"vdpbf16ps", avx512 && __builtin_cpu_supports("avx512bf16"), DpBf16Chains, 32},
      {"vpdpbusd", vnni, DpBusdChains, 64},
      {"vpdpbusd {1to16}", vnni, DpBusdBroadcastChains, 64},
      {"vpdpbusd + 1/2 shuffle", vnni, DpBusdWithShufflesChains, 64},
      {"vpdpwssd", vnni, DpWssdChains, 32},
  };
  const auto& kind = kinds[which];
  if (!kind.runs) {
    state.SkipWithError(absl::StrCat(kind.name, ": not on this CPU").c_str());
    return;
  }
  StepTimes times;
  for (auto _ : state) {
    const auto start = std::chrono::steady_clock::now();
    benchmark::DoNotOptimize(kind.loop());
    const double elapsed =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    state.SetIterationTime(elapsed);
    times.Add(elapsed);
  }
  const double instructions = static_cast<double>(kIterations) * kChains;
  state.counters["G_per_s"] = instructions / times.Best() / 1e9;
  state.counters["G_products_per_s"] = instructions * kind.products / times.Best() / 1e9;
  state.SetLabel(kind.name);
}

// args: FMAs per 32 bytes read (0: the probe's own loop), and streams per thread (4 as the
// probe, or 1). All threads, 256 MiB of huge-page memory (as the probe and the KV cache's
// blocks), each thread its own share.
void BM_ReadWithFmas(benchmark::State& state) {
  const int fmas = static_cast<int>(state.range(0));
  const bool one_stream = state.range(1) == 1;
  MeasureMachineLimits();
  __builtin_cpu_init();
  if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma")) {
    state.SkipWithError("needs AVX2 and FMA");
    return;
  }
  constexpr int64_t kBytes = int64_t{256} << 20;
  const LargeMemory memory = LargeMemory::Map(kBytes);
  if (!memory) {
    state.SkipWithError("cannot map 256 MiB");
    return;
  }
  auto* const data = reinterpret_cast<float*>(memory.data());
  const int64_t count = kBytes / 4;
  // Small values, so that no chain overflows; written by the threads that read them (page
  // placement, as in the probe).
#pragma omp parallel
  {
    const int64_t share = count / omp_get_num_threads(), begin = omp_get_thread_num() * share;
    for (int64_t i = begin; i < begin + share; ++i) data[i] = 1e-3f * static_cast<float>(i % 7);
  }
  using Loop = float (*)(const float*, int64_t);
  const Loop four[] = {ReadWithFmas<0>, ReadWithFmas<4>, ReadWithFmas<8>, ReadWithFmas<16>};
  const Loop one[] = {ReadWithFmas<0, 1>, ReadWithFmas<4, 1>, ReadWithFmas<8, 1>,
                      ReadWithFmas<16, 1>};
  const int index = fmas == 0 ? 0 : fmas == 4 ? 1 : fmas == 8 ? 2 : 3;
  const Loop loop = one_stream ? one[index] : four[index];
  StepTimes times;
  const MachineLimits before = MeasureLimitsNow();
  for (auto _ : state) {
    float sum = 0;
    const auto start = std::chrono::steady_clock::now();
#pragma omp parallel reduction(+ : sum)
    {
      const int64_t share = count / omp_get_num_threads();
      sum += loop(data + omp_get_thread_num() * share, share);
    }
    const double elapsed =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    state.SetIterationTime(elapsed);
    times.Add(elapsed);
    benchmark::DoNotOptimize(sum);
  }
  const MachineLimits limits = BetterOf(before, MeasureLimitsNow());
  // What the loops read: each thread's four streams of whole 16-float steps.
  const int64_t threads = omp_get_max_threads();
  const double bytes = static_cast<double>(threads * 4 * (count / threads / 4 / 16 * 16) * 4);
  state.counters["GBs"] = bytes / times.Median() / 1e9;
  state.counters["read_bw_GBs"] = limits.read_bytes_per_second / 1e9;
  state.counters["ratio"] = bytes / times.Median() / limits.read_bytes_per_second;
  state.counters["ratio_best"] = bytes / times.Best() / limits.read_bytes_per_second;
}

// The decode kernels over a long f32 sequence already in memory (128 MiB: 16384 tokens of 8 KV
// heads x 128, K then V), with nothing of the engine or the cache around them: which memory
// layout and order can stream at the read probe's rate. arg `layout`:
//   0: each head's rows contiguous (as in the KV cache's blocks); the threads take heads;
//   1: rows of every head side by side ([tokens, heads, d], a caller's tensor), head by head
//      (each pass reads a 512-byte piece of every 4 KiB row); the threads take heads;
//   2: the same tensor span by span: 64 tokens, all heads, then the next 64; each thread its
//      own half of the tokens (what the engine does, tile::Work::key_span);
//   3, 4: as 2, but each span in pieces of 16 (3) or 8 (4) whole token rows, every head's rows
//      of a piece before the next piece: the rows are read while they are in the cache.
// Fixed weights stand in for the softmax (its cost is not the question here).
void BM_DecodeLayout(benchmark::State& state) {
  const int layout = static_cast<int>(state.range(0));
  MeasureMachineLimits();
  constexpr int64_t kTokens = 16384, kGroup = kHeads / kKvHeads, kSpan = 64;
  constexpr int64_t kElements = kTokens * kKvHeads * kDim;  // of K, and of V
  const LargeMemory memory = LargeMemory::Map(2 * kElements * 4);
  if (!memory) {
    state.SkipWithError("cannot map 128 MiB");
    return;
  }
  float* const k = reinterpret_cast<float*>(memory.data());
  float* const v = k + kElements;
#pragma omp parallel for
  for (int64_t i = 0; i < 2 * kElements; ++i) k[i] = 1e-3f * static_cast<float>(i % 7);
  const std::vector<float> q = RandomNormal(kGroup * kDim, 4);
  const int64_t stride = layout == 0 ? kDim : kKvHeads * kDim;
  // Row t of head h.
  const auto row = [&](float* base, int64_t h, int64_t t) {
    return layout == 0 ? base + (h * kTokens + t) * kDim : base + (t * kKvHeads + h) * kDim;
  };
  // Both kernels over rows [t0, t0 + n) of head h.
  const auto step = [&](int64_t h, int64_t t0, int64_t n, float* scores, float* out) {
    simd::DotRows(q.data(), kGroup, kDim, {row(k, h, t0), DType::kFloat32, stride}, n, scores, n);
    for (int64_t i = 0; i < kGroup * n; ++i) scores[i] = 1.0f / kTokens;
    simd::AccumulateRows(scores, n, kGroup, {row(v, h, t0), DType::kFloat32, stride}, n, kDim, out);
  };
  StepTimes times;
  const MachineLimits before = MeasureLimitsNow();
  for (auto _ : state) {
    const auto start = std::chrono::steady_clock::now();
#pragma omp parallel
    {
      std::vector<float> scores(kGroup * kTokens), out(kGroup * kDim, 0.0f);
      if (layout == 2) {
        const int64_t share = kTokens / omp_get_num_threads();
        const int64_t begin = omp_get_thread_num() * share;
        for (int64_t t = begin; t < begin + share; t += kSpan) {
          for (int64_t h = 0; h < kKvHeads; ++h) step(h, t, kSpan, scores.data(), out.data());
        }
      } else if (layout >= 3) {
        // Pieces of `piece` whole token rows: every head's rows of the piece, then the next.
        const int64_t piece = layout == 3 ? 16 : 8;
        const int64_t share = kTokens / omp_get_num_threads();
        const int64_t begin = omp_get_thread_num() * share;
        for (int64_t t = begin; t < begin + share; t += kSpan) {
          float* const s = scores.data();
          for (int64_t c = t; c < t + kSpan; c += piece) {
            for (int64_t h = 0; h < kKvHeads; ++h) {
              simd::DotRows(q.data(), kGroup, kDim, {row(k, h, c), DType::kFloat32, stride}, piece,
                            s + h * kGroup * kSpan + (c - t), kSpan);
            }
          }
          for (int64_t i = 0; i < kKvHeads * kGroup * kSpan; ++i) s[i] = 1.0f / kTokens;
          for (int64_t c = t; c < t + kSpan; c += piece) {
            for (int64_t h = 0; h < kKvHeads; ++h) {
              simd::AccumulateRows(s + h * kGroup * kSpan + (c - t), kSpan, kGroup,
                                   {row(v, h, c), DType::kFloat32, stride}, piece, kDim,
                                   out.data());
            }
          }
        }
      } else {
#pragma omp for schedule(dynamic, 1)
        for (int64_t h = 0; h < kKvHeads; ++h) step(h, 0, kTokens, scores.data(), out.data());
      }
      benchmark::DoNotOptimize(out.data());
    }
    const double elapsed =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    state.SetIterationTime(elapsed);
    times.Add(elapsed);
  }
  const MachineLimits limits = BetterOf(before, MeasureLimitsNow());
  const double bytes = 2.0 * kElements * 4;
  state.counters["KV_GBs"] = bytes / times.Median() / 1e9;
  state.counters["read_bw_GBs"] = limits.read_bytes_per_second / 1e9;
  state.counters["ratio"] = bytes / times.Median() / limits.read_bytes_per_second;
  state.counters["ratio_best"] = bytes / times.Best() / limits.read_bytes_per_second;
  state.SetLabel(simd::KernelName());
}

BENCHMARK(BM_DecodeKernel)
    ->ArgNames({"storage", "kernels"})
    ->ArgsProduct({{0, 1, 2}, {-1}})
    ->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_DecodeKernelPart)
    ->ArgNames({"storage", "part", "dim", "sharp", "group"})
    ->ArgsProduct({{0, 1, 2}, {0, 1}, {128, 64, 256}, {0}, {4}})
    ->ArgsProduct({{0, 1, 2}, {1}, {128}, {1, 2}, {4}})
    ->ArgsProduct({{0, 1, 2}, {0, 1}, {128}, {0}, {1, 2}});
BENCHMARK(BM_KernelChoice)->ArgName("storage")->DenseRange(0, 2)->Unit(benchmark::kMillisecond);
// Every kernel set against every other (1 = avx2, then the AVX-512 sets the CPU has).
BENCHMARK(BM_DecodeKernel)
    ->ArgNames({"storage", "kernels"})
    ->ArgsProduct({{0, 1, 2}, {1, 2, 3, 4}})
    ->Unit(benchmark::kMicrosecond);

BENCHMARK(BM_InstructionRate)
    ->ArgName("kind")
    ->DenseRange(0, 6)
    ->Iterations(5)
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);

BENCHMARK(BM_ReadWithFmas)
    ->ArgNames({"fmas_per_32B", "streams"})
    ->ArgsProduct({{0, 4, 8, 16}, {4, 1}})
    ->Unit(benchmark::kMillisecond)
    ->UseManualTime()
    ->Iterations(20);

BENCHMARK(BM_DecodeLayout)
    ->ArgName("layout")
    ->DenseRange(0, 4)
    ->Unit(benchmark::kMillisecond)
    ->UseManualTime()
    ->Iterations(20);

BENCHMARK(BM_DecodeBatch)
    ->ArgNames({"context", "batch", "storage", "threads", "idle"})
    ->ArgsProduct({{1024, 4096, 16384}, {1, 16}, {0, 1, 2}, {0}, {0}})
    ->Args({4096, 1, 0, 1, 0})
    ->Args({4096, 1, 1, 1, 0})
    ->Unit(benchmark::kMillisecond)
    ->UseManualTime()
    ->Iterations(20);

// Short contexts, warm, 2 ms apart, on one thread and on all: where splitting a step across
// threads stops paying for waking them.
BENCHMARK(BM_DecodeBatch)
    ->ArgNames({"context", "batch", "storage", "threads", "idle"})
    ->ArgsProduct({{16, 64, 256, 1024}, {1, 4}, {0, 1}, {0, 1}, {2000}})
    ->Unit(benchmark::kMicrosecond)
    ->UseManualTime()
    ->Iterations(20);

// --scaling_*: see the top of the file. Removes the flags it takes from argv (Google Benchmark
// rejects flags it does not know) and registers BM_DecodeScaling when --scaling_threads is given.
// Returns false, with the reason printed, on a malformed list.
bool RegisterScaling(int* argc, char** argv) {
  std::vector<int64_t> threads, contexts = {4096}, batches = {1, 2, 16}, storages = {0, 1, 2};
  const struct {
    const char* prefix;
    std::vector<int64_t>* values;
    int64_t low, high;
  } flags[] = {{"--scaling_threads=", &threads, 1, 1024},
               {"--scaling_contexts=", &contexts, 2, int64_t{1} << 20},
               {"--scaling_batches=", &batches, 1, 1024},
               {"--scaling_storages=", &storages, 0, 2}};
  int kept = 1;
  for (int i = 1; i < *argc; ++i) {
    const std::string arg = argv[i];
    bool taken = false;
    for (const auto& flag : flags) {
      if (arg.rfind(flag.prefix, 0) != 0) continue;
      taken = true;
      flag.values->clear();
      for (absl::string_view item : absl::StrSplit(arg.substr(strlen(flag.prefix)), ',')) {
        int64_t value = 0;
        if (!absl::SimpleAtoi(item, &value) || value < flag.low || value > flag.high) {
          std::fprintf(stderr, "decode_bench: %s: '%s' is not a number in [%lld, %lld]\n",
                       flag.prefix, std::string(item).c_str(), static_cast<long long>(flag.low),
                       static_cast<long long>(flag.high));
          return false;
        }
        flag.values->push_back(value);
      }
    }
    if (!taken) argv[kept++] = argv[i];
  }
  *argc = kept;
  if (threads.empty()) return true;
  benchmark::RegisterBenchmark("BM_DecodeScaling", BM_DecodeBatch)
      ->ArgNames({"context", "batch", "storage", "threads", "idle"})
      ->ArgsProduct({contexts, batches, storages, threads, {0}})
      ->Unit(benchmark::kMillisecond)
      ->UseManualTime()
      ->Iterations(20);
  return true;
}

}  // namespace
}  // namespace attend::bench

int main(int argc, char** argv) {
  if (!attend::bench::RegisterScaling(&argc, argv)) return 2;
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
