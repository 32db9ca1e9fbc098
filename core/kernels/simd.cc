// The dispatch of simd.h: holds the kernel set of each storage type (chosen by measurement,
// simd_choice.cc, or named by UseKernels) and forwards every kernel to its set: the row kernels
// by the rows' dtype, the others to the f32 set. The sets live in their own files, each compiled
// for its instruction set: simd_scalar.cc, simd_avx2.cc and simd_avx512*.cc (simd_internal.h
// declares what this file takes from each).
#include "core/kernels/simd.h"

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "core/base/mutex.h"
#include "core/base/status_macros.h"
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

// Every kernel set of this build, runnable here or not (in the order RunnableKernels() lists
// them): the names ParseKernels accepts, so that a set another CPU runs reads as one this CPU
// cannot run rather than as an unknown name.
std::vector<std::string> KnownKernels() {
  std::vector<std::string> names{internal::ScalarKernels().name, internal::Avx2Kernels().name};
  int count = 0;
  const internal::Avx512Set* avx512 = internal::Avx512Sets(&count);
  for (int i = 0; i < count; ++i) names.push_back(avx512[i].kernels->name);
  return names;
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

bool ScaleCopy(const float* src, float factor, float* dst, int64_t n) {
  return Other().scale_copy(src, factor, dst, n);
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
  const Kernels& set = RowSet(v.dtype);
  if (v.dtype == DType::kInt8 && rows > 0) {
    // int8 rows whose scales are all below 2^-100 hold subnormal values, and every kernel folds
    // a row's scale into its weights: p * scale, subnormal, kept too few bits for the output
    // bound (an outside tester found outputs off by 4.6 times it at values of 1e-40, 25 times at
    // 3e-42, where f32 storage of the same values kept it). The kernel runs on the scales times
    // 2^100 into a zeroed buffer instead, whose sums are added to acc times 2^-100: one rounding
    // per output, as fine as f32 holds them. Larger scales in the tile make such rows' share of
    // the bound (relative to the largest value) far larger than their rounding.
    // Scales are non-negative finite floats, whose bits order as the values do: an integer max,
    // which the compiler vectorises (a float max it does not, for NaN's sake), keeps this scan
    // small next to the kernel's rows x dv x m products.
    constexpr int32_t kTinyBits = 0x0d800000;  // 2^-100
    int32_t largest = 0;
    for (int64_t t = 0; t < rows; ++t) {
      int32_t bits;
      std::memcpy(&bits, v.scales + t, sizeof(bits));
      largest = std::max(largest, bits);
    }
    if (largest > 0 && largest < kTinyBits) {
      thread_local std::vector<float> scaled, part;
      scaled.resize(static_cast<size_t>(rows));
      for (int64_t t = 0; t < rows; ++t) scaled[t] = v.scales[t] * 0x1p100f;  // exact
      part.assign(static_cast<size_t>(m * dv), 0.0f);
      Rows large = v;
      large.scales = scaled.data();
      set.accumulate_rows(p, ld, m, large, rows, dv, part.data());
      for (int64_t j = 0; j < m; ++j) {
        for (int64_t c = 0; c < dv; ++c) acc[j * dv + c] += part[j * dv + c] * 0x1p-100f;
      }
      return;
    }
  }
  set.accumulate_rows(p, ld, m, v, rows, dv, acc);
}

std::vector<std::string> RunnableKernels() {
  std::vector<std::string> names;
  for (const Kernels* k : Runnable()) names.push_back(k->name);
  return names;
}

absl::StatusOr<KernelSets> ParseKernels(std::string_view name_view) {
  // Debian's Abseil has its own string_view, which absl's string functions take.
  const absl::string_view name(name_view.data(), name_view.size());
  const auto quote = [](absl::string_view text) {
    return absl::StrCat("'", absl::CHexEscape(text), "'");
  };
  // `part` as a kernel set of this build, or why not.
  const auto parse_set = [&](absl::string_view part) -> absl::StatusOr<std::string> {
    const std::vector<std::string> known = KnownKernels();
    if (std::find(known.begin(), known.end(), part) != known.end()) return std::string(part);
    const std::string lower = absl::AsciiStrToLower(part);
    if (std::find(known.begin(), known.end(), lower) != known.end()) {
      // The lowercase form is suggested only where SetKernels would then take it.
      const std::vector<std::string> runnable = RunnableKernels();
      if (std::find(runnable.begin(), runnable.end(), lower) == runnable.end()) {
        return absl::InvalidArgumentError(absl::StrCat(
            quote(part), " is no kernel set: names are lowercase, but this CPU cannot run ", lower,
            " (it runs ", absl::StrJoin(runnable, ", "), ")"));
      }
      return absl::InvalidArgumentError(
          absl::StrCat(quote(part), " is no kernel set: names are lowercase: ", quote(lower)));
    }
    return absl::InvalidArgumentError(absl::StrCat(quote(part), " is no kernel set (",
                                                   absl::StrJoin(known, ", "), "; this CPU runs ",
                                                   absl::StrJoin(RunnableKernels(), ", "), ")"));
  };
  const absl::string_view whole = absl::StripAsciiWhitespace(name);
  if (whole.empty()) {
    return absl::InvalidArgumentError("names no kernel set (it is empty)");
  }
  KernelSets sets;
  if (whole.find(':') == absl::string_view::npos && whole.find(',') == absl::string_view::npos) {
    ATTEND_ASSIGN_OR_RETURN(sets[0], parse_set(whole));
    sets[1] = sets[2] = sets[0];
    return sets;
  }
  // "f32:avx512,bf16:avx2,int8:avx512_vnni": each type once, in any order. Empty items first: a
  // stray comma explains the rest.
  const std::vector<absl::string_view> items = absl::StrSplit(whole, ',');
  for (size_t i = 0; i < items.size(); ++i) {
    if (absl::StripAsciiWhitespace(items[i]).empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("item ", i + 1, " of ", items.size(), " is empty (a stray ','?)"));
    }
  }
  bool named[kRowTypes] = {};
  for (absl::string_view raw : items) {
    const absl::string_view item = absl::StripAsciiWhitespace(raw);
    const size_t colon = item.find(':');
    if (colon == absl::string_view::npos) {
      return absl::InvalidArgumentError(
          absl::StrCat("item ", quote(item), " is not TYPE:SET (f32:SET,bf16:SET,int8:SET)"));
    }
    const absl::string_view type_name = absl::StripAsciiWhitespace(item.substr(0, colon));
    const absl::string_view set_name = absl::StripAsciiWhitespace(item.substr(colon + 1));
    int type = 0;
    while (type < kRowTypes && type_name != internal::kRowTypeNames[type]) ++type;
    if (type == kRowTypes) {
      const std::string lower = absl::AsciiStrToLower(type_name);
      int lower_type = 0;
      while (lower_type < kRowTypes && lower != internal::kRowTypeNames[lower_type]) ++lower_type;
      if (lower_type < kRowTypes) {
        return absl::InvalidArgumentError(absl::StrCat(
            quote(type_name), " is no storage type: names are lowercase: ", quote(lower)));
      }
      return absl::InvalidArgumentError(
          absl::StrCat(quote(type_name), " is no storage type (f32, bf16, int8)"));
    }
    if (named[type]) {
      return absl::InvalidArgumentError(
          absl::StrCat("names ", internal::kRowTypeNames[type], " twice"));
    }
    named[type] = true;
    if (set_name.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("item ", quote(item), " names no set"));
    }
    absl::StatusOr<std::string> set = parse_set(set_name);
    if (!set.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat(internal::kRowTypeNames[type], ": ", set.status().message()));
    }
    sets[static_cast<size_t>(type)] = *std::move(set);
  }
  std::vector<absl::string_view> missing;
  for (int type = 0; type < kRowTypes; ++type) {
    if (!named[type]) missing.push_back(internal::kRowTypeNames[type]);
  }
  if (!missing.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "names no set for ", absl::StrJoin(missing, ", "),
        ": give one set for every type (avx2) or one for each type (f32:SET,bf16:SET,int8:SET)"));
  }
  return sets;
}

absl::Status SetKernels(std::string_view name) {
  ATTEND_ASSIGN_OR_RETURN(const KernelSets names, ParseKernels(name));
  const Kernels* sets[kRowTypes] = {};
  for (int type = 0; type < kRowTypes; ++type) {
    const std::string& set = names[static_cast<size_t>(type)];
    sets[type] = FindSet(set);
    if (sets[type] == nullptr) {
      // One set for every type: the type is no part of the mistake.
      const bool one = names[0] == names[1] && names[1] == names[2];
      return absl::InvalidArgumentError(absl::StrCat(
          one ? "" : absl::StrCat(internal::kRowTypeNames[type], ": "), "this CPU cannot run ", set,
          " (it runs ", absl::StrJoin(RunnableKernels(), ", "), ")"));
    }
  }
  MutexLock lock(&g_mu);
  Store(sets);
  return absl::OkStatus();
}

bool UseKernels(std::string_view name) { return SetKernels(name).ok(); }

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
