#include "server/convert/tensor.h"

#include <cstring>
#include <optional>

#include "absl/strings/str_cat.h"
#include "core/base/status_macros.h"
#include "server/convert/dtype.h"

namespace attend::server {

absl::StatusOr<DecodedTensor> DecodeTensor(const v1::Tensor& tensor, absl::string_view field,
                                           int64_t max_elements) {
  const std::optional<DType> known = FromProto(tensor.dtype(), kUnspecifiedTensorDType);
  if (!known) {
    return absl::InvalidArgumentError(absl::StrCat(field, ".dtype: unknown value ",
                                                   static_cast<int>(tensor.dtype()),
                                                   "; use FLOAT32, BFLOAT16 or FLOAT16"));
  }
  if (*known == DType::kInt8) {
    return absl::InvalidArgumentError(
        absl::StrCat(field,
                     ".dtype: INT8 is a KV-cache storage type, not a tensor dtype; send FLOAT32, "
                     "BFLOAT16 or FLOAT16"));
  }
  const DType dtype = *known;
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
  const std::optional<DType> known = FromProto(dtype, kUnspecifiedTensorDType);
  if (!known) {
    return absl::InvalidArgumentError(absl::StrCat(field, ": unknown dtype value ",
                                                   static_cast<int>(dtype),
                                                   "; use FLOAT32, BFLOAT16 or FLOAT16"));
  }
  if (*known == DType::kInt8) {
    return absl::InvalidArgumentError(
        absl::StrCat(field,
                     ": INT8 is a KV-cache storage type, not an output dtype; use "
                     "FLOAT32, BFLOAT16 or FLOAT16"));
  }
  return *known;
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
  out->set_dtype(ToProto(dtype));
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

void ToProto(const AttentionStats& stats, v1::ComputeStats* out) {
  out->set_attended_pairs(stats.attended_pairs);
  out->set_attention_flops(stats.attention_flops);
  out->set_compute_seconds(stats.compute_seconds);
  out->set_engine(stats.engine);
}

}  // namespace attend::server
