// Internal to core/kernels: what the AVX-512 kernel files share (simd_avx512.cc, the f32, bf16
// and dispatch parts; simd_avx512_int8.cc, the int8 dot products): the target attributes, lane
// masks, the row order of the blocked kernels, and the int8 entry point.
//
// Thread-safety: pure functions.
#ifndef ATTEND_CORE_KERNELS_SIMD_AVX512_H_
#define ATTEND_CORE_KERNELS_SIMD_AVX512_H_

#include <immintrin.h>

#include <cstdint>

#include "core/kernels/simd.h"

namespace attend::simd::internal {

#define ATTEND_AVX512_BASE "avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,bmi,bmi2"
#define ATTEND_AVX512 __attribute__((target(ATTEND_AVX512_BASE)))
#define ATTEND_AVX512_VNNI __attribute__((target(ATTEND_AVX512_BASE ",avx512vnni")))
#define ATTEND_AVX512_BF16 __attribute__((target(ATTEND_AVX512_BASE ",avx512vnni,avx512bf16")))

// The vdpbf16ps operand type; the casts from __m512i are bit casts.
using Bh512 = __m512bh;

// The first n lanes (none for n <= 0, all past the width).
ATTEND_AVX512 inline __mmask16 Mask16(int64_t n) {
  if (n <= 0) return 0;
  return n >= 16 ? static_cast<__mmask16>(0xffff) : static_cast<__mmask16>((1u << n) - 1);
}
ATTEND_AVX512 inline __mmask32 Mask32(int64_t n) {
  if (n <= 0) return 0;
  return n >= 32 ? static_cast<__mmask32>(0xffffffffu) : static_cast<__mmask32>((1u << n) - 1);
}
ATTEND_AVX512 inline __mmask64 Mask64(int64_t n) {
  if (n <= 0) return 0;
  return n >= 64 ? ~__mmask64{0} : static_cast<__mmask64>((uint64_t{1} << n) - 1);
}

// Row r of R's rows at step g: row g of span r (spans of `span` rows).
inline int64_t SpanRow(int r, int64_t g, int64_t span) { return r * span + g; }

// scores[j * ld + t] = q row j . int8 key row t (times its scale), on vpdpbusd with q in two
// int8 parts (simd_avx512_int8.cc); heads past the int32 sums' range take the AVX2 kernel.
// REQUIRES: the CPU has AVX512-VNNI (and F, BW, VL, DQ); k.dtype is kInt8.
void DotInt8Vnni(const float* q, int64_t m, int64_t d, const Rows& k, int64_t rows, float* scores,
                 int64_t ld);

}  // namespace attend::simd::internal

#endif  // ATTEND_CORE_KERNELS_SIMD_AVX512_H_
