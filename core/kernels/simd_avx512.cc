// The AVX-512 kernel sets of simd.h. Decode reads every cached byte once per step, so what matters
// is instructions per byte read: 16-lane FMAs halve the AVX2 kernels' count for f32, and the dot
// product instructions remove the widening that held bf16 and int8 to about half of f32's byte
// rate (each bf16 value took a zero-extend, a shift and an FMA):
//   - bf16 q.k and p.v on vdpbf16ps (AVX512-BF16; in simd_avx512_bf16.cc): 32 products per
//     instruction, exact products
//     of normal bf16 values with f32 sums; subnormal inputs and products below 2^-126 count as
//     zero, as in a native bf16 matmul, so only under native bf16 arithmetic (Rows::native_bf16),
//     and it needs q and p in bf16, as bf16 arithmetic (the default over bf16 storage) gives
//     them; otherwise the widening kernels run.
//   - int8 q.k and p.v on vpdpbusd (AVX512-VNNI; in simd_avx512_int8.cc), in the "avx512_vnni"
//     and "avx512_bf16" sets: q, and the weights p * scale, each in two 8-bit parts on one scale
//     per row (about 16 bits); the per-token scales multiply the int32 sums afterwards.
//   - bf16 widened in place on 16-lane FMAs (simd_avx512_split.cc: a shift and an and per 32
//     values, no shuffle), in the "avx512" and "avx512_vnni" sets.
// The "avx512" set has every kernel at 16 lanes with masked tails (f32, bf16 and int8 widened);
// the other two keep the AVX2 kernels where no dot product instruction applies (see below). Which
// set is best depends on the cores, not only on their instructions (Avx512Sets).
// Rows are read R at a time from R equal spans of the tile (as in the AVX2 kernels: sequential
// streams that the hardware prefetchers follow), and strided rows (a caller's [n, heads, d]
// tensor, one row a page) are prefetched ahead as the AVX2 kernels do: without that, stateless
// f32 decode read 5.2 GB/s against the AVX2 kernels' 9.3.
//
// Thread-safety: pure functions.
#include "core/kernels/simd_avx512.h"

#include <immintrin.h>

#include <cstdint>
#include <limits>

#include "core/kernels/simd_internal.h"

// GCC 12's own intrinsics header trips -Wuninitialized and -Wmaybe-uninitialized in the masked
// and cast intrinsics (its _mm512_undefined_* idiom, GCC bug 105593); nothing in this file reads
// an undefined value.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"

namespace attend::simd::internal {
namespace {

ATTEND_AVX512 inline __m512 Exp16(__m512 x) {
  // As the AVX2 kernel, to the bit: below -87 gives 0 (NaN compares false and is not zeroed).
  // There the lanes are zeroed by the last instruction's mask, so that they need no clamp: a
  // lane far below -87 may compute nonsense (r = x - n ln 2 cancels badly), which the mask drops.
  // vscalefps multiplies by 2^n exactly, as the AVX2 kernel's multiply by 2^n built from n's
  // bits does, in one instruction instead of four (a softmax's exp is 7% of a bf16 prefill).
  const __mmask16 below = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-87.0f), _CMP_LT_OQ);
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  p = _mm512_fmadd_ps(_mm512_mul_ps(p, r), r, _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
  return _mm512_maskz_scalef_ps(static_cast<__mmask16>(~below), p, n);
}

ATTEND_AVX512 float ExpShiftSum512(const float* x, float shift, float* y, int64_t n) {
  const __m512 s = _mm512_set1_ps(shift);
  __m512 sum = _mm512_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512 e = Exp16(_mm512_sub_ps(_mm512_loadu_ps(x + i), s));
    _mm512_storeu_ps(y + i, e);
    sum = _mm512_add_ps(sum, e);
  }
  float total = _mm512_reduce_add_ps(sum);
  for (; i < n; ++i) {
    y[i] = ExpScalar(x[i] - shift);
    total += y[i];
  }
  return total;
}

ATTEND_AVX512 float Max512(const float* x, int64_t n) {
  __m512 m = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  int64_t i = 0;
  // The running maximum second: max_ps returns it when the value is NaN (see MaxAvx2).
  for (; i + 16 <= n; i += 16) m = _mm512_max_ps(_mm512_loadu_ps(x + i), m);
  if (i < n)
    m = _mm512_mask_max_ps(m, Mask16(n - i), _mm512_maskz_loadu_ps(Mask16(n - i), x + i), m);
  return _mm512_reduce_max_ps(m);
}

ATTEND_AVX512 float ScaleMax512(float* x, int64_t n, float scale) {
  const __m512 s = _mm512_set1_ps(scale);
  const __m512 inf = _mm512_set1_ps(std::numeric_limits<float>::infinity());
  __m512 m = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  __mmask16 bad = 0;
  const bool scaled = scale != 1.0f;
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 k = Mask16(n - i);
    __m512 v = _mm512_maskz_loadu_ps(k, x + i);
    if (scaled) {
      v = _mm512_mul_ps(v, s);
      _mm512_mask_storeu_ps(x + i, k, v);
    }
    // |v| not below infinity, or unordered: an infinity or a NaN.
    bad |= _mm512_mask_cmp_ps_mask(k, _mm512_abs_ps(v), inf, _CMP_NLT_UQ);
    m = _mm512_mask_max_ps(m, k, v, m);
  }
  return bad != 0 ? std::numeric_limits<float>::quiet_NaN() : _mm512_reduce_max_ps(m);
}

ATTEND_AVX512 void ToBf16_512(const float* x, int64_t n, uint16_t* out) {
  const __m512i bias = _mm512_set1_epi32(0x7fff);
  const __m512i one = _mm512_set1_epi32(1);
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 k = Mask16(n - i);
    const __m512i bits = _mm512_castps_si512(_mm512_maskz_loadu_ps(k, x + i));
    const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(bits, 16), one);
    const __m512i r = _mm512_srli_epi32(_mm512_add_epi32(bits, _mm512_add_epi32(bias, odd)), 16);
    _mm256_mask_storeu_epi16(out + i, k, _mm512_cvtepi32_epi16(r));
  }
}

ATTEND_AVX512 bool ScaleCopy512(const float* src, float factor, float* dst, int64_t n) {
  const __m512 f = _mm512_set1_ps(factor);
  const __m512 inf = _mm512_set1_ps(std::numeric_limits<float>::infinity());
  __mmask16 bad = 0;
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 k = Mask16(n - i);
    const __m512 v = _mm512_mul_ps(_mm512_maskz_loadu_ps(k, src + i), f);
    _mm512_mask_storeu_ps(dst + i, k, v);
    bad |= _mm512_mask_cmp_ps_mask(k, _mm512_abs_ps(v), inf, _CMP_NLT_UQ);
  }
  return bad == 0;
}

ATTEND_AVX512 void ScaleAdd512(float* dst, float alpha, const float* src, int64_t n) {
  const __m512 a = _mm512_set1_ps(alpha);
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 k = Mask16(n - i);
    _mm512_mask_storeu_ps(
        dst + i, k,
        _mm512_fmadd_ps(_mm512_maskz_loadu_ps(k, dst + i), a, _mm512_maskz_loadu_ps(k, src + i)));
  }
}

// Sixteen consecutive values as floats (the first `n` when n < 16, zero after: masked loads do
// not touch the memory of masked-off elements).
template <DType kType>
ATTEND_AVX512 inline __m512 Load16(const void* base, int64_t i, __mmask16 k) {
  if constexpr (kType == DType::kBFloat16) {
    const __m256i h = _mm256_maskz_loadu_epi16(k, static_cast<const uint16_t*>(base) + i);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  } else if constexpr (kType == DType::kInt8) {
    const __m128i b = _mm_maskz_loadu_epi8(k, static_cast<const int8_t*>(base) + i);
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(b));
  } else {
    return _mm512_maskz_loadu_ps(k, static_cast<const float*>(base) + i);
  }
}

// Scores of M query rows against R key rows at a time (M * R <= 8 accumulators), values widened
// to f32 (f32 storage, and bf16 or int8 where the CPU has no dot product instruction for them).
template <int M, int R, DType kType>
ATTEND_AVX512 void DotBlock(const float* q, int64_t d, const Rows& k, int64_t rows, float* scores,
                            int64_t ld) {
  static_assert(M * R <= 8);
  const int64_t span = rows / R;
  const int64_t ahead = PrefetchRows<kType>(d);
  for (int64_t g = 0; g < span; ++g) {
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) PrefetchRow<kType>(k, r * span + g + ahead, (r + 1) * span, d);
    __m512 acc[M * R];
#pragma GCC unroll 8
    for (int i = 0; i < M * R; ++i) acc[i] = _mm512_setzero_ps();
    const void* row[R];
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) row[r] = RowAt<kType>(k, SpanRow(r, g, span));
    for (int64_t c = 0; c < d; c += 16) {
      const __mmask16 mask = Mask16(d - c);
      __m512 kv[R];
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) kv[r] = Load16<kType>(row[r], c, mask);
#pragma GCC unroll 4
      for (int j = 0; j < M; ++j) {
        __m512 qv = _mm512_maskz_loadu_ps(mask, q + j * d + c);
        if constexpr (R > 1) __asm__("" : "+v"(qv));  // one load for the R FMAs
#pragma GCC unroll 8
        for (int r = 0; r < R; ++r) acc[j * R + r] = _mm512_fmadd_ps(qv, kv[r], acc[j * R + r]);
      }
    }
    alignas(32) float sums[8];
    _mm256_store_ps(sums, Sum8Of16<M * R>(acc));
#pragma GCC unroll 4
    for (int j = 0; j < M; ++j) {
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) {
        const int64_t t = SpanRow(r, g, span);
        scores[j * ld + t] = sums[j * R + r] * ScaleAt<kType>(k, t);
      }
    }
  }
  if constexpr (R > 1) {
    const int64_t done = span * R;
    if (done < rows) {
      DotBlock<M, 1, kType>(q, d, RowsFrom<kType>(k, done), rows - done, scores + done, ld);
    }
  }
}

template <DType kType>
ATTEND_AVX512 void DotWidened(const float* q, int64_t m, int64_t d, const Rows& k, int64_t rows,
                              float* scores, int64_t ld) {
  int64_t j = 0;
  for (; j + 4 <= m; j += 4) DotBlock<4, 2, kType>(q + j * d, d, k, rows, scores + j * ld, ld);
  for (; j + 2 <= m; j += 2) DotBlock<2, 4, kType>(q + j * d, d, k, rows, scores + j * ld, ld);
  for (; j < m; ++j) DotBlock<1, 8, kType>(q + j * d, d, k, rows, scores + j * ld, ld);
}

// p.v for M accumulator rows, four value rows (from four spans) per step, values widened to f32.
template <int M, DType kType>
ATTEND_AVX512 void AccumulateBlock(const float* p, int64_t ld, const Rows& v, int64_t rows,
                                   int64_t dv, float* acc) {
  const int64_t span = rows / 4;
  const int64_t ahead = PrefetchRows<kType>(dv);
  for (int64_t g = 0; g < span; ++g) {
    int64_t at[4];
    __m512 w[M][4];
#pragma GCC unroll 4
    for (int r = 0; r < 4; ++r) {
      at[r] = SpanRow(r, g, span);
      PrefetchRow<kType>(v, at[r] + ahead, (r + 1) * span, dv);
      const float scale = ScaleAt<kType>(v, at[r]);
#pragma GCC unroll 4
      for (int j = 0; j < M; ++j) w[j][r] = _mm512_set1_ps(p[j * ld + at[r]] * scale);
    }
    const void* r0 = RowAt<kType>(v, at[0]);
    const void* r1 = RowAt<kType>(v, at[1]);
    const void* r2 = RowAt<kType>(v, at[2]);
    const void* r3 = RowAt<kType>(v, at[3]);
    for (int64_t c = 0; c < dv; c += 16) {
      const __mmask16 mask = Mask16(dv - c);
      const __m512 v0 = Load16<kType>(r0, c, mask);
      const __m512 v1 = Load16<kType>(r1, c, mask);
      const __m512 v2 = Load16<kType>(r2, c, mask);
      const __m512 v3 = Load16<kType>(r3, c, mask);
#pragma GCC unroll 4
      for (int j = 0; j < M; ++j) {
        float* a = acc + j * dv + c;
        __m512 x = _mm512_fmadd_ps(w[j][0], v0, _mm512_maskz_loadu_ps(mask, a));
        x = _mm512_fmadd_ps(w[j][1], v1, x);
        x = _mm512_fmadd_ps(w[j][2], v2, x);
        _mm512_mask_storeu_ps(a, mask, _mm512_fmadd_ps(w[j][3], v3, x));
      }
    }
  }
  for (int64_t t = 4 * span; t < rows; ++t) {
    const void* row = RowAt<kType>(v, t);
    const float scale = ScaleAt<kType>(v, t);
    for (int64_t c = 0; c < dv; c += 16) {
      const __mmask16 mask = Mask16(dv - c);
      const __m512 vv = Load16<kType>(row, c, mask);
#pragma GCC unroll 4
      for (int j = 0; j < M; ++j) {
        float* a = acc + j * dv + c;
        const __m512 wj = _mm512_set1_ps(p[j * ld + t] * scale);
        _mm512_mask_storeu_ps(a, mask, _mm512_fmadd_ps(wj, vv, _mm512_maskz_loadu_ps(mask, a)));
      }
    }
  }
}

template <DType kType>
ATTEND_AVX512 void AccumulateWidened(const float* p, int64_t ld, int64_t m, const Rows& v,
                                     int64_t rows, int64_t dv, float* acc) {
  int64_t j = 0;
  for (; j + 4 <= m; j += 4) AccumulateBlock<4, kType>(p + j * ld, ld, v, rows, dv, acc + j * dv);
  for (; j + 2 <= m; j += 2) AccumulateBlock<2, kType>(p + j * ld, ld, v, rows, dv, acc + j * dv);
  for (; j < m; ++j) AccumulateBlock<1, kType>(p + j * ld, ld, v, rows, dv, acc + j * dv);
}

ATTEND_AVX512 void DotRows512(const float* q, int64_t m, int64_t d, const Rows& k, int64_t rows,
                              float* scores, int64_t ld) {
  switch (k.dtype) {
    case DType::kBFloat16:
      return DotBf16Split(q, m, d, k, rows, scores, ld);
    case DType::kInt8:
      return DotWidened<DType::kInt8>(q, m, d, k, rows, scores, ld);
    default:
      return DotWidened<DType::kFloat32>(q, m, d, k, rows, scores, ld);
  }
}

ATTEND_AVX512 void AccumulateRows512(const float* p, int64_t ld, int64_t m, const Rows& v,
                                     int64_t rows, int64_t dv, float* acc) {
  switch (v.dtype) {
    case DType::kBFloat16:
      return AccumulateBf16Split(p, ld, m, v, rows, dv, acc);
    case DType::kInt8:
      return AccumulateWidened<DType::kInt8>(p, ld, m, v, rows, dv, acc);
    default:
      return AccumulateWidened<DType::kFloat32>(p, ld, m, v, rows, dv, acc);
  }
}

// The sets with dot product instructions use them where they replace the widening, and the AVX2
// kernels elsewhere: on Zen 4, with 512-bit instructions executed in two halves, the 16-lane f32
// kernels read 24-34 GB/s from L2 on one core against the AVX2 ones' 33-39 (the horizontal sums
// cost more at 16 lanes). BENCHMARKS.md has the figures. The vnni set's bf16 is the in-place
// widening (no dot product instruction of its own applies); the bf16 set's int8 is the vnni
// set's.
ATTEND_AVX512_VNNI void DotRowsVnni(const float* q, int64_t m, int64_t d, const Rows& k,
                                    int64_t rows, float* scores, int64_t ld) {
  if (k.dtype == DType::kInt8) return DotInt8Vnni(q, m, d, k, rows, scores, ld);
  if (k.dtype == DType::kBFloat16) return DotBf16Split(q, m, d, k, rows, scores, ld);
  return Avx2Kernels().dot_rows(q, m, d, k, rows, scores, ld);
}

ATTEND_AVX512_VNNI void AccumulateRowsVnni(const float* p, int64_t ld, int64_t m, const Rows& v,
                                           int64_t rows, int64_t dv, float* acc) {
  if (v.dtype == DType::kBFloat16) return AccumulateBf16Split(p, ld, m, v, rows, dv, acc);
  if (v.dtype == DType::kInt8) return AccumulateInt8Vnni(p, ld, m, v, rows, dv, acc);
  return Avx2Kernels().accumulate_rows(p, ld, m, v, rows, dv, acc);
}

ATTEND_AVX512_BF16 void DotRowsBf16(const float* q, int64_t m, int64_t d, const Rows& k,
                                    int64_t rows, float* scores, int64_t ld) {
  if (k.dtype == DType::kBFloat16 && k.native_bf16) return DotBf16(q, m, d, k, rows, scores, ld);
  if (k.dtype == DType::kInt8) return DotInt8Vnni(q, m, d, k, rows, scores, ld);
  return Avx2Kernels().dot_rows(q, m, d, k, rows, scores, ld);
}

ATTEND_AVX512_BF16 void AccumulateRowsBf16(const float* p, int64_t ld, int64_t m, const Rows& v,
                                           int64_t rows, int64_t dv, float* acc) {
  if (v.dtype == DType::kBFloat16 && v.native_bf16) {
    return AccumulateBf16(p, ld, m, v, rows, dv, acc);
  }
  if (v.dtype == DType::kInt8) return AccumulateInt8Vnni(p, ld, m, v, rows, dv, acc);
  return Avx2Kernels().accumulate_rows(p, ld, m, v, rows, dv, acc);
}

Kernels Make(const char* name,
             void (*dot_rows)(const float*, int64_t, int64_t, const Rows&, int64_t, float*,
                              int64_t),
             void (*accumulate_rows)(const float*, int64_t, int64_t, const Rows&, int64_t, int64_t,
                                     float*)) {
  const Kernels& avx2 = Avx2Kernels();
  return Kernels{
      name,        ExpShiftSum512, avx2.round_to_bf16, Max512,   ScaleMax512,    ToBf16_512,
      ScaleAdd512, ScaleCopy512,   avx2.row_to_float,  dot_rows, accumulate_rows};
}

bool CpuHasAvx512() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
         __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
}

}  // namespace

const Avx512Set* Avx512Sets(int* count) {
  static const Kernels avx512 = Make("avx512", DotRows512, AccumulateRows512);
  static const Kernels vnni = Make("avx512_vnni", DotRowsVnni, AccumulateRowsVnni);
  static const Kernels bf16 = Make("avx512_bf16", DotRowsBf16, AccumulateRowsBf16);
  const bool base = CpuHasAvx512();
  const bool has_vnni = base && __builtin_cpu_supports("avx512vnni");
  const bool has_bf16 = has_vnni && __builtin_cpu_supports("avx512bf16");
  // Best last. On Intel cores (two full-width 512-bit FMA units, vdpbf16ps at half their rate)
  // the 16-lane set decoded every storage dtype over the cache at least as fast as the others,
  // and bf16 1.2-1.4x faster than the vdpbf16ps set; on Zen 4 (512-bit instructions in two
  // halves) the sets with dot products were best. BENCHMARKS.md has both machines' figures.
  static const Avx512Set amd_order[] = {{&avx512, base}, {&vnni, has_vnni}, {&bf16, has_bf16}};
  static const Avx512Set intel_order[] = {{&vnni, has_vnni}, {&bf16, has_bf16}, {&avx512, base}};
  *count = 3;
  return __builtin_cpu_is("intel") ? intel_order : amd_order;
}

}  // namespace attend::simd::internal
