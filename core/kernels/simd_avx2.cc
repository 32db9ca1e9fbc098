// The AVX2 + FMA kernel set of simd.h ("avx2"): 8-lane f32 FMAs, bf16 and int8 rows widened to
// f32 as they are loaded. The AVX-512 sets reuse the kernels they do not replace
// (Avx2Kernels()).
//
// The build targets no particular CPU, so this file gets no -m flags: each function that uses
// AVX2 or FMA instructions carries ATTEND_AVX2 (a target attribute) instead, and the dispatch
// (simd.cc) calls them only on a CPU that has both. Helpers without the attribute (those of
// simd_internal.h) are compiled for the baseline ISA and may be inlined into these.
//
// Thread-safety: pure functions.
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include "core/kernels/simd.h"
#include "core/kernels/simd_internal.h"

namespace attend::simd::internal {
namespace {

#define ATTEND_AVX2 __attribute__((target("avx2,fma")))

ATTEND_AVX2 inline __m256 Exp8(__m256 x) {
  const __m256 zero_below = _mm256_cmp_ps(x, _mm256_set1_ps(-87.0f), _CMP_LT_OQ);
  x = _mm256_max_ps(x, _mm256_set1_ps(-87.0f));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.9875691500e-4f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
  p = _mm256_fmadd_ps(_mm256_mul_ps(p, r), r, _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
  const __m256i bits =
      _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_andnot_ps(zero_below, _mm256_mul_ps(p, _mm256_castsi256_ps(bits)));
}

ATTEND_AVX2 inline float Sum8(__m256 v) {
  const __m128 lo = _mm256_castps256_ps128(v);
  const __m128 hi = _mm256_extractf128_ps(v, 1);
  __m128 s = _mm_add_ps(lo, hi);
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// Eight consecutive values as floats: bf16 widened by a shift, int8 converted (unscaled).
template <DType kType>
ATTEND_AVX2 inline __m256 Load8T(const void* base, int64_t i) {
  if constexpr (kType == DType::kBFloat16) {
    const __m128i h =
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(base) + i));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  } else if constexpr (kType == DType::kInt8) {
    const __m128i b =
        _mm_loadl_epi64(reinterpret_cast<const __m128i*>(static_cast<const int8_t*>(base) + i));
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b));
  } else {
    return _mm256_loadu_ps(static_cast<const float*>(base) + i);
  }
}

ATTEND_AVX2 float ExpShiftSumAvx2(const float* x, float shift, float* y, int64_t n) {
  const __m256 s = _mm256_set1_ps(shift);
  __m256 sum = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 e = Exp8(_mm256_sub_ps(_mm256_loadu_ps(x + i), s));
    _mm256_storeu_ps(y + i, e);
    sum = _mm256_add_ps(sum, e);
  }
  float total = Sum8(sum);
  for (; i < n; ++i) {
    y[i] = ExpScalar(x[i] - shift);
    total += y[i];
  }
  return total;
}

ATTEND_AVX2 void RoundToBf16Avx2(float* x, int64_t n) {
  const __m256i bias = _mm256_set1_epi32(0x7fff);
  const __m256i one = _mm256_set1_epi32(1);
  const __m256i high = _mm256_set1_epi32(static_cast<int32_t>(0xffff0000u));
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256i bits = _mm256_castps_si256(_mm256_loadu_ps(x + i));
    const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(bits, 16), one);
    const __m256i rounded = _mm256_add_epi32(bits, _mm256_add_epi32(bias, odd));
    _mm256_storeu_ps(x + i, _mm256_castsi256_ps(_mm256_and_si256(rounded, high)));
  }
  RoundToBf16Scalar(x + i, n - i);
}

ATTEND_AVX2 float MaxAvx2(const float* x, int64_t n) {
  __m256 m = _mm256_set1_ps(-std::numeric_limits<float>::infinity());
  int64_t i = 0;
  // max_ps returns its second operand when either is NaN: with the running maximum second, a
  // NaN value is skipped instead of replacing (and losing) the lane's maximum so far.
  for (; i + 8 <= n; i += 8) m = _mm256_max_ps(_mm256_loadu_ps(x + i), m);
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, m);
  float result = lanes[0];
  for (int l = 1; l < 8; ++l) result = std::max(result, lanes[l]);
  for (; i < n; ++i) result = std::max(result, x[i]);
  return result;
}

ATTEND_AVX2 float ScaleMaxAvx2(float* x, int64_t n, float scale) {
  const __m256 s = _mm256_set1_ps(scale);
  const __m256 magnitude = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  const __m256 inf = _mm256_set1_ps(std::numeric_limits<float>::infinity());
  __m256 m = _mm256_set1_ps(-std::numeric_limits<float>::infinity());
  __m256 bad = _mm256_setzero_ps();
  const bool scaled = scale != 1.0f;
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256 v = _mm256_loadu_ps(x + i);
    if (scaled) {
      v = _mm256_mul_ps(v, s);
      _mm256_storeu_ps(x + i, v);
    }
    // |v| not below infinity, or unordered: an infinity or a NaN.
    bad = _mm256_or_ps(bad, _mm256_cmp_ps(_mm256_and_ps(v, magnitude), inf, _CMP_NLT_UQ));
    m = _mm256_max_ps(v, m);
  }
  const float tail = ScaleMaxScalar(x + i, n - i, scale);
  if (_mm256_movemask_ps(bad) != 0 || std::isnan(tail)) {
    return std::numeric_limits<float>::quiet_NaN();
  }
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, m);
  float result = tail;
  for (float lane : lanes) result = std::max(result, lane);
  return result;
}

// Eight floats rounded to bfloat16 (ties to even), each in the low half of its 32-bit lane.
ATTEND_AVX2 inline __m256i RoundedBf16x8(const float* p) {
  const __m256i bits = _mm256_castps_si256(_mm256_loadu_ps(p));
  const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(1));
  return _mm256_srli_epi32(_mm256_add_epi32(bits, _mm256_add_epi32(_mm256_set1_epi32(0x7fff), odd)),
                           16);
}

ATTEND_AVX2 void ToBf16Avx2(const float* x, int64_t n, uint16_t* out) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    // packus interleaves the two halves by 128-bit lane; the permute puts them back in order.
    const __m256i packed = _mm256_packus_epi32(RoundedBf16x8(x + i), RoundedBf16x8(x + i + 8));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i),
                        _mm256_permute4x64_epi64(packed, 0xd8));
  }
  ToBf16Scalar(x + i, n - i, out + i);
}

ATTEND_AVX2 bool ScaleCopyAvx2(const float* src, float factor, float* dst, int64_t n) {
  const __m256 f = _mm256_set1_ps(factor);
  const __m256 magnitude = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  const __m256 inf = _mm256_set1_ps(std::numeric_limits<float>::infinity());
  __m256 bad = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 v = _mm256_mul_ps(_mm256_loadu_ps(src + i), f);
    _mm256_storeu_ps(dst + i, v);
    bad = _mm256_or_ps(bad, _mm256_cmp_ps(_mm256_and_ps(v, magnitude), inf, _CMP_NLT_UQ));
  }
  const bool tail = ScaleCopyScalar(src + i, factor, dst + i, n - i);
  return tail && _mm256_movemask_ps(bad) == 0;
}

ATTEND_AVX2 void ScaleAddAvx2(float* dst, float alpha, const float* src, int64_t n) {
  const __m256 a = _mm256_set1_ps(alpha);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    _mm256_storeu_ps(dst + i,
                     _mm256_fmadd_ps(_mm256_loadu_ps(dst + i), a, _mm256_loadu_ps(src + i)));
  }
  for (; i < n; ++i) dst[i] = dst[i] * alpha + src[i];
}

// The kernels below are templates on the stored dtype, so that the widening is decided outside
// the loops, and their small fixed loops are unrolled so that accumulators live in registers
// (without that, GCC keeps them on the stack and the kernels run several times slower). Key
// rows are read once for all query rows and streamed in order: that keeps the memory busy, which
// matters more than arithmetic here.

template <DType kType>
ATTEND_AVX2 void RowToFloatImpl(const Rows& rows, int64_t t, int64_t n, float* out) {
  const void* row = RowAt<kType>(rows, t);
  const float scale = ScaleAt<kType>(rows, t);
  int64_t i = 0;
  if constexpr (kType == DType::kInt8) {
    const __m256 s = _mm256_set1_ps(scale);
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(out + i, _mm256_mul_ps(Load8T<kType>(row, i), s));
  } else {
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(out + i, Load8T<kType>(row, i));
  }
  for (; i < n; ++i) out[i] = Load(row, kType, i) * scale;
}

ATTEND_AVX2 void RowToFloatAvx2(const Rows& rows, int64_t t, int64_t n, float* out) {
  switch (rows.dtype) {
    case DType::kBFloat16:
      return RowToFloatImpl<DType::kBFloat16>(rows, t, n, out);
    case DType::kInt8:
      return RowToFloatImpl<DType::kInt8>(rows, t, n, out);
    default:
      return RowToFloatImpl<DType::kFloat32>(rows, t, n, out);
  }
}

// Eight sums at once: lane i of the result is the sum of the lanes of v[i].
ATTEND_AVX2 inline __m256 Sum8x8(const __m256* v) {
  const __m256 h01 = _mm256_hadd_ps(v[0], v[1]);
  const __m256 h23 = _mm256_hadd_ps(v[2], v[3]);
  const __m256 h45 = _mm256_hadd_ps(v[4], v[5]);
  const __m256 h67 = _mm256_hadd_ps(v[6], v[7]);
  const __m256 h0123 = _mm256_hadd_ps(h01, h23);
  const __m256 h4567 = _mm256_hadd_ps(h45, h67);
  return _mm256_add_ps(_mm256_permute2f128_ps(h0123, h4567, 0x20),
                       _mm256_permute2f128_ps(h0123, h4567, 0x31));
}

// DotRowsBlock's column loop, 8 columns a step from column `c` while 8 are left: acc[j * R + r]
// += q row j x key row r, widened as they are loaded. Returns the first column not done.
template <int M, int R, DType kType>
ATTEND_AVX2 inline int64_t DotEights(const float* q, int64_t d, int64_t c, const void* const* row,
                                     __m256* acc) {
  for (; c + 8 <= d; c += 8) {
    __m256 kv[R];
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) kv[r] = Load8T<kType>(row[r], c);
#pragma GCC unroll 4
    for (int j = 0; j < M; ++j) {
      __m256 qv = _mm256_loadu_ps(q + j * d + c);
      // Keeps qv in a register: otherwise GCC folds the load into each of the R FMAs, and the
      // extra loads bound the loop (bf16 from L2 on Zen 3: 8.4 GB/s folded, 10.9 kept).
      if constexpr (R > 1) __asm__("" : "+x"(qv));
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) acc[j * R + r] = _mm256_fmadd_ps(qv, kv[r], acc[j * R + r]);
    }
  }
  return c;
}

// The end of one step of DotRowsBlock: each accumulator's lanes summed, the columns from `c` on
// added one by one, times the row's scale, into scores (key row r of the step is row r * span + t).
template <int M, int R, DType kType>
ATTEND_AVX2 inline void StoreDots(const __m256* acc, const float* q, int64_t d, int64_t c,
                                  const void* const* row, const Rows& k, int64_t span, int64_t t,
                                  float* scores, int64_t ld) {
  alignas(32) float sums[8];
  if constexpr (M * R == 8) {
    _mm256_store_ps(sums, Sum8x8(acc));
  } else {
#pragma GCC unroll 8
    for (int i = 0; i < M * R; ++i) sums[i] = Sum8(acc[i]);
  }
#pragma GCC unroll 4
  for (int j = 0; j < M; ++j) {
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      float x = sums[j * R + r];
      for (int64_t e = c; e < d; ++e) x += q[j * d + e] * Load(row[r], kType, e);
      scores[j * ld + r * span + t] = x * ScaleAt<kType>(k, r * span + t);
    }
  }
}

// M query rows against R key rows at a time (M * R <= 8 accumulators): the R rows' loads are
// shared by the M query rows, and the M * R independent FMA chains hide the FMA latency (with
// one key row, M = 4 chains leave the FMA units half idle). The R rows come from R separate
// runs of the rows (row t of each of R equal spans), not R neighbours, so that memory sees R
// sequential streams: the hardware prefetchers follow those, while neighbouring rows read side by
// side look like a back-and-forth pattern to them (decode from memory: see BENCHMARKS.md).
template <int M, int R, DType kType>
ATTEND_AVX2 void DotRowsBlock(const float* q, int64_t d, const Rows& k, int64_t rows, float* scores,
                              int64_t ld) {
  static_assert(M * R <= 8);
  const int64_t ahead = PrefetchRows<kType>(d);
  const int64_t span = rows / R;
  for (int64_t t = 0; t < span; ++t) {
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) PrefetchRow<kType>(k, r * span + t + ahead, (r + 1) * span, d);
    __m256 acc[M * R];
#pragma GCC unroll 8
    for (int i = 0; i < M * R; ++i) acc[i] = _mm256_setzero_ps();
    const void* row[R];
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) row[r] = RowAt<kType>(k, r * span + t);
    const int64_t c = DotEights<M, R, kType>(q, d, 0, row, acc);
    StoreDots<M, R, kType>(acc, q, d, c, row, k, span, t, scores, ld);
  }
  if constexpr (R > 1) {
    const int64_t done = span * R;
    if (done < rows) {
      Rows rest = k;
      rest.data = RowAt<kType>(k, done);
      if (k.scales != nullptr) rest.scales = k.scales + done;
      DotRowsBlock<M, 1, kType>(q, d, rest, rows - done, scores + done, ld);
    }
  }
}

template <DType kType>
ATTEND_AVX2 void DotRowsImpl(const float* q, int64_t m, int64_t d, const Rows& k, int64_t rows,
                             float* scores, int64_t ld) {
  int64_t j = 0;
  for (; j + 4 <= m; j += 4) {
    DotRowsBlock<4, 2, kType>(q + j * d, d, k, rows, scores + j * ld, ld);
  }
  for (; j + 2 <= m; j += 2) {
    DotRowsBlock<2, 4, kType>(q + j * d, d, k, rows, scores + j * ld, ld);
  }
  for (; j < m; ++j) DotRowsBlock<1, 8, kType>(q + j * d, d, k, rows, scores + j * ld, ld);
}

// bf16 rows, 16 values at a time. Dword l of a 32-byte load holds values 2l (its low half) and
// 2l + 1 (its high half), so one shift gives the 8 even values as floats and one mask the 8 odd
// ones: two operations per 16 values, where widening them in order (Load8T) takes four (a
// zero-extension and a shift per 8). The other operand (q, or the accumulators) is put in the same
// order once per call (Deinterleave16), and the sums come out the same up to their order.
ATTEND_AVX2 inline void LoadBf16x16(const void* base, int64_t i, __m256* even, __m256* odd) {
  const __m256i x =
      _mm256_loadu_si256(reinterpret_cast<const __m256i*>(static_cast<const uint16_t*>(base) + i));
  *even = _mm256_castsi256_ps(_mm256_slli_epi32(x, 16));
  *odd = _mm256_and_ps(_mm256_castsi256_ps(x),
                       _mm256_castsi256_ps(_mm256_set1_epi32(static_cast<int32_t>(0xffff0000u))));
}

// x[0, 16) as its even values (x[0], x[2], ..., x[14]) and its odd ones (x[1], ..., x[15]).
ATTEND_AVX2 inline void Deinterleave16(const float* x, __m256* even, __m256* odd) {
  const __m256 a = _mm256_loadu_ps(x);
  const __m256 b = _mm256_loadu_ps(x + 8);
  // shuffle_ps picks within 128-bit halves, (a0 a2 b0 b2 | a4 a6 b4 b6); the 64-bit permute then
  // puts the quarters in order.
  *even = _mm256_castpd_ps(
      _mm256_permute4x64_pd(_mm256_castps_pd(_mm256_shuffle_ps(a, b, 0x88)), 0xd8));
  *odd = _mm256_castpd_ps(
      _mm256_permute4x64_pd(_mm256_castps_pd(_mm256_shuffle_ps(a, b, 0xdd)), 0xd8));
}

// The inverse of Deinterleave16: x[0, 16) from its even and odd values.
ATTEND_AVX2 inline void Interleave16(__m256 even, __m256 odd, float* x) {
  const __m256 lo = _mm256_unpacklo_ps(even, odd);  // x0 x1 x2 x3 | x8 x9 x10 x11
  const __m256 hi = _mm256_unpackhi_ps(even, odd);  // x4 x5 x6 x7 | x12 x13 x14 x15
  _mm256_storeu_ps(x, _mm256_permute2f128_ps(lo, hi, 0x20));
  _mm256_storeu_ps(x + 8, _mm256_permute2f128_ps(lo, hi, 0x31));
}

// Query rows or accumulators of at most this many columns are split into even and odd values on
// the stack (4 rows: 8 KiB); wider heads take the in-order kernels.
constexpr int64_t kMaxSplitColumns = 512;

// Rows [0, m) of x (stride cols) split into split (stride cols16 = cols / 16 * 16), 16 columns
// at a time: each 16 as its 8 even values, then its 8 odd ones (Deinterleave16).
ATTEND_AVX2 void SplitRows(const float* x, int64_t m, int64_t cols, float* split) {
  const int64_t cols16 = cols / 16 * 16;
  for (int64_t j = 0; j < m; ++j) {
    for (int64_t c = 0; c < cols16; c += 16) {
      __m256 even, odd;
      Deinterleave16(x + j * cols + c, &even, &odd);
      _mm256_storeu_ps(split + j * cols16 + c, even);
      _mm256_storeu_ps(split + j * cols16 + c + 8, odd);
    }
  }
}

// The inverse of SplitRows, for cols % 16 == 0.
ATTEND_AVX2 void JoinRows(const float* split, int64_t m, int64_t cols, float* x) {
  for (int64_t i = 0; i < m * cols; i += 16) {
    Interleave16(_mm256_loadu_ps(split + i), _mm256_loadu_ps(split + i + 8), x + i);
  }
}

// DotRowsBlock for bf16 rows, 16 columns per step (LoadBf16x16). `split` holds the M query rows'
// first d16 = d / 16 * 16 columns as SplitRows leaves them; the columns past d16 are read from q.
template <int M, int R>
ATTEND_AVX2 void DotRowsBf16Block(const float* q, const float* split, int64_t d, const Rows& k,
                                  int64_t rows, float* scores, int64_t ld) {
  static_assert(M * R <= 8);
  constexpr DType kType = DType::kBFloat16;
  const int64_t d16 = d / 16 * 16;
  const int64_t ahead = PrefetchRows<kType>(d);
  const int64_t span = rows / R;
  for (int64_t t = 0; t < span; ++t) {
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) PrefetchRow<kType>(k, r * span + t + ahead, (r + 1) * span, d);
    __m256 acc[M * R];
#pragma GCC unroll 8
    for (int i = 0; i < M * R; ++i) acc[i] = _mm256_setzero_ps();
    const void* row[R];
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) row[r] = RowAt<kType>(k, r * span + t);
    for (int64_t c = 0; c < d16; c += 16) {
      __m256 even[R], odd[R];
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) LoadBf16x16(row[r], c, &even[r], &odd[r]);
#pragma GCC unroll 4
      for (int j = 0; j < M; ++j) {
        __m256 qe = _mm256_loadu_ps(split + j * d16 + c);
        __m256 qo = _mm256_loadu_ps(split + j * d16 + c + 8);
        // As in DotRowsBlock: the q values stay in registers rather than folded into each FMA.
        if constexpr (R > 1) __asm__("" : "+x"(qe), "+x"(qo));
#pragma GCC unroll 8
        for (int r = 0; r < R; ++r) {
          acc[j * R + r] = _mm256_fmadd_ps(qe, even[r], acc[j * R + r]);
          acc[j * R + r] = _mm256_fmadd_ps(qo, odd[r], acc[j * R + r]);
        }
      }
    }
    const int64_t c = DotEights<M, R, kType>(q, d, d16, row, acc);
    StoreDots<M, R, kType>(acc, q, d, c, row, k, span, t, scores, ld);
  }
  if constexpr (R > 1) {
    const int64_t done = span * R;
    if (done < rows) {
      Rows rest = k;
      rest.data = RowAt<kType>(k, done);
      DotRowsBf16Block<M, 1>(q, split, d, rest, rows - done, scores + done, ld);
    }
  }
}

// DotRows over bf16 rows with 16 <= d <= kMaxSplitColumns. Fewer query rows than 4 take fewer
// accumulators per key row and more key rows (streams) at once, as DotRowsImpl does, within
// the 16 vector registers (R rows' even and odd values, M * R sums, two of q).
ATTEND_AVX2 void DotRowsBf16(const float* q, int64_t m, int64_t d, const Rows& k, int64_t rows,
                             float* scores, int64_t ld) {
  alignas(32) float split[4 * kMaxSplitColumns];
  int64_t j = 0;
  for (; j + 4 <= m; j += 4) {
    SplitRows(q + j * d, 4, d, split);
    DotRowsBf16Block<4, 2>(q + j * d, split, d, k, rows, scores + j * ld, ld);
  }
  for (; j + 2 <= m; j += 2) {
    SplitRows(q + j * d, 2, d, split);
    DotRowsBf16Block<2, 3>(q + j * d, split, d, k, rows, scores + j * ld, ld);
  }
  for (; j < m; ++j) {
    SplitRows(q + j * d, 1, d, split);
    DotRowsBf16Block<1, 4>(q + j * d, split, d, k, rows, scores + j * ld, ld);
  }
}

// AccumulateBlock for bf16 rows, 16 columns per step (LoadBf16x16), into `split`: the M
// accumulator rows as SplitRows leaves them (dv % 16 == 0). Each accumulator value gets the same
// FMAs in the same order as in AccumulateBlock.
template <int M>
ATTEND_AVX2 void AccumulateBf16Block(const float* p, int64_t ld, const Rows& v, int64_t rows,
                                     int64_t dv, float* split) {
  constexpr DType kType = DType::kBFloat16;
  const int64_t ahead = PrefetchRows<kType>(dv);
  const int64_t span = rows / 4;
  for (int64_t t = 0; t < span; ++t) {
    int64_t at[4];
#pragma GCC unroll 4
    for (int r = 0; r < 4; ++r) {
      at[r] = r * span + t;
      PrefetchRow<kType>(v, at[r] + ahead, (r + 1) * span, dv);
    }
    __m256 w[M][4];
#pragma GCC unroll 4
    for (int r = 0; r < 4; ++r) {
#pragma GCC unroll 4
      for (int j = 0; j < M; ++j) w[j][r] = _mm256_set1_ps(p[j * ld + at[r]]);
    }
    const void* r0 = RowAt<kType>(v, at[0]);
    const void* r1 = RowAt<kType>(v, at[1]);
    const void* r2 = RowAt<kType>(v, at[2]);
    const void* r3 = RowAt<kType>(v, at[3]);
    for (int64_t c = 0; c < dv; c += 16) {
      __m256 e0, o0, e1, o1, e2, o2, e3, o3;
      LoadBf16x16(r0, c, &e0, &o0);
      LoadBf16x16(r1, c, &e1, &o1);
      LoadBf16x16(r2, c, &e2, &o2);
      LoadBf16x16(r3, c, &e3, &o3);
#pragma GCC unroll 4
      for (int j = 0; j < M; ++j) {
        float* a = split + j * dv + c;
        __m256 x = _mm256_fmadd_ps(w[j][0], e0, _mm256_loadu_ps(a));
        x = _mm256_fmadd_ps(w[j][1], e1, x);
        x = _mm256_fmadd_ps(w[j][2], e2, x);
        _mm256_storeu_ps(a, _mm256_fmadd_ps(w[j][3], e3, x));
        __m256 y = _mm256_fmadd_ps(w[j][0], o0, _mm256_loadu_ps(a + 8));
        y = _mm256_fmadd_ps(w[j][1], o1, y);
        y = _mm256_fmadd_ps(w[j][2], o2, y);
        _mm256_storeu_ps(a + 8, _mm256_fmadd_ps(w[j][3], o3, y));
      }
    }
  }
  for (int64_t t = 4 * span; t < rows; ++t) {
    const void* row = RowAt<kType>(v, t);
    for (int64_t c = 0; c < dv; c += 16) {
      __m256 even, odd;
      LoadBf16x16(row, c, &even, &odd);
#pragma GCC unroll 4
      for (int j = 0; j < M; ++j) {
        float* a = split + j * dv + c;
        const __m256 w = _mm256_set1_ps(p[j * ld + t]);
        _mm256_storeu_ps(a, _mm256_fmadd_ps(w, even, _mm256_loadu_ps(a)));
        _mm256_storeu_ps(a + 8, _mm256_fmadd_ps(w, odd, _mm256_loadu_ps(a + 8)));
      }
    }
  }
}

// AccumulateRows over bf16 rows with dv % 16 == 0 and dv <= kMaxSplitColumns: the accumulator
// rows are split on the stack for the call, and put back in order at its end.
ATTEND_AVX2 void AccumulateRowsBf16(const float* p, int64_t ld, int64_t m, const Rows& v,
                                    int64_t rows, int64_t dv, float* acc) {
  alignas(32) float split[4 * kMaxSplitColumns];
  int64_t j = 0;
  for (; j + 4 <= m; j += 4) {
    SplitRows(acc + j * dv, 4, dv, split);
    AccumulateBf16Block<4>(p + j * ld, ld, v, rows, dv, split);
    JoinRows(split, 4, dv, acc + j * dv);
  }
  for (; j + 2 <= m; j += 2) {
    SplitRows(acc + j * dv, 2, dv, split);
    AccumulateBf16Block<2>(p + j * ld, ld, v, rows, dv, split);
    JoinRows(split, 2, dv, acc + j * dv);
  }
  for (; j < m; ++j) {
    SplitRows(acc + j * dv, 1, dv, split);
    AccumulateBf16Block<1>(p + j * ld, ld, v, rows, dv, split);
    JoinRows(split, 1, dv, acc + j * dv);
  }
}

ATTEND_AVX2 void DotRowsAvx2(const float* q, int64_t m, int64_t d, const Rows& k, int64_t rows,
                             float* scores, int64_t ld) {
  switch (k.dtype) {
    case DType::kBFloat16:
      if (d >= 16 && d <= kMaxSplitColumns) return DotRowsBf16(q, m, d, k, rows, scores, ld);
      return DotRowsImpl<DType::kBFloat16>(q, m, d, k, rows, scores, ld);
    case DType::kInt8:
      return DotRowsImpl<DType::kInt8>(q, m, d, k, rows, scores, ld);
    default:
      return DotRowsImpl<DType::kFloat32>(q, m, d, k, rows, scores, ld);
  }
}

// Accumulates into up to 4 accumulator rows (which stay in L1): four value rows per step, so
// that each accumulator chunk is loaded and stored once per four rows, then the rest one by one.
// As in DotRowsBlock, the four rows are row t of four equal spans: four sequential streams.
template <int M, DType kType>
ATTEND_AVX2 void AccumulateBlock(const float* p, int64_t ld, const Rows& v, int64_t rows,
                                 int64_t dv, float* acc) {
  const int64_t ahead = PrefetchRows<kType>(dv);
  const int64_t span = dv % 8 == 0 ? rows / 4 : 0;
  for (int64_t t = 0; t < span; ++t) {
    int64_t at[4];
#pragma GCC unroll 4
    for (int r = 0; r < 4; ++r) {
      at[r] = r * span + t;
      PrefetchRow<kType>(v, at[r] + ahead, (r + 1) * span, dv);
    }
    __m256 w[M][4];
#pragma GCC unroll 4
    for (int r = 0; r < 4; ++r) {
      const float scale = ScaleAt<kType>(v, at[r]);
#pragma GCC unroll 4
      for (int j = 0; j < M; ++j) w[j][r] = _mm256_set1_ps(p[j * ld + at[r]] * scale);
    }
    const void* r0 = RowAt<kType>(v, at[0]);
    const void* r1 = RowAt<kType>(v, at[1]);
    const void* r2 = RowAt<kType>(v, at[2]);
    const void* r3 = RowAt<kType>(v, at[3]);
    for (int64_t c = 0; c < dv; c += 8) {
      const __m256 v0 = Load8T<kType>(r0, c);
      const __m256 v1 = Load8T<kType>(r1, c);
      const __m256 v2 = Load8T<kType>(r2, c);
      const __m256 v3 = Load8T<kType>(r3, c);
#pragma GCC unroll 4
      for (int j = 0; j < M; ++j) {
        float* a = acc + j * dv + c;
        __m256 x = _mm256_fmadd_ps(w[j][0], v0, _mm256_loadu_ps(a));
        x = _mm256_fmadd_ps(w[j][1], v1, x);
        x = _mm256_fmadd_ps(w[j][2], v2, x);
        _mm256_storeu_ps(a, _mm256_fmadd_ps(w[j][3], v3, x));
      }
    }
  }
  for (int64_t t = 4 * span; t < rows; ++t) {
    const void* row = RowAt<kType>(v, t);
    const float scale = ScaleAt<kType>(v, t);
    int64_t c = 0;
    for (; c + 8 <= dv; c += 8) {
      const __m256 vv = Load8T<kType>(row, c);
#pragma GCC unroll 4
      for (int j = 0; j < M; ++j) {
        float* a = acc + j * dv + c;
        const __m256 w = _mm256_set1_ps(p[j * ld + t] * scale);
        _mm256_storeu_ps(a, _mm256_fmadd_ps(w, vv, _mm256_loadu_ps(a)));
      }
    }
    for (; c < dv; ++c) {
      const float value = Load(row, kType, c) * scale;
      for (int j = 0; j < M; ++j) acc[j * dv + c] += p[j * ld + t] * value;
    }
  }
}

template <DType kType>
ATTEND_AVX2 void AccumulateRowsImpl(const float* p, int64_t ld, int64_t m, const Rows& v,
                                    int64_t rows, int64_t dv, float* acc) {
  int64_t j = 0;
  for (; j + 4 <= m; j += 4) AccumulateBlock<4, kType>(p + j * ld, ld, v, rows, dv, acc + j * dv);
  for (; j + 2 <= m; j += 2) AccumulateBlock<2, kType>(p + j * ld, ld, v, rows, dv, acc + j * dv);
  for (; j < m; ++j) AccumulateBlock<1, kType>(p + j * ld, ld, v, rows, dv, acc + j * dv);
}

ATTEND_AVX2 void AccumulateRowsAvx2(const float* p, int64_t ld, int64_t m, const Rows& v,
                                    int64_t rows, int64_t dv, float* acc) {
  switch (v.dtype) {
    case DType::kBFloat16:
      if (dv % 16 == 0 && dv <= kMaxSplitColumns) {
        return AccumulateRowsBf16(p, ld, m, v, rows, dv, acc);
      }
      return AccumulateRowsImpl<DType::kBFloat16>(p, ld, m, v, rows, dv, acc);
    case DType::kInt8:
      return AccumulateRowsImpl<DType::kInt8>(p, ld, m, v, rows, dv, acc);
    default:
      return AccumulateRowsImpl<DType::kFloat32>(p, ld, m, v, rows, dv, acc);
  }
}

const Kernels kAvx2Kernels{"avx2",         ExpShiftSumAvx2, RoundToBf16Avx2,   MaxAvx2,
                           ScaleMaxAvx2,   ToBf16Avx2,      ScaleAddAvx2,      ScaleCopyAvx2,
                           RowToFloatAvx2, DotRowsAvx2,     AccumulateRowsAvx2};

}  // namespace

const Kernels& Avx2Kernels() { return kAvx2Kernels; }

}  // namespace attend::simd::internal
