#include "bench/kernel_step.h"

#include <benchmark/benchmark.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "common/half.h"

namespace attend::bench {

std::vector<float> RandomNormal(int64_t n, uint64_t seed) {
  std::mt19937 rng(static_cast<uint32_t>(seed));
  std::normal_distribution<float> normal;
  std::vector<float> x(static_cast<size_t>(n));
  for (float& e : x) e = normal(rng);
  return x;
}

KernelStep::KernelStep(DType storage, int64_t dim, int64_t group)
    : storage_(storage), dim_(dim), group_(group) {
  q_ = RandomNormal(group_ * dim_, 4);
  const std::vector<float> values = RandomNormal(2 * kRows * dim_, 5);
  // Over bf16 storage decode computes in bf16 (Precision::kAuto): q arrives rounded.
  if (storage == DType::kBFloat16) {
    for (float& x : q_) x = Bf16ToFloat(FloatToBf16(x));
  }
  // K and V in the storage dtype; int8 with one scale per row (the values' absmax / 127).
  kv_.resize(static_cast<size_t>(2 * kRows * dim_ * DTypeSize(storage)));
  scales_.assign(2 * kRows, 1.0f);
  for (int64_t row = 0; row < 2 * kRows; ++row) {
    float absmax = 0;
    for (int64_t c = 0; c < dim_; ++c) {
      absmax = std::max(absmax, std::abs(values[row * dim_ + c]));
    }
    if (storage == DType::kInt8) scales_[row] = absmax / 127.0f;
    for (int64_t c = 0; c < dim_; ++c) {
      const int64_t i = row * dim_ + c;
      if (storage == DType::kFloat32) {
        reinterpret_cast<float*>(kv_.data())[i] = values[i];
      } else if (storage == DType::kBFloat16) {
        reinterpret_cast<uint16_t*>(kv_.data())[i] = FloatToBf16(values[i]);
      } else {
        kv_[i] = static_cast<char>(std::lround(values[i] / scales_[row]));
      }
    }
  }
  k_ = simd::Rows{kv_.data(), storage, dim_, scales_.data()};
  v_ = simd::Rows{kv_.data() + kRows * dim_ * DTypeSize(storage), storage, dim_,
                  scales_.data() + kRows};
  // As under native bf16 arithmetic: the bf16 sets' dot product instructions may run.
  k_.native_bf16 = v_.native_bf16 = storage == DType::kBFloat16;
  scores_.resize(group_ * kRows);
  out_.resize(group_ * dim_);
  SetWeights(Weights::kUniform);
}

void KernelStep::SetWeights(Weights weights) {
  weights_.assign(group_ * kRows, 1.0f / kRows);
  const std::vector<float> draws =
      weights == Weights::kSharp ? RandomNormal(group_ * kRows, 6) : std::vector<float>();
  for (int64_t j = 0; j < group_; ++j) {
    float* row = weights_.data() + j * kRows;
    if (weights == Weights::kSink) {
      // One key with weight 1, the others 4.5e-5 of it (e^-10), as when a sink holds half the
      // attention of 20,000 keys; the int16 weights round such a tail alike.
      std::fill_n(row, kRows, 4.5e-5f);
      row[37] = 1.0f;
    } else if (weights == Weights::kSharp) {
      // A softmax of scores of standard deviation 2.
      constexpr double kSigma = 2.0;
      const float* s = draws.data() + j * kRows;
      const float top = kSigma * *std::max_element(s, s + kRows);
      double sum = 0;
      for (int64_t t = 0; t < kRows; ++t) sum += row[t] = std::exp(kSigma * s[t] - top);
      for (int64_t t = 0; t < kRows; ++t) row[t] = static_cast<float>(row[t] / sum);
    }
  }
  // As q: decode over bf16 storage computes in bf16, its weights arrive rounded (f32 ones would
  // send the bf16 sets to their f32 kernels).
  if (storage_ == DType::kBFloat16) {
    for (float& x : weights_) x = Bf16ToFloat(FloatToBf16(x));
  }
}

void KernelStep::Run(int steps, Part part) {
  if (part == Part::kAccumulate) std::copy(weights_.begin(), weights_.end(), scores_.begin());
  for (int rep = 0; rep < steps; ++rep) {
    if (part != Part::kAccumulate) {
      simd::DotRows(q_.data(), group_, dim_, k_, kRows, scores_.data(), kRows);
    }
    if (part == Part::kBoth) std::copy(weights_.begin(), weights_.end(), scores_.begin());
    if (part != Part::kDot) {
      simd::AccumulateRows(scores_.data(), kRows, group_, v_, kRows, dim_, out_.data());
    }
  }
  benchmark::DoNotOptimize(scores_.data());
  benchmark::DoNotOptimize(out_.data());
}

double KernelStep::Bytes() const { return 2.0 * kRows * dim_ * DTypeSize(storage_); }

}  // namespace attend::bench
