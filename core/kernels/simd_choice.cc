// The measurement behind simd::ChooseKernels: which kernel set decodes each storage type fastest
// on this machine's cores. The instructions a CPU reports do not answer it: on a Zen 5 the
// avx512_bf16 set (vdpbf16ps) read bf16 K/V at 10.6-14 GB/s where the avx2 set read 23.3-23.6, and
// on Intel cores vdpbf16ps runs at half the FMAs' rate.
//
// The problem is one decode step of one key/value head: 4 query rows (a GQA group) against 256
// cached tokens of d = 128, DotRows then AccumulateRows, dense rows as the KV cache's blocks hold
// them: 256 KiB of K and V in f32, 128 in bf16, 64 in int8, which stay in L2 (so that the
// measurement times the kernels, not the memory that every set reads alike). bf16 runs as under
// bf16 arithmetic, the default over bf16 storage: q and p hold bf16 values and the rows allow
// native bf16 products, so that the sets with vdpbf16ps use it.
//
// Noise: each (type, set) sample is a few back-to-back steps; a round takes one sample of every
// pair, the sets in a rotated order, so that a change of clock frequency or a neighbour's burst
// hits every set alike; a set other than the default must beat it by kClearMargin both in its
// best sample over the rounds (the least disturbed) and in its median (what most rounds saw).
// Rounds stop at 30 or when the 35 ms budget is spent (at least 3 rounds): the whole measurement,
// data set-up included, stays under 50 ms on a machine several times slower than the one that
// measured it.
//
// Thread-safety: MeasureRowKernels may run on any thread; it uses only its own buffers (and the
// kernels' thread_local scratch).
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <vector>

#include "common/half.h"
#include "core/kernels/simd.h"
#include "core/kernels/simd_internal.h"

namespace attend::simd::internal {
namespace {

constexpr int64_t kQueryRows = 4, kTokens = 256, kDim = 128;
// Steps per sample: a step took 7.4-9 us on a Xeon core (every type alike: the narrow ones do
// more work per byte), so a sample is about 32 us, well above the clock's resolution and short
// enough for many rounds: 30 rounds of 4 sets x 3 types took 13-35 ms there, set-up included.
constexpr int kStepsPerSample = 4;
constexpr int kMinRounds = 3, kMaxRounds = 30;
constexpr double kBudgetSeconds = 0.035;

using Clock = std::chrono::steady_clock;

// Deterministic values in [-1, 1): the kernels' speed does not depend on them.
class Values {
 public:
  float Next() {
    state_ ^= state_ << 13;
    state_ ^= state_ >> 7;
    state_ ^= state_ << 17;
    return static_cast<float>(state_ >> 40) / static_cast<float>(1 << 23) - 1.0f;
  }

 private:
  uint64_t state_ = 0x9e3779b97f4a7c15ull;
};

// One storage type's decode step: q, K, V, the weights p and the outputs.
struct Problem {
  DType dtype;
  std::vector<float> q, p, scores, out, scales;
  std::vector<char> kv;
  Rows k, v;

  Problem(DType type, Values& values) : dtype(type) {
    const bool bf16 = type == DType::kBFloat16;
    q.resize(kQueryRows * kDim);
    for (float& x : q) x = bf16 ? Bf16ToFloat(FloatToBf16(values.Next())) : values.Next();
    // Weights like a softmax's, positive and summing to about 1 per row (rounded to bf16 as
    // bf16 arithmetic rounds them).
    p.resize(kQueryRows * kTokens);
    for (float& x : p) {
      x = (1.5f + values.Next()) / kTokens;
      if (bf16) x = Bf16ToFloat(FloatToBf16(x));
    }
    scores.resize(kQueryRows * kTokens);
    out.assign(kQueryRows * kDim, 0.0f);
    scales.assign(2 * kTokens, 1.0f / 127);
    kv.resize(static_cast<size_t>(2 * kTokens * kDim * DTypeSize(type)));
    for (int64_t i = 0; i < 2 * kTokens * kDim; ++i) {
      const float x = values.Next();
      if (type == DType::kFloat32) {
        reinterpret_cast<float*>(kv.data())[i] = x;
      } else if (bf16) {
        reinterpret_cast<uint16_t*>(kv.data())[i] = FloatToBf16(x);
      } else {
        kv[static_cast<size_t>(i)] = static_cast<char>(static_cast<int>(x * 127));
      }
    }
    k = Rows{kv.data(), type, kDim, scales.data(), bf16};
    v = Rows{kv.data() + kTokens * kDim * DTypeSize(type), type, kDim, scales.data() + kTokens,
             bf16};
  }

  // Seconds for kStepsPerSample steps on `set`.
  double Time(const Kernels& set) {
    const Clock::time_point start = Clock::now();
    for (int step = 0; step < kStepsPerSample; ++step) {
      set.dot_rows(q.data(), kQueryRows, kDim, k, kTokens, scores.data(), kTokens);
      set.accumulate_rows(p.data(), kTokens, kQueryRows, v, kTokens, kDim, out.data());
    }
    return std::chrono::duration<double>(Clock::now() - start).count();
  }
};

}  // namespace

size_t ChooseSet(const std::vector<SetTimes>& times, size_t fallback) {
  // Another set only when clearly faster than the default by both statistics: a difference
  // within the noise would flip the choice between runs (by the best sample alone, two sets
  // running the same code came out 5% apart about once in a dozen runs here).
  const SetTimes& base = times[fallback];
  size_t chosen = fallback;
  for (size_t set = 0; set < times.size(); ++set) {
    if (times[set].best < base.best * (1 - kClearMargin) &&
        times[set].median < base.median * (1 - kClearMargin) &&
        times[set].median < times[chosen].median) {
      chosen = set;
    }
  }
  return chosen;
}

RowChoice MeasureRowKernels(const std::vector<const Kernels*>& candidates,
                            const Kernels* fallback) {
  const Clock::time_point start = Clock::now();
  RowChoice choice;
  for (const Kernels*& set : choice.sets) set = fallback;
  const size_t n = candidates.size();
  const size_t fallback_index =
      std::find(candidates.begin(), candidates.end(), fallback) - candidates.begin();
  if (n > 1 && fallback_index < n) {
    Values values;
    std::vector<Problem> problems;
    problems.reserve(kRowTypes);  // each Problem's Rows point into its own buffers
    for (DType type : {DType::kFloat32, DType::kBFloat16, DType::kInt8}) {
      problems.emplace_back(type, values);
    }
    // samples[type][set]: one per counted round.
    std::vector<std::vector<std::vector<double>>> samples(kRowTypes,
                                                          std::vector<std::vector<double>>(n));
    // Round 0 warms the caches, the kernels' scratch and the clock, and is not counted.
    for (int round = 0; round <= kMaxRounds; ++round) {
      for (int type = 0; type < kRowTypes; ++type) {
        for (size_t i = 0; i < n; ++i) {
          const size_t set = (i + static_cast<size_t>(round)) % n;
          const double seconds = problems[static_cast<size_t>(type)].Time(*candidates[set]);
          if (round > 0) samples[static_cast<size_t>(type)][set].push_back(seconds);
        }
      }
      if (round >= kMinRounds &&
          std::chrono::duration<double>(Clock::now() - start).count() > kBudgetSeconds) {
        break;
      }
    }
    for (int type = 0; type < kRowTypes; ++type) {
      std::vector<SetTimes> times;
      for (std::vector<double>& set_samples : samples[static_cast<size_t>(type)]) {
        std::sort(set_samples.begin(), set_samples.end());
        times.push_back(SetTimes{set_samples.front(), set_samples[set_samples.size() / 2]});
      }
      choice.sets[type] = candidates[ChooseSet(times, fallback_index)];
    }
  }
  choice.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  return choice;
}

}  // namespace attend::simd::internal
