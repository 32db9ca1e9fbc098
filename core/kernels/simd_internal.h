// Internal to core/kernels: the table of kernel functions that simd.h dispatches through, and the
// scalar pieces every implementation shares (the loops' tails). Not for other libraries.
//
// Thread-safety: the tables are immutable after their first use.
#ifndef ATTEND_CORE_KERNELS_SIMD_INTERNAL_H_
#define ATTEND_CORE_KERNELS_SIMD_INTERNAL_H_

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "common/half.h"
#include "core/kernels/simd.h"

namespace attend::simd::internal {

// One implementation of every kernel in simd.h, for one instruction set.
struct Kernels {
  const char* name;
  float (*exp_shift_sum)(const float*, float, float*, int64_t);
  void (*round_to_bf16)(float*, int64_t);
  float (*max)(const float*, int64_t);
  float (*scale_max)(float*, int64_t, float);
  void (*to_bf16)(const float*, int64_t, uint16_t*);
  void (*scale_add)(float*, float, const float*, int64_t);
  bool (*scale_copy)(const float*, float, float*, int64_t);
  void (*row_to_float)(const Rows&, int64_t, int64_t, float*);
  void (*dot_rows)(const float*, int64_t, int64_t, const Rows&, int64_t, float*, int64_t);
  void (*accumulate_rows)(const float*, int64_t, int64_t, const Rows&, int64_t, int64_t, float*);
};

// The kernel sets, each in its own file compiled for its instruction set, and what the dispatch
// (simd.cc) takes from them. Each table is constant-initialised, so it may be used at any time,
// static initialisation included.
//
// The portable kernels (simd_scalar.cc): every CPU runs them.
const Kernels& ScalarKernels();

// The AVX2 + FMA kernels (simd_avx2.cc); the AVX-512 sets reuse those they do not replace.
// REQUIRES (to call its kernels): the CPU has AVX2 and FMA.
const Kernels& Avx2Kernels();

// The AVX-512 kernel sets (simd_avx512.cc): "avx512" (F, BW, VL, DQ; every kernel at 16 lanes,
// bf16 and int8 widened to f32), "avx512_vnni" (int8 q.k on vpdpbusd, bf16 as in "avx512", the
// AVX2 kernels otherwise) and "avx512_bf16" (bf16 q.k and p.v on vdpbf16ps, the AVX2 kernels
// otherwise; simd_avx512.cc says why), in the order of how well they run on this CPU's vendor's
// cores, the best last. `cpu_ok` says whether this CPU can run each.
struct Avx512Set {
  const Kernels* kernels;
  bool cpu_ok;
};
const Avx512Set* Avx512Sets(int* count);

// The storage types whose row kernels get a set each, in this order (RowType gives the index).
inline constexpr int kRowTypes = 3;
inline constexpr const char* kRowTypeNames[kRowTypes] = {"f32", "bf16", "int8"};
inline int RowType(DType dtype) {
  return dtype == DType::kBFloat16 ? 1 : (dtype == DType::kInt8 ? 2 : 0);
}

// What MeasureRowKernels found: the set chosen for each row type, and the measurement's time.
struct RowChoice {
  const Kernels* sets[kRowTypes] = {};
  double seconds = 0;
};

// One set's samples of one row type: the best (the least disturbed) and the upper median (what
// most rounds saw, which one lucky sample cannot lower), in seconds.
struct SetTimes {
  double best, median;
};

// The index of the set to use among `times`: `fallback` (the default) unless another beats it by
// kClearMargin in both statistics, then the one of those with the lowest median.
// REQUIRES: fallback < times.size().
size_t ChooseSet(const std::vector<SetTimes>& times, size_t fallback);

// Times decode's row kernels of each of `candidates` for each row type and chooses the fastest
// per type, keeping `fallback` unless another is faster by kClearMargin (simd_choice.cc says
// how). REQUIRES: the CPU runs every candidate; `fallback` is one of them.
RowChoice MeasureRowKernels(const std::vector<const Kernels*>& candidates, const Kernels* fallback);

// exp(x) for x <= 0 as 2^n * e^r: n = round(x / ln 2), r = x - n ln 2 (Cody-Waite split), e^r by
// a degree-6 polynomial; relative error about 1e-7. Below -87 the result is 0. The vector
// versions evaluate the same polynomial with fused multiply-adds (the same bits in every vector
// set), within an ulp of this one, which rounds the range reduction's products separately.
inline float ExpScalar(float x) {
  if (x < -87.0f) return 0.0f;
  // A score that overflowed (inf - inf) stays NaN for the caller's output check to report;
  // converting it to an int below would be undefined.
  if (std::isnan(x)) return x;
  const float n = std::nearbyint(x * 1.44269504088896341f);
  const float r = (x - n * 0.693359375f) + n * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof(scale));
  return p * scale;
}

// ScaleMax's scalar loop, also every vector version's tail.
inline float ScaleMaxScalar(float* x, int64_t n, float scale) {
  float m = -std::numeric_limits<float>::infinity();
  bool finite = true;
  for (int64_t i = 0; i < n; ++i) {
    if (scale != 1.0f) x[i] *= scale;
    finite &= std::isfinite(x[i]);
    m = std::max(m, x[i]);
  }
  return finite ? m : std::numeric_limits<float>::quiet_NaN();
}

// RoundToBf16's scalar loop, also the vector versions' tail.
inline void RoundToBf16Scalar(float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] = Bf16ToFloat(FloatToBf16(x[i]));
}

inline void ToBf16Scalar(const float* x, int64_t n, uint16_t* out) {
  for (int64_t i = 0; i < n; ++i) out[i] = FloatToBf16(x[i]);
}

// ScaleCopy's scalar loop, also the vector versions' tail.
inline bool ScaleCopyScalar(const float* src, float factor, float* dst, int64_t n) {
  bool finite = true;
  for (int64_t i = 0; i < n; ++i) {
    dst[i] = src[i] * factor;
    finite &= std::isfinite(dst[i]);
  }
  return finite;
}

// Element i of a row's storage, without the int8 scale.
inline float Load(const void* base, DType dtype, int64_t i) {
  switch (dtype) {
    case DType::kBFloat16:
      return Bf16ToFloat(static_cast<const uint16_t*>(base)[i]);
    case DType::kInt8:
      return static_cast<float>(static_cast<const int8_t*>(base)[i]);
    default:
      return static_cast<const float*>(base)[i];
  }
}

// Bytes per stored element, known at compile time in the kernels: DTypeSize is an out-of-line
// call, and calling it for every row held the bf16 dot kernel to 6.1 GB/s from L2 (8.4 without).
template <DType kType>
constexpr int64_t kElementBytes = kType == DType::kFloat32 ? 4 : (kType == DType::kInt8 ? 1 : 2);

template <DType kType>
inline const void* RowAt(const Rows& rows, int64_t t) {
  return static_cast<const char*>(rows.data) + t * rows.stride * kElementBytes<kType>;
}

template <DType kType>
inline float ScaleAt(const Rows& rows, int64_t t) {
  if constexpr (kType == DType::kInt8) {
    return rows.scales[t];
  } else {
    return 1.0f;
  }
}

// One prefetcht0, as a volatile asm statement that the compiler must keep. With _mm_prefetch,
// GCC 12 deleted the whole prefetch loop once the element size was a compile-time constant: no
// prefetch was left in the binary, and f32 decode fell from 0.85 to 0.5 of the bandwidth.
inline void PrefetchLine(const char* p) { __asm__ volatile("prefetcht0 %0" : : "m"(*p)); }

// Asks for the cache lines of row `t` of `rows` (when it exists) ahead of their use. The
// kernels do little work per byte, so the out-of-order window covers only a few rows: without
// help, a single core stays well below its share of the memory bandwidth. Dense rows (stride ==
// row length, the KV cache's blocks) get that help from the hardware prefetchers, which follow
// the kernels' sequential streams, and software prefetches only get in their way (decode from
// memory, f32: 21 against 19-20 GB/s with them). Strided rows (a caller's [n, heads, d] tensor)
// move a whole head stride per row, often a page, which the hardware does not follow: those are
// prefetched here.
template <DType kType>
inline void PrefetchRow(const Rows& rows, int64_t t, int64_t count, int64_t cols) {
  if (t >= count || rows.stride == cols) return;
  const char* p = static_cast<const char*>(RowAt<kType>(rows, t));
  const int64_t bytes = cols * kElementBytes<kType>;
  for (int64_t off = 0; off < bytes; off += 64) PrefetchLine(p + off);
}

// How far ahead of the row being read the kernels prefetch: a distance in bytes, so that
// narrow (bf16, int8) rows are prefetched as far ahead in time as f32 ones.
constexpr int64_t kPrefetchBytes = 4096;

template <DType kType>
inline int64_t PrefetchRows(int64_t cols) {
  return std::max<int64_t>(4, kPrefetchBytes / std::max<int64_t>(1, cols * kElementBytes<kType>));
}

}  // namespace attend::simd::internal

#endif  // ATTEND_CORE_KERNELS_SIMD_INTERNAL_H_
