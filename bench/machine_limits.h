// This machine's own limits, measured in the same process as a benchmark so that results can be
// reported as ratios: oneDNN f32 (and bf16 where supported) matmul throughput, streaming read
// bandwidth, and one core's vector FMA throughput. The machine is shared and noisy; each figure is
// the best of several runs.
#ifndef ATTEND_BENCH_MACHINE_LIMITS_H_
#define ATTEND_BENCH_MACHINE_LIMITS_H_

#include <string>

namespace attend::bench {

struct MachineLimits {
  double matmul_f32_flops = 0;   // FLOP/s, 1024^3 oneDNN matmul, all threads
  double matmul_bf16_flops = 0;  // 0 when oneDNN has no bf16 matmul on this CPU
  double read_bytes_per_second = 0;
  // 8-lane FMA instructions per second on one core (register operands only, enough independent
  // chains to hide the latency); 0 without AVX2+FMA. The arithmetic ceiling of the decode kernels.
  double fma8_per_second_per_core = 0;
  std::string cpu_isa;
};

// Measures once per process (about a second), prints the figures to stderr (stdout stays for
// the benchmark's own output, JSON included) and caches the result.
const MachineLimits& MeasureMachineLimits();

// The limits again, quickly (about 0.2 s: fewer runs, a 256 MiB read). The machine's speed
// drifts by 10-30% over a run (other tenants), so each benchmark case probes right before and
// right after itself and reports its ratio against the better of the two (AroundCase): the limit
// of its own moment, and the less flattering one of the two.
MachineLimits MeasureLimitsNow();

// Field by field, the larger of a and b.
MachineLimits BetterOf(const MachineLimits& a, const MachineLimits& b);

// Reads 64 MiB (twice the last-level cache of the machines measured so far) so that the next
// step reads its K/V from memory, as serving does (many sequences and layers between two steps
// of one), not from a cache that still holds the previous step's. Returns a sum so that the
// reads are not elided.
float EvictCaches();

}  // namespace attend::bench

#endif  // ATTEND_BENCH_MACHINE_LIMITS_H_
