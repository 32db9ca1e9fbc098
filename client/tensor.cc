#include "client/tensor.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/half.h"

namespace attend::client {

int64_t FloatTensor::size() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

absl::StatusOr<Wire> ParseWire(const std::string& name) {
  if (name == "f32" || name == "float32") return Wire::kFloat32;
  if (name == "bf16" || name == "bfloat16") return Wire::kBFloat16;
  if (name == "f16" || name == "float16") return Wire::kFloat16;
  if (name == "values") return Wire::kValues;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown wire format '", name, "'; use f32, bf16, f16 or values"));
}

void EncodeTensor(const FloatTensor& tensor, Wire wire, v1::Tensor* out) {
  out->Clear();
  out->mutable_shape()->Add(tensor.shape.begin(), tensor.shape.end());
  const size_t n = tensor.values.size();
  switch (wire) {
    case Wire::kValues:
      out->set_dtype(v1::FLOAT32);
      out->mutable_values()->Add(tensor.values.begin(), tensor.values.end());
      return;
    case Wire::kFloat32:
      out->set_dtype(v1::FLOAT32);
      out->mutable_data()->assign(reinterpret_cast<const char*>(tensor.values.data()),
                                  n * sizeof(float));
      return;
    case Wire::kBFloat16:
    case Wire::kFloat16: {
      out->set_dtype(wire == Wire::kBFloat16 ? v1::BFLOAT16 : v1::FLOAT16);
      std::string* data = out->mutable_data();
      data->resize(n * 2);
      for (size_t i = 0; i < n; ++i) {
        const uint16_t h =
            wire == Wire::kBFloat16 ? FloatToBf16(tensor.values[i]) : FloatToHalf(tensor.values[i]);
        std::memcpy(data->data() + 2 * i, &h, 2);
      }
      return;
    }
  }
}

absl::StatusOr<FloatTensor> DecodeTensor(const v1::Tensor& tensor) {
  FloatTensor out;
  out.shape.assign(tensor.shape().begin(), tensor.shape().end());
  int64_t n = 1;
  for (int64_t d : out.shape) {
    if (d < 0 || (d > 0 && n > (int64_t{1} << 40) / d)) {
      return absl::InvalidArgumentError("response tensor has an invalid shape");
    }
    n *= d;
  }
  if (tensor.values_size() > 0) {
    if (tensor.values_size() != n) {
      return absl::InvalidArgumentError(
          absl::StrCat("response tensor: ", tensor.values_size(), " values for ", n, " elements"));
    }
    out.values.assign(tensor.values().begin(), tensor.values().end());
    return out;
  }
  const std::string& data = tensor.data();
  size_t width;
  switch (tensor.dtype()) {
    case v1::DTYPE_UNSPECIFIED:
    case v1::FLOAT32:
      width = 4;
      break;
    case v1::BFLOAT16:
    case v1::FLOAT16:
      width = 2;
      break;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("response tensor has unknown dtype ", static_cast<int>(tensor.dtype())));
  }
  if (data.size() != static_cast<size_t>(n) * width) {
    return absl::InvalidArgumentError(
        absl::StrCat("response tensor: ", data.size(), " bytes for ", n, " elements"));
  }
  out.values.resize(static_cast<size_t>(n));
  if (width == 4) {
    std::memcpy(out.values.data(), data.data(), data.size());
  } else {
    for (int64_t i = 0; i < n; ++i) {
      uint16_t h;
      std::memcpy(&h, data.data() + 2 * i, 2);
      out.values[i] = tensor.dtype() == v1::BFLOAT16 ? Bf16ToFloat(h) : HalfToFloat(h);
    }
  }
  return out;
}

}  // namespace attend::client
