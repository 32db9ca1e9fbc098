#include "bench/instruction_chains.h"

#include <immintrin.h>

#include <cstdint>

namespace attend::bench {

// GCC 12's AVX-512 intrinsics trip -Wuninitialized (its _mm512_undefined_* idiom, GCC bug
// 105593), as in core/kernels/simd_avx512.cc.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

__attribute__((target("avx2,fma"))) float Fma8Chains() {
  __m256 a[kChains];
  for (int i = 0; i < kChains; ++i) a[i] = _mm256_set1_ps(static_cast<float>(i));
  __m256 x = _mm256_set1_ps(0.999f);
  const __m256 y = _mm256_set1_ps(1e-3f);
  for (int64_t k = 0; k < kIterations; ++k) {
#pragma GCC unroll 24
    for (int i = 0; i < kChains; ++i) a[i] = _mm256_fmadd_ps(a[i], x, y);
    __asm__("" : "+v"(x));
  }
  for (int i = 1; i < kChains; ++i) a[0] = _mm256_add_ps(a[0], a[i]);
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, a[0]);
  return lanes[0];
}

__attribute__((target("avx512f"))) float Fma16Chains() {
  __m512 a[kChains];
  for (int i = 0; i < kChains; ++i) a[i] = _mm512_set1_ps(static_cast<float>(i));
  __m512 x = _mm512_set1_ps(0.999f);
  const __m512 y = _mm512_set1_ps(1e-3f);
  for (int64_t k = 0; k < kIterations; ++k) {
#pragma GCC unroll 24
    for (int i = 0; i < kChains; ++i) a[i] = _mm512_fmadd_ps(a[i], x, y);
    __asm__("" : "+v"(x));
  }
  for (int i = 1; i < kChains; ++i) a[0] = _mm512_add_ps(a[0], a[i]);
  return _mm512_reduce_add_ps(a[0]);
}

__attribute__((target("avx512f,avx512bw,avx512bf16"))) float DpBf16Chains() {
  __m512 a[kChains];
  for (int i = 0; i < kChains; ++i) a[i] = _mm512_setzero_ps();
  __m512i x = _mm512_set1_epi32(0x3f803f80);        // bf16 pairs (1, 1)
  const __m512i y = _mm512_set1_epi32(0x3a833a83);  // (1e-3, 1e-3)
  for (int64_t k = 0; k < kIterations; ++k) {
#pragma GCC unroll 24
    for (int i = 0; i < kChains; ++i) a[i] = _mm512_dpbf16_ps(a[i], (__m512bh)x, (__m512bh)y);
    __asm__("" : "+v"(x));
  }
  for (int i = 1; i < kChains; ++i) a[0] = _mm512_add_ps(a[0], a[i]);
  return _mm512_reduce_add_ps(a[0]);
}

__attribute__((target("avx512f,avx512bw,avx512vnni"))) float DpBusdChains() {
  __m512i a[kChains];
  for (int i = 0; i < kChains; ++i) a[i] = _mm512_setzero_si512();
  __m512i x = _mm512_set1_epi8(1);
  const __m512i y = _mm512_set1_epi8(1);
  for (int64_t k = 0; k < kIterations; ++k) {
#pragma GCC unroll 24
    for (int i = 0; i < kChains; ++i) a[i] = _mm512_dpbusd_epi32(a[i], x, y);
    __asm__("" : "+v"(x));
  }
  for (int i = 1; i < kChains; ++i) a[0] = _mm512_add_epi32(a[0], a[i]);
  return static_cast<float>(_mm_cvtsi128_si32(_mm512_castsi512_si128(a[0])));  // no overflow
}

#pragma GCC diagnostic pop

}  // namespace attend::bench
