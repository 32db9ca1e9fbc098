#include "server/convert/dtype.h"

namespace attend::server {

std::optional<DType> FromProto(v1::DType dtype, DType unspecified) {
  switch (dtype) {
    case v1::DTYPE_UNSPECIFIED:
      return unspecified;
    case v1::FLOAT32:
      return DType::kFloat32;
    case v1::BFLOAT16:
      return DType::kBFloat16;
    case v1::FLOAT16:
      return DType::kFloat16;
    case v1::INT8:
      return DType::kInt8;
    default:
      return std::nullopt;
  }
}

v1::DType ToProto(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return v1::FLOAT32;
    case DType::kBFloat16:
      return v1::BFLOAT16;
    case DType::kFloat16:
      return v1::FLOAT16;
    case DType::kInt8:
      return v1::INT8;
  }
  return v1::DTYPE_UNSPECIFIED;  // not reached: the switch covers every DType
}

}  // namespace attend::server
