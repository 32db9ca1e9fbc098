// Vector kernels for the parts of attention that oneDNN has no primitive for, or that are too
// small for a matmul to pay off: the exponentials of the softmax, and decode-sized attention
// (a handful of query rows against many keys), which is memory-bound and must stream K and V at
// the machine's bandwidth.
//
// Each kernel has a portable scalar version, an AVX2+FMA one and AVX-512 ones (bf16 dot products
// on vdpbf16ps where the CPU has AVX512-BF16, else int8 ones on vpdpbusd where it has
// AVX512-VNNI);
// the best set the CPU runs is chosen once per process, at the first call. The build targets
// no particular CPU: each set is compiled for its instruction set with target attributes.
//
// Thread-safety: pure functions.
#ifndef ATTEND_CORE_KERNELS_SIMD_H_
#define ATTEND_CORE_KERNELS_SIMD_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "core/base/tensor.h"

namespace attend::simd {

// The kernel set this process uses: "avx512_bf16", "avx512_vnni", "avx512", "avx2" or "scalar".
const char* KernelName();

// The names of the kernel sets this CPU can run, "scalar" first and the best last.
std::vector<std::string> RunnableKernels();

// Makes every kernel use the set `name` (one of RunnableKernels()) instead of the best, for an
// operator who wants the same arithmetic on every machine of a fleet, or to compare sets; false
// (and no change) if this CPU cannot run it. Call before any kernel runs (at start-up): the
// switch is not synchronised with kernels running on other threads.
bool UseKernels(std::string_view name);

// y[i] = exp(x[i] - shift) for i < n; returns the sum of the y[i]. x and y may be the same.
// Inputs below shift - 87 give 0. REQUIRES: x[i] - shift is not NaN or +inf.
float ExpShiftSum(const float* x, float shift, float* y, int64_t n);

// x[i] = x[i] rounded to the nearest bfloat16 (ties to even), kept as float. REQUIRES: finite.
void RoundToBf16(float* x, int64_t n);

// The largest of x[0, n), NaN values left out; -inf when n == 0 (or every value is NaN).
float Max(const float* x, int64_t n);

// x[i] *= scale for i < n (untouched when scale is 1), and the largest of the scaled values in
// the same pass; NaN when any of them is a NaN or an infinity (an overflow included), -inf when
// n == 0. A tile row's scores: scaling, the finite check and the maximum in one read.
float ScaleMax(float* x, int64_t n, float scale);

// out[i] = x[i] rounded to the nearest bfloat16 (ties to even), for i < n. REQUIRES: finite.
void ToBf16(const float* x, int64_t n, uint16_t* out);

// dst[i] = dst[i] * alpha + src[i].
void ScaleAdd(float* dst, float alpha, const float* src, int64_t n);

// Rows of keys or values where they live: float32, bfloat16, or int8 with one float scale per
// row (the row's values are int8 x scale).
struct Rows {
  const void* data = nullptr;
  DType dtype = DType::kFloat32;  // kFloat32, kBFloat16 or kInt8
  int64_t stride = 0;             // elements between rows
  const float* scales = nullptr;  // kInt8 only
  // Native bf16 arithmetic: bf16 rows may be multiplied with the CPU's bf16 dot product
  // instruction, which counts subnormal inputs and products below 2^-126 as zero (as a native
  // bf16 matmul does). Otherwise every product is exact.
  bool native_bf16 = false;
};

// out[i] = element i of row `t` of `rows` as float (int8 times the row's scale), for i < n.
void RowToFloat(const Rows& rows, int64_t t, int64_t n, float* out);

// scores[j * ld + t] = dot(q[j * d ...], key row t) for j < m, t < rows. Against bf16 and int8
// rows the AVX-512 kernels carry q in 16 significant bits (as two int8 parts, for the dot
// product instruction): each q value within 2^-16 of its row's largest |q|, far below the error
// of the storage itself (1/254 of the row's largest). Against bf16 rows they use bf16 dot
// products when k.native_bf16 is set and q holds bf16 values, and are exact f32 otherwise.
void DotRows(const float* q, int64_t m, int64_t d, const Rows& k, int64_t rows, float* scores,
             int64_t ld);

// acc[j * dv + c] += sum over t < rows of p[j * ld + t] * value row t [c], for j < m, c < dv.
// Against bf16 rows the AVX-512 kernels use bf16 dot products when v.native_bf16 is set and p
// holds bf16 values (bf16 arithmetic rounds the probabilities), and f32 otherwise.
void AccumulateRows(const float* p, int64_t ld, int64_t m, const Rows& v, int64_t rows, int64_t dv,
                    float* acc);

namespace testing {
// Makes every kernel use the portable scalar code (true) or the CPU's best (false), so that
// tests cover both. Not for concurrent use with the kernels.
void UseScalarKernels(bool scalar);
// As the functions above; tests switch sets between cases.
using ::attend::simd::RunnableKernels;
using ::attend::simd::UseKernels;

// Uses the set `name` while it lives (ok() false, and no change, when this CPU cannot run it),
// then the CPU's best again.
class ScopedKernels {
 public:
  explicit ScopedKernels(std::string_view name) : ok_(UseKernels(name)) {}
  ~ScopedKernels() { UseScalarKernels(false); }
  ScopedKernels(const ScopedKernels&) = delete;
  ScopedKernels& operator=(const ScopedKernels&) = delete;
  bool ok() const { return ok_; }

 private:
  bool ok_;
};
}  // namespace testing

}  // namespace attend::simd

#endif  // ATTEND_CORE_KERNELS_SIMD_H_
