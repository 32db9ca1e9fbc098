#include "bench/machine_limits.h"

#include <omp.h>

#include <algorithm>
#include <cstdio>
#include <string>

#include "core/onednn.h"
#include "core/planner/hardware.h"

namespace attend::bench {

namespace {

// The planner's probes (the same ones behind the "local" hardware profile). The machine is
// shared: the best of several runs is the closest to its limit.
MachineLimits Probe(int matmul_runs, int64_t read_bytes, int read_runs) {
  MachineLimits m;
  m.cpu_isa = onednn::CpuIsaName();
  m.matmul_f32_flops = planner::MeasureMatmulFlops(1024, matmul_runs, /*bf16=*/false).value_or(0.0);
  if (onednn::HasBf16Matmul()) {
    m.matmul_bf16_flops =
        planner::MeasureMatmulFlops(1024, matmul_runs, /*bf16=*/true).value_or(0.0);
  }
  m.read_bytes_per_second = planner::MeasureReadBandwidth(read_bytes, read_runs).value_or(0.0);
  return m;
}

}  // namespace

const MachineLimits& MeasureMachineLimits() {
  static const MachineLimits limits = [] {
    const MachineLimits m = Probe(8, int64_t{512} << 20, 5);
    const std::string bf16 = m.matmul_bf16_flops > 0
                                 ? std::to_string(m.matmul_bf16_flops / 1e9) + " GFLOP/s"
                                 : "not supported (emulated on f32 kernels)";
    std::fprintf(
        stderr,
        "machine: %d threads, isa %s, oneDNN matmul f32 %.1f GFLOP/s, bf16 %s, read bandwidth "
        "%.2f GB/s\n",
        omp_get_max_threads(), m.cpu_isa.c_str(), m.matmul_f32_flops / 1e9, bf16.c_str(),
        m.read_bytes_per_second / 1e9);
    return m;
  }();
  return limits;
}

MachineLimits MeasureLimitsNow() { return Probe(3, int64_t{256} << 20, 2); }

MachineLimits BetterOf(const MachineLimits& a, const MachineLimits& b) {
  MachineLimits m = a;
  m.matmul_f32_flops = std::max(a.matmul_f32_flops, b.matmul_f32_flops);
  m.matmul_bf16_flops = std::max(a.matmul_bf16_flops, b.matmul_bf16_flops);
  m.read_bytes_per_second = std::max(a.read_bytes_per_second, b.read_bytes_per_second);
  return m;
}

}  // namespace attend::bench
