// What the CPU offers the kernels, as oneDNN sees it (its dispatcher picks the kernels, so its
// view is the one that decides what runs). For the start-up line, /metrics and the engine's
// choice between native and emulated bf16.
//
// Thread-safety: both functions may be called from any thread; each probes once.
#ifndef ATTEND_CORE_KERNELS_CPU_FEATURES_H_
#define ATTEND_CORE_KERNELS_CPU_FEATURES_H_

#include <string>

namespace attend {

// Whether oneDNN can run bf16 matmuls on this CPU (AVX512-BF16 or AMX). oneDNN 2.6 has no bf16
// matmul for AVX2-only CPUs; callers then emulate bf16 with f32 kernels on bf16-rounded values.
bool HasBf16Matmul();

// Whether bf16 products run on oneDNN's bf16 matmul: where it has one and it is the faster of the
// two, that is with AMX, or on CPUs other than Intel's (AMD's Zen 4: twice the f32 rate). Intel
// cores without AMX retire vdpbf16ps at half the rate of the f32 FMAs, and oneDNN's bf16 matmul
// ran at 0.5-0.7x its f32 one there (BENCHMARKS.md); bf16 then multiplies bf16-rounded values on
// the f32 matmul instead, the same exact products with f32 sums.
bool UseBf16Matmul();

// oneDNN's name for the CPU's instruction set, e.g. "avx512_core_amx".
std::string CpuIsaName();

}  // namespace attend

#endif  // ATTEND_CORE_KERNELS_CPU_FEATURES_H_
