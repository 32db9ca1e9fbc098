// Where a token's keys and values live inside a block.
//
// One block holds `tokens_per_block` consecutive tokens of one layer of one sequence, for every
// key/value head, head-major so that each head's keys (and values) are one dense
// [tokens_per_block, head_dim] matrix, which is what the attention matmuls read:
//   keys   [n_head_kv][tokens_per_block][head_dim]     at offset 0
//   values [n_head_kv][tokens_per_block][head_dim_v]   after the keys
// Elements are float32 or bfloat16.
#ifndef ATTEND_CORE_KV_CACHE_LAYOUT_H_
#define ATTEND_CORE_KV_CACHE_LAYOUT_H_

#include <algorithm>
#include <cstdint>

#include "core/tensor.h"

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
  // Bytes one token of one layer takes in the cache.
  int64_t token_bytes() const { return n_head_kv * (head_dim + head_dim_v) * element_bytes(); }
  int64_t key_offset(int64_t head, int64_t token) const {
    return (head * tokens_per_block + token) * head_dim * element_bytes();
  }
  int64_t value_offset(int64_t head, int64_t token) const {
    return n_head_kv * tokens_per_block * head_dim * element_bytes() +
           (head * tokens_per_block + token) * head_dim_v * element_bytes();
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
  layout.tokens_per_block = token > 0 ? std::min(kMaxTokensPerBlock, block_bytes / token) : 0;
  return layout;
}

}  // namespace attend::kv

#endif  // ATTEND_CORE_KV_CACHE_LAYOUT_H_
