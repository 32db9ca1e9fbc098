#include "core/attention/tile_operands.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "common/half.h"

namespace attend::tile {

// Vectorised, row by row: this runs for every tile a prefill
// visits (bf16 semantics over f32 rows, or bf16 and int8 storage without a native bf16 matmul),
// and a scalar loop here took as long as the tile's matmuls.
void ConvertRows(const simd::Rows& src, int64_t rows, int64_t out_rows, int64_t cols, bool round,
                 float* out) {
  for (int64_t r = 0; r < rows; ++r) {
    simd::RowToFloat(src, r, cols, out + r * cols);
    if (round) simd::RoundToBf16(out + r * cols, cols);
  }
  std::fill(out + rows * cols, out + out_rows * cols, 0.0f);
}

namespace {

// Value `c` of row `r` of a tile's storage, dequantized.
float Element(const simd::Rows& src, int64_t r, int64_t c) {
  const int64_t i = r * src.stride + c;
  switch (src.dtype) {
    case DType::kBFloat16:
      return Bf16ToFloat(static_cast<const uint16_t*>(src.data)[i]);
    case DType::kInt8:
      return static_cast<float>(static_cast<const int8_t*>(src.data)[i]) * src.scales[r];
    default:
      return static_cast<const float*>(src.data)[i];
  }
}

// Whether rows of `dtype` already hold bf16 values: bf16 storage, or f32 the caller rounded
// (`bf16_exact`), so bf16 semantics read them as they are.
bool HoldsBf16(DType dtype, bool bf16_exact) {
  return dtype == DType::kBFloat16 || (bf16_exact && dtype == DType::kFloat32);
}

// A tile's keys or values as the matmul (or, with `for_kernels`, the vector kernels) needs them:
// the memory itself when its dtype fits and it has every row the operand shape covers;
// otherwise a converted (dequantized), zero-padded, dense thread-local copy. `rows` rows are
// valid; the matmul reads `width` (zero-padded when the memory has fewer).
simd::Rows PrepareOperand(const simd::Rows& src, bool padded, bool bf16_exact, int64_t rows,
                          int64_t width, int64_t cols, const Arithmetic& a, bool for_kernels,
                          std::vector<float>& f32, std::vector<uint16_t>& bf16) {
  const bool exact = HoldsBf16(src.dtype, bf16_exact);
  if (for_kernels) {
    // The kernels read every storage type in place; bf16 semantics over f32 or int8 rows need
    // the rounded values.
    if (!a.round_bf16 || exact) return src;
  } else {
    const bool type_fits = a.matmul == DType::kBFloat16
                               ? src.dtype == DType::kBFloat16
                               : (src.dtype == DType::kFloat32 && (!a.round_bf16 || exact));
    if (type_fits && (padded || rows >= width)) return src;
  }
  rows = std::min(rows, for_kernels ? rows : width);
  const int64_t out_rows = for_kernels ? rows : width;
  if (!for_kernels && a.matmul == DType::kBFloat16) {
    uint16_t* out = Buffer(bf16, out_rows * cols);
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t c = 0; c < cols; ++c) out[r * cols + c] = FloatToBf16(Element(src, r, c));
    }
    std::fill(out + rows * cols, out + out_rows * cols, uint16_t{0});
    return {out, DType::kBFloat16, cols, nullptr};
  }
  float* out = Buffer(f32, out_rows * cols);
  ConvertRows(src, rows, out_rows, cols, a.round_bf16 && !exact, out);
  return {out, DType::kFloat32, cols, nullptr};
}

}  // namespace

// Tile `t`'s keys (or values, with `values`; `valid` rows of `cols` at `src`) as its operand:
// for the f32 matmul path, from the Run's shared store when they need converting (bf16 or int8
// storage, or bf16 semantics over f32 that is not already rounded) and the store has them or
// can take them; otherwise as PrepareOperand makes them. `width` is the matmul's key count.
simd::Rows TileOperand(const Job& job, int64_t t, bool values, const simd::Rows& src, int64_t valid,
                       int64_t width, int64_t cols, bool kernels, std::vector<float>& f32,
                       std::vector<uint16_t>& bf16) {
  const KeyTiles& keys = *job.keys;
  const Arithmetic& a = job.arithmetic;
  const bool exact = HoldsBf16(src.dtype, keys.bf16_exact);
  const bool in_place = src.dtype == DType::kFloat32 && (!a.round_bf16 || exact);
  if (!kernels && !in_place && job.converted != nullptr && a.matmul == DType::kFloat32) {
    const float* shared =
        job.converted->Get(job.work, t, values, keys.width, cols, [&](float* out) {
          ConvertRows(src, valid, keys.width, cols, a.round_bf16 && !exact, out);
        });
    if (shared != nullptr) return {shared, DType::kFloat32, cols, nullptr};
  }
  return PrepareOperand(src, keys.padded, keys.bf16_exact, valid, width, cols, a, kernels, f32,
                        bf16);
}

onednn::MatmulSpec ScoresSpec(int64_t rows, int64_t d, int64_t cols, int64_t k_stride, DType type) {
  onednn::MatmulSpec spec;
  spec.src = {rows, d, d, 1, type};
  spec.weights = {d, cols, 1, k_stride, type};
  spec.dst = {rows, cols, cols, 1, DType::kFloat32};
  return spec;
}

onednn::MatmulSpec ValuesSpec(int64_t rows, int64_t cols, int64_t dv, int64_t v_stride,
                              DType type) {
  onednn::MatmulSpec spec;
  spec.src = {rows, cols, cols, 1, type};
  spec.weights = {cols, dv, v_stride, 1, type};
  spec.dst = {rows, dv, dv, 1, DType::kFloat32};
  return spec;
}

onednn::MatmulSpec Packed(onednn::MatmulSpec spec) {
  spec.weights.packed = true;
  return spec;
}

bool PackTile(const Job& job, int64_t t, bool values, void* out) {
  const KeyTiles& keys = *job.keys;
  const int64_t width = keys.width, valid = std::min(width, keys.keys - t * width);
  thread_local std::vector<float> f32;
  thread_local std::vector<uint16_t> bf16;
  const DType type = job.arithmetic.matmul;
  if (values) {
    const simd::Rows v =
        TileOperand(job, t, /*values=*/true,
                    {keys.Values(t), keys.dtype, keys.value_stride, keys.ValueScales(t)}, valid,
                    width, keys.head_dim_v, /*kernels=*/false, f32, bf16);
    const onednn::MatmulSpec plain =
        ValuesSpec(kQueryTileRows, width, keys.head_dim_v, v.stride, type);
    return onednn::PackWeights(Packed(plain), plain.weights, v.data, out).ok();
  }
  const simd::Rows k = TileOperand(job, t, /*values=*/false,
                                   {keys.Keys(t), keys.dtype, keys.key_stride, keys.KeyScales(t)},
                                   valid, width, keys.head_dim, /*kernels=*/false, f32, bf16);
  const onednn::MatmulSpec plain = ScoresSpec(kQueryTileRows, keys.head_dim, width, k.stride, type);
  return onednn::PackWeights(Packed(plain), plain.weights, k.data, out).ok();
}

std::pair<int64_t, int64_t> PackedTileBytes(int64_t width, int64_t d, int64_t dv, DType type) {
  struct Known {
    int64_t width, d, dv;
    DType type;
    std::pair<int64_t, int64_t> bytes;
  };
  thread_local std::vector<Known> known;
  for (const Known& k : known) {
    if (k.width == width && k.d == d && k.dv == dv && k.type == type) return k.bytes;
  }
  const absl::StatusOr<int64_t> k =
      onednn::PackedWeightsBytes(Packed(ScoresSpec(kQueryTileRows, d, width, 0, type)));
  const absl::StatusOr<int64_t> v =
      onednn::PackedWeightsBytes(Packed(ValuesSpec(kQueryTileRows, width, dv, 0, type)));
  const std::pair<int64_t, int64_t> bytes =
      k.ok() && v.ok() ? std::pair<int64_t, int64_t>{*k, *v} : std::pair<int64_t, int64_t>{0, 0};
  constexpr size_t kKeep = 16;  // shapes per thread
  if (known.size() >= kKeep) known.erase(known.begin());
  known.push_back({width, d, dv, type, bytes});
  return bytes;
}

}  // namespace attend::tile
