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

KernelStep::KernelStep(DType storage, int64_t dim) : storage_(storage), dim_(dim) {
  q_ = RandomNormal(kGroup * dim_, 4);
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
  scores_.resize(kGroup * kRows);
  out_.resize(kGroup * dim_);
}

void KernelStep::Run(int steps, Part part) {
  // Weights like a softmax's (positive, summing to 1 per row); the kernels' speed does not
  // depend on them, only the output's scale does.
  const float weight = 1.0f / kRows;
  if (part == Part::kAccumulate) std::fill(scores_.begin(), scores_.end(), weight);
  for (int rep = 0; rep < steps; ++rep) {
    if (part != Part::kAccumulate) {
      simd::DotRows(q_.data(), kGroup, dim_, k_, kRows, scores_.data(), kRows);
    }
    if (part == Part::kBoth) std::fill(scores_.begin(), scores_.end(), weight);
    if (part != Part::kDot) {
      simd::AccumulateRows(scores_.data(), kRows, kGroup, v_, kRows, dim_, out_.data());
    }
  }
  benchmark::DoNotOptimize(scores_.data());
  benchmark::DoNotOptimize(out_.data());
}

double KernelStep::Bytes() const { return 2.0 * kRows * dim_ * DTypeSize(storage_); }

}  // namespace attend::bench
