// The portable kernel set of simd.h ("scalar"): plain loops, for CPUs without AVX2 and for
// whoever asks for it by name (UseKernels). Compiled for the build's baseline ISA: no target
// attributes and no -m flags, so that it runs on every x86-64 CPU.
//
// Thread-safety: pure functions.
#include <algorithm>
#include <cstdint>
#include <limits>

#include "common/half.h"
#include "core/kernels/simd.h"
#include "core/kernels/simd_internal.h"

namespace attend::simd::internal {
namespace {

inline const void* RowStart(const Rows& rows, int64_t t) {
  return static_cast<const char*>(rows.data) + t * rows.stride * DTypeSize(rows.dtype);
}

inline float RowScale(const Rows& rows, int64_t t) {
  return rows.dtype == DType::kInt8 ? rows.scales[t] : 1.0f;
}

float ExpShiftSumScalar(const float* x, float shift, float* y, int64_t n) {
  float sum = 0.0f;
  for (int64_t i = 0; i < n; ++i) {
    y[i] = ExpScalar(x[i] - shift);
    sum += y[i];
  }
  return sum;
}

float MaxScalar(const float* x, int64_t n) {
  float m = -std::numeric_limits<float>::infinity();
  for (int64_t i = 0; i < n; ++i) m = std::max(m, x[i]);
  return m;
}

void ScaleAddScalar(float* dst, float alpha, const float* src, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = dst[i] * alpha + src[i];
}

void RowToFloatScalar(const Rows& rows, int64_t t, int64_t n, float* out) {
  const void* row = RowStart(rows, t);
  const float scale = RowScale(rows, t);
  for (int64_t i = 0; i < n; ++i) out[i] = Load(row, rows.dtype, i) * scale;
}

void DotRowsScalar(const float* q, int64_t m, int64_t d, const Rows& k, int64_t rows, float* scores,
                   int64_t ld) {
  for (int64_t t = 0; t < rows; ++t) {
    const void* row = RowStart(k, t);
    for (int64_t j = 0; j < m; ++j) {
      float s = 0.0f;
      for (int64_t c = 0; c < d; ++c) s += q[j * d + c] * Load(row, k.dtype, c);
      scores[j * ld + t] = s * RowScale(k, t);
    }
  }
}

void AccumulateRowsScalar(const float* p, int64_t ld, int64_t m, const Rows& v, int64_t rows,
                          int64_t dv, float* acc) {
  for (int64_t t = 0; t < rows; ++t) {
    const void* row = RowStart(v, t);
    const float scale = RowScale(v, t);
    for (int64_t j = 0; j < m; ++j) {
      const float w = p[j * ld + t] * scale;
      if (w == 0.0f) continue;
      for (int64_t c = 0; c < dv; ++c) acc[j * dv + c] += w * Load(row, v.dtype, c);
    }
  }
}

const Kernels kScalarKernels{"scalar",       ExpShiftSumScalar,   RoundToBf16Scalar,
                             MaxScalar,      ScaleMaxScalar,      ToBf16Scalar,
                             ScaleAddScalar, ScaleCopyScalar,     RowToFloatScalar,
                             DotRowsScalar,  AccumulateRowsScalar};

}  // namespace

const Kernels& ScalarKernels() { return kScalarKernels; }

}  // namespace attend::simd::internal
