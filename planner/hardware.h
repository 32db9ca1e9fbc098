// Hardware profiles for the cost model: peak FLOP/s per compute type, memory bandwidth and
// capacity. Named profiles carry datasheet figures (sources in hardware.cc and in each profile's
// note); "local" is this machine, measured once on first use with oneDNN (f32 matmul GFLOP/s)
// and a streaming read of a buffer far larger than the last-level cache.
//
// Thread-safety: every function may be called concurrently; the local measurement runs once
// (function-local static) and later callers share its result.
#ifndef ATTEND_PLANNER_HARDWARE_H_
#define ATTEND_PLANNER_HARDWARE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace attend::planner {

// Mirrors attend.v1.HardwareProfile. Dense (not sparse) peaks.
struct HardwareProfile {
  std::string name;
  double peak_flops_f32 = 0.0;   // FLOP/s
  double peak_flops_bf16 = 0.0;  // FLOP/s, also used for float16
  double peak_flops_fp8 = 0.0;   // FLOP/s, also used for int8; 0 when the part has neither
  double memory_bandwidth_bytes_per_second = 0.0;
  double memory_bytes = 0.0;  // capacity
  std::string note;           // where the figures come from
};

// The named profiles: "h100" (H100 SXM5 80GB), "h200" (H200 SXM 141GB), "a100" (A100 SXM4
// 80GB), "cpu-socket" (one Intel Xeon Platinum 8480+ socket).
const std::vector<HardwareProfile>& HardwareCatalog();

// A named profile (case-insensitive; also "h100-sxm", "a100-80gb", "xeon-8480+"), or "local"
// (measured on first use; INTERNAL when the measurement failed). NOT_FOUND lists the names.
// `field` names where `name` came from (e.g. a request field); when it is not empty, every error
// message starts with "<field>: ".
absl::StatusOr<HardwareProfile> FindHardware(absl::string_view name, absl::string_view field = "");

// This machine, measured on first use (a few hundred milliseconds) and cached for the process.
// When a measurement fails, its figure is 0 and the note says why.
const HardwareProfile& LocalHardware();

// Checks a custom profile: finite, non-negative figures; bandwidth > 0; at least one peak > 0;
// name and note lengths. INVALID_ARGUMENT naming the field under `field`, the path of the
// profile itself: "hardware.memory_bytes: ...", or "hardware: ..." for the profile as a whole.
absl::Status ValidateHardware(const HardwareProfile& hardware,
                              absl::string_view field = "hardware");

// Measurement primitives behind LocalHardware(), exposed for tests and benchmarks.
// Best-of-`runs` rate, in FLOP/s, of an n x n x n oneDNN matmul (f32, or bf16 inputs with f32
// output when `bf16`) after one warm-up run. 16 <= n <= 4096, 1 <= runs <= 100.
absl::StatusOr<double> MeasureMatmulFlops(int64_t n, int runs, bool bf16);
// Best-of-`runs` rate of summing a `bytes`-byte buffer with all OpenMP threads, in bytes/s: the
// buffer is LargeMemory (huge-page candidates, as KV-cache blocks are) and each thread sums its
// share with eight vector accumulators, so that the figure is what the memory delivers rather
// than what one add chain can take. The buffer is written once first so that page faults are
// not timed. 1 MiB <= bytes <= 4 GiB.
absl::StatusOr<double> MeasureReadBandwidth(int64_t bytes, int runs);

}  // namespace attend::planner

#endif  // ATTEND_PLANNER_HARDWARE_H_
