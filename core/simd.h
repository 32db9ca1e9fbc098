// Vector kernels for the parts of attention that oneDNN has no primitive for, or that are too
// small for a matmul to pay off: the exponentials of the softmax, and decode-sized attention
// (a handful of query rows against many keys), which is memory-bound and must stream K and V at
// the machine's bandwidth.
//
// Each kernel has an AVX2+FMA version (AVX-512 machines use it too) and a portable scalar one,
// chosen once per process from the CPU's features.
//
// Thread-safety: pure functions.
#ifndef ATTEND_CORE_SIMD_H_
#define ATTEND_CORE_SIMD_H_

#include <cstdint>

namespace attend::simd {

// "avx2" or "scalar": the kernels this process uses.
const char* KernelName();

// y[i] = exp(x[i] - shift) for i < n; returns the sum of the y[i]. x and y may be the same.
// Inputs below shift - 87 give 0. REQUIRES: x[i] - shift is not NaN or +inf.
float ExpShiftSum(const float* x, float shift, float* y, int64_t n);

// x[i] = x[i] rounded to the nearest bfloat16 (ties to even), kept as float. REQUIRES: finite.
void RoundToBf16(float* x, int64_t n);

// The largest of x[0, n); -inf when n == 0.
float Max(const float* x, int64_t n);

// dst[i] = dst[i] * alpha + src[i].
void ScaleAdd(float* dst, float alpha, const float* src, int64_t n);

// scores[j * ld + t] = dot(q[j * d ...], key row t) for j < m, t < rows. Key row t starts at
// element t * k_stride of `k`, which holds float32 or (k_bf16) bfloat16 values.
void DotRows(const float* q, int64_t m, int64_t d, const void* k, bool k_bf16, int64_t k_stride,
             int64_t rows, float* scores, int64_t ld);

// acc[j * dv + c] += sum over t < rows of p[j * ld + t] * value row t [c], for j < m, c < dv.
// Value row t starts at element t * v_stride of `v` (float32 or bfloat16).
void AccumulateRows(const float* p, int64_t ld, int64_t m, const void* v, bool v_bf16,
                    int64_t v_stride, int64_t rows, int64_t dv, float* acc);

namespace testing {
// Makes every kernel use the portable scalar code (true) or the CPU's best (false), so that
// tests cover both. Not for concurrent use with the kernels.
void UseScalarKernels(bool scalar);
}  // namespace testing

}  // namespace attend::simd

#endif  // ATTEND_CORE_SIMD_H_
