// The one mapping between attend.v1.DType (tensor.proto) and the core's DType, in both
// directions. Every proto dtype the server reads or writes goes through it; which dtypes a field
// accepts, and how a refusal reads, stay with the field's decoder (DecodeTensor,
// DecodeOutputDType, FromProto(SequenceConfig)).
//
// DTYPE_UNSPECIFIED has no meaning of its own: each field documents its default, and the
// defaults differ, so FromProto takes it as an argument instead of picking one. A single
// built-in default would silently change one of the fields below:
//   kUnspecifiedTensorDType: a Tensor's dtype and every output_dtype mean FLOAT32 (tensor.proto:
//     "Means FLOAT32 where a default is documented"; attention.proto and kv_cache.proto say so
//     for output_dtype);
//   kUnspecifiedKvDType: a SequenceConfig's kv_dtype means BFLOAT16 (kv_cache.proto:
//     "BFLOAT16 (the default)").
//
// Thread-safety: pure functions.
#ifndef ATTEND_SERVER_CONVERT_DTYPE_H_
#define ATTEND_SERVER_CONVERT_DTYPE_H_

#include <optional>

#include "attend/v1/tensor.pb.h"
#include "core/base/tensor.h"

namespace attend::server {

// What DTYPE_UNSPECIFIED means for a tensor's dtype and for output_dtype.
inline constexpr DType kUnspecifiedTensorDType = DType::kFloat32;
// What DTYPE_UNSPECIFIED means for SequenceConfig.kv_dtype.
inline constexpr DType kUnspecifiedKvDType = DType::kBFloat16;

// The core dtype `dtype` names, `unspecified` for DTYPE_UNSPECIFIED; nullopt for a number that
// is no DType value (proto3 enums are open: any int32 arrives), for the caller to refuse naming
// its field.
std::optional<DType> FromProto(v1::DType dtype, DType unspecified);

// The proto value of `dtype`; never DTYPE_UNSPECIFIED (every core dtype has its own value), so
// that FromProto(ToProto(d), any) == d.
v1::DType ToProto(DType dtype);

}  // namespace attend::server

#endif  // ATTEND_SERVER_CONVERT_DTYPE_H_
