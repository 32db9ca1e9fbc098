// Typed tensors for the client: float values with a shape, encoded into attend.v1.Tensor as
// float32, bfloat16 or float16 bytes (or `values` for hand-readable requests) and decoded back.
//
// Thread-safety: value types and pure functions.
#ifndef ATTEND_CLIENT_TENSOR_H_
#define ATTEND_CLIENT_TENSOR_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "attend/v1/tensor.pb.h"

namespace attend::client {

struct FloatTensor {
  std::vector<int64_t> shape;
  std::vector<float> values;  // row-major, product(shape) elements

  int64_t size() const;
};

// How a tensor travels: raw bytes of a dtype, or `values` (float32, human-readable).
enum class Wire { kFloat32, kBFloat16, kFloat16, kValues };

// Parses "f32", "float32", "bf16", "bfloat16", "f16", "float16" or "values".
absl::StatusOr<Wire> ParseWire(const std::string& name);

void EncodeTensor(const FloatTensor& tensor, Wire wire, v1::Tensor* out);
// INVALID_ARGUMENT when the message is malformed (shape and payload disagree, unknown dtype).
absl::StatusOr<FloatTensor> DecodeTensor(const v1::Tensor& tensor);

}  // namespace attend::client

#endif  // ATTEND_CLIENT_TENSOR_H_
