#include "core/attention_engine.h"

#include <omp.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/half.h"
#include "core/mutex.h"
#include "core/onednn.h"
#include "core/softmax.h"
#include "core/status_macros.h"

namespace attend {
namespace {

using dt = dnnl::memory::data_type;

// An input in the compute dtype: the caller's memory when it already matches, else a converted
// copy (one per tensor, never per head).
struct Operand {
  const char* data = nullptr;
  std::vector<float> f32;
  std::vector<uint16_t> bf16;
};

// `round_to_bf16` (f32 only) rounds every value to bf16 and back: bf16 inputs on f32 kernels.
Operand Prepare(const TensorView& view, dt type, bool round_to_bf16) {
  Operand op;
  const bool matches = (type == dt::f32 && view.dtype == DType::kFloat32 && !round_to_bf16) ||
                       (type == dt::bf16 && view.dtype == DType::kBFloat16);
  if (matches) {
    op.data = static_cast<const char*>(view.data);
    return op;
  }
  const int64_t n = view.num_elements();
  op.f32.resize(static_cast<size_t>(n));
  ConvertToFloat(view, op.f32.data());
  if (round_to_bf16 && view.dtype != DType::kBFloat16) {
    for (float& x : op.f32) x = Bf16ToFloat(FloatToBf16(x));
  }
  if (type == dt::f32) {
    op.data = reinterpret_cast<const char*>(op.f32.data());
    return op;
  }
  op.bf16.resize(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) op.bf16[i] = FloatToBf16(op.f32[i]);
  op.f32 = {};
  op.data = reinterpret_cast<const char*>(op.bf16.data());
  return op;
}

template <typename T>
T* ThreadBuffer(std::vector<T>& buffer, int64_t elements) {
  if (buffer.size() < static_cast<size_t>(elements)) buffer.resize(static_cast<size_t>(elements));
  return buffer.data();
}

struct TileContext {
  AttentionShape s;
  MaskSpec mask;
  float scale;
  dt type;
  bool emulate_bf16;  // f32 kernels with probabilities rounded to bf16, as a bf16 kernel sees them
  int64_t elem;       // bytes per input element
  int64_t block;
  const char* q;
  const char* k;
  const char* v;
  float* output;
  float* weights;  // nullptr when not requested
};

// One (query head, query block) tile.
absl::Status RunTile(const TileContext& c, int64_t h, int64_t b) {
  const AttentionShape& s = c.s;
  const int64_t i0 = b * c.block;
  const int64_t rows = std::min(c.block, s.n_q - i0);
  const int64_t g = h / s.group_size();
  // Visible ranges grow monotonically with the query position, so the tile needs the keys from
  // its first row's first visible key to its last row's last.
  const int64_t kb = VisibleKeys(c.mask, s.n_q, s.n_kv, i0).begin;
  const int64_t ke = std::max(kb, VisibleKeys(c.mask, s.n_q, s.n_kv, i0 + rows - 1).end);
  const int64_t nk = ke - kb;

  float* weight_rows = c.weights ? c.weights + (h * s.n_q + i0) * s.n_kv : nullptr;
  if (nk == 0) {
    for (int64_t r = 0; r < rows; ++r) {
      std::fill_n(c.output + ((i0 + r) * s.n_head + h) * s.head_dim_v, s.head_dim_v, 0.0f);
    }
    if (weight_rows) std::fill_n(weight_rows, rows * s.n_kv, 0.0f);
    return absl::OkStatus();
  }

  thread_local std::vector<float> score_buffer;
  thread_local std::vector<uint16_t> prob_buffer;
  thread_local std::vector<float> rounded_prob_buffer;
  float* scores;
  int64_t ld;
  if (weight_rows) {
    scores = weight_rows + kb;
    ld = s.n_kv;
  } else {
    scores = ThreadBuffer(score_buffer, rows * nk);
    ld = nk;
  }

  onednn::MatmulSpec qk;
  qk.src = {rows, s.head_dim, s.n_head * s.head_dim, 1, c.type};
  qk.weights = {s.head_dim, nk, 1, s.n_head_kv * s.head_dim, c.type};
  qk.dst = {rows, nk, ld, 1, dt::f32};
  ATTEND_RETURN_IF_ERROR(onednn::RunMatmul(qk, c.q + ((i0 * s.n_head + h) * s.head_dim) * c.elem,
                                           c.k + ((kb * s.n_head_kv + g) * s.head_dim) * c.elem,
                                           scores));

  for (int64_t r = 0; r < rows; ++r) {
    float* row = scores + r * ld;
    const KeyRange range = VisibleKeys(c.mask, s.n_q, s.n_kv, i0 + r);
    const int64_t lo = std::clamp(range.begin - kb, int64_t{0}, nk);
    const int64_t hi = std::clamp(range.end - kb, lo, nk);
    std::fill(row, row + lo, 0.0f);
    std::fill(row + hi, row + nk, 0.0f);
    SoftmaxInPlace(row + lo, hi - lo, c.scale);
    if (weight_rows) {
      std::fill(weight_rows + r * s.n_kv, weight_rows + r * s.n_kv + kb, 0.0f);
      std::fill(weight_rows + r * s.n_kv + ke, weight_rows + (r + 1) * s.n_kv, 0.0f);
    }
  }

  const void* probs = scores;
  int64_t probs_ld = ld;
  if (c.type == dt::bf16) {
    uint16_t* p = ThreadBuffer(prob_buffer, rows * nk);
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t j = 0; j < nk; ++j) p[r * nk + j] = FloatToBf16(scores[r * ld + j]);
    }
    probs = p;
    probs_ld = nk;
  } else if (c.emulate_bf16) {
    float* p = ThreadBuffer(rounded_prob_buffer, rows * nk);
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t j = 0; j < nk; ++j) p[r * nk + j] = Bf16ToFloat(FloatToBf16(scores[r * ld + j]));
    }
    probs = p;
    probs_ld = nk;
  }

  onednn::MatmulSpec pv;
  pv.src = {rows, nk, probs_ld, 1, c.type};
  pv.weights = {nk, s.head_dim_v, s.n_head_kv * s.head_dim_v, 1, c.type};
  pv.dst = {rows, s.head_dim_v, s.n_head * s.head_dim_v, 1, dt::f32};
  return onednn::RunMatmul(pv, probs, c.v + ((kb * s.n_head_kv + g) * s.head_dim_v) * c.elem,
                           c.output + (i0 * s.n_head + h) * s.head_dim_v);
}

}  // namespace

absl::Status AttentionEngine::Compute(const TensorView& q, const TensorView& k, const TensorView& v,
                                      const AttentionOptions& options,
                                      const AttentionLimits& limits, absl::Span<float> output,
                                      absl::Span<float> weights, AttentionStats* stats) const {
  ATTEND_ASSIGN_OR_RETURN(const AttentionShape s, ValidateAttention(q, k, v, options, limits));
  if (static_cast<int64_t>(output.size()) != s.output_elements()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "output holds ", output.size(), " floats; the shapes need ", s.output_elements()));
  }
  if (!weights.empty() && static_cast<int64_t>(weights.size()) != s.weight_elements()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "weights hold ", weights.size(), " floats; the shapes need ", s.weight_elements()));
  }
  const auto start = std::chrono::steady_clock::now();
  const Precision precision = ResolvePrecision(options.precision, q, k, v);
  const bool bf16 = precision == Precision::kBFloat16;
  const bool emulate_bf16 = bf16 && !onednn::HasBf16Matmul();
  const dt type = bf16 && !emulate_bf16 ? dt::bf16 : dt::f32;
  const Operand pq = Prepare(q, type, emulate_bf16);
  const Operand pk = Prepare(k, type, emulate_bf16);
  const Operand pv = Prepare(v, type, emulate_bf16);

  TileContext c;
  c.s = s;
  c.mask = options.mask;
  c.scale = EffectiveScale(options, s);
  c.type = type;
  c.emulate_bf16 = emulate_bf16;
  c.elem = type == dt::bf16 ? 2 : 4;
  c.block = std::clamp(kMaxTileElements / s.n_kv, int64_t{1}, std::min(kQueryBlock, s.n_q));
  c.q = pq.data;
  c.k = pk.data;
  c.v = pv.data;
  c.output = output.data();
  c.weights = weights.empty() ? nullptr : weights.data();

  const int64_t blocks = (s.n_q + c.block - 1) / c.block;
  const int64_t tiles = s.n_head * blocks;
  const int threads = options_.threads > 0 ? options_.threads : omp_get_max_threads();

  absl::Status status;
  if (tiles == 1 || threads == 1) {
    // One tile: let oneDNN parallelise inside the primitives instead.
    for (int64_t t = 0; t < tiles && status.ok(); ++t) status = RunTile(c, t / blocks, t % blocks);
  } else {
    Mutex mu;
    std::atomic<bool> failed{false};
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads)
    for (int64_t t = 0; t < tiles; ++t) {
      if (failed.load(std::memory_order_relaxed)) continue;
      absl::Status tile_status = RunTile(c, t / blocks, t % blocks);
      if (!tile_status.ok()) {
        MutexLock lock(&mu);
        if (status.ok()) status = tile_status;
        failed.store(true, std::memory_order_relaxed);
      }
    }
  }
  ATTEND_RETURN_IF_ERROR(status);

  for (size_t i = 0; i < output.size(); ++i) {
    if (!std::isfinite(output[i])) {
      return absl::InvalidArgumentError(absl::StrCat(
          "attention output element ", i, " is not finite: q.k * scale overflowed float32; ",
          "the inputs' magnitudes are too large (q ", ShapeToString(q.shape), ", scale ", c.scale,
          ")"));
    }
  }
  if (stats) {
    *stats = CountAttentionWork(s, options.mask);
    stats->compute_seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    stats->engine =
        absl::StrCat("onednn/", PrecisionName(precision), emulate_bf16 ? "-emulated" : "");
  }
  return absl::OkStatus();
}

}  // namespace attend
