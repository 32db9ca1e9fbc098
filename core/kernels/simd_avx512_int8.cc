// int8 q.k on vpdpbusd and p.v on vpdpwssd (AVX512-VNNI), for the "avx512_vnni" and
// "avx512_bf16" kernel sets (simd_avx512.cc has the rest of the AVX-512 kernels).
//
// On a Zen 4 (one core, K or V in L2, a GQA group of 4), q.k read 9.3 GB/s of keys with
// horizontal sums per row, 14.8 transposed, and 19.4-19.6 transposed in 4 x 4 blocks and
// software-pipelined, its scratch reached without __tls_get_addr (CMakeLists.txt); p.v 10.4 widened
// to f32, 13-14 on vpdpbusd (the weights in two uint8 parts, four rows interleaved by byte) and
// 18-20 on vpdpwssd (one int16 part, two rows widened and interleaved): BENCHMARKS.md. With sharp
// weights (a softmax of scores of standard deviation 2, `BM_DecodeKernelPart` sharp:1), p.v
// reads 14.0-14.7 on steps per 32 rows, where the widening kernel that such weights took before
// read 9.8-9.9.
//
// Thread-safety: pure functions.
#include <immintrin.h>

#include <algorithm>
#include <cmath>
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

// ---- int8 q.k on vpdpbusd ----

// Beyond this head size a row's int32 sum could overflow: 256 * hi.k + lo.k is at most
// 257 * 127 * 127 * d (the int32 arithmetic before it wraps, and the result is exact when it
// fits). Larger heads take the widening kernel.
constexpr int64_t kMaxVnniHeadDim = 512;

// Below this, a row's largest |q| takes the widening kernel, and a block of weights is carried
// as zeros (QuantizeInt8Weights, which counts their mass as error): the reciprocal times 32767
// must be finite and the step a normal float, or the values would turn into zeros or garbage
// (weights of 1e-40, from subnormal value scales, came out as 0). Far below anything a model
// computes; the widening kernels keep such values as f32 does.
constexpr float kSmallestScaled = 0x1p-100f;

// q's rows as DotInt8Rows16 takes them: two signed 8-bit parts on the row's scale s = max|q| / 127,
// q ~ s * (hi + lo / 256), each value within s / 512; rows padded with zeros to `width` (a
// multiple of 64). An all-zero row gets s = 0.
struct QuantizedRows {
  std::vector<int8_t> hi, lo;
  std::vector<int32_t> offset;  // per row: 128 * (256 * sum(hi) + sum(lo)), wrapped to int32
  std::vector<float> factor;    // per row: s / 256
  // hi and lo as DotInt8Rows16 reads them: per group of query rows (4, then 2, then 1, as
  // DotInt8Vnni takes them), DotInt8Rows16's order (see there).
  std::vector<int32_t> interleaved;
};

// Fills parts->interleaved for the groups DotInt8Vnni passes over m query rows.
inline void InterleaveGroups(int64_t m, int64_t width, QuantizedRows* parts) {
  const int64_t groups = width / 4;
  parts->interleaved.resize(static_cast<size_t>(m * groups * 2));
  const auto* hi = reinterpret_cast<const int32_t*>(parts->hi.data());
  const auto* lo = reinterpret_cast<const int32_t*>(parts->lo.data());
  int64_t j0 = 0;
  for (const int64_t size : {4, 2, 1}) {
    for (; j0 + size <= m; j0 += size) {
      int32_t* out = parts->interleaved.data() + j0 * groups * 2;
      for (int64_t g = 0; g < groups; ++g) {
        for (int64_t j = 0; j < size; ++j) {
          out[(g * size + j) * 2] = hi[(j0 + j) * groups + g];
          out[(g * size + j) * 2 + 1] = lo[(j0 + j) * groups + g];
        }
      }
    }
  }
}

// Returns false (the parts unusable) when a row's largest |q| is positive and below
// kSmallestScaled.
ATTEND_AVX512 bool QuantizeRows(const float* q, int64_t m, int64_t d, int64_t width,
                                QuantizedRows* out) {
  out->hi.resize(static_cast<size_t>(m * width));
  out->lo.resize(out->hi.size());
  out->offset.resize(static_cast<size_t>(m));
  out->factor.resize(static_cast<size_t>(m));
  const __m512 limit = _mm512_set1_ps(127.0f);
  for (int64_t j = 0; j < m; ++j) {
    const float* row = q + j * d;
    __m512 absmax = _mm512_setzero_ps();
    for (int64_t c = 0; c < d; c += 16) {
      absmax = _mm512_max_ps(absmax, _mm512_abs_ps(_mm512_maskz_loadu_ps(Mask16(d - c), row + c)));
    }
    const float top = _mm512_reduce_max_ps(absmax);
    if (top > 0.0f && top < kSmallestScaled) return false;
    out->factor[static_cast<size_t>(j)] = top / 127.0f / 256.0f;
    const __m512 inverse = _mm512_set1_ps(top > 0.0f ? 127.0f / top : 0.0f);
    __m512i sum_hi = _mm512_setzero_si512(), sum_lo = _mm512_setzero_si512();
    for (int64_t c = 0; c < width; c += 16) {
      const __mmask16 mask = c < d ? Mask16(d - c) : 0;
      const __m512 x = _mm512_mul_ps(_mm512_maskz_loadu_ps(mask, row + c), inverse);
      const __m512 h = _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
      __m512 l = _mm512_roundscale_ps(_mm512_mul_ps(_mm512_sub_ps(x, h), _mm512_set1_ps(256.0f)),
                                      _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
      l = _mm512_max_ps(_mm512_min_ps(l, limit), _mm512_set1_ps(-127.0f));
      const __m512i hi = _mm512_cvtps_epi32(h), lo = _mm512_cvtps_epi32(l);
      sum_hi = _mm512_add_epi32(sum_hi, hi);
      sum_lo = _mm512_add_epi32(sum_lo, lo);
      const size_t at = static_cast<size_t>(j * width + c);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(out->hi.data() + at), _mm512_cvtepi32_epi8(hi));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(out->lo.data() + at), _mm512_cvtepi32_epi8(lo));
    }
    const auto total = static_cast<uint32_t>(_mm512_reduce_add_epi32(sum_hi)) * 256u +
                       static_cast<uint32_t>(_mm512_reduce_add_epi32(sum_lo));
    out->offset[static_cast<size_t>(j)] = static_cast<int32_t>(total * 128u);
  }
  return true;
}

// The 16 x 16 matrix of 32-bit elements in x transposed in place: lane t of x[i] becomes element i
// of x[t] before. Four rounds of 16 two-input shuffles.
ATTEND_AVX512 inline void Transpose16x16(__m512i* x) {
  __m512i a[16];
#pragma GCC unroll 8
  for (int p = 0; p < 8; ++p) {
    a[2 * p] = _mm512_unpacklo_epi32(x[2 * p], x[2 * p + 1]);
    a[2 * p + 1] = _mm512_unpackhi_epi32(x[2 * p], x[2 * p + 1]);
  }
  // b[4 g + e], 128-bit lane L: element 4 L + e of rows 4 g .. 4 g + 3.
  __m512i b[16];
#pragma GCC unroll 4
  for (int g = 0; g < 4; ++g) {
    b[4 * g] = _mm512_unpacklo_epi64(a[4 * g], a[4 * g + 2]);
    b[4 * g + 1] = _mm512_unpackhi_epi64(a[4 * g], a[4 * g + 2]);
    b[4 * g + 2] = _mm512_unpacklo_epi64(a[4 * g + 1], a[4 * g + 3]);
    b[4 * g + 3] = _mm512_unpackhi_epi64(a[4 * g + 1], a[4 * g + 3]);
  }
  // Element 4 L + e of all 16 rows: lane L of b[e], b[4 + e], b[8 + e], b[12 + e].
#pragma GCC unroll 4
  for (int e = 0; e < 4; ++e) {
    const __m512i u0 = _mm512_shuffle_i32x4(b[e], b[4 + e], 0x44);
    const __m512i u1 = _mm512_shuffle_i32x4(b[e], b[4 + e], 0xee);
    const __m512i u2 = _mm512_shuffle_i32x4(b[8 + e], b[12 + e], 0x44);
    const __m512i u3 = _mm512_shuffle_i32x4(b[8 + e], b[12 + e], 0xee);
    x[e] = _mm512_shuffle_i32x4(u0, u2, 0x88);
    x[4 + e] = _mm512_shuffle_i32x4(u0, u2, 0xdd);
    x[8 + e] = _mm512_shuffle_i32x4(u1, u3, 0x88);
    x[12 + e] = _mm512_shuffle_i32x4(u1, u3, 0xdd);
  }
}

// Quarter g (columns c + 16 g .. c + 16 g + 15) of key rows [t0, t0 + 16) as Transpose16x16
// leaves them, x[0..3] = its x[4 g .. 4 g + 3] (lane t of x[e]: columns c + 16 g + 4 e ..
// c + 16 g + 4 e + 3 of row t0 + t), each byte xor `flip`, from 16-byte loads: lane L of v[a] is
// row t0 + 4 L + a's 16 bytes, so that each 128-bit lane needs only a 4 x 4 transpose (two
// rounds of shuffles, where Transpose16x16 takes four; the inserts are loads on other ports).
// `base` points at row t0's column c. On a Zen 4, q.k from L2: 14.7 -> 15.0 GB/s at d 128,
// 12.3 -> 13.4 at d 64.
ATTEND_AVX512 inline void LoadQuarter(const int8_t* base, int64_t stride, int g, __m512i flip,
                                      __m512i* x) {
  __m512i v[4];
#pragma GCC unroll 4
  for (int a = 0; a < 4; ++a) {
    const int8_t* p = base + a * stride + 16 * g;
    __m512i w = _mm512_castsi128_si512(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    w = _mm512_inserti32x4(w, _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 4 * stride)), 1);
    w = _mm512_inserti32x4(w, _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 8 * stride)), 2);
    w = _mm512_inserti32x4(w, _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 12 * stride)),
                           3);
    v[a] = _mm512_xor_si512(w, flip);
  }
  const __m512i t0 = _mm512_unpacklo_epi32(v[0], v[1]), t1 = _mm512_unpackhi_epi32(v[0], v[1]);
  const __m512i t2 = _mm512_unpacklo_epi32(v[2], v[3]), t3 = _mm512_unpackhi_epi32(v[2], v[3]);
  x[0] = _mm512_unpacklo_epi64(t0, t2);
  x[1] = _mm512_unpackhi_epi64(t0, t2);
  x[2] = _mm512_unpacklo_epi64(t1, t3);
  x[3] = _mm512_unpackhi_epi64(t1, t3);
}

// All four quarters of columns [c, c + 64) of rows [t0, t0 + 16).
ATTEND_AVX512 inline void LoadTransposed16x64(const Rows& k, int64_t t0, int64_t c, __m512i flip,
                                              __m512i* x) {
  const int8_t* base = static_cast<const int8_t*>(RowAt<DType::kInt8>(k, t0)) + c;
#pragma GCC unroll 4
  for (int g = 0; g < 4; ++g) LoadQuarter(base, k.stride, g, flip, x + 4 * g);
}

// How far ahead PrefetchAhead asks for rows, in bytes. Near: on a Zen 4 the far distance of the
// other kernels (kPrefetchBytes, 4 KiB) made int8 decode over the cache 13-16% slower than this
// one (one thread, 4096 tokens x 16 sequences: 15.7-15.9 ms at 4 KiB, 13.6-13.9 at 512 bytes,
// 18.4-18.5 with none; docs/perf-log/2026-12-06-int8-prefetch-and-weight-blocks.md). The likely
// reason: lines asked for 4 KiB ahead wait on memory in the L1's few miss buffers, which the
// current rows' loads then queue behind, while lines 512 bytes ahead are mostly in L2 already,
// brought by the hardware's stream prefetcher, and only need moving to L1 before the transposes
// read them. Asking for the far lines into L2 only (prefetcht1) measured the same as this.
constexpr int64_t kInt8PrefetchBytes = 512;

// Asks for the cache lines of `count` rows of `cols` int8 values, kInt8PrefetchBytes past row `t`
// (those below `rows`), dense rows too (unlike PrefetchRow): these kernels do about three times
// f32's arithmetic per byte, and without it the hardware prefetchers alone left memory and
// arithmetic barely overlapped (18.4-18.5 ms against 13.6-13.9 in the case above).
inline void PrefetchAhead(const Rows& r, int64_t t, int64_t rows, int64_t count, int64_t cols) {
  const int64_t ahead =
      t + std::max<int64_t>(1, kInt8PrefetchBytes / std::max<int64_t>(1, r.stride));
  const int64_t end = std::min(rows, ahead + count);
  for (int64_t u = ahead; u < end; ++u) {
    const char* row = static_cast<const char*>(RowAt<DType::kInt8>(r, u));
    for (int64_t off = 0; off < cols; off += 64) PrefetchLine(row + off);
  }
}

// The scores of query rows j0 .. j0 + M - 1 against 16 key rows (lanes in `out`) from vpdpbusd's
// sums of q's two parts, h and l, into scores[j * ld + lane].
template <int M>
ATTEND_AVX512 inline void StoreScores16(const QuantizedRows& q, int64_t j0, const __m512i* h,
                                        const __m512i* l, __mmask16 out, const float* key_scales,
                                        float* scores, int64_t ld) {
  const __m512 ks = _mm512_maskz_loadu_ps(out, key_scales);
#pragma GCC unroll 4
  for (int j = 0; j < M; ++j) {
    // 256 * (hi.k' - 128 sum hi) + (lo.k' - 128 sum lo), k' = k + 128, in wrapping int32
    // arithmetic: exact, since the row's total fits (kMaxVnniHeadDim).
    const __m512i combined =
        _mm512_sub_epi32(_mm512_add_epi32(_mm512_slli_epi32(h[j], 8), l[j]),
                         _mm512_set1_epi32(q.offset[static_cast<size_t>(j0 + j)]));
    _mm512_mask_storeu_ps(
        scores + j * ld, out,
        _mm512_mul_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(combined),
                                    _mm512_set1_ps(q.factor[static_cast<size_t>(j0 + j)])),
                      ks));
  }
}

// Scores of M query rows against key rows [t0, t0 + 16) (those below `rows`), the key rows
// transposed 64 columns at a time so that lane t of vector i holds columns 4 i .. 4 i + 3 of row
// t0 + t: vpdpbusd then adds 4 products per lane with q's four values broadcast, and each lane
// ends with one row's whole dot product, with no horizontal sums. The keys go in as the unsigned
// operand, offset by 128 (an xor), q's two signed parts as the signed one; 128 * (the sum of a
// part) comes off again once per query row.
template <int M>
ATTEND_AVX512_VNNI void DotInt8Rows16(const QuantizedRows& q, int64_t j0, int64_t width, int64_t d,
                                      const Rows& k, int64_t t0, int64_t rows, float* scores,
                                      int64_t ld, bool prefetch) {
  // Group (j0, M)'s 4-byte parts interleaved: column group g, query row j, part (hi, lo) at
  // (g * M + j) * 2 + part, so that every broadcast of a chunk is one pointer plus a constant.
  const int32_t* qg = q.interleaved.data() + j0 * width / 2;
  const int64_t n = std::min<int64_t>(16, rows - t0);
  if (prefetch) PrefetchAhead(k, t0 + n, rows, 16, d);
  const __m512i flip = _mm512_set1_epi8(static_cast<char>(0x80));
  __m512i h[M], l[M];
#pragma GCC unroll 4
  for (int j = 0; j < M; ++j) h[j] = l[j] = _mm512_setzero_si512();
  for (int64_t c = 0; c < d; c += 64) {
    const __mmask64 mask = Mask64(d - c);
    __m512i x[16];
    if (n == 16 && c + 64 <= d) {
      LoadTransposed16x64(k, t0, c, flip, x);
    } else {
#pragma GCC unroll 16
      for (int t = 0; t < 16; ++t) {
        const auto* row =
            static_cast<const int8_t*>(RowAt<DType::kInt8>(k, t0 + std::min<int64_t>(t, n - 1)));
        x[t] = _mm512_xor_si512(_mm512_maskz_loadu_epi8(t < n ? mask : 0, row + c), flip);
      }
      Transpose16x16(x);
    }
    const int32_t* qc = qg + (c / 4) * 2 * M;  // q's 4-byte groups from column c
    // Column group outermost: the 2 M accumulators' chains advance in turn (with one query
    // row's 16 groups innermost, each chain waited on its own latency: 13.2-13.6 -> 14.5-14.7
    // GB/s from L2 on a Zen 4).
#pragma GCC unroll 16
    for (int i = 0; i < 16; ++i) {
#pragma GCC unroll 4
      for (int j = 0; j < M; ++j) {
        h[j] = _mm512_dpbusd_epi32(h[j], x[i], _mm512_set1_epi32(qc[(i * M + j) * 2]));
        l[j] = _mm512_dpbusd_epi32(l[j], x[i], _mm512_set1_epi32(qc[(i * M + j) * 2 + 1]));
      }
    }
  }
  StoreScores16<M>(q, j0, h, l, Mask16(n), k.scales + t0, scores + t0, ld);
}

// acc += vpdpbusd(x, *b broadcast), the broadcast folded into the instruction's memory
// operand ({1to16}), which GCC 12 does not do for vpdpbusd: one instruction instead of two in
// the loop, 2-5% faster q.k on a Zen 4 (18.2-19.0 -> 19.4-19.6 GB/s from L2 at d 128).
ATTEND_AVX512_VNNI inline void DpbusdBroadcast(__m512i& acc, __m512i x, const int32_t* b) {
  __asm__("vpdpbusd %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(x), "m"(*b));
}

// Scores of the query rows of group (j0, M) against key rows [0, full) (full a multiple of 16,
// d of 64), as DotInt8Rows16 computes them, software-pipelined: the loads and transposes of the
// next 64 columns of 16 rows are interleaved, a quarter at a time, with the vpdpbusd of the
// current ones, so that the out-of-order window, full of a block's 128 vpdpbusd (one a cycle on
// a Zen 4, whatever else runs beside them), need not reach past them to start the next block's
// shuffles. From L2, d 128: 14.5-14.9 -> 15.1-16.2 GB/s (16.0-16.5 -> 18.0-18.6 at d 256).
template <int M>
ATTEND_AVX512_VNNI void DotInt8Pipelined(const QuantizedRows& q, int64_t j0, int64_t width,
                                         int64_t d, const Rows& k, int64_t full, int64_t rows,
                                         float* scores, int64_t ld, bool prefetch,
                                         NextRows* next_rows) {
  const int32_t* qg = q.interleaved.data() + j0 * width / 2;
  const __m512i flip = _mm512_set1_epi8(static_cast<char>(0x80));
  const auto* keys = static_cast<const int8_t*>(k.data);
  __m512i x[16];
  LoadTransposed16x64(k, 0, 0, flip, x);
  for (int64_t t0 = 0; t0 < full; t0 += 16) {
    if (prefetch) {
      PrefetchAhead(k, t0 + 16, rows, 16, d);
      next_rows->Reached(t0 + 16);
    }
    __m512i h[M], l[M];
#pragma GCC unroll 4
    for (int j = 0; j < M; ++j) h[j] = l[j] = _mm512_setzero_si512();
    for (int64_t c = 0; c < d; c += 64) {
      // The next block: the next 64 columns, or the next 16 rows' first; at the very end the
      // current one again (loaded for nothing, but no branch in the loop).
      int64_t next_t = t0, next_c = c + 64;
      if (next_c == d) {
        next_t += 16;
        next_c = 0;
      }
      if (next_t >= full) next_t = t0, next_c = c;
      const int8_t* next = keys + next_t * k.stride + next_c;
      const int32_t* qc = qg + (c / 4) * 2 * M;
#pragma GCC unroll 4
      for (int g = 0; g < 4; ++g) {
#pragma GCC unroll 4
        for (int i = 4 * g; i < 4 * g + 4; ++i) {
#pragma GCC unroll 4
          for (int j = 0; j < M; ++j) {
            DpbusdBroadcast(h[j], x[i], qc + (i * M + j) * 2);
            DpbusdBroadcast(l[j], x[i], qc + (i * M + j) * 2 + 1);
          }
        }
        LoadQuarter(next, k.stride, g, flip, x + 4 * g);
      }
    }
    StoreScores16<M>(q, j0, h, l, 0xffff, k.scales + t0, scores + t0, ld);
  }
}

// ---- int8 p.v on vpdpwssd ----

}  // namespace

namespace {

// Sums a whole row's int16 weight errors against this.
constexpr float kMaxWeightError = 0x1p-12f;

// The largest weight of block b of `block` rows (a multiple of kFineBlockRows), from the
// largest of each kFineBlockRows rows (`subs` of them).
inline float BlockLargest(const float* sub_max, int64_t subs, int64_t block, int64_t b) {
  const int64_t per = block / kFineBlockRows;
  float largest = 0.0f;
  for (int64_t u = b * per; u < std::min(subs, (b + 1) * per); ++u) {
    largest = std::max(largest, sub_max[u]);
  }
  return largest;
}

// Quantizes every row's weights on a step per block of `block` rows (a multiple of
// kFineBlockRows), from the blocks' largest weights in sub_max ([m, subs], one per
// kFineBlockRows rows). Where a row's rounding is off by more than kMaxWeightError of its mass in
// all: false on coarse blocks (`exact_allowed` unset); on fine ones, the blocks with the most
// rounding are marked exact (out->exact, the widening kernel, no rounding) until every row is
// within, false when that would take more than half of them.
ATTEND_AVX512 bool QuantizeBlocks(const float* p, int64_t ld, int64_t m, const float* scales,
                                  int64_t rows, const float* sub_max, int64_t subs,
                                  const float* mass, int64_t block, bool exact_allowed,
                                  Int8Weights* out) {
  const int64_t width = out->width, blocks = (width + block - 1) / block;
  out->block = block;
  out->values.resize(static_cast<size_t>(m * width));
  out->step.resize(static_cast<size_t>(blocks * m));
  out->exact.assign(static_cast<size_t>(blocks), 0);
  thread_local std::vector<float> errors, totals;  // [m, blocks], [m]
  errors.resize(static_cast<size_t>(m * blocks));
  totals.assign(static_cast<size_t>(m), 0.0f);
  bool within = true;
  const __m512 zero = _mm512_setzero_ps();
  for (int64_t j = 0; j < m; ++j) {
    const float* row = p + j * ld;
    for (int64_t b = 0; b < blocks; ++b) {
      const float largest = BlockLargest(sub_max + j * subs, subs, block, b);
      // A block whose largest weight is below kSmallestScaled (its reciprocal times 32767 would
      // not be finite) is carried as zeros: its whole mass counts as error below, so it passes
      // only where that mass does not matter.
      const bool usable = largest >= kSmallestScaled;
      const float step = usable ? largest / 32767.0f : 0.0f;
      out->step[static_cast<size_t>(b * m + j)] = step;
      const __m512 inverse = _mm512_set1_ps(usable ? 32767.0f / largest : 0.0f);
      const __m512 step_v = _mm512_set1_ps(step);
      __m512 error = zero;
      for (int64_t t = b * block; t < std::min(width, (b + 1) * block); t += 16) {
        const __mmask16 mask = Mask16(rows - t);
        const __m512 w = _mm512_mul_ps(_mm512_maskz_loadu_ps(mask, row + t),
                                       _mm512_maskz_loadu_ps(mask, scales + t));
        const __m512i q = _mm512_min_epi32(_mm512_cvtps_epi32(_mm512_mul_ps(w, inverse)),
                                           _mm512_set1_epi32(32767));
        _mm256_mask_storeu_epi16(out->values.data() + j * width + t, Mask16(width - t),
                                 _mm512_cvtepi32_epi16(q));
        error =
            _mm512_add_ps(error, _mm512_abs_ps(_mm512_fnmadd_ps(_mm512_cvtepi32_ps(q), step_v, w)));
      }
      errors[static_cast<size_t>(j * blocks + b)] = _mm512_reduce_add_ps(error);
      totals[static_cast<size_t>(j)] += errors[static_cast<size_t>(j * blocks + b)];
    }
    // The rounding moves this row's sum by at most its total error times the largest |value|;
    // past kMaxWeightError of its mass (a long tail of weights a step or two each, all rounded
    // alike: 1.4% off an average of equal values), bits of p are kept instead.
    if (totals[static_cast<size_t>(j)] > kMaxWeightError * mass[j]) {
      if (!exact_allowed) return false;
      within = false;
    }
  }
  // An attention sink among a long tail of small weights puts most of a row's rounding in the
  // sink's block: that block alone is summed exactly, the rest stays on vpdpwssd.
  for (int64_t marked = 0; !within; ++marked) {
    if (2 * (marked + 1) > blocks) return false;
    // The row furthest over its bound, and its block with the most rounding not yet exact.
    int64_t worst_row = 0;
    float worst = 0.0f;
    for (int64_t j = 0; j < m; ++j) {
      const float over = totals[static_cast<size_t>(j)] - kMaxWeightError * mass[j];
      if (over > worst) {
        worst = over;
        worst_row = j;
      }
    }
    int64_t pick = -1;
    for (int64_t b = 0; b < blocks; ++b) {
      if (out->exact[static_cast<size_t>(b)]) continue;
      if (pick < 0 || errors[static_cast<size_t>(worst_row * blocks + b)] >
                          errors[static_cast<size_t>(worst_row * blocks + pick)]) {
        pick = b;
      }
    }
    out->exact[static_cast<size_t>(pick)] = 1;
    within = true;
    for (int64_t j = 0; j < m; ++j) {
      totals[static_cast<size_t>(j)] -= errors[static_cast<size_t>(j * blocks + pick)];
      within = within && totals[static_cast<size_t>(j)] <= kMaxWeightError * mass[j];
    }
  }
  return true;
}

}  // namespace

ATTEND_AVX512 bool QuantizeInt8Weights(const float* p, int64_t ld, int64_t m, const float* scales,
                                       int64_t rows, Int8Weights* out) {
  out->width = (rows + 1) / 2 * 2;
  const int64_t subs = (out->width + kFineBlockRows - 1) / kFineBlockRows;
  thread_local std::vector<float> sub_max, mass;
  sub_max.resize(static_cast<size_t>(m * subs));
  mass.resize(static_cast<size_t>(m));
  const __m512 zero = _mm512_setzero_ps();
  const __m512 inf = _mm512_set1_ps(std::numeric_limits<float>::infinity());
  for (int64_t j = 0; j < m; ++j) {
    const float* row = p + j * ld;
    __m512 sum = zero;
    __mmask16 bad = 0;
    for (int64_t u = 0; u < subs; ++u) {
      __m512 top = zero;
      for (int64_t t = u * kFineBlockRows; t < std::min(rows, (u + 1) * kFineBlockRows); t += 16) {
        const __mmask16 mask = Mask16(std::min(rows, (u + 1) * kFineBlockRows) - t);
        const __m512 x = _mm512_mul_ps(_mm512_maskz_loadu_ps(mask, row + t),
                                       _mm512_maskz_loadu_ps(mask, scales + t));
        bad |= _mm512_cmp_ps_mask(x, zero, _CMP_NGE_UQ) | _mm512_cmp_ps_mask(x, inf, _CMP_EQ_OQ);
        top = _mm512_max_ps(top, x);
        sum = _mm512_add_ps(sum, x);
      }
      sub_max[static_cast<size_t>(j * subs + u)] = _mm512_reduce_max_ps(top);
    }
    if (bad != 0) return false;
    mass[static_cast<size_t>(j)] = _mm512_reduce_add_ps(sum);
  }
  // Coarse blocks where they will likely do: each block costs p.v a conversion of its int32 sums
  // to f32 (blocks of 32 keys read 20% slower than of 128), and a try that fails costs a pass
  // over the weights (12% of a sharp p.v). Rounding to nearest is off by a quarter step on
  // average; where that already breaks the bound on the coarse blocks, they are skipped. Either
  // way the exact check decides.
  bool coarse = true;
  for (int64_t j = 0; j < m && coarse; ++j) {
    double expected = 0;
    for (int64_t b = 0; b * kBlockRows < rows; ++b) {
      const float largest = BlockLargest(sub_max.data() + j * subs, subs, kBlockRows, b);
      expected += static_cast<double>(std::min(rows, (b + 1) * kBlockRows) - b * kBlockRows) *
                  largest / (4.0 * 32767.0);
    }
    coarse = expected <= kMaxWeightError * mass[static_cast<size_t>(j)];
  }
  if (coarse && QuantizeBlocks(p, ld, m, scales, rows, sub_max.data(), subs, mass.data(),
                               kBlockRows, /*exact_allowed=*/false, out)) {
    return true;
  }
  return QuantizeBlocks(p, ld, m, scales, rows, sub_max.data(), subs, mass.data(), kFineBlockRows,
                        /*exact_allowed=*/true, out);
}

namespace {

// Rows [t0, t0 + n) (n even) of p.v into M accumulator rows, 64 columns at a time: two value rows
// widened to int16 and interleaved, so that each 32-bit lane holds one column of both, which
// vpdpwssd multiplies by the pair's two weights. A row at `total` (an odd count's last pair)
// reads as zero. The int32 sums stay exact: at most 2 * 32767 * 128 per instruction, n / 2 of
// them (the weights' blocks, at most kBlockRows rows).
template <int M>
ATTEND_AVX512_VNNI void AccumulateInt8Rows(const int16_t* w, int64_t width, const float* step,
                                           const Rows& v, int64_t t0, int64_t n, int64_t total,
                                           int64_t dv, float* acc, bool prefetch, NextRows* next) {
  for (int64_t c0 = 0; c0 < dv; c0 += 64) {
    const __mmask32 m0 = Mask32(dv - c0), m1 = Mask32(dv - c0 - 32);
    __m512i s[M][4];
#pragma GCC unroll 4
    for (int j = 0; j < M; ++j) {
#pragma GCC unroll 4
      for (int k = 0; k < 4; ++k) s[j][k] = _mm512_setzero_si512();
    }
    for (int64_t t = t0; t < t0 + n; t += 2) {
      if (c0 == 0 && prefetch) {
        PrefetchAhead(v, t, total, 2, dv);
        next->Reached(t + 2);
      }
      const auto* a = static_cast<const int8_t*>(RowAt<DType::kInt8>(v, t)) + c0;
      const auto* b =
          static_cast<const int8_t*>(RowAt<DType::kInt8>(v, std::min(t + 1, total - 1))) + c0;
      const bool has_b = t + 1 < total;
      const __m512i a0 = _mm512_cvtepi8_epi16(_mm256_maskz_loadu_epi8(m0, a));
      const __m512i a1 = _mm512_cvtepi8_epi16(_mm256_maskz_loadu_epi8(m1, a + 32));
      const __m512i b0 = _mm512_cvtepi8_epi16(_mm256_maskz_loadu_epi8(has_b ? m0 : 0, b));
      const __m512i b1 = _mm512_cvtepi8_epi16(_mm256_maskz_loadu_epi8(has_b ? m1 : 0, b + 32));
      const __m512i e[4] = {_mm512_unpacklo_epi16(a0, b0), _mm512_unpackhi_epi16(a0, b0),
                            _mm512_unpacklo_epi16(a1, b1), _mm512_unpackhi_epi16(a1, b1)};
#pragma GCC unroll 4
      for (int j = 0; j < M; ++j) {
        int32_t pair;
        std::memcpy(&pair, w + j * width + t, sizeof(pair));
        const __m512i pw = _mm512_set1_epi32(pair);
#pragma GCC unroll 4
        for (int k = 0; k < 4; ++k) s[j][k] = _mm512_dpwssd_epi32(s[j][k], pw, e[k]);
      }
    }
    // e[0] lane (L, i): column c0 + 8 L + i (i < 4); e[1]: c0 + 8 L + 4 + i; e[2], e[3]: + 32.
    const __m512i first = _mm512_setr_epi32(0, 1, 2, 3, 16, 17, 18, 19, 4, 5, 6, 7, 20, 21, 22, 23);
    const __m512i second =
        _mm512_setr_epi32(8, 9, 10, 11, 24, 25, 26, 27, 12, 13, 14, 15, 28, 29, 30, 31);
#pragma GCC unroll 4
    for (int j = 0; j < M; ++j) {
      const __m512 sc = _mm512_set1_ps(step[j]);
#pragma GCC unroll 2
      for (int half = 0; half < 2; ++half) {
        const __m512 lo = _mm512_cvtepi32_ps(s[j][2 * half]),
                     hi = _mm512_cvtepi32_ps(s[j][2 * half + 1]);
        const __m512 cols[2] = {_mm512_permutex2var_ps(lo, first, hi),
                                _mm512_permutex2var_ps(lo, second, hi)};
#pragma GCC unroll 2
        for (int q = 0; q < 2; ++q) {
          const int64_t c = c0 + 32 * half + 16 * q;
          if (c >= dv) continue;
          const __mmask16 mask = Mask16(dv - c);
          float* x = acc + j * dv + c;
          _mm512_mask_storeu_ps(x, mask,
                                _mm512_fmadd_ps(cols[q], sc, _mm512_maskz_loadu_ps(mask, x)));
        }
      }
    }
  }
}

}  // namespace

ATTEND_AVX512_VNNI void DotInt8Vnni(const float* q, int64_t m, int64_t d, const Rows& k,
                                    int64_t rows, float* scores, int64_t ld) {
  if (m <= 0 || rows <= 0) return;
  if (d > kMaxVnniHeadDim) return Avx2Kernels().dot_rows(q, m, d, k, rows, scores, ld);
  // q's parts are kept for the next call: decode calls this once per tile of a job's keys with
  // the same q (a 4096-token context in 1 MiB blocks: 9 tiles), and quantising 4 rows of q cost
  // 13% of q.k over 256 keys. A call with other q (any bit) quantises again.
  thread_local QuantizedRows parts;
  thread_local std::vector<float> parts_of;  // the q `parts` holds, [m, d]
  thread_local int64_t parts_m = -1, parts_d = -1;
  thread_local bool parts_ok = false;
  const int64_t width = (d + 63) / 64 * 64;
  const size_t count = static_cast<size_t>(m * d);
  if (m != parts_m || d != parts_d || std::memcmp(q, parts_of.data(), count * sizeof(float)) != 0) {
    parts_ok = QuantizeRows(q, m, d, width, &parts);
    if (parts_ok) InterleaveGroups(m, width, &parts);
    parts_of.assign(q, q + count);
    parts_m = m;
    parts_d = d;
  }
  if (!parts_ok) return Avx2Kernels().dot_rows(q, m, d, k, rows, scores, ld);
  // Whole blocks of 16 rows, when whole 64-column blocks make them up, on the pipelined kernel:
  // once per group of query rows (4, 2, 1). A second group reads the rows again, from the cache.
  int64_t done = 0;
  if (d % 64 == 0 && rows >= 16) {
    done = rows / 16 * 16;
    NextRows next(k, done);
    int64_t j = 0;
    for (; j + 4 <= m; j += 4)
      DotInt8Pipelined<4>(parts, j, width, d, k, done, rows, scores + j * ld, ld, j == 0, &next);
    for (; j + 2 <= m; j += 2)
      DotInt8Pipelined<2>(parts, j, width, d, k, done, rows, scores + j * ld, ld, j == 0, &next);
    for (; j < m; ++j)
      DotInt8Pipelined<1>(parts, j, width, d, k, done, rows, scores + j * ld, ld, j == 0, &next);
  }
  // The rest: each block of 16 key rows is loaded and transposed once per 4 query rows (a GQA
  // group of 4 in one pass).
  for (int64_t t0 = done; t0 < rows; t0 += 16) {
    int64_t j = 0;
    for (; j + 4 <= m; j += 4)
      DotInt8Rows16<4>(parts, j, width, d, k, t0, rows, scores + j * ld, ld, j == 0);
    for (; j + 2 <= m; j += 2)
      DotInt8Rows16<2>(parts, j, width, d, k, t0, rows, scores + j * ld, ld, j == 0);
    for (; j < m; ++j)
      DotInt8Rows16<1>(parts, j, width, d, k, t0, rows, scores + j * ld, ld, j == 0);
  }
}

ATTEND_AVX512_VNNI void AccumulateInt8Vnni(const float* p, int64_t ld, int64_t m, const Rows& v,
                                           int64_t rows, int64_t dv, float* acc) {
  thread_local Int8Weights weights;
  if (!QuantizeInt8Weights(p, ld, m, v.scales, rows, &weights)) {
    return Avx2Kernels().accumulate_rows(p, ld, m, v, rows, dv, acc);
  }
  // Value rows in the weights' blocks (at most 128 rows, 16 KiB of int8 rows of 128): one step
  // per block, and the int32 sums' range; the passes over a block's column chunks and query rows
  // after the first read it from L1.
  const int64_t width = weights.width, block = weights.block;
  NextRows next(v, width);
  for (int64_t t0 = 0, b = 0; t0 < width; t0 += block, ++b) {
    if (weights.exact[static_cast<size_t>(b)]) {
      Avx2Kernels().accumulate_rows(p + t0, ld, m, RowsFrom<DType::kInt8>(v, t0),
                                    std::min(block, rows - t0), dv, acc);
      continue;
    }
    const int64_t n = std::min(block, width - t0);
    const int16_t* w = weights.values.data();
    const float* step = weights.step.data() + b * m;
    int64_t j = 0;
    for (; j + 4 <= m; j += 4) {
      AccumulateInt8Rows<4>(w + j * width, width, step + j, v, t0, n, rows, dv, acc + j * dv,
                            j == 0, &next);
    }
    for (; j + 2 <= m; j += 2) {
      AccumulateInt8Rows<2>(w + j * width, width, step + j, v, t0, n, rows, dv, acc + j * dv,
                            j == 0, &next);
    }
    for (; j < m; ++j) {
      AccumulateInt8Rows<1>(w + j * width, width, step + j, v, t0, n, rows, dv, acc + j * dv,
                            j == 0, &next);
    }
  }
}

}  // namespace attend::simd::internal
