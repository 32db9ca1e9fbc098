// bf16 q.k and p.v on vdpbf16ps (AVX512-BF16), for the "avx512_bf16" kernel set under native
// bf16 arithmetic (simd_avx512.cc has the rest of the AVX-512 kernels): 32 exact products of
// bf16 values per instruction, with f32 sums.
//
// On a Zen 4 (one core, K or V in L2, a GQA group of 4, d 128), q.k read 30 GB/s of keys with q
// reloaded per key row pair and 40 with q held in registers; p.v 36-40 (BENCHMARKS.md and
// docs/perf-log/2026-12-06-bf16-whole-rows.md).
//
// Thread-safety: pure functions.
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "core/kernels/simd_avx512.h"
#include "core/kernels/simd_internal.h"

// GCC 12's own intrinsics header trips -Wuninitialized and -Wmaybe-uninitialized in the masked
// and cast intrinsics (its _mm512_undefined_* idiom, GCC bug 105593); nothing in this file reads
// an undefined value.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"

namespace attend::simd::internal {
namespace {

// Sixteen floats rounded to bf16 (to nearest even, as FloatToBf16 for finite values, denormals
// included): the bf16 bits in the upper half of each lane, zeros below (the rounded floats).
ATTEND_AVX512 inline __m512i RoundBf16Bits(__m512 x) {
  const __m512i bits = _mm512_castps_si512(x);
  const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
  const __m512i rounded = _mm512_add_epi32(bits, _mm512_add_epi32(_mm512_set1_epi32(0x7fff), odd));
  return _mm512_and_si512(rounded, _mm512_set1_epi32(static_cast<int>(0xffff0000u)));
}

// Sixteen floats as bf16 at `out`; returns whether any was not a bf16 value (was rounded).
ATTEND_AVX512 inline bool ToBf16x16(__m512 x, uint16_t* out) {
  const __m512i h = RoundBf16Bits(x);
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(out),
                      _mm512_cvtepi32_epi16(_mm512_srli_epi32(h, 16)));
  return _mm512_cmp_ps_mask(x, _mm512_castsi512_ps(h), _CMP_NEQ_UQ) != 0;
}

// The `n` floats at x as bf16, padded with zeros to `width` (a multiple of 16). Returns whether
// they were all bf16 values already (as under bf16 arithmetic), which the bf16 dot kernels need.
ATTEND_AVX512 bool ToBf16Row(const float* x, int64_t n, int64_t width, uint16_t* out) {
  bool exact = true;
  for (int64_t c = 0; c < width; c += 16) {
    const __mmask16 mask = c < n ? Mask16(n - c) : 0;
    exact &= !ToBf16x16(_mm512_maskz_loadu_ps(mask, x + c), out + c);
  }
  return exact;
}

template <int M, int R>
ATTEND_AVX512_BF16 void DotBf16Block(const uint16_t* qh, int64_t width, int64_t d, const Rows& k,
                                     int64_t rows, float* scores, int64_t ld) {
  static_assert(M * R <= 8);
  const int64_t span = rows / R;
  const int64_t ahead = PrefetchRows<DType::kBFloat16>(d);
  for (int64_t g = 0; g < span; ++g) {
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      PrefetchRow<DType::kBFloat16>(k, r * span + g + ahead, (r + 1) * span, d);
    }
    __m512 acc[M * R];
#pragma GCC unroll 8
    for (int i = 0; i < M * R; ++i) acc[i] = _mm512_setzero_ps();
    const uint16_t* row[R];
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      row[r] = static_cast<const uint16_t*>(RowAt<DType::kBFloat16>(k, SpanRow(r, g, span)));
    }
    for (int64_t c = 0; c < d; c += 32) {
      const __mmask32 mask = Mask32(d - c);
      __m512i kv[R];
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) kv[r] = _mm512_maskz_loadu_epi16(mask, row[r] + c);
#pragma GCC unroll 4
      for (int j = 0; j < M; ++j) {
        const __m512i hv = _mm512_loadu_si512(qh + j * width + c);
#pragma GCC unroll 8
        for (int r = 0; r < R; ++r) {
          acc[j * R + r] = _mm512_dpbf16_ps(acc[j * R + r], (Bh512)kv[r], (Bh512)hv);
        }
      }
    }
    StoreSpanSums<M, R>(acc, g, span, scores, ld);
  }
  if constexpr (R > 1) {
    const int64_t done = span * R;
    if (done < rows) {
      DotBf16Block<M, 1>(qh, width, d, RowsFrom<DType::kBFloat16>(k, done), rows - done,
                         scores + done, ld);
    }
  }
}

// DotBf16Block for heads of exactly 32 * C columns: M query rows' bf16 values stay in M * C
// registers for the whole call, where the general block reloads them for every R key rows (loads
// were as many as the dot products: 4 of q and 2 of keys per 8 vdpbf16ps).
template <int M, int R, int C>
ATTEND_AVX512_BF16 void DotBf16BlockHeld(const uint16_t* qh, int64_t width, const Rows& k,
                                         int64_t rows, float* scores, int64_t ld) {
  static_assert(M * R <= 8 && M * C + M * R + R <= 32);
  constexpr int64_t d = 32 * C;
  __m512i qv[M * C];
#pragma GCC unroll 16
  for (int i = 0; i < M * C; ++i) qv[i] = _mm512_loadu_si512(qh + (i / C) * width + (i % C) * 32);
  const int64_t span = rows / R;
  const int64_t ahead = PrefetchRows<DType::kBFloat16>(d);
  for (int64_t g = 0; g < span; ++g) {
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      PrefetchRow<DType::kBFloat16>(k, r * span + g + ahead, (r + 1) * span, d);
    }
    __m512 acc[M * R];
#pragma GCC unroll 8
    for (int i = 0; i < M * R; ++i) acc[i] = _mm512_setzero_ps();
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const auto* row =
          static_cast<const uint16_t*>(RowAt<DType::kBFloat16>(k, SpanRow(r, g, span)));
#pragma GCC unroll 4
      for (int c = 0; c < C; ++c) {
        const __m512i kv = _mm512_loadu_si512(row + 32 * c);
#pragma GCC unroll 4
        for (int j = 0; j < M; ++j) {
          acc[j * R + r] = _mm512_dpbf16_ps(acc[j * R + r], (Bh512)kv, (Bh512)qv[j * C + c]);
        }
      }
    }
    StoreSpanSums<M, R>(acc, g, span, scores, ld);
  }
  if constexpr (R > 1) {
    const int64_t done = span * R;
    if (done < rows) {
      DotBf16BlockHeld<M, 1, C>(qh, width, RowsFrom<DType::kBFloat16>(k, done), rows - done,
                                scores + done, ld);
    }
  }
}

// Scores of 4 query rows against rows [t, t + 4 G) of 64 columns, into out[g] (per 128-bit
// lane j: rows 4 g .. 4 g + 3 of query row j). The query rows are in the lanes: lane 4 j + l of
// qq[c] holds bf16 pair l of columns 8 c .. 8 c + 7 of query row j, and each key row's 8 columns
// are broadcast to the four 128-bit lanes, so one vdpbf16ps serves 4 query rows and a row's
// sums need adding over 4 lanes, not 16. (G = 2, 8 accumulators' chains in flight, was no
// faster than G = 1 from L2 on a Zen 4: 28.6-28.8 against 28.3-33.3 GB/s.)
template <int G>
ATTEND_AVX512_BF16 inline void DotQuadRows(const __m512i* qq, const uint16_t* const* row,
                                           __m512* out) {
  __m512 acc[4 * G];
#pragma GCC unroll 8
  for (int r = 0; r < 4 * G; ++r) acc[r] = _mm512_setzero_ps();
#pragma GCC unroll 8
  for (int c = 0; c < 8; ++c) {
#pragma GCC unroll 8
    for (int r = 0; r < 4 * G; ++r) {
      const __m512i kv =
          _mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row[r] + 8 * c)));
      acc[r] = _mm512_dpbf16_ps(acc[r], (Bh512)kv, (Bh512)qq[c]);
    }
  }
#pragma GCC unroll 2
  for (int g = 0; g < G; ++g) {
    const __m512* x = acc + 4 * g;
    const __m512 s01 =
        _mm512_add_ps(_mm512_unpacklo_ps(x[0], x[1]), _mm512_unpackhi_ps(x[0], x[1]));
    const __m512 s23 =
        _mm512_add_ps(_mm512_unpacklo_ps(x[2], x[3]), _mm512_unpackhi_ps(x[2], x[3]));
    const __m512d a = _mm512_castps_pd(s01), b = _mm512_castps_pd(s23);
    out[g] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(a, b)),
                           _mm512_castpd_ps(_mm512_unpackhi_pd(a, b)));
  }
}

// DotBf16Rows for 4 query rows of exactly 64 columns (Llama 3.2 1B, GPT-2): with 16 lanes per
// row and query pair, as DotBf16BlockHeld sums them, a head of 64 columns took 2 dot products
// and 3 shuffles or adds per pair (27.6-28.9 GB/s from L2 on a Zen 4, against 38.8 at 128;
// this: 29.2-32.9, five rounds alternated).
ATTEND_AVX512_BF16 void DotBf16Quad64(const uint16_t* qh, int64_t width, const Rows& k,
                                      int64_t rows, float* scores, int64_t ld) {
  __m512i qq[8];
#pragma GCC unroll 8
  for (int c = 0; c < 8; ++c) {
    // Dwords 4 j .. 4 j + 3: query row j's columns 8 c .. 8 c + 7.
    qq[c] = _mm512_inserti32x4(
        _mm512_inserti32x4(
            _mm512_inserti32x4(
                _mm512_castsi128_si512(
                    _mm_loadu_si128(reinterpret_cast<const __m128i*>(qh + 8 * c))),
                _mm_loadu_si128(reinterpret_cast<const __m128i*>(qh + width + 8 * c)), 1),
            _mm_loadu_si128(reinterpret_cast<const __m128i*>(qh + 2 * width + 8 * c)), 2),
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(qh + 3 * width + 8 * c)), 3);
  }
  const int64_t ahead = PrefetchRows<DType::kBFloat16>(64);
  int64_t t = 0;
  alignas(64) float out[16];
  for (; t + 4 <= rows; t += 4) {
    const uint16_t* row[4];
#pragma GCC unroll 4
    for (int r = 0; r < 4; ++r) {
      PrefetchRow<DType::kBFloat16>(k, t + r + ahead, rows, 64);
      row[r] = static_cast<const uint16_t*>(RowAt<DType::kBFloat16>(k, t + r));
    }
    __m512 sums[1];
    DotQuadRows<1>(qq, row, sums);
    _mm512_store_ps(out, sums[0]);
#pragma GCC unroll 4
    for (int j = 0; j < 4; ++j) _mm_storeu_ps(scores + j * ld + t, _mm_load_ps(out + 4 * j));
  }
  if (t < rows) {
    DotBf16BlockHeld<4, 1, 2>(qh, width, RowsFrom<DType::kBFloat16>(k, t), rows - t, scores + t,
                              ld);
  }
}

template <int C>
ATTEND_AVX512_BF16 void DotBf16RowsHeld(const uint16_t* qh, int64_t width, int64_t m, const Rows& k,
                                        int64_t rows, float* scores, int64_t ld) {
  int64_t j = 0;
  for (; j + 4 <= m; j += 4) {
    if constexpr (C == 2) {
      DotBf16Quad64(qh + j * width, width, k, rows, scores + j * ld, ld);
    } else {
      DotBf16BlockHeld<4, 2, C>(qh + j * width, width, k, rows, scores + j * ld, ld);
    }
  }
  for (; j + 2 <= m; j += 2) {
    DotBf16BlockHeld<2, 4, C>(qh + j * width, width, k, rows, scores + j * ld, ld);
  }
  for (; j < m; ++j) DotBf16BlockHeld<1, 8, C>(qh + j * width, width, k, rows, scores + j * ld, ld);
}

ATTEND_AVX512_BF16 void DotBf16Rows(const uint16_t* qh, int64_t width, int64_t m, int64_t d,
                                    const Rows& k, int64_t rows, float* scores, int64_t ld) {
  // The common head sizes (64: Llama 3.2 1B, GPT-2; 128: most others) keep q in registers.
  if (d == 64) return DotBf16RowsHeld<2>(qh, width, m, k, rows, scores, ld);
  if (d == 128) return DotBf16RowsHeld<4>(qh, width, m, k, rows, scores, ld);
  int64_t j = 0;
  for (; j + 4 <= m; j += 4) {
    DotBf16Block<4, 2>(qh + j * width, width, d, k, rows, scores + j * ld, ld);
  }
  for (; j + 2 <= m; j += 2) {
    DotBf16Block<2, 4>(qh + j * width, width, d, k, rows, scores + j * ld, ld);
  }
  for (; j < m; ++j) DotBf16Block<1, 8>(qh + j * width, width, d, k, rows, scores + j * ld, ld);
}

// Whether vdpbf16ps's flushing could move q.k: a subnormal component of q (counted as zero,
// while a key near float's top makes its product about 1), or a component of 2^32 or more
// (subnormal keys, counted as zero, would then give products above 2^-94; at the engine's
// largest native scale, 2^64, summed over a head those stay below 2^-20 of a score). Products of
// normal values below 2^-126 stay below 2^-62 after that scale.
ATTEND_AVX512 bool FlushWouldShow(const float* q, int64_t n) {
  const __m512 smallest = _mm512_set1_ps(std::numeric_limits<float>::min());
  const __m512 limit = _mm512_set1_ps(0x1p32f);
  const __m512 zero = _mm512_setzero_ps();
  __mmask16 any = 0;
  for (int64_t c = 0; c < n; c += 16) {
    const __m512 x = _mm512_abs_ps(_mm512_maskz_loadu_ps(Mask16(n - c), q + c));
    any |=
        (_mm512_cmp_ps_mask(x, smallest, _CMP_LT_OQ) & _mm512_cmp_ps_mask(x, zero, _CMP_NEQ_OQ)) |
        _mm512_cmp_ps_mask(x, limit, _CMP_GE_OQ);
  }
  return any != 0;
}

// The weights of value rows (2i, 2i + 1) of accumulator row j as pair i of bf16 values: p's rows
// as bf16 (hi and lo parts), padded with a zero to an even count, which vdpbf16ps reads as pairs.
// Pair i of bf16 values at w, broadcast to every 32-bit lane.
ATTEND_AVX512 inline __m512i PairAt(const uint16_t* w, int64_t i) {
  int32_t pair;
  std::memcpy(&pair, w + 2 * i, sizeof(pair));
  return _mm512_set1_epi32(pair);
}

// acc[j][c0 + 32 g ...] += the sums vdpbf16ps left in (even, odd) = (lanes from unpacklo,
// unpackhi): unpacklo of two rows holds, per 128-bit lane L, columns 8L..8L+3, unpackhi columns
// 8L+4..8L+7.
ATTEND_AVX512 inline void AddPairSums(__m512 even, __m512 odd, float* a, int64_t cols) {
  AddPermuted(even, odd, _mm512_setr_epi32(0, 1, 2, 3, 16, 17, 18, 19, 4, 5, 6, 7, 20, 21, 22, 23),
              _mm512_setr_epi32(8, 9, 10, 11, 24, 25, 26, 27, 12, 13, 14, 15, 28, 29, 30, 31), a,
              cols);
}

// Value rows t and t + 1 (t alone, paired with zeros, unless kHasB), columns [c0, c0 + 32 G),
// into M accumulator rows.
template <int M, int G, bool kHasB>
ATTEND_AVX512_BF16 __attribute__((always_inline)) inline void AccumulateBf16Pair(
    const uint16_t* wh, int64_t pairs, const Rows& v, int64_t t, int64_t c0, const __mmask32* mask,
    __m512 (&even)[M][G], __m512 (&odd)[M][G]) {
  const auto* a = static_cast<const uint16_t*>(RowAt<DType::kBFloat16>(v, t));
  const auto* b = static_cast<const uint16_t*>(RowAt<DType::kBFloat16>(v, t + 1));
  __m512i lo[G], hi[G];
#pragma GCC unroll 8
  for (int g = 0; g < G; ++g) {
    const int64_t c = c0 + 32 * g;
    const __m512i x = _mm512_maskz_loadu_epi16(mask[g], a + c);
    const __m512i y = kHasB ? _mm512_maskz_loadu_epi16(mask[g], b + c) : _mm512_setzero_si512();
    lo[g] = _mm512_unpacklo_epi16(x, y);
    hi[g] = _mm512_unpackhi_epi16(x, y);
  }
#pragma GCC unroll 4
  for (int j = 0; j < M; ++j) {
    const __m512i w = PairAt(wh, j * pairs + t / 2);
#pragma GCC unroll 8
    for (int g = 0; g < G; ++g) {
      even[j][g] = _mm512_dpbf16_ps(even[j][g], (Bh512)lo[g], (Bh512)w);
      odd[j][g] = _mm512_dpbf16_ps(odd[j][g], (Bh512)hi[g], (Bh512)w);
    }
  }
}

// Rows [t0, t0 + n) of p.v into M accumulator rows, G column chunks of 32 at a time: pairs of
// value rows interleaved (unpacklo/hi) so that each 32-bit lane holds one column of two rows,
// which vdpbf16ps multiplies by the pair's two weights.
template <int M, int G>
ATTEND_AVX512_BF16 void AccumulateBf16Rows(const uint16_t* wh, int64_t pairs, const Rows& v,
                                           int64_t t0, int64_t n, int64_t total, int64_t dv,
                                           float* acc) {
  // Loop invariants out of the loop over rows: it divided (the prefetch distance) and built
  // masks per row pair (bf16 p.v from L2 on a Zen 4: 33.3-37.0 -> 39.0-40.1 GB/s).
  const int64_t ahead = PrefetchRows<DType::kBFloat16>(dv);
  // Rows [t0, pair_end) come in whole pairs; a last row without a partner pairs with zeros.
  const int64_t end = t0 + n, pair_end = t0 + std::min(n, total - t0) / 2 * 2;
  for (int64_t c0 = 0; c0 < dv; c0 += 32 * G) {
    __m512 even[M][G], odd[M][G];
    __mmask32 mask[G];
#pragma GCC unroll 8
    for (int g = 0; g < G; ++g) {
      const int64_t c = c0 + 32 * g;
      mask[g] = c < dv ? Mask32(dv - c) : 0;
    }
#pragma GCC unroll 4
    for (int j = 0; j < M; ++j) {
#pragma GCC unroll 8
      for (int g = 0; g < G; ++g) even[j][g] = odd[j][g] = _mm512_setzero_ps();
    }
    if (c0 == 0) {
      for (int64_t t = t0; t < pair_end; t += 2) {
        PrefetchRow<DType::kBFloat16>(v, t + ahead, total, dv);
        PrefetchRow<DType::kBFloat16>(v, t + 1 + ahead, total, dv);
        AccumulateBf16Pair<M, G, true>(wh, pairs, v, t, c0, mask, even, odd);
      }
    } else {
      for (int64_t t = t0; t < pair_end; t += 2) {
        AccumulateBf16Pair<M, G, true>(wh, pairs, v, t, c0, mask, even, odd);
      }
    }
    if (pair_end < end)
      AccumulateBf16Pair<M, G, false>(wh, pairs, v, pair_end, c0, mask, even, odd);
#pragma GCC unroll 4
    for (int j = 0; j < M; ++j) {
#pragma GCC unroll 8
      for (int g = 0; g < G; ++g) {
        const int64_t c = c0 + 32 * g;
        if (c < dv)
          AddPairSums(even[j][g], odd[j][g], acc + j * dv + c, std::min<int64_t>(32, dv - c));
      }
    }
  }
}

// Value rows in blocks of 32 (8 KiB of bf16 rows of 128), so that the passes over a block's
// column chunks after the first read it from L1.
template <int M, int G>
ATTEND_AVX512_BF16 void AccumulateBf16Block(const uint16_t* wh, int64_t pairs, const Rows& v,
                                            int64_t rows, int64_t dv, float* acc) {
  constexpr int64_t kBlockRows = 32;
  for (int64_t t0 = 0; t0 < rows; t0 += kBlockRows) {
    AccumulateBf16Rows<M, G>(wh, pairs, v, t0, std::min(kBlockRows, rows - t0), rows, dv, acc);
  }
}

}  // namespace

ATTEND_AVX512_BF16 void DotBf16(const float* q, int64_t m, int64_t d, const Rows& k, int64_t rows,
                                float* scores, int64_t ld) {
  thread_local std::vector<uint16_t> hi;
  const int64_t width = (d + 31) / 32 * 32;
  hi.resize(static_cast<size_t>(m * width));
  bool exact = true;
  for (int64_t j = 0; j < m; ++j) exact &= ToBf16Row(q + j * d, d, width, hi.data() + j * width);
  // q in f32 (f32 arithmetic): the widening kernels keep its every bit. So they do for q that
  // vdpbf16ps would not multiply as it is (FlushWouldShow).
  if (!exact || FlushWouldShow(q, m * d))
    return Avx2Kernels().dot_rows(q, m, d, k, rows, scores, ld);
  DotBf16Rows(hi.data(), width, m, d, k, rows, scores, ld);
}

ATTEND_AVX512_BF16 void AccumulateBf16(const float* p, int64_t ld, int64_t m, const Rows& v,
                                       int64_t rows, int64_t dv, float* acc) {
  thread_local std::vector<uint16_t> hi;
  const int64_t pairs = (rows + 1) / 2;
  // Rows of 2 * pairs weights; ToBf16Row writes whole vectors of 16, so the last row gets room.
  const int64_t width = 2 * pairs, padded = (width + 15) / 16 * 16;
  hi.resize(static_cast<size_t>((m - 1) * width + padded));
  bool exact = true;
  for (int64_t j = 0; j < m; ++j) {
    // Rows `width` apart, in order: what a row writes past its end the next row overwrites.
    exact &= ToBf16Row(p + j * ld, rows, padded, hi.data() + j * width);
  }
  // p in f32 (f32 arithmetic): the widening kernels keep its every bit.
  if (!exact) return Avx2Kernels().accumulate_rows(p, ld, m, v, rows, dv, acc);
  int64_t j = 0;
  // Value rows of 65-128 columns are read whole, two query rows at a time, and the tile again
  // (from L2) for the next two, not four query rows over half rows in two passes. From L2 that
  // is 15% slower (twice the interleaving), but over the cache a bf16 step was 13-15% faster
  // (16384 tokens x 16, 32/8 heads, d 128, Zen 4: 42.5-45.8 -> 35.5-38.8 ms).
  if (dv <= 64 || dv > 128) {
    for (; j + 4 <= m; j += 4) {
      AccumulateBf16Block<4, 2>(hi.data() + j * width, pairs, v, rows, dv, acc + j * dv);
    }
  }
  for (; j + 2 <= m; j += 2) {
    AccumulateBf16Block<2, 4>(hi.data() + j * width, pairs, v, rows, dv, acc + j * dv);
  }
  for (; j < m; ++j) {
    AccumulateBf16Block<1, 4>(hi.data() + j * width, pairs, v, rows, dv, acc + j * dv);
  }
}

}  // namespace attend::simd::internal
