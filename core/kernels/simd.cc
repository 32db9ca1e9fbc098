// The dispatch of simd.h: holds the kernel set of each storage type (chosen by measurement,
// simd_choice.cc, or named by UseKernels) and forwards every kernel to its set: the row kernels
// by the rows' dtype, the others to the f32 set. The sets live in their own files, each compiled
// for its instruction set: simd_scalar.cc, simd_avx2.cc and simd_avx512*.cc (simd_internal.h
// declares what this file takes from each).
#include "core/kernels/simd.h"

#include <algorithm>
#include <atomic>
#include <string>
#include <string_view>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/base/mutex.h"
#include "core/kernels/simd_internal.h"

namespace attend::simd {
namespace {

using internal::Kernels;
using internal::kRowTypes;
using internal::RowChoice;

bool CpuHasAvx2() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
}

// Every kernel set this CPU can run, the portable one first and the default last.
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

// The set kept unless the measurement finds a clearly faster one: the best by the CPU's
// instructions and vendor (Avx512Sets orders them).
const Kernels& Default() { return *Runnable().back(); }

// The sets the measurement times: the vector ones, where the CPU runs any. The scalar set is
// several times slower than AVX2 and would take most of the time budget; it stays for CPUs
// without AVX2 and for whoever names it.
std::vector<const Kernels*> Candidates() {
  std::vector<const Kernels*> out = Runnable();
  if (out.size() > 1) out.erase(out.begin());
  return out;
}

const Kernels* FindSet(std::string_view name) {
  for (const Kernels* k : Runnable()) {
    if (name == k->name) return k;
  }
  return nullptr;
}

// The set of each row type (internal::RowType's order); the other kernels take the f32 one.
// Null until chosen: the first kernel call (or ChooseKernels) fills every slot under g_mu.
std::atomic<const Kernels*> g_sets[kRowTypes];

Mutex g_mu;
// The measurement runs at most once per process; testing::UseScalarKernels(false) and
// ScopedKernels come back to its result.
bool g_measured ABSL_GUARDED_BY(g_mu) = false;
RowChoice g_measurement ABSL_GUARDED_BY(g_mu);

const RowChoice& Measured() ABSL_EXCLUSIVE_LOCKS_REQUIRED(g_mu) {
  if (!g_measured) {
    g_measurement = internal::MeasureRowKernels(Candidates(), &Default());
    g_measured = true;
  }
  return g_measurement;
}

void Store(const Kernels* const (&sets)[kRowTypes]) ABSL_EXCLUSIVE_LOCKS_REQUIRED(g_mu) {
  for (int i = 0; i < kRowTypes; ++i) g_sets[i].store(sets[i], std::memory_order_release);
}

bool Chosen() ABSL_EXCLUSIVE_LOCKS_REQUIRED(g_mu) {
  for (const std::atomic<const Kernels*>& set : g_sets) {
    if (set.load(std::memory_order_acquire) == nullptr) return false;
  }
  return true;
}

// The slow path of Set: the first call measures and fills every slot.
const Kernels* Settle(int type) {
  MutexLock lock(&g_mu);
  if (!Chosen()) Store(Measured().sets);
  return g_sets[type].load(std::memory_order_acquire);
}

inline const Kernels& Set(int type) {
  const Kernels* set = g_sets[type].load(std::memory_order_acquire);
  return set != nullptr ? *set : *Settle(type);
}

inline const Kernels& RowSet(DType dtype) { return Set(internal::RowType(dtype)); }

// The kernels that read no rows: f32 loops, on the f32 rows' set (simd.h says why).
inline const Kernels& Other() { return Set(0); }

}  // namespace

void ChooseKernels() { (void)Settle(0); }

std::string KernelName(absl::Span<const DType> storage) {
  bool used[kRowTypes] = {};
  for (DType dtype : storage) used[internal::RowType(dtype)] = true;
  const char* names[kRowTypes] = {};
  const char* first = nullptr;
  bool same = true;
  for (int i = 0; i < kRowTypes; ++i) {
    if (!used[i]) continue;
    names[i] = Set(i).name;
    if (first == nullptr) first = names[i];
    same &= std::string_view(names[i]) == first;
  }
  if (first == nullptr) return "";
  if (same) return first;
  std::string out;
  for (int i = 0; i < kRowTypes; ++i) {
    if (!used[i]) continue;
    absl::StrAppend(&out, out.empty() ? "" : ",", internal::kRowTypeNames[i], ":", names[i]);
  }
  return out;
}

std::string KernelName() { return KernelName({DType::kFloat32, DType::kBFloat16, DType::kInt8}); }

float ExpShiftSum(const float* x, float shift, float* y, int64_t n) {
  return Other().exp_shift_sum(x, shift, y, n);
}

void RoundToBf16(float* x, int64_t n) { Other().round_to_bf16(x, n); }

float Max(const float* x, int64_t n) { return Other().max(x, n); }

float ScaleMax(float* x, int64_t n, float scale) { return Other().scale_max(x, n, scale); }

void ToBf16(const float* x, int64_t n, uint16_t* out) { Other().to_bf16(x, n, out); }

void ScaleAdd(float* dst, float alpha, const float* src, int64_t n) {
  Other().scale_add(dst, alpha, src, n);
}

void RowToFloat(const Rows& rows, int64_t t, int64_t n, float* out) {
  RowSet(rows.dtype).row_to_float(rows, t, n, out);
}

void DotRows(const float* q, int64_t m, int64_t d, const Rows& k, int64_t rows, float* scores,
             int64_t ld) {
  RowSet(k.dtype).dot_rows(q, m, d, k, rows, scores, ld);
}

void AccumulateRows(const float* p, int64_t ld, int64_t m, const Rows& v, int64_t rows, int64_t dv,
                    float* acc) {
  RowSet(v.dtype).accumulate_rows(p, ld, m, v, rows, dv, acc);
}

std::vector<std::string> RunnableKernels() {
  std::vector<std::string> names;
  for (const Kernels* k : Runnable()) names.push_back(k->name);
  return names;
}

bool UseKernels(std::string_view name) {
  const Kernels* sets[kRowTypes] = {};
  if (name.find(':') == std::string_view::npos) {
    const Kernels* set = FindSet(name);
    if (set == nullptr) return false;
    for (const Kernels*& s : sets) s = set;
  } else {
    // "f32:avx512,bf16:avx2,int8:avx512_vnni": each type once, in any order.
    std::string_view rest = name;
    while (!rest.empty()) {
      const size_t comma = std::min(rest.find(','), rest.size());
      const std::string_view part = rest.substr(0, comma);
      rest.remove_prefix(std::min(comma + 1, rest.size()));
      const size_t colon = std::min(part.find(':'), part.size());
      int type = 0;
      while (type < kRowTypes && part.substr(0, colon) != internal::kRowTypeNames[type]) ++type;
      if (type == kRowTypes || sets[type] != nullptr) return false;
      sets[type] = FindSet(part.substr(std::min(colon + 1, part.size())));
      if (sets[type] == nullptr) return false;
    }
    for (const Kernels* s : sets) {
      if (s == nullptr) return false;
    }
  }
  MutexLock lock(&g_mu);
  Store(sets);
  return true;
}

namespace testing {
void UseScalarKernels(bool scalar) {
  MutexLock lock(&g_mu);
  if (scalar) {
    const Kernels* const sets[kRowTypes] = {&internal::ScalarKernels(), &internal::ScalarKernels(),
                                            &internal::ScalarKernels()};
    Store(sets);
  } else {
    Store(Measured().sets);
  }
}

Measurement MeasureKernels() {
  const RowChoice choice = internal::MeasureRowKernels(Candidates(), &Default());
  return Measurement{choice.sets[0]->name, choice.sets[1]->name, choice.sets[2]->name,
                     choice.seconds};
}

ScopedKernels::ScopedKernels(std::string_view name) {
  static_assert(std::tuple_size_v<decltype(saved_)> == kRowTypes);
  for (int i = 0; i < kRowTypes; ++i) saved_[i] = g_sets[i].load(std::memory_order_acquire);
  ok_ = UseKernels(name);
}

ScopedKernels::~ScopedKernels() {
  if (!ok_) return;
  MutexLock lock(&g_mu);
  for (int i = 0; i < kRowTypes; ++i) {
    g_sets[i].store(static_cast<const Kernels*>(saved_[i]), std::memory_order_release);
  }
}

}  // namespace testing

}  // namespace attend::simd
