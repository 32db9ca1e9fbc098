#include "core/kv_cache/paged_attention.h"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/attention/tile_attention.h"
#include "core/base/status_macros.h"
#include "core/base/tensor.h"
#include "core/kernels/cpu_features.h"
#include "core/kernels/onednn.h"
#include "core/kernels/simd.h"

namespace attend::kv {
namespace {

// One key/value head of a sequence's layer: tile i is block i.
class BlockTiles : public tile::KeyTiles {
 public:
  BlockTiles(const PagedProblem& p, int64_t head)
      : blocks_(p.blocks), layout_(p.layout), head_(head) {
    width = p.layout->tokens_per_block;
    keys = p.tokens;
    head_dim = p.layout->head_dim;
    head_dim_v = p.layout->head_dim_v;
    dtype = p.layout->dtype;
    key_stride = head_dim;
    value_stride = head_dim_v;
    padded = true;  // blocks are whole (and zeroed when taken from the pool)
  }
  const void* Keys(int64_t t) const override {
    return (*blocks_)[static_cast<size_t>(t)]->data + layout_->key_offset(head_, 0);
  }
  const void* Values(int64_t t) const override {
    return (*blocks_)[static_cast<size_t>(t)]->data + layout_->value_offset(head_, 0);
  }
  const float* KeyScales(int64_t t) const override {
    if (!layout_->quantized()) return nullptr;
    return reinterpret_cast<const float*>((*blocks_)[static_cast<size_t>(t)]->data +
                                          layout_->key_scale_offset(head_, 0));
  }
  const float* ValueScales(int64_t t) const override {
    if (!layout_->quantized()) return nullptr;
    return reinterpret_cast<const float*>((*blocks_)[static_cast<size_t>(t)]->data +
                                          layout_->value_scale_offset(head_, 0));
  }

 private:
  const std::vector<BlockRef>* blocks_;
  const BlockLayout* layout_;
  int64_t head_;
};

}  // namespace

absl::Status RunPagedAttention(absl::Span<const PagedProblem> problems, Precision precision,
                               int threads, AttentionStats* stats, const Cancellation* cancel) {
  const auto start = std::chrono::steady_clock::now();
  std::vector<BlockTiles> heads;
  std::vector<tile::Work> works;
  size_t total_heads = 0;
  for (const PagedProblem& p : problems) total_heads += static_cast<size_t>(p.layout->n_head_kv);
  heads.reserve(total_heads);  // Work keeps pointers into it
  works.reserve(total_heads);
  int64_t pairs = 0, flops = 0;
  bool any_f32 = false, any_bf16 = false, any_emulated = false, any_int8 = false;
  // The storage types the vector kernels read: each has its own kernel set (simd.h).
  std::vector<DType> kernel_storage;
  for (const PagedProblem& p : problems) {
    if (p.n == 0) continue;
    const BlockLayout& layout = *p.layout;
    const bool bf16 = precision == Precision::kBFloat16 ||
                      (precision == Precision::kAuto && layout.dtype == DType::kBFloat16);
    const bool native = bf16 && UseBf16Matmul() && tile::NativeBf16Scale(p.scale);
    any_f32 |= !bf16;
    any_bf16 |= bf16;
    any_emulated |= bf16 && !native;
    any_int8 |= layout.quantized();
    if (tile::UsesKernels(p.n, p.n_head / layout.n_head_kv) &&
        std::find(kernel_storage.begin(), kernel_storage.end(), layout.dtype) ==
            kernel_storage.end()) {
      kernel_storage.push_back(layout.dtype);
    }
    if (p.weights != nullptr) std::fill_n(p.weights, p.n_head * p.n * p.tokens, 0.0f);
    for (int64_t g = 0; g < layout.n_head_kv; ++g) {
      heads.emplace_back(p, g);
      tile::Work w;
      w.keys = &heads.back();
      w.q = p.q;
      w.n_q = p.n;
      w.n_head = p.n_head;
      w.head_kv = g;
      w.group = p.n_head / layout.n_head_kv;
      w.mask = p.mask;
      w.scale = p.scale;
      w.arithmetic = {native ? DType::kBFloat16 : DType::kFloat32, bf16};
      w.output = p.output;
      w.weights = p.weights;
      works.push_back(w);
    }
    const int64_t visible = VisiblePairs(p.mask, p.n, p.tokens) * p.n_head;
    pairs += visible;
    flops += visible * 2 * (layout.head_dim + layout.head_dim_v);
  }
  bool outputs_finite = false;
  ATTEND_RETURN_IF_ERROR(tile::Run(works, threads, cancel, &outputs_finite));
  // A non-finite output means q.k * scale, or the weighted sum of v, overflowed. The tiles check
  // the values as they write them (a prefill's output is megabytes: read again, it cost a pass).
  if (!outputs_finite) {
    return absl::InvalidArgumentError(
        "attention output is not finite: the scores (q.k * scale) or the weighted sum of v "
        "overflowed float32; the inputs' magnitudes are too large");
  }
  if (stats != nullptr) {
    stats->attended_pairs += pairs;
    stats->attention_flops += flops;
    stats->compute_seconds +=
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    // A batch of sequences stored in f32 and in bf16 names both arithmetics, and the kernel sets
    // of the storage types the vector kernels read ("+bf16:avx2,int8:avx512_vnni" where they
    // differ).
    stats->engine = absl::StrCat(
        "onednn-paged/", any_f32 && any_bf16 ? "f32,bf16" : (any_bf16 ? "bf16" : "f32"),
        any_emulated ? "-emulated" : "", any_int8 ? "+int8kv" : "",
        kernel_storage.empty() ? "" : absl::StrCat("+", simd::KernelName(kernel_storage)));
  }
  return absl::OkStatus();
}

absl::Status WarmUpPagedAttention(const BlockLayout& layout, int64_t n_head, int threads) {
  const int64_t width = layout.tokens_per_block;
  const int64_t group = n_head / layout.n_head_kv;
  // Enough tokens for the matmul path (tile::kMatmulRows folded rows), in whole blocks. Causal
  // over one block's worth of queries, each query tile ends at a later key, so the tiles take
  // every column count the matmul path uses (multiples of 64 up to the block width).
  const int64_t needed = std::max(width, (tile::kMatmulRows + group - 1) / group);
  const int64_t blocks = (needed + width - 1) / width;
  const int64_t tokens = blocks * width;
  const int64_t block_bytes = layout.token_bytes() * width + 64;  // scales' alignment included
  std::vector<char> memory(static_cast<size_t>(blocks * block_bytes + 64), 0);
  char* base = reinterpret_cast<char*>((reinterpret_cast<uintptr_t>(memory.data()) + 63) / 64 *
                                       64);  // blocks are 64-aligned
  std::vector<BlockRef> refs;
  for (int64_t b = 0; b < blocks; ++b) {
    // Non-owning: the scratch memory outlives the call.
    refs.push_back(std::make_shared<Block>(Block{base + b * block_bytes}));
  }
  std::vector<float> q(static_cast<size_t>(tokens * n_head * layout.head_dim), 0.0f);
  std::vector<float> out(static_cast<size_t>(tokens * n_head * layout.head_dim_v));
  PagedProblem p;
  p.layout = &layout;
  p.blocks = &refs;
  p.tokens = tokens;
  p.mask.causal = true;
  p.q = q.data();
  p.n = tokens;
  p.n_head = n_head;
  p.output = out.data();
  return RunPagedAttention({p}, Precision::kAuto, threads, nullptr);
}

}  // namespace attend::kv
