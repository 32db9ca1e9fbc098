// Internal to core/kernels: what the AVX-512 kernel files share (simd_avx512.cc, the 16-lane f32
// kernels and the sets' dispatch; simd_avx512_bf16.cc, the bf16 dot products;
// simd_avx512_int8.cc, the int8 dot products; simd_avx512_split.cc, bf16 widened in place): the
// target attributes, lane masks, the row order of the blocked kernels, and their entry points.
//
// Thread-safety: pure functions.
#ifndef ATTEND_CORE_KERNELS_SIMD_AVX512_H_
#define ATTEND_CORE_KERNELS_SIMD_AVX512_H_

#include <immintrin.h>

#include <cstdint>
#include <vector>

#include "core/kernels/simd.h"
#include "core/kernels/simd_internal.h"

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

// Eight horizontal sums: lane i of the result is the sum of the 16 lanes of v[i] (v[i] for i >=
// N counts as zero).
template <int N>
ATTEND_AVX512 inline __m256 Sum8Of16(const __m512* v) {
  static_assert(N >= 1 && N <= 8);
  __m512 x[8];
#pragma GCC unroll 8
  for (int i = 0; i < 8; ++i) x[i] = i < N ? v[i] : _mm512_setzero_ps();
  // Per 128-bit lane L: [a(L0)+a(L2), b(L0)+b(L2), a(L1)+a(L3), b(L1)+b(L3)] for each pair.
  __m512 y[4];
#pragma GCC unroll 4
  for (int i = 0; i < 4; ++i) {
    y[i] = _mm512_add_ps(_mm512_unpacklo_ps(x[2 * i], x[2 * i + 1]),
                         _mm512_unpackhi_ps(x[2 * i], x[2 * i + 1]));
  }
  // Per 128-bit lane: the lane's sums of four vectors.
  __m512 z[2];
#pragma GCC unroll 2
  for (int i = 0; i < 2; ++i) {
    const __m512d a = _mm512_castps_pd(y[2 * i]), b = _mm512_castps_pd(y[2 * i + 1]);
    // (Unpacked as pairs of floats, added as floats.)
    z[i] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(a, b)),
                         _mm512_castpd_ps(_mm512_unpackhi_pd(a, b)));
  }
  // Adds the four 128-bit lanes: s = [z0 L0+L2, z0 L1+L3, z1 L0+L2, z1 L1+L3], then pairs.
  const __m512 s =
      _mm512_add_ps(_mm512_shuffle_f32x4(z[0], z[1], 0x44), _mm512_shuffle_f32x4(z[0], z[1], 0xee));
  const __m512 t =
      _mm512_add_ps(_mm512_shuffle_f32x4(s, s, 0x88), _mm512_shuffle_f32x4(s, s, 0xdd));
  return _mm512_castps512_ps256(t);
}

// Row r of R's rows at step g: row g of span r (spans of `span` rows).
inline int64_t SpanRow(int r, int64_t g, int64_t span) { return r * span + g; }

// The scores of a block step over R spans' rows (g: the step) from its M * R accumulators, query
// row j's against span r's row in acc[j * R + r]: each summed over its 16 lanes.
template <int M, int R>
ATTEND_AVX512 inline void StoreSpanSums(const __m512* acc, int64_t g, int64_t span, float* scores,
                                        int64_t ld) {
  alignas(32) float sums[8];
  _mm256_store_ps(sums, Sum8Of16<M * R>(acc));
#pragma GCC unroll 4
  for (int j = 0; j < M; ++j) {
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) scores[j * ld + SpanRow(r, g, span)] = sums[j * R + r];
  }
}

// acc[0..cols) (cols <= 32) += 32 column sums that a p.v kernel left spread over two vectors in
// its own order: permutex2var over (a, b) with `first` gives columns 0-15, with `second` 16-31.
ATTEND_AVX512 inline void AddPermuted(__m512 a, __m512 b, __m512i first, __m512i second, float* acc,
                                      int64_t cols) {
  const __mmask16 m0 = Mask16(cols), m1 = Mask16(cols - 16);
  const __m512 lo = _mm512_permutex2var_ps(a, first, b);
  _mm512_mask_storeu_ps(acc, m0, _mm512_add_ps(_mm512_maskz_loadu_ps(m0, acc), lo));
  if (cols > 16) {
    const __m512 hi = _mm512_permutex2var_ps(a, second, b);
    _mm512_mask_storeu_ps(acc + 16, m1, _mm512_add_ps(_mm512_maskz_loadu_ps(m1, acc + 16), hi));
  }
}

// `rows` advanced by `t` rows of kType (and their scales, where they have them).
template <DType kType>
inline Rows RowsFrom(const Rows& rows, int64_t t) {
  Rows rest = rows;
  rest.data = RowAt<kType>(rows, t);
  if (rows.scales != nullptr) rest.scales = rows.scales + t;
  return rest;
}

// scores[j * ld + t] = q row j . int8 key row t (times its scale), on vpdpbusd with q in two
// int8 parts and the key rows transposed 16 at a time (simd_avx512_int8.cc); heads past the int32
// sums' range take the AVX2 kernel.
// REQUIRES: the CPU has AVX512-VNNI (and F, BW, VL, DQ); k.dtype is kInt8.
void DotInt8Vnni(const float* q, int64_t m, int64_t d, const Rows& k, int64_t rows, float* scores,
                 int64_t ld);

// acc[j][c] += sum over t of p[j][t] * value row t[c] over int8 rows, on vpdpwssd with the weights
// in int16 as QuantizeInt8Weights carries them (simd_avx512_int8.cc); the widening kernel where
// it refuses them.
// REQUIRES: the CPU has AVX512-VNNI (and F, BW, VL, DQ); v.dtype is kInt8.
void AccumulateInt8Vnni(const float* p, int64_t ld, int64_t m, const Rows& v, int64_t rows,
                        int64_t dv, float* acc);

// Rows per step of the int16 weights: the int32 sums' range (at most 2 * 32767 * 127 per
// vpdpwssd lane, one per row pair), and, where that is too coarse, blocks of kFineBlockRows.
inline constexpr int64_t kBlockRows = 128;
inline constexpr int64_t kFineBlockRows = 32;

// The weights w[j][t] = p[j][t] * scale[t] (the value row's scale folded in) of p.v in int16:
// values[j * width + t] * step[b * m + j] with b = t / block, each within step / 2 of w, where
// a block's step is its largest weight / 32767 (1/65534 of it).
struct Int8Weights {
  std::vector<int16_t> values;  // [m, width]; rows past `rows` are zero
  std::vector<float> step;      // [blocks, m]
  std::vector<uint8_t> exact;   // [blocks]: 1 where the block's p is summed exactly instead
  int64_t width = 0;            // rows rounded up to even (vpdpwssd reads pairs)
  int64_t block = 0;            // kBlockRows or kFineBlockRows
};

// Carries p's m rows ([m, ld], `rows` weights each) in int16 on blocks of kBlockRows rows, or of
// kFineBlockRows where that leaves a row's rounding off by more than 2^-12 of its sum in all
// (and on the fine blocks, marks `exact` the blocks with the most rounding, at most half of
// them, until every row is within: an attention sink's block among a long tail)
// (weights spread over more than 2^16 in 128 rows, as sharp attention's are: with scores of
// standard deviation 2, 96% of the p.v calls of a decode step over 4096 tokens were refused on
// one step per tile). False, for the widening kernel, where a weight is
// negative or not finite, or the rounding is off by more than that on the finer blocks even with
// half of them exact. A block whose largest weight is below 2^-100 is
// carried as zeros, its mass counted as rounding error.
// REQUIRES: the CPU has AVX-512 F, BW, VL, DQ.
bool QuantizeInt8Weights(const float* p, int64_t ld, int64_t m, const float* scales, int64_t rows,
                         Int8Weights* out);

// DotRows and AccumulateRows over bf16 rows on vdpbf16ps (simd_avx512_bf16.cc): exact products
// of bf16 values with f32 sums. Where q or p are not all bf16 values (f32 arithmetic), or q has
// a subnormal component or one of 2^32 or more (vdpbf16ps counts subnormal inputs as zero), the
// exact AVX2 kernels run instead. Subnormal keys and values still count as zero, as in a native
// bf16 matmul.
// REQUIRES: the CPU has AVX512-BF16 (and F, BW, VL, DQ, VNNI); the rows' dtype is kBFloat16 and
// they may take native bf16 arithmetic (Rows::native_bf16).
void DotBf16(const float* q, int64_t m, int64_t d, const Rows& k, int64_t rows, float* scores,
             int64_t ld);
void AccumulateBf16(const float* p, int64_t ld, int64_t m, const Rows& v, int64_t rows, int64_t dv,
                    float* acc);

// DotRows and AccumulateRows over bf16 rows on 16-lane f32 FMAs, q and p in f32
// (simd_avx512_split.cc): each 32-bit lane of a 64-byte load holds two bf16 values, which a shift
// and an and widen in place, with no shuffle.
// REQUIRES: the CPU has AVX-512 F, BW, VL and DQ; the rows' dtype is kBFloat16.
void DotBf16Split(const float* q, int64_t m, int64_t d, const Rows& k, int64_t rows, float* scores,
                  int64_t ld);
void AccumulateBf16Split(const float* p, int64_t ld, int64_t m, const Rows& v, int64_t rows,
                         int64_t dv, float* acc);

// Rows::next asked for into L2 in step with a kernel's progress: after `done` of the `count` rows
// the kernel reads, that share of the next rows, so that memory brings them while the kernel
// computes on the current ones (decode reads a tile's keys, its values, then the next tile's
// keys: three streams, each of which memory would otherwise start cold).
class NextRows {
 public:
  NextRows(const Rows& rows, int64_t count)
      : begin_(static_cast<const char*>(rows.next)),
        at_(begin_),
        end_(begin_ == nullptr ? nullptr : begin_ + rows.next_bytes),
        per_row_(count > 0 ? (rows.next_bytes + count - 1) / count : 0) {}
  void Reached(int64_t done) {
    const char* target = begin_ + done * per_row_;
    if (target > end_) target = end_;
    for (; at_ < target; at_ += 64) __asm__ volatile("prefetcht1 %0" : : "m"(*at_));
  }

 private:
  const char* begin_;
  const char* at_;
  const char* end_;
  int64_t per_row_;
};

}  // namespace attend::simd::internal

#endif  // ATTEND_CORE_KERNELS_SIMD_AVX512_H_
