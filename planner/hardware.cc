#include "planner/hardware.h"

#include <immintrin.h>
#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <new>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/half.h"
#include "core/base/large_memory.h"
#include "core/base/status_macros.h"
#include "core/kernels/cpu_features.h"
#include "core/kernels/onednn.h"
#include "planner/model.h"

namespace attend::planner {
namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

// The bandwidth probe's reader: four sequential streams (the four quarters of the range), two
// 256-bit loads from each per step into eight independent accumulators, so that neither an add
// chain nor a single stream limits the loads. On the development machine GCC's own vectorisation
// of a plain sum (16-byte loads, one chain) read 15-20% fewer bytes per second than eight
// accumulators, and four streams read 5-9% more than one (the decode kernels read 2-4 streams).
__attribute__((target("avx2"))) uint64_t SumAvx2(const uint64_t* data, int64_t n) {
  constexpr int kStreams = 4;
  const int64_t span = n / kStreams / 8 * 8;  // whole 64-byte steps
  __m256i acc[2 * kStreams];
  for (__m256i& a : acc) a = _mm256_setzero_si256();
  for (int64_t i = 0; i < span; i += 8) {
#pragma GCC unroll 4
    for (int s = 0; s < kStreams; ++s) {
      const auto* p = reinterpret_cast<const __m256i*>(data + s * span + i);
      acc[2 * s] = _mm256_add_epi64(acc[2 * s], _mm256_loadu_si256(p));
      acc[2 * s + 1] = _mm256_add_epi64(acc[2 * s + 1], _mm256_loadu_si256(p + 1));
    }
  }
  for (int a = 1; a < 2 * kStreams; ++a) acc[0] = _mm256_add_epi64(acc[0], acc[a]);
  alignas(32) uint64_t lanes[4];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), acc[0]);
  uint64_t sum = lanes[0] + lanes[1] + lanes[2] + lanes[3];
  for (int64_t i = kStreams * span; i < n; ++i) sum += data[i];
  return sum;
}

uint64_t SumPortable(const uint64_t* data, int64_t n) {
  uint64_t s[4] = {0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) {
    for (int a = 0; a < 4; ++a) s[a] += data[i + a];
  }
  for (; i < n; ++i) s[0] += data[i];
  return s[0] + s[1] + s[2] + s[3];
}

// Datasheet "GB" of GPU memory is read as GiB: the devices expose about that much (an A100 80GB
// reports 81,920 MiB).
std::vector<HardwareProfile> BuildHardwareCatalog() {
  std::vector<HardwareProfile> c;
  // NVIDIA H100 Tensor Core GPU datasheet, H100 SXM column: FP32 67 TFLOPS; BF16/FP16 Tensor
  // Core 1,979 and FP8 3,958 TFLOPS "with sparsity", so 989.5 and 1,979 dense; 80 GB HBM3 at
  // 3.35 TB/s.
  c.push_back({"h100", 67e12, 989.5e12, 1979e12, 3.35e12, 80 * kGiB,
               "NVIDIA H100 SXM5 80GB datasheet: FP32 67 TFLOPS, BF16 989.5 / FP8 1,979 dense "
               "tensor TFLOPS (half the with-sparsity figures), HBM3 3.35 TB/s, 80 GB"});
  // NVIDIA H200 Tensor Core GPU datasheet, H200 SXM column: the H100's compute (FP8 3,958 and
  // BF16 1,979 TFLOPS with sparsity) with 141 GB of HBM3e at 4.8 TB/s.
  c.push_back({"h200", 67e12, 989.5e12, 1979e12, 4.8e12, 141 * kGiB,
               "NVIDIA H200 SXM 141GB datasheet: FP32 67 TFLOPS, BF16 989.5 / FP8 1,979 dense "
               "tensor TFLOPS, HBM3e 4.8 TB/s, 141 GB"});
  // NVIDIA A100 Tensor Core GPU datasheet, A100 80GB SXM column: FP32 19.5 TFLOPS, BF16 Tensor
  // Core 312 TFLOPS and INT8 624 TOPS dense, HBM2e 2,039 GB/s. Ampere has no FP8: the fp8 slot
  // carries the INT8 rate, which the proto also uses for int8.
  c.push_back({"a100", 19.5e12, 312e12, 624e12, 2.039e12, 80 * kGiB,
               "NVIDIA A100 SXM4 80GB datasheet: FP32 19.5 TFLOPS, BF16 312 dense tensor TFLOPS, "
               "no FP8 (the fp8 figure is INT8 624 TOPS), HBM2e 2,039 GB/s, 80 GB"});
  // Intel Xeon Platinum 8480+ (Sapphire Rapids), Intel ARK: 56 cores, 2.0 GHz base, 8 channels
  // of DDR5-4800, Intel AMX. Peaks are derived at the base clock: two AVX-512 FMA units give
  // 64 f32 FLOP/cycle/core; an AMX tile unit gives 1024 bf16 FLOP and 2048 int8 OP/cycle/core.
  // Bandwidth: 8 channels x 4800 MT/s x 8 bytes = 307.2 GB/s. Capacity: a common 512 GiB
  // configuration (the part supports up to 4 TB).
  c.push_back({"cpu-socket", 56 * 2.0e9 * 64, 56 * 2.0e9 * 1024, 56 * 2.0e9 * 2048, 307.2e9,
               512 * kGiB,
               "one Intel Xeon Platinum 8480+ socket (Intel ARK: 56 cores, 2.0 GHz base, 8 x "
               "DDR5-4800, AMX): AVX-512 f32 7.2 TFLOPS, AMX bf16 114.7 TFLOPS and int8 229.4 "
               "TOPS (in the fp8 slot; no fp8) at base clock, 307.2 GB/s, 512 GiB configured "
               "(up to 4 TB)"});
  return c;
}

absl::string_view CanonicalHardwareName(const std::string& lower) {
  if (lower == "h100-sxm" || lower == "h100-sxm5") return "h100";
  if (lower == "h200-sxm") return "h200";
  if (lower == "a100-80gb" || lower == "a100-sxm" || lower == "a100-sxm4") return "a100";
  if (lower == "xeon-8480+" || lower == "xeon-platinum-8480+") return "cpu-socket";
  return lower;
}

double Seconds(std::chrono::steady_clock::duration d) {
  return std::chrono::duration<double>(d).count();
}

HardwareProfile MeasureLocal() {
  const auto start = std::chrono::steady_clock::now();
  constexpr int64_t kMatmulN = 1024;
  constexpr int kRuns = 3;
  // Much larger than this machine's 32 MiB L3 (and than most servers' LLC), so the sum streams
  // from DRAM.
  constexpr int64_t kBufferBytes = int64_t{256} << 20;

  HardwareProfile p;
  p.name = "local";
  std::vector<std::string> notes;
  absl::StatusOr<double> f32 = MeasureMatmulFlops(kMatmulN, kRuns, /*bf16=*/false);
  if (f32.ok()) {
    p.peak_flops_f32 = *f32;
  } else {
    notes.push_back(absl::StrCat("f32 matmul failed: ", f32.status().message()));
  }
  if (UseBf16Matmul()) {
    absl::StatusOr<double> bf16 = MeasureMatmulFlops(kMatmulN, kRuns, /*bf16=*/true);
    if (bf16.ok()) {
      p.peak_flops_bf16 = *bf16;
      notes.push_back("bf16 measured with a bf16 matmul");
    } else {
      notes.push_back(absl::StrCat("bf16 matmul failed: ", bf16.status().message()));
    }
  } else {
    // attend computes bf16 with f32 kernels where oneDNN has no bf16 matmul (no AVX512-BF16 or
    // AMX) or where it has a slower one (UseBf16Matmul), so the f32 rate is what a bf16 request
    // gets.
    p.peak_flops_bf16 = p.peak_flops_f32;
    notes.push_back(HasBf16Matmul()
                        ? "bf16 runs on the f32 matmul: this CPU's bf16 matmul is slower than its "
                          "f32 one; bf16 is the f32 figure"
                        : "no bf16 matmul on this CPU: bf16 is the f32 figure");
  }
  notes.push_back("fp8/int8 not measured (0)");
  absl::StatusOr<double> bandwidth = MeasureReadBandwidth(kBufferBytes, kRuns);
  if (bandwidth.ok()) {
    p.memory_bandwidth_bytes_per_second = *bandwidth;
  } else {
    notes.push_back(absl::StrCat("bandwidth failed: ", bandwidth.status().message()));
  }
  const long pages = sysconf(_SC_PHYS_PAGES);
  const long page_size = sysconf(_SC_PAGESIZE);
  if (pages > 0 && page_size > 0) {
    p.memory_bytes = static_cast<double>(pages) * static_cast<double>(page_size);
  }
  p.note = absl::StrFormat(
      "measured at first use in %.2f s with %d threads on oneDNN ISA %s: f32 matmul %dx%dx%d "
      "best of %d (%.1f GFLOP/s); read of a %d MiB buffer best of %d (%.2f GB/s); physical "
      "memory; %s",
      Seconds(std::chrono::steady_clock::now() - start), omp_get_max_threads(), CpuIsaName(),
      kMatmulN, kMatmulN, kMatmulN, kRuns, p.peak_flops_f32 / 1e9, kBufferBytes >> 20, kRuns,
      p.memory_bandwidth_bytes_per_second / 1e9, absl::StrJoin(notes, "; "));
  return p;
}

absl::Status CheckFigure(absl::string_view prefix, absl::string_view field, double value) {
  if (!std::isfinite(value) || value < 0.0) {
    return absl::InvalidArgumentError(
        absl::StrCat(FieldPath(prefix, field), ": ", value, "; must be finite and >= 0"));
  }
  // Below 1 FLOP/s or 1 byte/s is no machine, and a denormal figure makes every time infinite
  // and every price NaN.
  if (value > 0.0 && value < 1.0) {
    return absl::InvalidArgumentError(
        absl::StrCat(FieldPath(prefix, field), ": ", value, "; must be 0 (none) or at least 1"));
  }
  return absl::OkStatus();
}

// `message` about the name given to FindHardware, after "<field>: " when `field` is not empty.
std::string AboutField(absl::string_view field, absl::string_view message) {
  return field.empty() ? std::string(message) : absl::StrCat(field, ": ", message);
}

}  // namespace

const std::vector<HardwareProfile>& HardwareCatalog() {
  static const std::vector<HardwareProfile>* const catalog =
      new std::vector<HardwareProfile>(BuildHardwareCatalog());
  return *catalog;
}

const HardwareProfile& LocalHardware() {
  static const HardwareProfile* const local = new HardwareProfile(MeasureLocal());
  return *local;
}

absl::StatusOr<HardwareProfile> FindHardware(absl::string_view name, absl::string_view field) {
  const std::string lower = absl::AsciiStrToLower(name);
  const absl::string_view key = CanonicalHardwareName(lower);
  if (key == "local") {
    const HardwareProfile& local = LocalHardware();
    if (local.peak_flops_f32 <= 0.0 || local.memory_bandwidth_bytes_per_second <= 0.0) {
      return absl::InternalError(
          AboutField(field, absl::StrCat("the local measurement failed: ", local.note)));
    }
    return local;
  }
  std::vector<std::string> names;
  for (const HardwareProfile& h : HardwareCatalog()) {
    if (h.name == key) return h;
    names.push_back(h.name);
  }
  names.push_back("local");
  return absl::NotFoundError(AboutField(
      field, absl::StrCat("hardware ", QuoteForError(name),
                          " is not a known profile; known: ", absl::StrJoin(names, ", "))));
}

absl::Status ValidateHardware(const HardwareProfile& h, absl::string_view field) {
  if (h.name.size() > kMaxNameBytes) {
    return absl::InvalidArgumentError(absl::StrCat(FieldPath(field, "name"), ": ", h.name.size(),
                                                   " bytes; at most ", kMaxNameBytes));
  }
  if (h.note.size() > kMaxSourceBytes) {
    return absl::InvalidArgumentError(absl::StrCat(FieldPath(field, "note"), ": ", h.note.size(),
                                                   " bytes; at most ", kMaxSourceBytes));
  }
  ATTEND_RETURN_IF_ERROR(CheckFigure(field, "peak_flops_f32", h.peak_flops_f32));
  ATTEND_RETURN_IF_ERROR(CheckFigure(field, "peak_flops_bf16", h.peak_flops_bf16));
  ATTEND_RETURN_IF_ERROR(CheckFigure(field, "peak_flops_fp8", h.peak_flops_fp8));
  ATTEND_RETURN_IF_ERROR(
      CheckFigure(field, "memory_bandwidth_bytes_per_second", h.memory_bandwidth_bytes_per_second));
  ATTEND_RETURN_IF_ERROR(CheckFigure(field, "memory_bytes", h.memory_bytes));
  if (h.memory_bandwidth_bytes_per_second <= 0.0) {
    return absl::InvalidArgumentError(
        absl::StrCat(FieldPath(field, "memory_bandwidth_bytes_per_second"), ": must be > 0"));
  }
  if (h.peak_flops_f32 <= 0.0 && h.peak_flops_bf16 <= 0.0 && h.peak_flops_fp8 <= 0.0) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": every peak FLOP/s figure is 0; give at least one"));
  }
  return absl::OkStatus();
}

absl::StatusOr<double> MeasureMatmulFlops(int64_t n, int runs, bool bf16) {
  if (n < 16 || n > 4096) {
    return absl::InvalidArgumentError(absl::StrCat("n: ", n, "; must be in [16, 4096]"));
  }
  if (runs < 1 || runs > 100) {
    return absl::InvalidArgumentError(absl::StrCat("runs: ", runs, "; must be in [1, 100]"));
  }
  const DType in_type = bf16 ? DType::kBFloat16 : DType::kFloat32;
  const size_t elements = static_cast<size_t>(n * n);
  const size_t in_bytes = elements * (bf16 ? sizeof(uint16_t) : sizeof(float));
  std::vector<char> a(in_bytes), b(in_bytes);
  std::vector<float> c(elements);
  // Small values keep the sums finite; the timing does not depend on them.
  for (size_t i = 0; i < elements; ++i) {
    const float x = static_cast<float>(i % 7) * 0.125f;
    if (bf16) {
      const uint16_t h = FloatToBf16(x);
      std::memcpy(a.data() + 2 * i, &h, 2);
      std::memcpy(b.data() + 2 * i, &h, 2);
    } else {
      std::memcpy(a.data() + 4 * i, &x, 4);
      std::memcpy(b.data() + 4 * i, &x, 4);
    }
  }
  onednn::MatmulSpec spec;
  spec.src = {n, n, n, 1, in_type};
  spec.weights = {n, n, n, 1, in_type};
  spec.dst = {n, n, n, 1, DType::kFloat32};
  ATTEND_RETURN_IF_ERROR(onednn::RunMatmul(spec, a.data(), b.data(), c.data()));  // warm-up
  double best = std::numeric_limits<double>::infinity();
  for (int r = 0; r < runs; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    ATTEND_RETURN_IF_ERROR(onednn::RunMatmul(spec, a.data(), b.data(), c.data()));
    best = std::min(best, Seconds(std::chrono::steady_clock::now() - t0));
  }
  if (!(best > 0.0)) return absl::InternalError("the matmul took no measurable time");
  return 2.0 * static_cast<double>(n) * static_cast<double>(n) * static_cast<double>(n) / best;
}

absl::StatusOr<double> MeasureReadBandwidth(int64_t bytes, int runs) {
  if (bytes < (int64_t{1} << 20) || bytes > (int64_t{4} << 30)) {
    return absl::InvalidArgumentError(
        absl::StrCat("bytes: ", bytes, "; must be in [1 MiB, 4 GiB]"));
  }
  if (runs < 1 || runs > 100) {
    return absl::InvalidArgumentError(absl::StrCat("runs: ", runs, "; must be in [1, 100]"));
  }
  const int64_t count = bytes / static_cast<int64_t>(sizeof(uint64_t));
  // The same memory the KV cache uses (huge-page candidates): the probe is the ceiling the
  // decode ratios are judged against, so it must read the way the fastest reader here can.
  const LargeMemory buffer = LargeMemory::Map(bytes);
  if (!buffer) {
    return absl::ResourceExhaustedError(absl::StrCat("cannot allocate ", bytes, " bytes"));
  }
  auto* const data = reinterpret_cast<uint64_t*>(buffer.data());
  const bool avx2 = __builtin_cpu_supports("avx2");
  // Written by the same partition that reads it, so each thread's pages are faulted in (and,
  // on NUMA machines, placed) before the timed runs.
  const auto share = [count](int64_t* begin, int64_t* end) {
    const int64_t threads = omp_get_num_threads(), t = omp_get_thread_num();
    const int64_t chunk = (count / threads + 31) / 32 * 32;  // whole 256-byte steps
    *begin = std::min(count, t * chunk);
    *end = t == threads - 1 ? count : std::min(count, *begin + chunk);
  };
#pragma omp parallel
  {
    int64_t begin = 0, end = 0;
    share(&begin, &end);
    for (int64_t i = begin; i < end; ++i) data[i] = static_cast<uint64_t>(i);
  }
  const uint64_t expected =
      static_cast<uint64_t>(count) * static_cast<uint64_t>(count - 1) / 2;  // count <= 2^29

  double best = std::numeric_limits<double>::infinity();
  for (int r = 0; r < runs; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    uint64_t sum = 0;
#pragma omp parallel reduction(+ : sum)
    {
      int64_t begin = 0, end = 0;
      share(&begin, &end);
      sum += avx2 ? SumAvx2(data + begin, end - begin) : SumPortable(data + begin, end - begin);
    }
    best = std::min(best, Seconds(std::chrono::steady_clock::now() - t0));
    // Checking the result keeps the loop from being optimised away and catches a broken read.
    if (sum != expected) return absl::InternalError("the bandwidth probe read wrong values");
  }
  if (!(best > 0.0)) return absl::InternalError("the read took no measurable time");
  return static_cast<double>(count) * sizeof(uint64_t) / best;
}

}  // namespace attend::planner
