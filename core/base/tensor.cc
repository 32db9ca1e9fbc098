#include "core/base/tensor.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/half.h"

namespace attend {

int64_t DTypeSize(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return 4;
    case DType::kBFloat16:
    case DType::kFloat16:
      return 2;
    case DType::kInt8:
      return 1;
  }
  return 4;
}

absl::string_view DTypeName(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return "float32";
    case DType::kBFloat16:
      return "bfloat16";
    case DType::kFloat16:
      return "float16";
    case DType::kInt8:
      return "int8";
  }
  return "unknown";
}

std::string ShapeToString(absl::Span<const int64_t> shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

std::optional<int64_t> CheckedMul(int64_t a, int64_t b) {
  int64_t result;
  if (__builtin_mul_overflow(a, b, &result)) return std::nullopt;
  return result;
}

std::optional<int64_t> CheckedAdd(int64_t a, int64_t b) {
  int64_t result;
  if (__builtin_add_overflow(a, b, &result)) return std::nullopt;
  return result;
}

absl::StatusOr<int64_t> CheckedElementCount(absl::Span<const int64_t> dims, absl::string_view field,
                                            int64_t max_elements) {
  int64_t count = 1;
  for (size_t i = 0; i < dims.size(); ++i) {
    if (dims[i] < 1) {
      return absl::InvalidArgumentError(absl::StrCat(field, " ", ShapeToString(dims),
                                                     ": dimension ", i, " is ", dims[i],
                                                     "; every dimension must be >= 1"));
    }
    std::optional<int64_t> next = CheckedMul(count, dims[i]);
    if (!next) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, " ", ShapeToString(dims), ": element count overflows 64 bits"));
    }
    count = *next;
  }
  if (count > max_elements) {
    return absl::ResourceExhaustedError(absl::StrCat(field, " ", ShapeToString(dims), " has ",
                                                     count, " elements, over the limit of ",
                                                     max_elements));
  }
  return count;
}

int64_t TensorView::num_elements() const {
  int64_t count = 1;
  for (int64_t d : shape) count *= d;
  return count;
}

float TensorView::At(int64_t i) const {
  switch (dtype) {
    case DType::kFloat32:
      return static_cast<const float*>(data)[i];
    case DType::kBFloat16: {
      uint16_t h;
      std::memcpy(&h, static_cast<const char*>(data) + 2 * i, 2);
      return Bf16ToFloat(h);
    }
    case DType::kFloat16: {
      uint16_t h;
      std::memcpy(&h, static_cast<const char*>(data) + 2 * i, 2);
      return HalfToFloat(h);
    }
    case DType::kInt8:  // storage only: never a view's dtype
      break;
  }
  return 0.0f;
}

void ConvertToFloat(const TensorView& view, float* out) {
  const int64_t n = view.num_elements();
  if (view.dtype == DType::kFloat32) {
    std::memcpy(out, view.data, static_cast<size_t>(n) * sizeof(float));
    return;
  }
  const auto* halves = static_cast<const uint16_t*>(view.data);
  if (view.dtype == DType::kBFloat16) {
    for (int64_t i = 0; i < n; ++i) out[i] = Bf16ToFloat(halves[i]);
  } else {
    for (int64_t i = 0; i < n; ++i) out[i] = HalfToFloat(halves[i]);
  }
}

void AppendEncoded(absl::Span<const float> values, DType dtype, std::string* out) {
  const size_t start = out->size();
  out->resize(start + values.size() * static_cast<size_t>(DTypeSize(dtype)));
  char* dst = out->data() + start;
  if (dtype == DType::kFloat32) {
    std::memcpy(dst, values.data(), values.size() * sizeof(float));
    return;
  }
  for (size_t i = 0; i < values.size(); ++i) {
    const uint16_t h = dtype == DType::kBFloat16 ? FloatToBf16(values[i]) : FloatToHalf(values[i]);
    std::memcpy(dst + 2 * i, &h, 2);
  }
}

namespace {

// Below this many elements a parallel region costs more than the scan.
constexpr int64_t kParallelCheckElements = int64_t{1} << 18;

// The index of the first of n values whose magnitude bits (all but the sign) are at least
// `limit`, or -1: with the exponent-all-ones pattern as the limit, the first NaN or infinity.
// Chunks are scanned without branches, so that the compiler vectorises the scan (an early-exit
// loop does not vectorise: 0.8 ns per value, about 5 ms for one 2048-token prefill's q, k and v);
// only a chunk that holds such a value is searched again.
template <typename Bits>
int64_t FirstAtLeast(const Bits* p, int64_t n, Bits limit) {
  constexpr Bits kMagnitude = static_cast<Bits>(~Bits{0}) >> 1;
  constexpr int64_t kChunk = 2048;
  for (int64_t begin = 0; begin < n; begin += kChunk) {
    const int64_t end = std::min(n, begin + kChunk);
    Bits found = 0;
    for (int64_t i = begin; i < end; ++i) found |= static_cast<Bits>((p[i] & kMagnitude) >= limit);
    if (found == 0) continue;
    for (int64_t i = begin; i < end; ++i) {
      if ((p[i] & kMagnitude) >= limit) return i;
    }
  }
  return -1;
}

// The bit pattern from which an element of `view` is not finite once stored as `storage`.
// float32 values from 0x7f7f8000 (about 3.3962e38) round to bfloat16's infinity, and from
// 0x477ff000 (65520) to float16's.
uint32_t Limit(const TensorView& view, DType storage) {
  switch (view.dtype) {
    case DType::kFloat32:
      if (storage == DType::kBFloat16) return 0x7f7f8000u;
      if (storage == DType::kFloat16) return 0x477ff000u;
      return 0x7f800000u;
    case DType::kBFloat16:
      return 0x7f80u;
    default:
      return 0x7c00u;  // float16 (its largest, 65504, fits every storage dtype)
  }
}

}  // namespace

int64_t FirstElementNotFiniteAs(const TensorView& view, DType storage, int threads) {
  const int64_t n = view.num_elements();
  // Each thread scans one contiguous share; the first bad element is the smallest found. A
  // 2048-token prefill's q, k and v are 6M values, about 1.5 ms on one thread while the others
  // waited.
  if (threads <= 0) threads = omp_get_max_threads();
  if (n < kParallelCheckElements) threads = 1;
  const uint32_t limit = Limit(view, storage);
  int64_t first = n;
#pragma omp parallel num_threads(threads) reduction(min : first) if (threads > 1)
  {
    const int64_t parts = omp_get_num_threads(), part = omp_get_thread_num();
    const int64_t begin = n * part / parts, end = n * (part + 1) / parts;
    const int64_t bad =
        view.dtype == DType::kFloat32
            ? FirstAtLeast(static_cast<const uint32_t*>(view.data) + begin, end - begin, limit)
            : FirstAtLeast(static_cast<const uint16_t*>(view.data) + begin, end - begin,
                           static_cast<uint16_t>(limit));
    if (bad >= 0) first = std::min(first, begin + bad);
  }
  return first == n ? -1 : first;
}

int64_t FirstNonFiniteElement(const TensorView& view, int threads) {
  return FirstElementNotFiniteAs(view, DType::kFloat32, threads);
}

double LargestFinite(DType dtype) {
  switch (dtype) {
    case DType::kBFloat16:
      return 3.3895313892515355e38;
    case DType::kFloat16:
      return 65504.0;
    default:
      return 3.4028234663852886e38;
  }
}

namespace {

absl::Status NonFiniteError(const TensorView& view, int64_t bad, absl::string_view field) {
  const float value = view.At(bad);
  return absl::InvalidArgumentError(
      absl::StrCat(field, " holds a non-finite value (",
                   std::isnan(value) ? "NaN" : (value > 0 ? "+inf" : "-inf"), ") at element ", bad,
                   " of ", ShapeToString(view.shape), "; attention inputs must be finite"));
}

}  // namespace

absl::Status CheckFinite(const TensorView& view, absl::string_view field, int threads) {
  const int64_t bad = FirstNonFiniteElement(view, threads);
  return bad < 0 ? absl::OkStatus() : NonFiniteError(view, bad, field);
}

absl::Status CheckRowsFinite(const TensorView& view, int64_t begin, int64_t end,
                             absl::string_view field, int threads) {
  if (end <= begin) return absl::OkStatus();
  const int64_t row = view.num_elements() / view.dim(0);
  const TensorView rows{view.dtype,
                        {(end - begin) * row},
                        static_cast<const char*>(view.data) + begin * row * DTypeSize(view.dtype)};
  const int64_t bad = FirstNonFiniteElement(rows, threads);
  return bad < 0 ? absl::OkStatus() : NonFiniteError(view, begin * row + bad, field);
}

absl::Status CheckStorable(const TensorView& view, absl::string_view field, DType storage,
                           int threads) {
  const int64_t bad = FirstElementNotFiniteAs(view, storage, threads);
  if (bad < 0) return absl::OkStatus();
  const float value = view.At(bad);
  if (!std::isfinite(value)) return CheckFinite(view, field, threads);
  return absl::InvalidArgumentError(
      absl::StrCat(field, " holds ", value, " at element ", bad, " of ", ShapeToString(view.shape),
                   ", beyond what ", DTypeName(storage),
                   " storage holds (its largest value is about ", LargestFinite(storage), ")"));
}

absl::Status CheckFitsDType(absl::Span<const float> values, DType dtype, absl::string_view field,
                            absl::string_view advice) {
  const TensorView view{DType::kFloat32, {static_cast<int64_t>(values.size())}, values.data()};
  const int64_t bad = FirstElementNotFiniteAs(view, dtype);
  if (bad < 0) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(field, ": element ", bad, " is ", values[static_cast<size_t>(bad)], ", beyond ",
                   DTypeName(dtype), "'s range (largest ", LargestFinite(dtype), ")", advice));
}

}  // namespace attend
