#include "core/kv_cache/token_storage.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "absl/strings/str_cat.h"
#include "common/half.h"

namespace attend::kv {
namespace {

// `count` elements from element `offset` of `src` as floats: in place when `src` is float32
// (the common case, read without TensorView::At's per-element dispatch), else widened into
// `buffer`.
const float* FloatRow(const TensorView& src, int64_t offset, int64_t count,
                      std::vector<float>* buffer) {
  if (src.dtype == DType::kFloat32) return static_cast<const float*>(src.data) + offset;
  buffer->resize(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) (*buffer)[static_cast<size_t>(i)] = src.At(offset + i);
  return buffer->data();
}

// Stores `count` elements starting at element `offset` of `src` as symmetric int8 with one scale
// (max |x| / 127; 0 for an all-zero row) in `*scale`: each value the integer nearest
// x * (127 / max) in float32 (ties to even). Read back as int8 * scale, a value is within
// max / 254 x (1 + 2^-14): the scale, 127 / max and the product each round by up to 2^-24, which
// can tip a value just short of a midpoint to the far side (at most 763 x 2^-24 of half a step
// in all); exact rounding would cost a double division per value on every append.
void Quantize(const TensorView& src, int64_t offset, int64_t count, int8_t* dst, float* scale) {
  thread_local std::vector<float> buffer;
  const float* x = FloatRow(src, offset, count, &buffer);
  float max = 0.0f;
  for (int64_t i = 0; i < count; ++i) max = std::max(max, std::abs(x[i]));
  *scale = max / 127.0f;
  // Near FLT_MAX, max / 127 may round up so that 127 * scale, the largest value read back,
  // overflows to infinity; every later step over the row would then fail "not finite" although
  // the Append succeeded. One ulp less keeps it finite (a relative error of 2^-24, far below
  // int8's own 1/254).
  while (std::isinf(*scale * 127.0f)) *scale = std::nextafter(*scale, 0.0f);
  const float inverse = max > 0.0f ? 127.0f / max : 0.0f;
  if (max > 0.0f && *scale < std::numeric_limits<float>::min()) {
    // A subnormal scale (max below about 1.5e-36) keeps fewer bits than the values need: read
    // back as int8 * scale, values quantized against the exact 127 / max were off by the
    // scale's rounding times up to 127, past max / 254 (an outside tester's finding). The scale
    // is rounded up instead, so that 127 * scale covers max, and the values are quantized
    // against that scale itself: each within scale / 2, max / 254 plus half of float's smallest
    // step. (127 / max also overflows float below about 3.7e-37; in double it is finite.)
    if (127.0 * static_cast<double>(*scale) < static_cast<double>(max)) {
      *scale = std::nextafter(*scale, 1.0f);
    }
    const double exact = 1.0 / static_cast<double>(*scale);
    for (int64_t i = 0; i < count; ++i) {
      dst[i] = static_cast<int8_t>(std::clamp(std::nearbyint(x[i] * exact), -127.0, 127.0));
    }
    return;
  }
  // Rounds half to even like std::nearbyint in the default rounding mode, without its library
  // call per value: adding 1.5 x 2^23 leaves no fraction bits, so the sum is rounded to an
  // integer; exact for |v| <= 2^22, and |v| <= 127 here. (This loop with nearbyint was 12.6% of
  // a 2048-token int8 prefill's time.)
  constexpr float kRound = 12582912.0f;
  for (int64_t i = 0; i < count; ++i) {
    const float q = (x[i] * inverse + kRound) - kRound;
    dst[i] = static_cast<int8_t>(std::clamp(q, -127.0f, 127.0f));
  }
}

// Copies `count` elements starting at element `offset` of `src` into `dst` as `dtype`
// (float32 or bfloat16).
void CopyConverted(const TensorView& src, int64_t offset, int64_t count, DType dtype, char* dst) {
  if (src.dtype == dtype) {
    std::memcpy(dst, static_cast<const char*>(src.data) + offset * DTypeSize(dtype),
                static_cast<size_t>(count * DTypeSize(dtype)));
    return;
  }
  if (dtype == DType::kFloat32) {
    auto* out = reinterpret_cast<float*>(dst);
    for (int64_t i = 0; i < count; ++i) out[i] = src.At(offset + i);
    return;
  }
  thread_local std::vector<float> buffer;
  const float* x = FloatRow(src, offset, count, &buffer);
  auto* out = reinterpret_cast<uint16_t*>(dst);  // bf16 slots are 2-byte aligned in a block
  for (int64_t i = 0; i < count; ++i) out[i] = FloatToBf16(x[i]);
}

}  // namespace

int64_t BlocksToTake(const CachedLayer& layer, const BlockLayout& layout, int64_t n) {
  const int64_t first = layer.tokens / layout.tokens_per_block;
  const int64_t last = layout.blocks_for(layer.tokens + n);  // exclusive
  int64_t needed = 0;
  for (int64_t b = first; b < last; ++b) {
    // A block to write into is new, or existing and shared (copied before writing).
    if (b >= static_cast<int64_t>(layer.blocks.size()) ||
        layer.blocks[static_cast<size_t>(b)].use_count() > 1) {
      ++needed;
    }
  }
  return needed;
}

std::vector<const Block*> BlocksToCopy(const CachedLayer& layer, const BlockLayout& layout,
                                       int64_t n) {
  std::vector<const Block*> copies;
  const int64_t first = layer.tokens / layout.tokens_per_block;
  const int64_t last = std::min<int64_t>(layout.blocks_for(layer.tokens + n), layer.blocks.size());
  for (int64_t b = first; b < last; ++b) {
    const BlockRef& block = layer.blocks[static_cast<size_t>(b)];
    if (block.use_count() > 1) copies.push_back(block.get());
  }
  return copies;
}

void WriteTokens(const TensorView& k, const TensorView& v, const BlockLayout& layout,
                 int64_t block_bytes, int threads, std::vector<BlockRef>& fresh,
                 CachedLayer* layer) {
  const int64_t tpb = layout.tokens_per_block;
  const int64_t n = k.dim(0);
  const int64_t first = layer->tokens / tpb;
  const int64_t last = layout.blocks_for(layer->tokens + n);
  for (int64_t b = first; b < last; ++b) {
    if (b >= static_cast<int64_t>(layer->blocks.size())) {
      layer->blocks.push_back(std::move(fresh.back()));
      fresh.pop_back();
    } else if (layer->blocks[static_cast<size_t>(b)].use_count() > 1) {
      BlockRef copy = std::move(fresh.back());
      fresh.pop_back();
      std::memcpy(copy->data, layer->blocks[static_cast<size_t>(b)]->data,
                  static_cast<size_t>(block_bytes));
      layer->blocks[static_cast<size_t>(b)] = std::move(copy);
    }
  }
  const int64_t d = layout.head_dim, dv = layout.head_dim_v;
  const int64_t start = layer->tokens;
  std::vector<BlockRef>& blocks = layer->blocks;
  // Tokens write disjoint slots: a long append converts them on every compute thread (serially,
  // a 2048-token prefill's conversion to bf16 took 8% of its time while the other threads
  // waited).
  if (threads <= 0) threads = omp_get_max_threads();
#pragma omp parallel for schedule(static) num_threads(threads) if (n * layout.n_head_kv >= 256)
  for (int64_t t = 0; t < n; ++t) {
    const int64_t position = start + t;
    char* block = blocks[static_cast<size_t>(position / tpb)]->data;
    const int64_t slot = position % tpb;
    for (int64_t g = 0; g < layout.n_head_kv; ++g) {
      if (layout.quantized()) {
        Quantize(k, (t * layout.n_head_kv + g) * d, d,
                 reinterpret_cast<int8_t*>(block + layout.key_offset(g, slot)),
                 reinterpret_cast<float*>(block + layout.key_scale_offset(g, slot)));
        Quantize(v, (t * layout.n_head_kv + g) * dv, dv,
                 reinterpret_cast<int8_t*>(block + layout.value_offset(g, slot)),
                 reinterpret_cast<float*>(block + layout.value_scale_offset(g, slot)));
        continue;
      }
      CopyConverted(k, (t * layout.n_head_kv + g) * d, d, layout.dtype,
                    block + layout.key_offset(g, slot));
      CopyConverted(v, (t * layout.n_head_kv + g) * dv, dv, layout.dtype,
                    block + layout.value_offset(g, slot));
    }
  }
  layer->tokens += n;
}

void DropOutsideWindow(int64_t window, int64_t reserved_blocks, const BlockLayout& layout,
                       CachedLayer* layer) {
  if (window <= 0) return;
  // The next query (position layer->tokens) sees keys from tokens - window + 1 on; every later
  // one sees no earlier key. Blocks wholly before that are never read again.
  const int64_t first_needed = layer->tokens - window + 1;
  const int64_t tpb = layout.tokens_per_block;
  for (int64_t b = 0;
       (b + 1) * tpb <= first_needed && b < static_cast<int64_t>(layer->blocks.size()); ++b) {
    if (b < reserved_blocks) continue;  // reservations stay taken
    layer->blocks[static_cast<size_t>(b)].reset();
  }
}

absl::Status CheckWindowKept(absl::Span<const CachedLayer> layers, int64_t window,
                             const BlockLayout& layout, int64_t tokens, absl::string_view what,
                             absl::string_view sequence) {
  if (window <= 0) return absl::OkStatus();
  const int64_t tpb = layout.tokens_per_block;
  const int64_t first_needed = std::max<int64_t>(0, tokens - window + 1);
  for (size_t l = 0; l < layers.size(); ++l) {
    const CachedLayer& layer = layers[l];
    for (int64_t b = first_needed / tpb; b * tpb < tokens; ++b) {
      if (b < static_cast<int64_t>(layer.blocks.size()) && !layer.blocks[static_cast<size_t>(b)]) {
        int64_t kept_from = 0;
        while (kept_from < static_cast<int64_t>(layer.blocks.size()) &&
               !layer.blocks[static_cast<size_t>(kept_from)]) {
          ++kept_from;
        }
        return absl::OutOfRangeError(absl::StrCat(
            what, " ", tokens, " tokens: layer ", l, " of sequence ", sequence,
            " released the keys before token ", kept_from * tpb, " as its sliding window of ",
            window, " moved on; the shortest length possible is ", kept_from * tpb + window - 1));
      }
    }
    if (tokens > 0 && first_needed < layer.first_kept) {
      return absl::OutOfRangeError(
          absl::StrCat(what, " ", tokens, " tokens: layer ", l, " of sequence ", sequence,
                       " holds no keys before token ", layer.first_kept, " (its sliding window of ",
                       window, " had moved on when it was saved); the shortest length possible is ",
                       layer.first_kept + window - 1));
    }
  }
  return absl::OkStatus();
}

}  // namespace attend::kv
