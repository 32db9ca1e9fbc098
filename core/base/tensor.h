// Tensor views over caller memory and the shape checks every entry point runs before allocating.
//
// Sizes use checked 64-bit arithmetic: a shape whose element or byte count would overflow, or
// exceed a caller's limit, is rejected with a Status that names the field and the shape, before
// any buffer is sized from it.
//
// Thread-safety: TensorView is a value type that does not own its data; concurrent reads are
// safe as long as the viewed memory outlives the view and is not written meanwhile.
#ifndef ATTEND_CORE_BASE_TENSOR_H_
#define ATTEND_CORE_BASE_TENSOR_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/inlined_vector.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace attend {

// Element types. kInt8 is a KV-cache storage type only (symmetric int8 with a float scale per
// token and head, see core/kv_cache/layout.h): tensors in requests are never int8, and the
// TensorView functions below do not accept it.
enum class DType { kFloat32, kBFloat16, kFloat16, kInt8 };

// Bytes per element: 4, 2 or 1.
int64_t DTypeSize(DType dtype);
// "float32", "bfloat16", "float16", "int8".
absl::string_view DTypeName(DType dtype);

using Shape = absl::InlinedVector<int64_t, 4>;

// "[2, 8, 64]".
std::string ShapeToString(absl::Span<const int64_t> shape);

// a * b, or nullopt when the product of two non-negative values overflows int64.
std::optional<int64_t> CheckedMul(int64_t a, int64_t b);
// a + b, or nullopt on overflow (both non-negative).
std::optional<int64_t> CheckedAdd(int64_t a, int64_t b);

// Product of `dims` with every dimension >= 1 and the product <= `max_elements`.
// Errors (INVALID_ARGUMENT for bad dims or overflow, RESOURCE_EXHAUSTED over the limit) name
// `field` and the shape, e.g. "q.shape [4, 0, 8]: dimension 1 is 0; every dimension must be >= 1".
absl::StatusOr<int64_t> CheckedElementCount(absl::Span<const int64_t> dims, absl::string_view field,
                                            int64_t max_elements);

// A read-only, dense, row-major view of `dtype` elements.
struct TensorView {
  DType dtype = DType::kFloat32;
  Shape shape;
  const void* data = nullptr;

  int64_t rank() const { return static_cast<int64_t>(shape.size()); }
  int64_t dim(int64_t i) const { return shape[static_cast<size_t>(i)]; }
  // REQUIRES: the shape was validated (no overflow).
  int64_t num_elements() const;
  // Element `i` converted to float. REQUIRES: 0 <= i < num_elements().
  float At(int64_t i) const;
};

// Converts every element of `view` to float into `out` (which must hold num_elements()).
void ConvertToFloat(const TensorView& view, float* out);
// Converts floats to `dtype` and appends the raw little-endian bytes to `out`.
void AppendEncoded(absl::Span<const float> values, DType dtype, std::string* out);

// The index of the first element of `view` that is NaN or an infinity, or -1 when every element
// is finite. Large tensors are scanned by `threads` OpenMP threads (0 = all), small ones on the
// calling thread.
int64_t FirstNonFiniteElement(const TensorView& view, int threads = 1);

// The index of the first element of `view` that is not finite once stored as `storage`
// (kFloat32, kBFloat16, kFloat16, or kInt8, whose scales are float32), or -1: as
// FirstNonFiniteElement, and for 16-bit storage also the finite float32 values that round to
// its infinity.
int64_t FirstElementNotFiniteAs(const TensorView& view, DType storage, int threads = 1);

// The largest finite value of a floating-point dtype (float32's for kInt8, whose scales are).
double LargestFinite(DType dtype);

// OK when every value is finite in `dtype`; INVALID_ARGUMENT otherwise, "<field>: element 3 is
// 1e+06, beyond float16's range (largest 65504)" followed by `advice` ("; ask for ...").
absl::Status CheckFitsDType(absl::Span<const float> values, DType dtype, absl::string_view field,
                            absl::string_view advice = "");

// OK when every element is finite; otherwise INVALID_ARGUMENT naming `field` and the first bad
// element ("k holds a non-finite value (NaN) at element 17 of [4, 2, 8]"). `threads` as in
// FirstNonFiniteElement.
absl::Status CheckFinite(const TensorView& view, absl::string_view field, int threads = 1);

// CheckFinite for rows [begin, end) of dimension 0 only; the error names the element by its index
// in the whole view. REQUIRES: 0 <= begin <= end <= view.dim(0).
absl::Status CheckRowsFinite(const TensorView& view, int64_t begin, int64_t end,
                             absl::string_view field, int threads = 1);

// CheckFinite for values about to be stored as `storage`: also INVALID_ARGUMENT for a finite
// value that `storage` cannot hold ("v holds 3.4e+38 at element 13 of [4, 1, 8], beyond what
// BFLOAT16 storage holds ...").
absl::Status CheckStorable(const TensorView& view, absl::string_view field, DType storage,
                           int threads = 1);

}  // namespace attend

#endif  // ATTEND_CORE_BASE_TENSOR_H_
