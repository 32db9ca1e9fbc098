// The dispatch of simd.h: picks one kernel set per process (the best this CPU runs, or the one
// UseKernels names) and forwards every kernel to it. The sets live in their own files, each
// compiled for its instruction set: simd_scalar.cc, simd_avx2.cc and simd_avx512*.cc
// (simd_internal.h declares what this file takes from each).
#include "core/kernels/simd.h"

#include <atomic>
#include <string>
#include <string_view>
#include <vector>

#include "core/kernels/simd_internal.h"

namespace attend::simd {
namespace {

using internal::Kernels;

bool CpuHasAvx2() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
}

// Every kernel set this CPU can run, the portable one first and the best last.
const std::vector<const Kernels*>& Runnable() {
  static const std::vector<const Kernels*> sets = [] {
    std::vector<const Kernels*> out{&internal::ScalarKernels()};
    if (!CpuHasAvx2()) return out;
    out.push_back(&internal::Avx2Kernels());
    int count = 0;
    const internal::Avx512Set* avx512 = internal::Avx512Sets(&count);
    for (int i = 0; i < count; ++i) {
      if (avx512[i].cpu_ok) out.push_back(avx512[i].kernels);
    }
    return out;
  }();
  return sets;
}

const Kernels& Best() { return *Runnable().back(); }

std::atomic<const Kernels*> g_kernels{nullptr};

const Kernels& Chosen() {
  const Kernels* kernels = g_kernels.load(std::memory_order_acquire);
  if (kernels == nullptr) {
    kernels = &Best();
    g_kernels.store(kernels, std::memory_order_release);
  }
  return *kernels;
}

}  // namespace

const char* KernelName() { return Chosen().name; }

float ExpShiftSum(const float* x, float shift, float* y, int64_t n) {
  return Chosen().exp_shift_sum(x, shift, y, n);
}

void RoundToBf16(float* x, int64_t n) { Chosen().round_to_bf16(x, n); }

float Max(const float* x, int64_t n) { return Chosen().max(x, n); }

float ScaleMax(float* x, int64_t n, float scale) { return Chosen().scale_max(x, n, scale); }

void ToBf16(const float* x, int64_t n, uint16_t* out) { Chosen().to_bf16(x, n, out); }

void ScaleAdd(float* dst, float alpha, const float* src, int64_t n) {
  Chosen().scale_add(dst, alpha, src, n);
}

void RowToFloat(const Rows& rows, int64_t t, int64_t n, float* out) {
  Chosen().row_to_float(rows, t, n, out);
}

void DotRows(const float* q, int64_t m, int64_t d, const Rows& k, int64_t rows, float* scores,
             int64_t ld) {
  Chosen().dot_rows(q, m, d, k, rows, scores, ld);
}

void AccumulateRows(const float* p, int64_t ld, int64_t m, const Rows& v, int64_t rows, int64_t dv,
                    float* acc) {
  Chosen().accumulate_rows(p, ld, m, v, rows, dv, acc);
}

std::vector<std::string> RunnableKernels() {
  std::vector<std::string> names;
  for (const Kernels* k : Runnable()) names.push_back(k->name);
  return names;
}

bool UseKernels(std::string_view name) {
  for (const Kernels* k : Runnable()) {
    if (name == k->name) {
      g_kernels.store(k, std::memory_order_release);
      return true;
    }
  }
  return false;
}

namespace testing {
void UseScalarKernels(bool scalar) {
  g_kernels.store(scalar ? &internal::ScalarKernels() : &Best(), std::memory_order_release);
}

}  // namespace testing

}  // namespace attend::simd
