// Conversion between attend.v1.Tensor messages and core tensor views, and of the other
// tensor.proto types (Precision, ComputeStats). Dtypes map through server/convert/dtype.h.
//
// Decoding validates everything a request can get wrong about a tensor, before anything is
// allocated from its shape: the dtype is known, exactly one of data/values is set, values come
// only as float32, every dimension is >= 1 and the element count neither overflows nor exceeds
// the limit, and the byte or value count matches the shape. Errors are INVALID_ARGUMENT
// (RESOURCE_EXHAUSTED for limits) naming the field path and the shape. The values themselves
// (NaN, infinities) are the core's to check, on every path and on its compute threads.
//
// Thread-safety: pure functions. A decoded view points into the message and lives as long as it.
#ifndef ATTEND_SERVER_CONVERT_TENSOR_H_
#define ATTEND_SERVER_CONVERT_TENSOR_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "attend/v1/tensor.pb.h"
#include "core/attention/attention.h"
#include "core/base/tensor.h"

namespace attend::server {

struct DecodedTensor {
  TensorView view;
  bool from_values = false;  // the caller used `values`; answer in kind
};

// Decodes `tensor` (the field `field`, e.g. "q" or "steps[3].k").
absl::StatusOr<DecodedTensor> DecodeTensor(const v1::Tensor& tensor, absl::string_view field,
                                           int64_t max_elements);

// The dtype for response tensors: FLOAT32 when unspecified (kUnspecifiedTensorDType);
// INVALID_ARGUMENT for INT8 (storage only) and unknown values.
absl::StatusOr<DType> DecodeOutputDType(v1::DType dtype, absl::string_view field);
// The precision enum (PRECISION_UNSPECIFIED is kAuto, as tensor.proto documents); INVALID_ARGUMENT
// for unknown values.
absl::StatusOr<Precision> DecodePrecision(v1::Precision precision);

// The engine's figures (attended_pairs, attention_flops, compute_seconds, engine); the call's
// own times (queue, prepare, cache, respond) are the service's to set.
void ToProto(const AttentionStats& stats, v1::ComputeStats* out);

// Writes float values into `out` with `shape`: as `values` when `as_values`, else as raw
// little-endian `dtype` bytes.
void EncodeTensor(absl::Span<const float> values, absl::Span<const int64_t> shape, bool as_values,
                  DType dtype, v1::Tensor* out);
// As EncodeTensor, for values held in several parts (one per sequence of a batch), written one
// after the other straight into `out`: a batch's output is not gathered into one buffer first
// (for a prompt chunk that copy was megabytes a call).
void EncodeTensorParts(absl::Span<const absl::Span<const float>> parts,
                       absl::Span<const int64_t> shape, bool as_values, DType dtype,
                       v1::Tensor* out);

// OK when every value fits `dtype` (float16 holds up to 65504); INVALID_ARGUMENT naming `field`,
// the element and what to ask for instead otherwise, so that no answer carries an infinity.
absl::Status CheckEncodable(absl::Span<const float> values, DType dtype, absl::string_view field);

// Bytes an encoded tensor of `elements` will occupy on the wire (payload only).
int64_t EncodedBytes(int64_t elements, bool as_values, DType dtype);

}  // namespace attend::server

#endif  // ATTEND_SERVER_CONVERT_TENSOR_H_
