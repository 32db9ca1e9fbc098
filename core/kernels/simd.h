// Vector kernels for the parts of attention that oneDNN has no primitive for, or that are too
// small for a matmul to pay off: the exponentials of the softmax, and decode-sized attention
// (a handful of query rows against many keys), which is memory-bound and must stream K and V at
// the machine's bandwidth.
//
// Each kernel has a portable scalar version, an AVX2+FMA one and AVX-512 ones (bf16 dot products
// on vdpbf16ps where the CPU has AVX512-BF16, int8 ones on vpdpbusd where it has
// AVX512-VNNI). The build targets no particular CPU: each set is compiled for its instruction
// set with target attributes.
//
// Which set runs is chosen once per process, per storage type of the rows (f32, bf16, int8), by
// measurement (ChooseKernels): the instructions a CPU has do not say which set is fastest on its
// cores (on a Zen 5 the avx512_bf16 set read bf16 K/V at 10.6-14 GB/s, the avx2 set at 23.3-23.6).
// The row kernels (RowToFloat, DotRows, AccumulateRows) dispatch on Rows::dtype to that type's
// set; the others (exponentials, maxima, bf16 rounding, ScaleAdd) use the f32 rows' set: they
// are f32 loops over data in cache, as the f32 row kernels are, so that set's measurement is the
// nearest evidence for them, and one rule then covers the measured and the pinned choice.
// Every set keeps the contract stated below for every storage type (the differences between sets
// are the ones the comments of DotRows and AccumulateRows allow), so a choice per type changes
// speed, and the last bits of the sums, only.
//
// Thread-safety: the kernels are pure functions and may run on any thread. The first kernel
// call (or ChooseKernels) measures and sets the choice under a lock: concurrent first callers
// wait for one measurement. UseKernels and the testing hooks are not synchronised with kernels
// running on other threads: call them at start-up, or between tests.
#ifndef ATTEND_CORE_KERNELS_SIMD_H_
#define ATTEND_CORE_KERNELS_SIMD_H_

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "core/base/tensor.h"

namespace attend::simd {

// The kernel sets in use, for the start-up line, attend_build_info and stats.engine: one name
// ("avx512_bf16", "avx512_vnni", "avx512", "avx2" or "scalar") when the rows of every storage
// type use the same set, else each type's set, "f32:avx512,bf16:avx2,int8:avx512_vnni". The
// latter is accepted by UseKernels, to pin a measured choice across a fleet. Chooses the sets
// first when nothing has (ChooseKernels).
std::string KernelName();

// As KernelName() over the storage types a call read (kFloat32, kBFloat16, kInt8; kFloat16
// counts as f32): the one set's name when those types' sets agree, else "bf16:avx2,int8:avx512".
std::string KernelName(absl::Span<const DType> storage);

// The names of the kernel sets this CPU can run, "scalar" first, the default last: the set
// kept for every type unless the measurement finds another clearly faster (by kClearMargin).
std::vector<std::string> RunnableKernels();

// How much faster (as a fraction of the default's time) another set must decode a storage type
// for the measurement to choose it over the default: less than this is within the run-to-run
// noise of a 50 ms measurement, and a choice that flipped between restarts would change
// stats.engine and the sums' last bits for no gain.
inline constexpr double kClearMargin = 0.05;

// Chooses the kernel set of each storage type, unless UseKernels or an earlier call did: times
// decode's row kernels (DotRows then AccumulateRows, 4 query rows against 256 rows of d = 128, in
// the L2 cache) for every vector set the CPU runs (scalar ones only where there is none) and each
// storage type, interleaving sets, and keeps the fastest per type (the default unless another is
// faster by kClearMargin in both its best and its median repetition). It takes at most 50 ms
// (13-35 ms on a shared 2-vCPU Xeon), on the calling thread. The server calls it at start-up,
// before it serves, so that no request waits for it; any other program measures at its first
// kernel call. Thread-safe: concurrent callers wait for one measurement.
void ChooseKernels();

// The set each storage type's rows run on, in the order f32, bf16, int8.
using KernelSets = std::array<std::string, 3>;

// Reads the kernel sets `name` names: one set for every storage type ("avx2"), or one per type
// as KernelName() prints them ("f32:avx512,bf16:avx2,int8:avx512_vnni": each of the three types
// once, in any order). Spaces around the whole, an item, a type or a set are ignored (an
// environment variable or a hand-edited file may carry them; no name contains one); names are
// lowercase, as KernelName() prints them, and an uppercase one is refused with its lowercase
// form (or, for a set this CPU cannot run, saying so with the sets it runs). INVALID_ARGUMENT
// saying which part is wrong (the types with no set, an unknown type or set, a type named twice, an
// empty item): --simd_kernels and the snapshot directory's KERNELS record both read through here,
// so their messages agree. Checks that each set is one of this build, not that this CPU runs it
// (SetKernels does).
absl::StatusOr<KernelSets> ParseKernels(std::string_view name);

// Makes every kernel use the sets `name` names (ParseKernels) instead of the measured choice,
// with no measurement: the row kernels each type's set, the other kernels the f32 set. For an
// operator who wants the same arithmetic on every machine of a fleet, or to compare sets.
// INVALID_ARGUMENT (and no change) with ParseKernels' errors, or naming a set this CPU cannot
// run and those it can. Call before any kernel runs (at start-up): the switch is not
// synchronised with kernels running on other threads.
absl::Status SetKernels(std::string_view name);

// SetKernels(name).ok(), for callers that need no reason.
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

// dst[i] = src[i] * factor for i < n; returns whether every dst[i] is finite. The attention
// output written and checked in one pass (a separate scan read a prefill's megabytes again).
bool ScaleCopy(const float* src, float factor, float* dst, int64_t n);

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
  // Optional: the bytes [next, next + next_bytes) the caller reads after these rows (a tile's
  // values while q.k reads its keys, the next tile's keys while p.v reads values). The int8 VNNI
  // kernels, which compute about as long as memory takes to deliver their rows, ask for them
  // into L2 a little at a time as they go, so that memory streams the next rows while they
  // compute, instead of starting each stream cold. Speed only: any range the caller may read,
  // or none.
  const void* next = nullptr;
  int64_t next_bytes = 0;
};

// out[i] = element i of row `t` of `rows` as float (int8 times the row's scale), for i < n.
void RowToFloat(const Rows& rows, int64_t t, int64_t n, float* out);

// scores[j * ld + t] = dot(q[j * d ...], key row t) for j < m, t < rows. Against int8 rows the
// VNNI kernels carry q in two int8 parts (for the dot product instruction): each q value within
// 1/65024 (half a step of max / 127 / 256, 2^-16 x 128/127) of its row's largest |q|, far below
// the error of the storage itself (1/254 of the row's largest). Against bf16 rows the AVX-512
// kernels use bf16 dot products when k.native_bf16 is set and q holds bf16 values, and are exact
// f32 otherwise.
void DotRows(const float* q, int64_t m, int64_t d, const Rows& k, int64_t rows, float* scores,
             int64_t ld);

// acc[j * dv + c] += sum over t < rows of p[j * ld + t] * value row t [c], for j < m, c < dv.
// Against bf16 rows the AVX-512 kernels use bf16 dot products when v.native_bf16 is set and p
// holds bf16 values (bf16 arithmetic rounds the probabilities), and f32 otherwise. Against int8
// rows the VNNI kernels carry the weights p * (the row's scale) in int16 (15 bits and a sign):
// each within 1/65534 of the largest weight of its block of 128 rows (of 32 rows where 128 would
// break the bound that follows), about as fine as q against int8 keys, and all of a row's
// together off by at most 2^-12 of the row's sum (a long tail of small weights rounded alike
// moved an average of equal values by 1.4% before that bound); where that bound fails, every bit
// of p is kept in the blocks of 32 rows with the most rounding (up to half of them), or in all
// of them, as where a weight is negative or not finite. int8 rows whose scales are all below
// 2^-100 (subnormal values) are summed on scales times 2^100 and added at 2^-100, so that the
// weights keep their bits on every set.
void AccumulateRows(const float* p, int64_t ld, int64_t m, const Rows& v, int64_t rows, int64_t dv,
                    float* acc);

namespace testing {
// Makes every kernel use the portable scalar code (true) or the chosen sets (false: the
// measurement's choice, measured first if it has not run), so that tests cover both. Not for
// concurrent use with the kernels.
void UseScalarKernels(bool scalar);
// As the functions above; tests switch sets between cases.
using ::attend::simd::RunnableKernels;
using ::attend::simd::UseKernels;

// What ChooseKernels' measurement chose for each storage type, and how long it took.
struct Measurement {
  std::string f32, bf16, int8;
  double seconds = 0;
};
// Runs ChooseKernels' measurement again, on the calling thread, and returns its choice without
// applying it: to check the choice and the time budget.
Measurement MeasureKernels();

// Uses the set `name` (either form UseKernels takes) while it lives (ok() false, and no change,
// when UseKernels refuses it), then the sets in use before it again (not yet chosen, if
// nothing had been).
class ScopedKernels {
 public:
  explicit ScopedKernels(std::string_view name);
  ~ScopedKernels();
  ScopedKernels(const ScopedKernels&) = delete;
  ScopedKernels& operator=(const ScopedKernels&) = delete;
  bool ok() const { return ok_; }

 private:
  std::array<const void*, 3> saved_;  // the sets in use before (simd.cc's selection)
  bool ok_;
};
}  // namespace testing

}  // namespace attend::simd

#endif  // ATTEND_CORE_KERNELS_SIMD_H_
