#include "server/tensor_codec.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "core/base/status_macros.h"

namespace attend::server {

absl::StatusOr<DecodedTensor> DecodeTensor(const v1::Tensor& tensor, absl::string_view field,
                                           int64_t max_elements) {
  DType dtype;
  switch (tensor.dtype()) {
    case v1::DTYPE_UNSPECIFIED:
    case v1::FLOAT32:
      dtype = DType::kFloat32;
      break;
    case v1::BFLOAT16:
      dtype = DType::kBFloat16;
      break;
    case v1::FLOAT16:
      dtype = DType::kFloat16;
      break;
    case v1::INT8:
      return absl::InvalidArgumentError(
          absl::StrCat(field,
                       ".dtype: INT8 is a KV-cache storage type, not a tensor dtype; send FLOAT32, "
                       "BFLOAT16 or FLOAT16"));
    default:
      return absl::InvalidArgumentError(absl::StrCat(field, ".dtype: unknown value ",
                                                     static_cast<int>(tensor.dtype()),
                                                     "; use FLOAT32, BFLOAT16 or FLOAT16"));
  }
  // The shape first: a shape with a zero or negative dimension has no bytes to send, and the
  // dimension, not the missing data, is what to fix.
  if (tensor.shape().empty()) {
    return absl::InvalidArgumentError(absl::StrCat(field, ".shape: empty; give the dimensions"));
  }
  ATTEND_ASSIGN_OR_RETURN(
      const int64_t elements,
      CheckedElementCount(tensor.shape(), absl::StrCat(field, ".shape"), max_elements));
  const bool has_data = !tensor.data().empty();
  const bool has_values = tensor.values_size() > 0;
  if (has_data && has_values) {
    return absl::InvalidArgumentError(absl::StrCat(field, ": both data (", tensor.data().size(),
                                                   " bytes) and values (", tensor.values_size(),
                                                   ") are set; set exactly one"));
  }
  if (!has_data && !has_values) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": neither data nor values is set (shape ",
                     ShapeToString(tensor.shape()), "); set exactly one"));
  }
  if (has_values && dtype != DType::kFloat32) {
    return absl::InvalidArgumentError(absl::StrCat(field, ": values are float32, but dtype is ",
                                                   DTypeName(dtype), "; send ", DTypeName(dtype),
                                                   " elements as data"));
  }
  DecodedTensor out;
  out.view.dtype = dtype;
  out.view.shape.assign(tensor.shape().begin(), tensor.shape().end());
  if (has_values) {
    if (tensor.values_size() != elements) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, ".values: ", tensor.values_size(), " values, but shape ",
                       ShapeToString(tensor.shape()), " has ", elements, " elements"));
    }
    out.view.data = tensor.values().data();
    out.from_values = true;
  } else {
    const int64_t expected = elements * DTypeSize(dtype);
    if (static_cast<int64_t>(tensor.data().size()) != expected) {
      return absl::InvalidArgumentError(absl::StrCat(
          field, ".data: ", tensor.data().size(), " bytes, but shape ",
          ShapeToString(tensor.shape()), " of ", DTypeName(dtype), " needs ", expected));
    }
    out.view.data = tensor.data().data();
  }
  return out;
}

absl::StatusOr<DType> DecodeOutputDType(v1::DType dtype, absl::string_view field) {
  switch (dtype) {
    case v1::DTYPE_UNSPECIFIED:
    case v1::FLOAT32:
      return DType::kFloat32;
    case v1::BFLOAT16:
      return DType::kBFloat16;
    case v1::FLOAT16:
      return DType::kFloat16;
    case v1::INT8:
      return absl::InvalidArgumentError(
          absl::StrCat(field,
                       ": INT8 is a KV-cache storage type, not an output dtype; use "
                       "FLOAT32, BFLOAT16 or FLOAT16"));
    default:
      return absl::InvalidArgumentError(absl::StrCat(field, ": unknown dtype value ",
                                                     static_cast<int>(dtype),
                                                     "; use FLOAT32, BFLOAT16 or FLOAT16"));
  }
}

absl::StatusOr<Precision> DecodePrecision(v1::Precision precision) {
  switch (precision) {
    case v1::PRECISION_UNSPECIFIED:
      return Precision::kAuto;
    case v1::PRECISION_FLOAT32:
      return Precision::kFloat32;
    case v1::PRECISION_BFLOAT16:
      return Precision::kBFloat16;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("precision: unknown value ", static_cast<int>(precision),
                       "; use PRECISION_FLOAT32 or PRECISION_BFLOAT16"));
  }
}

void EncodeTensor(absl::Span<const float> values, absl::Span<const int64_t> shape, bool as_values,
                  DType dtype, v1::Tensor* out) {
  const absl::Span<const float> parts[] = {values};
  EncodeTensorParts(parts, shape, as_values, dtype, out);
}

void EncodeTensorParts(absl::Span<const absl::Span<const float>> parts,
                       absl::Span<const int64_t> shape, bool as_values, DType dtype,
                       v1::Tensor* out) {
  out->Clear();
  out->mutable_shape()->Add(shape.begin(), shape.end());
  size_t elements = 0;
  for (absl::Span<const float> part : parts) elements += part.size();
  if (as_values) {
    out->set_dtype(v1::FLOAT32);
    auto* dst = out->mutable_values();
    dst->Resize(static_cast<int>(elements), 0.0f);
    float* at = dst->mutable_data();
    for (absl::Span<const float> part : parts) {
      if (!part.empty()) std::memcpy(at, part.data(), part.size() * sizeof(float));
      at += part.size();
    }
    return;
  }
  switch (dtype) {
    case DType::kFloat32:
      out->set_dtype(v1::FLOAT32);
      break;
    case DType::kBFloat16:
      out->set_dtype(v1::BFLOAT16);
      break;
    case DType::kFloat16:
      out->set_dtype(v1::FLOAT16);
      break;
    case DType::kInt8:  // storage only: never an output dtype
      break;
  }
  std::string* data = out->mutable_data();
  data->reserve(elements * static_cast<size_t>(DTypeSize(dtype)));
  for (absl::Span<const float> part : parts) AppendEncoded(part, dtype, data);
}

int64_t EncodedBytes(int64_t elements, bool as_values, DType dtype) {
  return elements * (as_values ? 4 : DTypeSize(dtype));
}

absl::Status CheckEncodable(absl::Span<const float> values, DType dtype, absl::string_view field) {
  return CheckFitsDType(values, dtype, field, "; ask for output_dtype FLOAT32 (or BFLOAT16)");
}

}  // namespace attend::server
