#include "bench/machine_limits.h"

#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_format.h"
#include "core/kernels/cpu_features.h"
#include "core/kernels/onednn.h"
#include "core/kernels/simd.h"
#include "planner/hardware.h"

namespace attend::bench {

namespace {

// Ten independent chains of 8-lane FMAs on the calling thread: more than the FMA latency times
// the number of FMA pipes on current x86 cores, so the pipes, not the chains, bound the rate.
__attribute__((target("avx2,fma"))) double MeasureFma8PerSecond() {
  __m256 a[10];
  for (int i = 0; i < 10; ++i) a[i] = _mm256_set1_ps(1.0f + 0.1f * static_cast<float>(i));
  const __m256 m = _mm256_set1_ps(0.999999f), c = _mm256_set1_ps(1e-7f);
  constexpr int64_t kIterations = 20'000'000;
  double best = 0;
  for (int run = 0; run < 3; ++run) {
    const auto start = std::chrono::steady_clock::now();
    for (int64_t i = 0; i < kIterations; ++i) {
#pragma GCC unroll 10
      for (int j = 0; j < 10; ++j) a[j] = _mm256_fmadd_ps(a[j], m, c);
    }
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    best = std::max(best, 10.0 * kIterations / seconds);
  }
  // Keeps the chains alive (their values are never 12345).
  float lanes[8];
  __m256 sum = a[0];
  for (int i = 1; i < 10; ++i) sum = _mm256_add_ps(sum, a[i]);
  _mm256_storeu_ps(lanes, sum);
  return lanes[0] == 12345.0f ? 0.0 : best;
}

double MeasureFma8PerSecondIfSupported() {
  __builtin_cpu_init();
  if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma")) return 0;
  return MeasureFma8PerSecond();
}

// The planner's probes (the same ones behind the "local" hardware profile). The machine is
// shared: the best of several runs is the closest to its limit.
MachineLimits Probe(int matmul_runs, int64_t read_bytes, int read_runs) {
  MachineLimits m;
  m.cpu_isa = CpuIsaName();
  m.matmul_f32_flops = planner::MeasureMatmulFlops(1024, matmul_runs, /*bf16=*/false).value_or(0.0);
  if (HasBf16Matmul()) {
    m.matmul_bf16_flops =
        planner::MeasureMatmulFlops(1024, matmul_runs, /*bf16=*/true).value_or(0.0);
  }
  m.read_bytes_per_second = planner::MeasureReadBandwidth(read_bytes, read_runs).value_or(0.0);
  m.fma8_per_second_per_core = MeasureFma8PerSecondIfSupported();
  return m;
}

}  // namespace

const MachineLimits& MeasureMachineLimits() {
  static const MachineLimits limits = [] {
    // ATTEND_SIMD_KERNELS picks the decode kernel set, as the server's --simd_kernels does, so
    // that two runs compare sets on one machine.
    if (const char* kernels = std::getenv("ATTEND_SIMD_KERNELS");
        kernels != nullptr && *kernels != '\0') {
      if (const absl::Status set = simd::SetKernels(kernels); !set.ok()) {
        std::fprintf(stderr, "ATTEND_SIMD_KERNELS='%s': %s\n", kernels,
                     std::string(set.message()).c_str());
        std::exit(2);
      }
    }
    const MachineLimits m = Probe(8, int64_t{512} << 20, 5);
    const std::string bf16 = m.matmul_bf16_flops > 0
                                 ? absl::StrFormat("%.1f GFLOP/s", m.matmul_bf16_flops / 1e9)
                                 : "not supported (emulated on f32 kernels)";
    std::fprintf(
        stderr,
        "machine: %d threads, isa %s, oneDNN matmul f32 %.1f GFLOP/s, bf16 %s, read bandwidth "
        "%.2f GB/s, one core %.2f G 8-lane FMA/s, decode kernels %s\n",
        omp_get_max_threads(), m.cpu_isa.c_str(), m.matmul_f32_flops / 1e9, bf16.c_str(),
        m.read_bytes_per_second / 1e9, m.fma8_per_second_per_core / 1e9,
        simd::KernelName().c_str());
    return m;
  }();
  return limits;
}

MachineLimits MeasureLimitsNow() { return Probe(3, int64_t{256} << 20, 2); }

float EvictCaches() {
  static std::vector<float> buffer(size_t{16} << 20, 1.0f);
  float sum = 0;
  for (size_t i = 0; i < buffer.size(); i += 16) sum += buffer[i];
  return sum;
}

MachineLimits BetterOf(const MachineLimits& a, const MachineLimits& b) {
  MachineLimits m = a;
  m.matmul_f32_flops = std::max(a.matmul_f32_flops, b.matmul_f32_flops);
  m.matmul_bf16_flops = std::max(a.matmul_bf16_flops, b.matmul_bf16_flops);
  m.read_bytes_per_second = std::max(a.read_bytes_per_second, b.read_bytes_per_second);
  m.fma8_per_second_per_core = std::max(a.fma8_per_second_per_core, b.fma8_per_second_per_core);
  return m;
}

}  // namespace attend::bench
