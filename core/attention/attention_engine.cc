#include "core/attention/attention_engine.h"

#include <omp.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/half.h"
#include "core/attention/tile_attention.h"
#include "core/base/mutex.h"
#include "core/base/status_macros.h"
#include "core/kernels/cpu_features.h"
#include "core/kernels/onednn.h"
#include "core/kernels/simd.h"

namespace attend {
namespace {

// K or V of a [n_kv, n_head_kv, dim] tensor in the form the products read:
//   - for the vector kernels (decode-sized calls), the caller's memory itself when it is f32 or
//     bf16: each head's rows are strided, and the kernels stream them in place;
//   - for matmuls (prefill-sized calls), one head-major copy [n_head_kv][n_kv padded][dim] in the
//     arithmetic's dtype, zero-padded to whole tiles, so that every tile is a dense, fixed-shape
//     operand (strided operands take oneDNN's slower paths).
class Operand {
 public:
  // `threads` (0 = all) copy the rows: a serial copy of a long prefill's K and V left the other
  // threads idle for several percent of the call.
  Operand(const TensorView& view, int64_t heads, int64_t dim, bool head_major, int64_t padded_rows,
          DType dtype, bool round_bf16, int threads, ScratchPool* scratch)
      : dtype_(dtype), dim_(dim), heads_(heads), head_major_(head_major), scratch_(scratch) {
    const int64_t n = view.dim(0);
    if (!head_major) {
      if (view.dtype == dtype && !round_bf16) {
        data_ = static_cast<const char*>(view.data);
      } else {  // float16 input (or bf16 semantics over f32): one converted copy
        Fill(view, n, n, round_bf16, /*head_major=*/false, threads);
      }
      rows_ = n;
      return;
    }
    Fill(view, n, padded_rows, round_bf16, /*head_major=*/true, threads);
    rows_ = padded_rows;
  }
  ~Operand() { scratch_->Give(std::move(large_)); }
  Operand(const Operand&) = delete;
  Operand& operator=(const Operand&) = delete;

  // Head `head`'s row `row`, and the stride between its rows, in elements.
  const void* Row(int64_t head, int64_t row) const {
    const int64_t index = head_major_ ? (head * rows_ + row) * dim_ : (row * heads_ + head) * dim_;
    return data_ + index * DTypeSize(dtype_);
  }
  int64_t stride() const { return head_major_ ? dim_ : heads_ * dim_; }
  DType dtype() const { return dtype_; }

 private:
  // Copies (converting) the n rows of every head and zeroes the padding rows [n, rows). The
  // buffers are not value-initialised first: that would write every byte twice.
  void Fill(const TensorView& view, int64_t n, int64_t rows, bool round_bf16, bool head_major,
            int threads) {
    const size_t elements = static_cast<size_t>(heads_ * rows * dim_);
    const auto target = [&](int64_t h, int64_t r) {
      return head_major ? (h * rows + r) * dim_ : (r * heads_ + h) * dim_;
    };
    if (threads <= 0) threads = omp_get_max_threads();
    // Small copies stay on the calling thread: a parallel region costs microseconds.
    const bool parallel = elements >= (size_t{1} << 16);
    if (dtype_ == DType::kBFloat16) {
      uint16_t* out = static_cast<uint16_t*>(Allocate(elements * sizeof(uint16_t)));
#pragma omp parallel for num_threads(threads) schedule(static) if (parallel)
      for (int64_t r = 0; r < rows; ++r) {
        for (int64_t h = 0; h < heads_; ++h) {
          uint16_t* dst = out + target(h, r);
          if (r >= n) {
            std::fill_n(dst, dim_, uint16_t{0});
            continue;
          }
          const int64_t src = (r * heads_ + h) * dim_;
          if (view.dtype == DType::kBFloat16) {
            std::memcpy(dst, static_cast<const uint16_t*>(view.data) + src,
                        dim_ * sizeof(uint16_t));
            continue;
          }
          for (int64_t c = 0; c < dim_; ++c) dst[c] = FloatToBf16(view.At(src + c));
        }
      }
      data_ = reinterpret_cast<const char*>(out);
      return;
    }
    float* out = static_cast<float*>(Allocate(elements * sizeof(float)));
#pragma omp parallel for num_threads(threads) schedule(static) if (parallel)
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t h = 0; h < heads_; ++h) {
        float* dst = out + target(h, r);
        if (r >= n) {
          std::fill_n(dst, dim_, 0.0f);
          continue;
        }
        const int64_t src = (r * heads_ + h) * dim_;
        if (view.dtype == DType::kFloat32) {
          std::memcpy(dst, static_cast<const float*>(view.data) + src, dim_ * sizeof(float));
        } else {
          for (int64_t c = 0; c < dim_; ++c) dst[c] = view.At(src + c);
        }
        if (round_bf16) {
          for (int64_t c = 0; c < dim_; ++c) dst[c] = Bf16ToFloat(FloatToBf16(dst[c]));
        }
      }
    }
    data_ = reinterpret_cast<const char*>(out);
  }

  // Memory for the copy, not initialised (Fill writes every element). Copies of a megabyte or
  // more, a prefill's, reuse the engine's cached buffers: mapped afresh on each call, they were
  // faulted in and zeroed by the kernel every time. Small ones, such as a converted decode
  // input's, come from the heap.
  void* Allocate(size_t bytes) {
    if (bytes >= kScratchBytes) {
      large_ = scratch_->Take(static_cast<int64_t>(bytes));
      if (large_) return large_.data();
    }
    small_.reset(new char[bytes]);
    return small_.get();
  }
  static constexpr size_t kScratchBytes = size_t{1} << 20;

  const char* data_ = nullptr;
  DType dtype_;
  int64_t dim_, heads_, rows_ = 0;
  bool head_major_;
  ScratchPool* scratch_;
  LargeMemory large_;
  std::unique_ptr<char[]> small_;
};

// One key/value head's keys and values, in tiles.
class HeadTiles : public tile::KeyTiles {
 public:
  HeadTiles(const Operand& k, const Operand& v, const AttentionShape& s, int64_t head,
            int64_t tile_width, bool padded_memory, bool rounded_to_bf16)
      : k_(k), v_(v), head_(head) {
    width = tile_width;
    keys = s.n_kv;
    head_dim = s.head_dim;
    head_dim_v = s.head_dim_v;
    dtype = k.dtype();
    key_stride = k.stride();
    value_stride = v.stride();
    padded = padded_memory;
    bf16_exact = rounded_to_bf16;
  }
  const void* Keys(int64_t t) const override { return k_.Row(head_, t * width); }
  const void* Values(int64_t t) const override { return v_.Row(head_, t * width); }

 private:
  const Operand& k_;
  const Operand& v_;
  int64_t head_;
};

// Keys per tile: decode kernels stream any width; matmul tiles of up to 512 keys (each job's
// last tile is cut to a multiple of 64) keep the products efficient and the shapes few.
constexpr int64_t kKernelTile = AttentionEngine::kKernelKeyTile;
constexpr int64_t kMatmulTile = AttentionEngine::kKeyTile;

}  // namespace

absl::Status AttentionEngine::Compute(const TensorView& q, const TensorView& k, const TensorView& v,
                                      const AttentionOptions& options,
                                      const AttentionLimits& limits, absl::Span<float> output,
                                      absl::Span<float> weights, AttentionStats* stats,
                                      const Cancellation* cancel) const {
  ATTEND_ASSIGN_OR_RETURN(const AttentionProblem problem,
                          PrepareAttention(q, k, v, options, limits, options_.threads));
  return Compute(problem, output, weights, stats, cancel);
}

absl::Status AttentionEngine::Compute(const AttentionProblem& problem, absl::Span<float> output,
                                      absl::Span<float> weights, AttentionStats* stats,
                                      const Cancellation* cancel) const {
  const TensorView& q = problem.q();
  const TensorView& k = problem.k();
  const TensorView& v = problem.v();
  const AttentionOptions& options = problem.options();
  const AttentionShape& s = problem.shape();
  if (static_cast<int64_t>(output.size()) != s.output_elements()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "output holds ", output.size(), " floats; the shapes need ", s.output_elements()));
  }
  if (!weights.empty() && static_cast<int64_t>(weights.size()) != s.weight_elements()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "weights hold ", weights.size(), " floats; the shapes need ", s.weight_elements()));
  }
  ATTEND_RETURN_IF_ERROR(CheckCancelled(cancel, "attention"));
  const auto start = std::chrono::steady_clock::now();
  const Precision precision = ResolvePrecision(options.precision, q, k, v);
  const bool bf16 = precision == Precision::kBFloat16;
  const float scale = EffectiveScale(options, s);
  const bool native_bf16 = bf16 && UseBf16Matmul() && tile::NativeBf16Scale(scale);
  const tile::Arithmetic arithmetic{native_bf16 ? DType::kBFloat16 : DType::kFloat32, bf16};

  const bool kernels = tile::UsesKernels(s.n_q, s.group_size());
  const int64_t width = kernels ? kKernelTile : kMatmulTile;
  const int64_t padded_rows = (s.n_kv + width - 1) / width * width;
  // Kernels read f32 or bf16 in place (float16 is converted to f32); matmuls need the
  // arithmetic's dtype. Keys and values share one dtype (the tiles carry one): bf16 in place
  // only when both are bf16, else f32, converting whichever is not.
  const bool kv_bf16 = k.dtype == DType::kBFloat16 && v.dtype == DType::kBFloat16;
  const DType storage = (kernels ? kv_bf16 : native_bf16) ? DType::kBFloat16 : DType::kFloat32;
  const bool round_kv = !kernels && bf16 && !native_bf16;
  const Operand pk(k, s.n_head_kv, s.head_dim, !kernels, padded_rows, storage, round_kv,
                   options_.threads, scratch_.get());
  const Operand pv(v, s.n_head_kv, s.head_dim_v, !kernels, padded_rows, storage, round_kv,
                   options_.threads, scratch_.get());
  // The tiles pack their own query rows from f32 or bf16 in place; float16 is converted first.
  std::unique_ptr<float[]> qf;
  const void* q_rows = q.data;
  DType q_dtype = q.dtype;
  if (q.dtype != DType::kFloat32 && q.dtype != DType::kBFloat16) {
    qf.reset(new float[static_cast<size_t>(q.num_elements())]);  // every element written
    ConvertToFloat(q, qf.get());
    q_rows = qf.get();
    q_dtype = DType::kFloat32;
  }

  std::vector<HeadTiles> heads;
  heads.reserve(static_cast<size_t>(s.n_head_kv));
  for (int64_t g = 0; g < s.n_head_kv; ++g)
    heads.emplace_back(pk, pv, s, g, width, !kernels, round_kv);
  // Weights rows are written only at visible keys: clear them first.
  if (!weights.empty()) std::fill(weights.begin(), weights.end(), 0.0f);
  std::vector<tile::Work> works(static_cast<size_t>(s.n_head_kv));
  for (int64_t g = 0; g < s.n_head_kv; ++g) {
    tile::Work& w = works[static_cast<size_t>(g)];
    w.keys = &heads[static_cast<size_t>(g)];
    w.q = q_rows;
    w.q_dtype = q_dtype;
    w.n_q = s.n_q;
    w.n_head = s.n_head;
    w.head_kv = g;
    w.group = s.group_size();
    w.mask = options.mask;
    w.scale = scale;
    w.arithmetic = arithmetic;
    w.output = output.data();
    w.weights = weights.empty() ? nullptr : weights.data();
    // The heads' rows interleave in the caller's tensor: decode reads them span by span.
    w.key_span = s.n_head_kv > 1 ? kKernelTile : 0;
    w.packing = options_.tile_packing;
  }
  bool outputs_finite = false;
  ATTEND_RETURN_IF_ERROR(tile::Run(works, options_.threads, cancel, &outputs_finite));

  // A non-finite output means q.k * scale, or the weighted sum of v (summed before it is divided
  // by the weights' sum), overflowed. The tiles check the values as they write them; only then
  // is the output scanned for the first one, for the message.
  const int64_t first_bad =
      outputs_finite
          ? -1
          : FirstNonFiniteElement(
                TensorView{DType::kFloat32, {static_cast<int64_t>(output.size())}, output.data()},
                options_.threads);
  if (first_bad >= 0) {
    // A NaN or infinity among the inputs poisons the output too; a decode-sized problem's k and
    // v were not scanned beforehand (PrepareAttention): name the tensor and element.
    if (!problem.kv_checked()) {
      ATTEND_RETURN_IF_ERROR(CheckFinite(k, "k", options_.threads));
      ATTEND_RETURN_IF_ERROR(CheckFinite(v, "v", options_.threads));
    }
    return absl::InvalidArgumentError(
        absl::StrCat("attention output element ", first_bad,
                     " is not finite: the scores (q.k * scale) or the weighted sum of v "
                     "overflowed float32; the inputs' magnitudes are too large (q ",
                     ShapeToString(q.shape), ", scale ", scale, ")"));
  }
  if (stats) {
    *stats = CountAttentionWork(s, options.mask);
    stats->compute_seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    // Decode-sized calls run the vector kernels: the engine names the set of the storage type
    // they read (K and V as f32 or bf16).
    stats->engine =
        absl::StrCat("onednn/", PrecisionName(precision), bf16 && !native_bf16 ? "-emulated" : "",
                     kernels ? absl::StrCat("+", simd::KernelName({storage})) : "");
  }
  return absl::OkStatus();
}

}  // namespace attend
