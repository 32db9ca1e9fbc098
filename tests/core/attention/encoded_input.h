// An attention input as a client sends it: float values encoded in f32, bf16 or f16, with the
// float values the encoding actually holds, which is what a reference must compute from. Shared
// by the differential tests of the engine and of the KV cache.
//
// Thread-safety: a value; `view` points into the Input's own vectors, so an Input is not
// copied or moved while a view of it is in use (vectors keep their buffers across a move, so a
// moved Input's view stays valid).
#ifndef ATTEND_TESTS_CORE_ATTENTION_ENCODED_INPUT_H_
#define ATTEND_TESTS_CORE_ATTENTION_ENCODED_INPUT_H_

#include <cstdint>
#include <utility>
#include <vector>

#include "common/half.h"
#include "core/base/tensor.h"

namespace attend::testing {

struct EncodedInput {
  std::vector<float> exact;    // the values the encoding holds
  std::vector<uint16_t> half;  // the bf16 or f16 encoding (empty for f32)
  TensorView view;             // of `half`, or of `exact` for f32
};

// `values` of `shape` encoded in `dtype` (kFloat32, kBFloat16 or kFloat16), rounded to nearest.
inline EncodedInput EncodeInput(std::vector<float> values, Shape shape, DType dtype) {
  EncodedInput in;
  in.exact = std::move(values);
  in.view = TensorView{dtype, std::move(shape), in.exact.data()};
  if (dtype == DType::kFloat32) return in;
  in.half.resize(in.exact.size());
  for (size_t i = 0; i < in.exact.size(); ++i) {
    in.half[i] = dtype == DType::kBFloat16 ? FloatToBf16(in.exact[i]) : FloatToHalf(in.exact[i]);
    in.exact[i] = dtype == DType::kBFloat16 ? Bf16ToFloat(in.half[i]) : HalfToFloat(in.half[i]);
  }
  in.view.data = in.half.data();
  return in;
}

}  // namespace attend::testing

#endif  // ATTEND_TESTS_CORE_ATTENTION_ENCODED_INPUT_H_
