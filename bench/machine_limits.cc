#include "bench/machine_limits.h"

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <vector>

#include "core/half.h"
#include "core/onednn.h"

namespace attend::bench {
namespace {

double Seconds(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

double MatmulFlops(dnnl::memory::data_type type) {
  const int64_t n = 1024;
  onednn::MatmulSpec spec;
  spec.src = {n, n, n, 1, type};
  spec.weights = {n, n, n, 1, type};
  spec.dst = {n, n, n, 1, dnnl::memory::data_type::f32};
  auto matmul = onednn::GetMatmul(spec);
  if (!matmul.ok()) return 0;
  const size_t bytes = static_cast<size_t>(n * n) * (type == dnnl::memory::data_type::bf16 ? 2 : 4);
  std::vector<char> a(bytes, 0), b(bytes, 0);
  std::vector<float> c(static_cast<size_t>(n * n));
  // Fill with small values (valid in both f32 and bf16 encodings).
  for (size_t i = 0; i + 1 < bytes; i += 2) {
    const uint16_t h = FloatToBf16(0.01f);
    a[i + 1] = static_cast<char>(h >> 8);
    b[i + 1] = static_cast<char>(h >> 8);
  }
  double best = 1e30;
  for (int rep = 0; rep < 6; ++rep) {
    const auto start = std::chrono::steady_clock::now();
    if (!(*matmul)->Execute(a.data(), b.data(), c.data()).ok()) return 0;
    best = std::min(best, Seconds(start));
  }
  return 2.0 * n * n * n / best;
}

double ReadBandwidth() {
  // 512 MiB: far larger than any cache here.
  const size_t n = (size_t{512} << 20) / sizeof(float);
  std::vector<float> data(n, 1.0f);
  double best = 1e30;
  volatile float sink = 0;
  for (int rep = 0; rep < 4; ++rep) {
    const auto start = std::chrono::steady_clock::now();
    float total = 0;
#pragma omp parallel for reduction(+ : total) schedule(static)
    for (int64_t i = 0; i < static_cast<int64_t>(n); i += 16) {
      float s = 0;
      for (int j = 0; j < 16; ++j) s += data[static_cast<size_t>(i + j)];
      total += s;
    }
    best = std::min(best, Seconds(start));
    sink = sink + total;
  }
  return static_cast<double>(n * sizeof(float)) / best;
}

}  // namespace

const MachineLimits& MeasureMachineLimits() {
  static const MachineLimits limits = [] {
    MachineLimits m;
    m.cpu_isa = onednn::CpuIsaName();
    m.matmul_f32_flops = MatmulFlops(dnnl::memory::data_type::f32);
    if (onednn::HasBf16Matmul()) m.matmul_bf16_flops = MatmulFlops(dnnl::memory::data_type::bf16);
    m.read_bytes_per_second = ReadBandwidth();
    std::printf(
        "machine: %d threads, isa %s, oneDNN matmul f32 %.1f GFLOP/s, bf16 %s, read bandwidth "
        "%.2f GB/s\n",
        omp_get_max_threads(), m.cpu_isa.c_str(), m.matmul_f32_flops / 1e9,
        m.matmul_bf16_flops > 0 ? (std::to_string(m.matmul_bf16_flops / 1e9) + " GFLOP/s").c_str()
                                : "not supported (emulated on f32 kernels)",
        m.read_bytes_per_second / 1e9);
    return m;
  }();
  return limits;
}

}  // namespace attend::bench
