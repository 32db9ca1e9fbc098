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

// The VNNI loops are inline assembly: from intrinsics GCC 12 kept some of the 24 vpdpbusd
// chains in memory (a store and a load in each chain, every step), and the loop measured half
// the instruction's rate (1.75 G/s on a Zen 4, where these loops measure 3.6). Each asm
// statement is one step of 12 chains, the chains held in registers by "+v".
#define ATTEND_ACCS12(a)                                                                          \
  "+v"(a[0]), "+v"(a[1]), "+v"(a[2]), "+v"(a[3]), "+v"(a[4]), "+v"(a[5]), "+v"(a[6]), "+v"(a[7]), \
      "+v"(a[8]), "+v"(a[9]), "+v"(a[10]), "+v"(a[11])
#define ATTEND_TWELVE(op)                                                                        \
  op " %13, %12, %0\n\t" op " %13, %12, %1\n\t" op " %13, %12, %2\n\t" op " %13, %12, %3\n\t" op \
     " %13, %12, %4\n\t" op " %13, %12, %5\n\t" op " %13, %12, %6\n\t" op " %13, %12, %7\n\t" op \
     " %13, %12, %8\n\t" op " %13, %12, %9\n\t" op " %13, %12, %10\n\t" op " %13, %12, %11"
// kIterations steps of 24 chains (two asm statements of 12, `body` with the accumulators `acc`),
// then their sum. Every loop over the accumulators is unrolled: an array indexed by a variable
// lives in memory, and GCC then stored every chain after every step.
#define ATTEND_VNNI_LOOP(body)                                                                  \
  __m512i lo[12], hi[12];                                                                       \
  _Pragma("GCC unroll 12") for (int i = 0; i < 12; ++i) lo[i] = hi[i] = _mm512_setzero_si512(); \
  for (int64_t k = 0; k < kIterations; ++k) {                                                   \
    body(lo);                                                                                   \
    body(hi);                                                                                   \
  }                                                                                             \
  _Pragma("GCC unroll 12") for (int i = 1; i < 12; ++i) lo[0] =                                 \
      _mm512_add_epi32(lo[0], _mm512_add_epi32(lo[i], hi[i]));                                  \
  return static_cast<float>(_mm_cvtsi128_si32(_mm512_castsi512_si128(lo[0])))

__attribute__((target("avx512f,avx512bw,avx512vnni"))) float DpBusdChains() {
  const __m512i x = _mm512_set1_epi8(1), y = _mm512_set1_epi8(1);
#define ATTEND_STEP(acc) \
  __asm__ volatile(ATTEND_TWELVE("vpdpbusd") : ATTEND_ACCS12(acc) : "v"(x), "v"(y))
  ATTEND_VNNI_LOOP(ATTEND_STEP);
#undef ATTEND_STEP
}

__attribute__((target("avx512f,avx512bw,avx512vnni"))) float DpBusdBroadcastChains() {
  const __m512i x = _mm512_set1_epi8(1);
  alignas(64) static const int32_t kQ[12] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1};
#define ATTEND_STEP(acc)                                                             \
  __asm__ volatile(                                                                  \
      "vpdpbusd (%13)%{1to16%}, %12, %0\n\tvpdpbusd 4(%13)%{1to16%}, %12, %1\n\t"    \
      "vpdpbusd 8(%13)%{1to16%}, %12, %2\n\tvpdpbusd 12(%13)%{1to16%}, %12, %3\n\t"  \
      "vpdpbusd 16(%13)%{1to16%}, %12, %4\n\tvpdpbusd 20(%13)%{1to16%}, %12, %5\n\t" \
      "vpdpbusd 24(%13)%{1to16%}, %12, %6\n\tvpdpbusd 28(%13)%{1to16%}, %12, %7\n\t" \
      "vpdpbusd 32(%13)%{1to16%}, %12, %8\n\tvpdpbusd 36(%13)%{1to16%}, %12, %9\n\t" \
      "vpdpbusd 40(%13)%{1to16%}, %12, %10\n\tvpdpbusd 44(%13)%{1to16%}, %12, %11"   \
      : ATTEND_ACCS12(acc)                                                           \
      : "v"(x), "r"(kQ)                                                              \
      : "memory")
  ATTEND_VNNI_LOOP(ATTEND_STEP);
#undef ATTEND_STEP
}

__attribute__((target("avx512f,avx512bw,avx512vnni"))) float DpBusdWithShufflesChains() {
  const __m512i x = _mm512_set1_epi8(1), y = _mm512_set1_epi8(2);
  __m512i t0, t1, t2;  // the shuffles' outputs, which nothing reads
#define ATTEND_STEP(acc)                                                                      \
  __asm__ volatile(                                                                           \
      "vpdpbusd %16, %15, %0\n\tvpunpckldq %15, %16, %12\n\tvpdpbusd %16, %15, %1\n\t"        \
      "vpdpbusd %16, %15, %2\n\tvpunpckhdq %15, %16, %13\n\tvpdpbusd %16, %15, %3\n\t"        \
      "vpdpbusd %16, %15, %4\n\tvshufi32x4 $0x44, %15, %16, %14\n\tvpdpbusd %16, %15, %5\n\t" \
      "vpdpbusd %16, %15, %6\n\tvpunpckldq %16, %15, %12\n\tvpdpbusd %16, %15, %7\n\t"        \
      "vpdpbusd %16, %15, %8\n\tvpunpckhdq %16, %15, %13\n\tvpdpbusd %16, %15, %9\n\t"        \
      "vpdpbusd %16, %15, %10\n\tvshufi32x4 $0xee, %15, %16, %14\n\tvpdpbusd %16, %15, %11"   \
      : ATTEND_ACCS12(acc), "=&v"(t0), "=&v"(t1), "=&v"(t2)                                   \
      : "v"(x), "v"(y))
  ATTEND_VNNI_LOOP(ATTEND_STEP);
#undef ATTEND_STEP
}

__attribute__((target("avx512f,avx512bw,avx512vnni"))) float DpWssdChains() {
  const __m512i x = _mm512_set1_epi16(1), y = _mm512_set1_epi16(1);
#define ATTEND_STEP(acc) \
  __asm__ volatile(ATTEND_TWELVE("vpdpwssd") : ATTEND_ACCS12(acc) : "v"(x), "v"(y))
  ATTEND_VNNI_LOOP(ATTEND_STEP);
#undef ATTEND_STEP
}

#undef ATTEND_VNNI_LOOP
#undef ATTEND_TWELVE
#undef ATTEND_ACCS12

#pragma GCC diagnostic pop

}  // namespace attend::bench
