// bf16 rows on 16-lane f32 FMAs without shuffles. A 64-byte load of a bf16 row holds 32 values,
// two to a 32-bit lane: the lane shifted left by 16 is the even-indexed value as a float, and the
// lane with its low half cleared is the odd-indexed one. Widening then costs two single-cycle
// integer instructions per 32 values, against a zero-extend (a shuffle) and a shift per 16 for
// the plain widening, and both halves feed f32 FMAs, which take q and p at full f32 precision.
//
// Why this exists next to vdpbf16ps: on the Intel Xeon measured (BENCHMARKS.md) vdpbf16ps retires
// one instruction per two cycles, 16 products per cycle, while two 16-lane FMAs per cycle make 32;
// these kernels read bf16 rows from L2 faster than the vdpbf16ps ones there.
//
// q.k: q is split once per call into its even and odd elements (per 32-element chunk: 16 even,
// then 16 odd), so that lane i of the even half multiplies element 2i of the key chunk.
// p.v: the call accumulates into a split copy of its output rows (per chunk: even columns, then
// odd), added back in column order at its end.
//
// Thread-safety: pure functions (the split q and accumulators are thread_local buffers).
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "core/kernels/simd_avx512.h"
#include "core/kernels/simd_internal.h"

// As in simd_avx512.cc: GCC 12's masked intrinsics trip these warnings (GCC bug 105593).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"

namespace attend::simd::internal {
namespace {

constexpr DType kBf16 = DType::kBFloat16;

// The 32 bf16 values at `row + c` (zero past `mask`) as floats: lo = elements c, c+2, ..., c+30;
// hi = c+1, c+3, ..., c+31.
ATTEND_AVX512 inline void LoadSplit(const uint16_t* row, int64_t c, __mmask32 mask, __m512* lo,
                                    __m512* hi) {
  const __m512i x = _mm512_maskz_loadu_epi16(mask, row + c);
  *lo = _mm512_castsi512_ps(_mm512_slli_epi32(x, 16));
  *hi = _mm512_castsi512_ps(_mm512_and_si512(x, _mm512_set1_epi32(static_cast<int>(0xffff0000u))));
}

// Row j of q (d elements) as chunks of 32: 16 even-indexed elements, then 16 odd-indexed ones,
// zeros past d.
ATTEND_AVX512 void SplitRow(const float* q, int64_t d, int64_t chunks, float* out) {
  const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
  const __m512i odd = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
  for (int64_t i = 0; i < chunks; ++i) {
    const int64_t c = 32 * i;
    const __m512 a = _mm512_maskz_loadu_ps(Mask16(d - c), q + c);
    const __m512 b = _mm512_maskz_loadu_ps(Mask16(d - c - 16), q + c + 16);
    _mm512_storeu_ps(out + c, _mm512_permutex2var_ps(a, even, b));
    _mm512_storeu_ps(out + c + 16, _mm512_permutex2var_ps(a, odd, b));
  }
}

// Scores of M query rows against R key rows (from R spans, as the other kernels) at a time, each
// pair's even and odd products chained into one accumulator (two FMAs in a row per chunk) rather
// than kept in two and added before the horizontal sums: M * R may then reach 16 with the key
// rows' halves still in registers (M * R accumulators, 2 * R halves and q's two: 32 registers).
template <int M, int R>
ATTEND_AVX512 void DotSplitBlock(const float* qs, int64_t width, int64_t d, const Rows& k,
                                 int64_t rows, float* scores, int64_t ld) {
  static_assert(M * R <= 16);
  const int64_t span = rows / R;
  const int64_t ahead = PrefetchRows<kBf16>(d);
  for (int64_t g = 0; g < span; ++g) {
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) PrefetchRow<kBf16>(k, r * span + g + ahead, (r + 1) * span, d);
    __m512 acc[M * R];
#pragma GCC unroll 16
    for (int i = 0; i < M * R; ++i) acc[i] = _mm512_setzero_ps();
    const uint16_t* row[R];
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      row[r] = static_cast<const uint16_t*>(RowAt<kBf16>(k, SpanRow(r, g, span)));
    }
    for (int64_t c = 0; c < d; c += 32) {
      const __mmask32 mask = Mask32(d - c);
      __m512 lo[R], hi[R];
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) LoadSplit(row[r], c, mask, &lo[r], &hi[r]);
#pragma GCC unroll 4
      for (int j = 0; j < M; ++j) {
        __m512 qe = _mm512_loadu_ps(qs + j * width + c);
        __m512 qo = _mm512_loadu_ps(qs + j * width + c + 16);
        // One load each for the R rows' FMAs: GCC would fold a load into every one of them.
        if constexpr (R > 1) __asm__("" : "+v"(qe), "+v"(qo));
#pragma GCC unroll 8
        for (int r = 0; r < R; ++r) {
          acc[j * R + r] = _mm512_fmadd_ps(qe, lo[r], acc[j * R + r]);
          acc[j * R + r] = _mm512_fmadd_ps(qo, hi[r], acc[j * R + r]);
        }
      }
    }
    if constexpr (M * R <= 8) {
      StoreSpanSums<M, R>(acc, g, span, scores, ld);
    } else {
      alignas(32) float sums[16];
      _mm256_store_ps(sums, Sum8Of16<8>(acc));
      _mm256_store_ps(sums + 8, Sum8Of16<M * R - 8>(acc + 8));
#pragma GCC unroll 4
      for (int j = 0; j < M; ++j) {
#pragma GCC unroll 8
        for (int r = 0; r < R; ++r) scores[j * ld + SpanRow(r, g, span)] = sums[j * R + r];
      }
    }
  }
  if constexpr (R > 1) {
    const int64_t done = span * R;
    if (done < rows) {
      DotSplitBlock<M, 1>(qs, width, d, RowsFrom<kBf16>(k, done), rows - done, scores + done, ld);
    }
  }
}

// acc[0..cols) += the chunk held as even columns (lane i: column 2i) and odd ones (2i + 1).
ATTEND_AVX512 inline void AddSplit(__m512 even, __m512 odd, float* acc, int64_t cols) {
  AddPermuted(even, odd, _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23),
              _mm512_setr_epi32(8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31), acc,
              cols);
}

// p.v into M accumulator rows held split (per 32-column chunk: 16 even columns, then 16 odd, as
// SplitRow lays out q), `width` floats apart. Four value rows per step, row g of four equal spans
// (four sequential streams, as the other kernels read), so that each accumulator chunk is loaded
// and stored once per four rows; then the rest one by one.
template <int M>
ATTEND_AVX512 void AccumulateSplitBlock(const float* p, int64_t ld, const Rows& v, int64_t rows,
                                        int64_t dv, int64_t width, float* split) {
  const int64_t ahead = PrefetchRows<kBf16>(dv);
  const int64_t span = rows / 4;
  for (int64_t g = 0; g < span; ++g) {
    const uint16_t* row[4];
    __m512 w[M][4];
#pragma GCC unroll 4
    for (int r = 0; r < 4; ++r) {
      const int64_t t = SpanRow(r, g, span);
      PrefetchRow<kBf16>(v, t + ahead, (r + 1) * span, dv);
      row[r] = static_cast<const uint16_t*>(RowAt<kBf16>(v, t));
#pragma GCC unroll 4
      for (int j = 0; j < M; ++j) w[j][r] = _mm512_set1_ps(p[j * ld + t]);
    }
    for (int64_t c = 0; c < dv; c += 32) {
      const __mmask32 mask = Mask32(dv - c);
      __m512 lo[4], hi[4];
#pragma GCC unroll 4
      for (int r = 0; r < 4; ++r) LoadSplit(row[r], c, mask, &lo[r], &hi[r]);
#pragma GCC unroll 4
      for (int j = 0; j < M; ++j) {
        float* a = split + j * width + c;
        __m512 e = _mm512_loadu_ps(a), o = _mm512_loadu_ps(a + 16);
#pragma GCC unroll 4
        for (int r = 0; r < 4; ++r) {
          e = _mm512_fmadd_ps(w[j][r], lo[r], e);
          o = _mm512_fmadd_ps(w[j][r], hi[r], o);
        }
        _mm512_storeu_ps(a, e);
        _mm512_storeu_ps(a + 16, o);
      }
    }
  }
  for (int64_t t = 4 * span; t < rows; ++t) {
    const auto* row = static_cast<const uint16_t*>(RowAt<kBf16>(v, t));
    for (int64_t c = 0; c < dv; c += 32) {
      __m512 lo, hi;
      LoadSplit(row, c, Mask32(dv - c), &lo, &hi);
#pragma GCC unroll 4
      for (int j = 0; j < M; ++j) {
        float* a = split + j * width + c;
        const __m512 wj = _mm512_set1_ps(p[j * ld + t]);
        _mm512_storeu_ps(a, _mm512_fmadd_ps(wj, lo, _mm512_loadu_ps(a)));
        _mm512_storeu_ps(a + 16, _mm512_fmadd_ps(wj, hi, _mm512_loadu_ps(a + 16)));
      }
    }
  }
}

}  // namespace

ATTEND_AVX512 void DotBf16Split(const float* q, int64_t m, int64_t d, const Rows& k, int64_t rows,
                                float* scores, int64_t ld) {
  thread_local std::vector<float> split;
  const int64_t chunks = (d + 31) / 32, width = 32 * chunks;
  split.resize(static_cast<size_t>(m * width));
  for (int64_t j = 0; j < m; ++j) SplitRow(q + j * d, d, chunks, split.data() + j * width);
  const float* qs = split.data();
  // As many key rows per step as the registers hold, so that each Sum8Of16 and each q load
  // serves more of them: four query rows (GQA groups of 4, 8) against four key rows, two
  // against six (groups of 2, the rest of 6 or 7), one against eight (MHA, odd groups). One core
  // from L2 on an Emerald Rapids without AVX512-BF16, d 128, against even and odd accumulators
  // kept apart (at most 8 pairs: four query rows against two key rows, two against four, one
  // against four): q.k 16-17 -> 20-21 GB/s (group of 4), 30-31 -> 31-35 (2), 32-33 -> 45-46 (1).
  int64_t j = 0;
  for (; j + 4 <= m; j += 4) {
    DotSplitBlock<4, 4>(qs + j * width, width, d, k, rows, scores + j * ld, ld);
  }
  for (; j + 2 <= m; j += 2) {
    DotSplitBlock<2, 6>(qs + j * width, width, d, k, rows, scores + j * ld, ld);
  }
  for (; j < m; ++j) DotSplitBlock<1, 8>(qs + j * width, width, d, k, rows, scores + j * ld, ld);
}

ATTEND_AVX512 void AccumulateBf16Split(const float* p, int64_t ld, int64_t m, const Rows& v,
                                       int64_t rows, int64_t dv, float* acc) {
  thread_local std::vector<float> split;
  const int64_t chunks = (dv + 31) / 32, width = 32 * chunks;
  split.assign(static_cast<size_t>(m * width), 0.0f);
  float* sa = split.data();
  int64_t j = 0;
  for (; j + 4 <= m; j += 4)
    AccumulateSplitBlock<4>(p + j * ld, ld, v, rows, dv, width, sa + j * width);
  for (; j + 2 <= m; j += 2)
    AccumulateSplitBlock<2>(p + j * ld, ld, v, rows, dv, width, sa + j * width);
  for (; j < m; ++j) AccumulateSplitBlock<1>(p + j * ld, ld, v, rows, dv, width, sa + j * width);
  for (j = 0; j < m; ++j) {
    for (int64_t c = 0; c < dv; c += 32) {
      const float* e = sa + j * width + c;
      AddSplit(_mm512_loadu_ps(e), _mm512_loadu_ps(e + 16), acc + j * dv + c,
               std::min<int64_t>(32, dv - c));
    }
  }
}

}  // namespace attend::simd::internal
