// One layer's append in flight, the one write path of Append and DecodeBatch: the new tokens
// are written at once, and what a failed (or cancelled) attention must restore is kept: the
// layer's block count and the shared blocks that writing replaced with private copies (held
// here, they stay shared either way).
//
// Thread-safety: REQUIRES the sequence's lock for the object's whole lifetime.
#ifndef ATTEND_CORE_KV_CACHE_PENDING_WRITE_H_
#define ATTEND_CORE_KV_CACHE_PENDING_WRITE_H_

#include <cstdint>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "core/kv_cache/block_pool.h"
#include "core/kv_cache/kv_cache.h"
#include "core/kv_cache/paged_attention.h"
#include "core/kv_cache/sequence.h"

namespace attend::kv {

class PendingWrite {
 public:
  // Writes the input's k and v after the layer's tokens, taking blocks from the back of
  // `fresh`. REQUIRES: `fresh` holds BlocksToTake blocks for this input (token_storage.h).
  PendingWrite(Sequence& sequence, int64_t layer, const AppendInput& input, int64_t block_bytes,
               int threads, std::vector<BlockRef>& fresh);

  int64_t first_position() const { return first_position_; }
  int64_t layer_tokens() const { return layer_.tokens; }

  // The attention of `q` ([n, n_head, head_dim] f32) over the layer as it is now, causal, with
  // the sequence's window and scale.
  PagedProblem Problem(const float* q, float* output, float* weights) const;

  // Puts the layer and the sequence's token count back as they were.
  void Rollback();

  // Keeps the write, and releases the blocks the sliding window no longer needs.
  void Commit();

 private:
  static CachedLayer& LayerOf(Sequence& s, int64_t layer) ABSL_NO_THREAD_SAFETY_ANALYSIS {
    return s.layers[static_cast<size_t>(layer)];
  }

  Sequence& sequence_;
  CachedLayer& layer_;
  const int64_t n_;
  int64_t first_position_ = 0;
  size_t old_size_ = 0;
  std::vector<std::pair<size_t, BlockRef>> replaced_;
};

}  // namespace attend::kv

#endif  // ATTEND_CORE_KV_CACHE_PENDING_WRITE_H_
