// int8 q.k on vpdpbusd (AVX512-VNNI), for the "avx512_vnni" kernel set (simd_avx512.cc has the
// rest of the AVX-512 kernels and says why p.v stays widened).
//
// Thread-safety: pure functions.
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
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

// ---- int8 q.k on vpdpbusd ----

// Beyond this head size a row's int32 sum could overflow: 256 * hi.k + lo.k is at most
// 257 * 127 * 127 * d (the int32 arithmetic before it wraps, and the result is exact when it
// fits). Larger heads take the widening kernel.
constexpr int64_t kMaxVnniHeadDim = 512;

// Each q row as two int8 parts on the row's scale s = max|q| / 127, offset by 128 into uint8:
// q ~ s * (hi + lo / 256), each value within s / 512. Rows padded to `width` (a multiple of 64)
// with the offset zero; an all-zero row gets s = 0.
ATTEND_AVX512 void QuantizeRows(const float* q, int64_t m, int64_t d, int64_t width,
                                std::vector<uint8_t>* hi, std::vector<uint8_t>* lo,
                                std::vector<float>* scale) {
  hi->resize(static_cast<size_t>(m * width));
  lo->resize(hi->size());
  scale->resize(static_cast<size_t>(m));
  const __m512 limit = _mm512_set1_ps(127.0f);
  const __m512i offset = _mm512_set1_epi32(128);
  for (int64_t j = 0; j < m; ++j) {
    const float* row = q + j * d;
    __m512 absmax = _mm512_setzero_ps();
    for (int64_t c = 0; c < d; c += 16) {
      absmax = _mm512_max_ps(absmax, _mm512_abs_ps(_mm512_maskz_loadu_ps(Mask16(d - c), row + c)));
    }
    const float top = _mm512_reduce_max_ps(absmax);
    (*scale)[static_cast<size_t>(j)] = top / 127.0f;
    const __m512 inverse = _mm512_set1_ps(top > 0.0f ? 127.0f / top : 0.0f);
    for (int64_t c = 0; c < width; c += 16) {
      const __mmask16 mask = c < d ? Mask16(d - c) : 0;
      const __m512 x = _mm512_mul_ps(_mm512_maskz_loadu_ps(mask, row + c), inverse);
      const __m512 h = _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
      __m512 l = _mm512_roundscale_ps(_mm512_mul_ps(_mm512_sub_ps(x, h), _mm512_set1_ps(256.0f)),
                                      _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
      l = _mm512_max_ps(_mm512_min_ps(l, limit), _mm512_set1_ps(-127.0f));
      const size_t at = static_cast<size_t>(j * width + c);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(hi->data() + at),
                       _mm512_cvtepi32_epi8(_mm512_add_epi32(_mm512_cvtps_epi32(h), offset)));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(lo->data() + at),
                       _mm512_cvtepi32_epi8(_mm512_add_epi32(_mm512_cvtps_epi32(l), offset)));
    }
  }
}

// Eight horizontal int32 sums as in Sum8Of16 (v[i] for i >= N counts as zero).
template <int N>
ATTEND_AVX512 inline __m256i Sum8Of16I(const __m512i* v) {
  static_assert(N >= 1 && N <= 8);
  __m512i x[8];
#pragma GCC unroll 8
  for (int i = 0; i < 8; ++i) x[i] = i < N ? v[i] : _mm512_setzero_si512();
  __m512i y[4];
#pragma GCC unroll 4
  for (int i = 0; i < 4; ++i) {
    y[i] = _mm512_add_epi32(_mm512_unpacklo_epi32(x[2 * i], x[2 * i + 1]),
                            _mm512_unpackhi_epi32(x[2 * i], x[2 * i + 1]));
  }
  __m512i z[2];
#pragma GCC unroll 2
  for (int i = 0; i < 2; ++i) {
    z[i] = _mm512_add_epi32(_mm512_unpacklo_epi64(y[2 * i], y[2 * i + 1]),
                            _mm512_unpackhi_epi64(y[2 * i], y[2 * i + 1]));
  }
  const __m512i s = _mm512_add_epi32(_mm512_shuffle_i32x4(z[0], z[1], 0x44),
                                     _mm512_shuffle_i32x4(z[0], z[1], 0xee));
  const __m512i t =
      _mm512_add_epi32(_mm512_shuffle_i32x4(s, s, 0x88), _mm512_shuffle_i32x4(s, s, 0xdd));
  return _mm512_castsi512_si256(t);
}

template <int M, int R>
ATTEND_AVX512_VNNI void DotInt8Block(const uint8_t* qh, const uint8_t* ql, const float* qs,
                                     int64_t width, int64_t d, const Rows& k, int64_t rows,
                                     float* scores, int64_t ld) {
  static_assert(M * R <= 8);
  const __m512i ones = _mm512_set1_epi8(1);
  const int64_t span = rows / R;
  // Locals, so that the stores to `scores` do not make the compiler reload them (aliasing).
  const float* const key_scales = k.scales;
  float q_factor[M];
#pragma GCC unroll 4
  for (int j = 0; j < M; ++j) q_factor[j] = qs[j] * (1.0f / 256.0f);
  const int64_t ahead = PrefetchRows<DType::kInt8>(d);
  for (int64_t g = 0; g < span; ++g) {
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      PrefetchRow<DType::kInt8>(k, r * span + g + ahead, (r + 1) * span, d);
    }
    // Per (j, r): 256 * hi.k + lo.k, each with its 128 * sum(k) offset.
    __m512i ah[M * R], al[M * R], sum[R];
#pragma GCC unroll 8
    for (int i = 0; i < M * R; ++i) ah[i] = al[i] = _mm512_setzero_si512();
    const int8_t* row[R];
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      sum[r] = _mm512_setzero_si512();
      row[r] = static_cast<const int8_t*>(RowAt<DType::kInt8>(k, SpanRow(r, g, span)));
    }
    for (int64_t c = 0; c < d; c += 64) {
      const __mmask64 mask = Mask64(d - c);
      __m512i kv[R];
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) {
        kv[r] = _mm512_maskz_loadu_epi8(mask, row[r] + c);
        sum[r] = _mm512_dpbusd_epi32(sum[r], ones, kv[r]);
      }
#pragma GCC unroll 4
      for (int j = 0; j < M; ++j) {
        const __m512i hv = _mm512_loadu_si512(qh + j * width + c);
        const __m512i lv = _mm512_loadu_si512(ql + j * width + c);
#pragma GCC unroll 8
        for (int r = 0; r < R; ++r) {
          ah[j * R + r] = _mm512_dpbusd_epi32(ah[j * R + r], hv, kv[r]);
          al[j * R + r] = _mm512_dpbusd_epi32(al[j * R + r], lv, kv[r]);
        }
      }
    }
    // 256 * (hi.k - 128 sum) + (lo.k - 128 sum), lane by lane, in wrapping int32 arithmetic:
    // exact, since the row's total fits (kMaxVnniHeadDim).
    __m512i combined[M * R];
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      // 128 * 257 * sum, as shifts (vpmulld is a slow instruction).
      const __m512i offset =
          _mm512_add_epi32(_mm512_slli_epi32(sum[r], 15), _mm512_slli_epi32(sum[r], 7));
#pragma GCC unroll 4
      for (int j = 0; j < M; ++j) {
        combined[j * R + r] = _mm512_sub_epi32(
            _mm512_add_epi32(_mm512_slli_epi32(ah[j * R + r], 8), al[j * R + r]), offset);
      }
    }
    alignas(32) int32_t sums[8];
    _mm256_store_si256(reinterpret_cast<__m256i*>(sums), Sum8Of16I<M * R>(combined));
#pragma GCC unroll 4
    for (int j = 0; j < M; ++j) {
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) {
        const int64_t t = SpanRow(r, g, span);
        scores[j * ld + t] = static_cast<float>(sums[j * R + r]) * q_factor[j] * key_scales[t];
      }
    }
  }
  if constexpr (R > 1) {
    const int64_t done = span * R;
    if (done < rows) {
      Rows rest = k;
      rest.data = RowAt<DType::kInt8>(k, done);
      rest.scales = k.scales + done;
      DotInt8Block<M, 1>(qh, ql, qs, width, d, rest, rows - done, scores + done, ld);
    }
  }
}

}  // namespace

ATTEND_AVX512_VNNI void DotInt8Vnni(const float* q, int64_t m, int64_t d, const Rows& k,
                                    int64_t rows, float* scores, int64_t ld) {
  if (d > kMaxVnniHeadDim) return Avx2Kernels().dot_rows(q, m, d, k, rows, scores, ld);
  thread_local std::vector<uint8_t> hi, lo;
  thread_local std::vector<float> scale;
  const int64_t width = (d + 63) / 64 * 64;
  QuantizeRows(q, m, d, width, &hi, &lo, &scale);
  int64_t j = 0;
  for (; j + 4 <= m; j += 4) {
    DotInt8Block<4, 2>(hi.data() + j * width, lo.data() + j * width, scale.data() + j, width, d, k,
                       rows, scores + j * ld, ld);
  }
  for (; j + 2 <= m; j += 2) {
    DotInt8Block<2, 4>(hi.data() + j * width, lo.data() + j * width, scale.data() + j, width, d, k,
                       rows, scores + j * ld, ld);
  }
  for (; j < m; ++j) {
    DotInt8Block<1, 4>(hi.data() + j * width, lo.data() + j * width, scale.data() + j, width, d, k,
                       rows, scores + j * ld, ld);
  }
}

}  // namespace attend::simd::internal
