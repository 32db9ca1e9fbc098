// Where a token's keys and values live inside a block.
//
// One block holds `tokens_per_block` consecutive tokens of one layer of one sequence, for every
// key/value head, head-major so that each head's keys (and values) are one dense
// [tokens_per_block, head_dim] matrix, which is what the attention kernels read:
//   keys         [n_head_kv][tokens_per_block][head_dim]     at offset 0
//   values       [n_head_kv][tokens_per_block][head_dim_v]   after the keys
//   int8 only:
//   key scales   [n_head_kv][tokens_per_block] float32       after the values
//   value scales [n_head_kv][tokens_per_block] float32       after the key scales
// Elements are float32, bfloat16 or int8. int8 is symmetric per token and head: a row x is
// stored as the integers nearest x * (127 / max|x|) in float32 (ties to even), with the scale
// s = max|x| / 127, so each value is off by at most s / 2, times 1 + 2^-14 for float32's
// roundings (token_storage.cc).
#ifndef ATTEND_CORE_KV_CACHE_LAYOUT_H_
#define ATTEND_CORE_KV_CACHE_LAYOUT_H_

#include <algorithm>
#include <cstdint>

#include "core/base/tensor.h"

namespace attend::kv {

// Upper bound on tokens per block: beyond it a block's tile stops helping the matmuls and only
// raises the memory a short sequence pins.
inline constexpr int64_t kMaxTokensPerBlock = 1024;

struct BlockLayout {
  int64_t n_head_kv = 0;
  int64_t head_dim = 0;
  int64_t head_dim_v = 0;
  DType dtype = DType::kBFloat16;
  int64_t tokens_per_block = 0;

  int64_t element_bytes() const { return DTypeSize(dtype); }
  bool quantized() const { return dtype == DType::kInt8; }
  // Bytes one token of one layer takes in the cache (its scales included).
  int64_t token_bytes() const {
    return n_head_kv * ((head_dim + head_dim_v) * element_bytes() + (quantized() ? 8 : 0));
  }
  int64_t key_offset(int64_t head, int64_t token) const {
    return (head * tokens_per_block + token) * head_dim * element_bytes();
  }
  int64_t value_offset(int64_t head, int64_t token) const {
    return n_head_kv * tokens_per_block * head_dim * element_bytes() +
           (head * tokens_per_block + token) * head_dim_v * element_bytes();
  }
  // int8 only: the scale of head `head`'s token `token`, keys and values.
  int64_t key_scale_offset(int64_t head, int64_t token) const {
    const int64_t values_end =
        n_head_kv * tokens_per_block * (head_dim + head_dim_v) * element_bytes();
    const int64_t aligned = (values_end + 3) / 4 * 4;
    return aligned + (head * tokens_per_block + token) * 4;
  }
  int64_t value_scale_offset(int64_t head, int64_t token) const {
    return key_scale_offset(n_head_kv, 0) + (head * tokens_per_block + token) * 4;
  }
  int64_t blocks_for(int64_t tokens) const {
    return (tokens + tokens_per_block - 1) / tokens_per_block;
  }
};

// The layout for blocks of `block_bytes`; tokens_per_block is 0 when one token does not fit.
inline BlockLayout MakeLayout(int64_t n_head_kv, int64_t head_dim, int64_t head_dim_v, DType dtype,
                              int64_t block_bytes) {
  BlockLayout layout{n_head_kv, head_dim, head_dim_v, dtype, 0};
  const int64_t token = layout.token_bytes();
  // int8 scales start at a 4-byte boundary: keep 4 bytes for the padding.
  const int64_t usable = layout.quantized() ? block_bytes - 4 : block_bytes;
  layout.tokens_per_block = token > 0 ? std::min(kMaxTokensPerBlock, usable / token) : 0;
  return layout;
}

}  // namespace attend::kv

#endif  // ATTEND_CORE_KV_CACHE_LAYOUT_H_
