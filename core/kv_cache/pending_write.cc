#include "core/kv_cache/pending_write.h"

#include <cmath>

#include "core/kv_cache/token_storage.h"

namespace attend::kv {

PendingWrite::PendingWrite(Sequence& sequence, int64_t layer, const AppendInput& input,
                           int64_t block_bytes, int threads, std::vector<BlockRef>& fresh)
    : sequence_(sequence), layer_(LayerOf(sequence, layer)), n_(input.k.dim(0)) {
  first_position_ = layer_.tokens;
  old_size_ = layer_.blocks.size();
  const int64_t tpb = sequence.layout.tokens_per_block;
  for (int64_t b = layer_.tokens / tpb; b < static_cast<int64_t>(old_size_); ++b) {
    if (layer_.blocks[static_cast<size_t>(b)].use_count() > 1) {
      replaced_.emplace_back(static_cast<size_t>(b), layer_.blocks[static_cast<size_t>(b)]);
    }
  }
  WriteTokens(input.k, input.v, sequence.layout, block_bytes, threads, fresh, &layer_);
  sequence.total_tokens += n_;
}

PagedProblem PendingWrite::Problem(const float* q, float* output, float* weights) const {
  const SequenceConfig& c = sequence_.config;
  PagedProblem p;
  p.layout = &sequence_.layout;
  p.blocks = &layer_.blocks;
  p.tokens = layer_.tokens;
  p.mask = {/*causal=*/true, c.window};
  // The sequence's own scale, or 1 / sqrt(head_dim).
  p.scale =
      c.scale ? *c.scale : static_cast<float>(1.0 / std::sqrt(static_cast<double>(c.head_dim)));
  p.q = q;
  p.n = n_;
  p.n_head = c.n_head;
  p.output = output;
  p.weights = weights;
  return p;
}

void PendingWrite::Rollback() {
  layer_.tokens = first_position_;
  sequence_.total_tokens -= n_;
  layer_.blocks.resize(old_size_);
  for (auto& [index, block] : replaced_) layer_.blocks[index] = std::move(block);
}

void PendingWrite::Commit() {
  DropOutsideWindow(sequence_.config.window, sequence_.layout.blocks_for(sequence_.reserved_tokens),
                    sequence_.layout, &layer_);
}

}  // namespace attend::kv
