#include "core/attention/tile_attention.h"

#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <optional>

#include "common/half.h"
#include "core/base/mutex.h"
#include "core/base/status_macros.h"
#include "core/kernels/onednn.h"
#include "core/kernels/simd.h"

namespace attend::tile {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

template <typename T>
T* Buffer(std::vector<T>& buffer, int64_t elements) {
  if (buffer.size() < static_cast<size_t>(elements)) buffer.resize(static_cast<size_t>(elements));
  return buffer.data();
}

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

// Rows [0, rows) of `src` as dense f32 [out_rows, cols] at `out` (dequantized; rounded to bf16
// when `round`), zero past `rows`. Vectorised, row by row: this runs for the tiles a prefill
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

// Online-softmax update of one row from its scores `row` (tile-relative columns [lo, hi)
// visible): scales them by `scale` (1 when q was scaled), copies the scaled scores to `weights`
// when set, and turns them into probabilities exp(score - max), rounded to bf16 under bf16
// arithmetic: in place, or into `row_bf16` when set. The other of the `width` columns are zeroed
// (in `row_bf16` when set, else in `row`). Returns the factor the row's accumulator must be
// scaled by before this tile's contribution is added. Sets *overflowed when a visible scaled
// score is not finite.
float UpdateRow(float* row, int64_t lo, int64_t hi, int64_t width, float scale, bool round_bf16,
                float* weights, uint16_t* row_bf16, float* max, float* sum, bool* overflowed) {
  if (row_bf16 != nullptr) {
    std::fill(row_bf16, row_bf16 + lo, uint16_t{0});
    std::fill(row_bf16 + hi, row_bf16 + width, uint16_t{0});
  } else {
    std::fill(row, row + lo, 0.0f);
    std::fill(row + hi, row + width, 0.0f);
  }
  if (hi <= lo) return 1.0f;
  // Scaling, the finite check and the max in one pass. A score that is not finite (q.k * scale
  // overflowed, or a key held a NaN or an infinity) has no weight: a -inf one would get
  // exp(-inf) = 0 and drop out unnoticed. The whole call is to fail instead.
  const float row_max = simd::ScaleMax(row + lo, hi - lo, scale);
  if (weights != nullptr) std::copy(row + lo, row + hi, weights + lo);
  if (std::isnan(row_max)) {
    *overflowed = true;
    if (row_bf16 != nullptr) std::fill(row_bf16 + lo, row_bf16 + hi, uint16_t{0});
    return 1.0f;
  }
  const float new_max = std::max(*max, row_max);
  const float alpha = *max == kNegInf ? 0.0f : std::exp(*max - new_max);
  const float added = simd::ExpShiftSum(row + lo, new_max, row + lo, hi - lo);
  if (row_bf16 != nullptr) {
    simd::ToBf16(row + lo, hi - lo, row_bf16 + lo);
  } else if (round_bf16) {
    simd::RoundToBf16(row + lo, hi - lo);
  }
  *sum = *sum * alpha + added;
  *max = new_max;
  return alpha;
}

}  // namespace

// Key and value tiles converted to dense f32 once per Run, for the matmul path without a native
// bf16 matmul: a prefill's jobs for one head read the same tiles (once per query tile), and
// converting a bf16 or int8 tile on every read was 10% of a 2048-token prefill over bf16 blocks.
// A slot holds a whole tile (`width` rows, zero past the valid ones), so any job's cut serves.
// The first job to need a slot converts it; a job that finds it taken but not ready converts its
// own copy rather than wait. Memory is capped per Run (kMaxBytes); tiles past it are converted
// per job as before.
class ConvertedTiles {
 public:
  static constexpr int64_t kMaxBytes = int64_t{64} << 20;

  explicit ConvertedTiles(const std::vector<Work>& works) {
    for (const Work& w : works) {
      first_slot_.push_back(static_cast<int64_t>(slots_size_));
      slots_size_ += static_cast<size_t>(2 * ((w.keys->keys + w.keys->width - 1) / w.keys->width));
    }
    slots_ = std::make_unique<Slot[]>(slots_size_);
  }

  // Tile `tile` of work `work` (values when `values`) as dense f32 [width, cols], converted by
  // `convert` into the slot's memory the first time; null when another job is converting it or
  // the memory cap is reached.
  template <typename Convert>
  const float* Get(int64_t work, int64_t tile, bool values, int64_t width, int64_t cols,
                   const Convert& convert) {
    Slot& slot = slots_[static_cast<size_t>(first_slot_[static_cast<size_t>(work)] + 2 * tile +
                                            (values ? 1 : 0))];
    int state = slot.state.load(std::memory_order_acquire);
    if (state == kReady) return slot.data.get();
    if (state != kEmpty) return nullptr;
    const int64_t bytes = width * cols * static_cast<int64_t>(sizeof(float));
    if (bytes_.fetch_add(bytes, std::memory_order_relaxed) + bytes > kMaxBytes) {
      bytes_.fetch_sub(bytes, std::memory_order_relaxed);
      return nullptr;
    }
    if (!slot.state.compare_exchange_strong(state, kConverting, std::memory_order_acq_rel)) {
      bytes_.fetch_sub(bytes, std::memory_order_relaxed);
      return state == kReady ? slot.data.get() : nullptr;
    }
    slot.data.reset(new float[static_cast<size_t>(width * cols)]);  // written whole by `convert`
    convert(slot.data.get());
    slot.state.store(kReady, std::memory_order_release);
    return slot.data.get();
  }

 private:
  static constexpr int kEmpty = 0, kConverting = 1, kReady = 2;
  struct Slot {
    std::atomic<int> state{kEmpty};
    std::unique_ptr<float[]> data;
  };
  std::vector<int64_t> first_slot_;
  size_t slots_size_ = 0;
  std::unique_ptr<Slot[]> slots_;
  std::atomic<int64_t> bytes_{0};
};

namespace {

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

}  // namespace

void State::Reset(int64_t m, int64_t head_dim_v) {
  max.assign(static_cast<size_t>(m), kNegInf);
  sum.assign(static_cast<size_t>(m), 0.0f);
  acc.assign(static_cast<size_t>(m * head_dim_v), 0.0f);
  overflowed.assign(static_cast<size_t>(m), 0);
}

KeyRange RowKeys(const Job& job, int64_t row) {
  KeyRange r = VisibleKeys(job.mask, job.n_q, job.keys->keys, job.first_token + row / job.group);
  r.begin = std::max(r.begin, job.key_begin);
  r.end = std::max(r.begin, std::min(r.end, job.key_end));
  return r;
}

absl::Status RunTileJob(const Job& job, State* state) {
  const KeyTiles& keys = *job.keys;
  const int64_t m = job.m, d = keys.head_dim, dv = keys.head_dim_v, width = keys.width;
  const Arithmetic& a = job.arithmetic;
  const bool kernels = m < kMatmulRows;
  // Rows see monotonically later keys, so the job needs keys from its first row's first visible
  // key to its last row's last.
  const int64_t kb = RowKeys(job, 0).begin;
  const int64_t ke = std::max(kb, RowKeys(job, m - 1).end);
  if (ke <= kb) return absl::OkStatus();

  thread_local std::vector<float> q_pad, scores, partial, k_f32, v_f32;
  thread_local std::vector<uint16_t> q_bf16, p_bf16, k_bf16, v_bf16;

  // The matmul path multiplies a fixed number of query rows: pad with zero rows.
  const int64_t rows = kernels ? m : (m + kQueryTileRows - 1) / kQueryTileRows * kQueryTileRows;
  const void* q_operand = job.q;
  if (!kernels) {
    if (a.matmul == DType::kBFloat16) {
      uint16_t* qb = Buffer(q_bf16, rows * d);
      simd::ToBf16(job.q, m * d, qb);  // q was checked finite
      std::fill(qb + m * d, qb + rows * d, uint16_t{0});
      q_operand = qb;
    } else if (rows != m) {
      float* qp = Buffer(q_pad, rows * d);
      std::copy(job.q, job.q + m * d, qp);
      std::fill(qp + m * d, qp + rows * d, 0.0f);
      q_operand = qp;
    }
  }
  float* s = Buffer(scores, rows * width);
  // A native bf16 matmul takes the probabilities in bf16, written by UpdateRow.
  uint16_t* pb = !kernels && a.matmul == DType::kBFloat16 ? Buffer(p_bf16, rows * width) : nullptr;
  float* tmp = kernels ? nullptr : Buffer(partial, rows * dv);
  std::vector<float> alpha(static_cast<size_t>(m));

  for (int64_t t = kb / width; t <= (ke - 1) / width; ++t) {
    ATTEND_RETURN_IF_ERROR(CheckCancelled(job.cancel, "attention"));
    const int64_t start = t * width;
    const int64_t valid = std::min(width, keys.keys - start);
    // Columns this tile computes: the matmul path stops at the job's last visible key, rounded
    // up to 64 so that the shapes come from a small fixed set; the kernels take exact rows.
    const int64_t cols =
        kernels ? valid : std::min(width, (std::min(valid, ke - start) + 63) / 64 * 64);
    simd::Rows k = TileOperand(job, t, /*values=*/false,
                               {keys.Keys(t), keys.dtype, keys.key_stride, keys.KeyScales(t)},
                               valid, cols, d, kernels, k_f32, k_bf16);
    // The kernels' bf16 dot products flush as a native bf16 matmul does: only where one may run.
    k.native_bf16 = a.matmul == DType::kBFloat16;
    if (kernels) {
      simd::DotRows(job.q, m, d, k, valid, s, cols);
    } else {
      onednn::MatmulSpec qk;
      qk.src = {rows, d, d, 1, a.matmul};
      qk.weights = {d, cols, 1, k.stride, a.matmul};
      qk.dst = {rows, cols, cols, 1, DType::kFloat32};
      ATTEND_RETURN_IF_ERROR(onednn::RunMatmul(qk, q_operand, k.data, s));
    }

    for (int64_t i = 0; i < m; ++i) {
      const KeyRange range = RowKeys(job, i);
      const int64_t lo = std::clamp(range.begin - start, int64_t{0}, valid);
      const int64_t hi = std::clamp(range.end - start, lo, valid);
      bool overflowed = false;
      alpha[i] =
          UpdateRow(s + i * cols, lo, hi, cols, job.q_scaled ? 1.0f : job.scale, a.round_bf16,
                    job.weight_rows ? job.weight_rows[i] + start : nullptr,
                    pb ? pb + i * cols : nullptr, &state->max[i], &state->sum[i], &overflowed);
      if (overflowed) state->overflowed[i] = 1;
    }
    // The matmul's padding rows.
    if (pb != nullptr) {
      std::fill(pb + m * cols, pb + rows * cols, uint16_t{0});
    } else if (!kernels) {
      std::fill(s + m * cols, s + rows * cols, 0.0f);
    }

    simd::Rows v = TileOperand(job, t, /*values=*/true,
                               {keys.Values(t), keys.dtype, keys.value_stride, keys.ValueScales(t)},
                               valid, cols, dv, kernels, v_f32, v_bf16);
    v.native_bf16 = k.native_bf16;
    if (kernels) {
      for (int64_t i = 0; i < m; ++i) {
        if (alpha[i] == 1.0f) continue;
        float* acc = &state->acc[i * dv];
        for (int64_t c = 0; c < dv; ++c) acc[c] *= alpha[i];
      }
      simd::AccumulateRows(s, cols, m, v, valid, dv, state->acc.data());
    } else {
      const void* p_operand = pb != nullptr ? static_cast<const void*>(pb) : s;
      onednn::MatmulSpec pv;
      pv.src = {rows, cols, cols, 1, a.matmul};
      pv.weights = {cols, dv, v.stride, 1, a.matmul};
      pv.dst = {rows, dv, dv, 1, DType::kFloat32};
      ATTEND_RETURN_IF_ERROR(onednn::RunMatmul(pv, p_operand, v.data, tmp));
      for (int64_t i = 0; i < m; ++i) {
        simd::ScaleAdd(&state->acc[i * dv], alpha[i], tmp + i * dv, dv);
      }
    }
  }
  return absl::OkStatus();
}

void Merge(const State& part, State* into) {
  const int64_t m = static_cast<int64_t>(into->max.size());
  const int64_t dv = m > 0 ? static_cast<int64_t>(into->acc.size()) / m : 0;
  for (int64_t i = 0; i < m; ++i) {
    into->overflowed[i] |= part.overflowed[i];
    const float a = into->max[i], b = part.max[i];
    if (b == kNegInf) continue;
    const float new_max = std::max(a, b);
    const float scale_into = a == kNegInf ? 0.0f : std::exp(a - new_max);
    const float scale_part = std::exp(b - new_max);
    into->sum[i] = into->sum[i] * scale_into + part.sum[i] * scale_part;
    for (int64_t c = 0; c < dv; ++c) {
      into->acc[i * dv + c] =
          into->acc[i * dv + c] * scale_into + part.acc[i * dv + c] * scale_part;
    }
    into->max[i] = new_max;
  }
}

void Finish(const Job& job, const State& state, float* const* out_rows, float* const* weight_rows) {
  const int64_t dv = job.keys->head_dim_v;
  for (int64_t i = 0; i < job.m; ++i) {
    if (state.overflowed[i]) {
      std::fill_n(out_rows[i], dv, std::numeric_limits<float>::quiet_NaN());
      continue;
    }
    const float inv = state.sum[i] > 0.0f ? 1.0f / state.sum[i] : 0.0f;
    for (int64_t c = 0; c < dv; ++c) out_rows[i][c] = state.acc[i * dv + c] * inv;
    if (weight_rows != nullptr) {
      // Every visible key of the row (over the whole key range, not one split).
      KeyRange range =
          VisibleKeys(job.mask, job.n_q, job.keys->keys, job.first_token + i / job.group);
      float* w = weight_rows[i] + range.begin;
      const int64_t n = range.size();
      if (n > 0 && state.max[i] != kNegInf) {
        simd::ExpShiftSum(w, state.max[i], w, n);
        for (int64_t j = 0; j < n; ++j) w[j] *= inv;
      }
    }
  }
}

namespace {

// One job of a Work: a tile of its query tokens over a range of its keys.
struct Task {
  const Work* work;
  int64_t first_token;
  int64_t tokens;
  int64_t key_begin;
  int64_t key_end;
  int64_t slot;  // tasks with the same slot are key splits of the same rows, in key order
  bool whole;    // covers every key: finished inside the task
};

// The job of a task, with its queries packed into `packed` (null: geometry only, for Finish).
Job MakeJob(const Task& task, std::vector<float>* packed) {
  const Work& w = *task.work;
  const int64_t d = w.keys->head_dim;
  Job job;
  job.m = task.tokens * w.group;
  job.group = w.group;
  job.first_token = task.first_token;
  job.n_q = w.n_q;
  job.mask = w.mask;
  job.key_begin = task.key_begin;
  job.key_end = task.key_end;
  job.keys = w.keys;
  job.arithmetic = w.arithmetic;
  job.scale = w.scale;
  if (packed == nullptr) return job;
  packed->resize(static_cast<size_t>(job.m * d));
  // Under bf16 semantics the operands must stay the caller's values (rounded), so the scores are
  // scaled afterwards; in f32 the scale goes into the packed rows.
  job.q_scaled = !w.arithmetic.round_bf16;
  // A token's query rows for this group are contiguous, but the next token's are a whole row of
  // every head later (often the next 4 KiB page), which the hardware prefetchers do not follow:
  // unaided, packing was latency-bound (3-4% of a 2048-token prefill). Ask for a few tokens
  // ahead.
  const int64_t group_bytes = w.group * d * static_cast<int64_t>(sizeof(float));
  const auto group_rows = [&](int64_t r) {  // token r's rows of this group, contiguous
    return w.q + ((task.first_token + r) * w.n_head + w.head_kv * w.group) * d;
  };
  const auto prefetch = [&](int64_t r) {
    const char* p = reinterpret_cast<const char*>(group_rows(r));
    for (int64_t b = 0; b < group_bytes; b += 64) __builtin_prefetch(p + b);
  };
  constexpr int64_t kAheadTokens = 4;
  // Whether some q * scale is not finite (a huge q and a scale above 1): the scores may still
  // be, so the rows are then packed unscaled and the scale applied to the scores instead.
  uint32_t scaled_overflow = 0;
  for (int64_t r = 0; r < std::min(kAheadTokens, task.tokens); ++r) prefetch(r);
  for (int64_t r = 0; r < task.tokens; ++r) {
    if (r + kAheadTokens < task.tokens) prefetch(r + kAheadTokens);
    for (int64_t j = 0; j < w.group; ++j) {
      const float* src = group_rows(r) + j * d;
      float* dst = &(*packed)[static_cast<size_t>((r * w.group + j) * d)];
      if (job.q_scaled) {
        for (int64_t c = 0; c < d; ++c) {
          dst[c] = src[c] * w.scale;
          uint32_t bits;
          std::memcpy(&bits, &dst[c], sizeof(bits));
          scaled_overflow |= static_cast<uint32_t>((bits & 0x7fffffffu) >= 0x7f800000u);
        }
      } else {
        std::copy(src, src + d, dst);
        simd::RoundToBf16(dst, d);  // q was checked finite
      }
    }
  }
  if (scaled_overflow != 0) {
    job.q_scaled = false;
    for (int64_t r = 0; r < task.tokens; ++r) {
      std::copy(group_rows(r), group_rows(r) + w.group * d, &(*packed)[r * w.group * d]);
    }
  }
  job.q = packed->data();
  return job;
}

void RowsOf(const Task& task, std::vector<float*>* out_rows, std::vector<float*>* weight_rows) {
  const Work& w = *task.work;
  out_rows->clear();
  weight_rows->clear();
  for (int64_t r = 0; r < task.tokens; ++r) {
    for (int64_t j = 0; j < w.group; ++j) {
      const int64_t h = w.head_kv * w.group + j;
      const int64_t token = task.first_token + r;
      out_rows->push_back(w.output + (token * w.n_head + h) * w.keys->head_dim_v);
      if (w.weights != nullptr)
        weight_rows->push_back(w.weights + (h * w.n_q + token) * w.keys->keys);
    }
  }
}

// Whether every work is decode-sized and all of them together read fewer than
// kSerialDecodeBytes of keys and values.
bool SmallDecode(const std::vector<Work>& works) {
  int64_t bytes = 0;
  for (const Work& w : works) {
    if (!UsesKernels(w.n_q, w.group)) return false;
    const int64_t row = (w.keys->head_dim + w.keys->head_dim_v) * DTypeSize(w.keys->dtype);
    bytes += w.keys->keys * row;
    if (bytes >= kSerialDecodeBytes) return false;
  }
  return true;
}

}  // namespace

absl::Status Run(const std::vector<Work>& works, int threads, const Cancellation* cancel) {
  if (threads <= 0) threads = omp_get_max_threads();
  int64_t jobs = 0;
  for (const Work& w : works) {
    const int64_t tokens = std::max<int64_t>(1, kQueryTileRows / w.group);
    jobs += (w.n_q + tokens - 1) / tokens;
  }
  const bool by_span = std::all_of(works.begin(), works.end(), [](const Work& w) {
    return w.key_span > 0 && UsesKernels(w.n_q, w.group);
  });
  if (threads > 1 && SmallDecode(works)) threads = 1;
  std::vector<Task> tasks;
  int64_t slot = 0;
  for (const Work& w : works) {
    const int64_t tokens_per_job = std::max<int64_t>(1, kQueryTileRows / w.group);
    const int64_t key_tiles = (w.keys->keys + w.keys->width - 1) / w.keys->width;
    // Fewer jobs than threads (decode over few heads): split each job's keys so that every
    // thread gets a share of the stream.
    int64_t splits = jobs >= 2 * threads
                         ? 1
                         : std::clamp<int64_t>((2 * threads + jobs - 1) / jobs, 1, key_tiles);
    if (by_span) {
      const int64_t span_tiles = std::max<int64_t>(1, w.key_span / w.keys->width);
      splits = std::max(splits, (key_tiles + span_tiles - 1) / span_tiles);
    }
    const int64_t tiles_per_split = (key_tiles + splits - 1) / splits;
    for (int64_t first = 0; first < w.n_q; first += tokens_per_job, ++slot) {
      const int64_t count = std::min(tokens_per_job, w.n_q - first);
      for (int64_t p = 0; p < splits; ++p) {
        const int64_t kb = p * tiles_per_split * w.keys->width;
        const int64_t ke = std::min(w.keys->keys, (p + 1) * tiles_per_split * w.keys->width);
        if (p > 0 && kb >= ke) break;
        tasks.push_back({&w, first, count, kb, ke, slot, splits == 1});
      }
    }
  }
  // The order tasks run in: as made, or span by span (Work::key_span; the stable sort keeps the
  // works' order within a span).
  std::vector<size_t> order(tasks.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  if (by_span) {
    std::stable_sort(order.begin(), order.end(),
                     [&](size_t a, size_t b) { return tasks[a].key_begin < tasks[b].key_begin; });
  }
  std::vector<State> partials(tasks.size());
  // Only the matmul path converts tiles (decode's kernels read every dtype in place).
  std::optional<ConvertedTiles> converted;
  for (const Work& w : works) {
    if (!UsesKernels(w.n_q, w.group)) {
      converted.emplace(works);
      break;
    }
  }

  auto run = [&](size_t index) -> absl::Status {
    const Task& task = tasks[index];
    thread_local std::vector<float> packed;
    thread_local std::vector<float*> out_rows, weight_rows;
    thread_local State whole_state;
    Job job = MakeJob(task, &packed);
    job.converted = converted ? &*converted : nullptr;
    job.work = task.work - works.data();
    job.cancel = cancel;
    RowsOf(task, &out_rows, &weight_rows);
    if (task.work->weights != nullptr) job.weight_rows = weight_rows.data();
    State& state = task.whole ? whole_state : partials[index];
    state.Reset(job.m, task.work->keys->head_dim_v);
    ATTEND_RETURN_IF_ERROR(RunTileJob(job, &state));
    if (task.whole) {
      Finish(job, state, out_rows.data(), task.work->weights ? weight_rows.data() : nullptr);
    }
    return absl::OkStatus();
  };

  absl::Status status;
  if (tasks.size() == 1 || threads == 1) {
    // Without the cap, a call limited to one thread would run oneDNN's matmuls on every CPU.
    const onednn::ScopedThreadLimit limit(threads);
    for (size_t i = 0; i < tasks.size() && status.ok(); ++i) status = run(order[i]);
  } else {
    Mutex mu;
    std::atomic<bool> failed{false};
    const auto run_one = [&](size_t i) {
      if (failed.load(std::memory_order_relaxed)) return;
      absl::Status task_status = run(order[i]);
      if (!task_status.ok()) {
        MutexLock lock(&mu);
        if (status.ok()) status = task_status;
        failed.store(true, std::memory_order_relaxed);
      }
    };
    if (by_span) {
      // Equal spans: one contiguous run of them per thread (Work::key_span says why).
#pragma omp parallel for schedule(static) num_threads(threads)
      for (size_t i = 0; i < tasks.size(); ++i) run_one(i);
    } else {
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads)
      for (size_t i = 0; i < tasks.size(); ++i) run_one(i);
    }
  }
  if (!status.ok()) return status;

  // Key splits: merge each slot's partial softmaxes in key order, then normalise.
  std::vector<float*> out_rows, weight_rows;
  for (size_t i = 0; i < tasks.size();) {
    size_t end = i + 1;
    while (end < tasks.size() && tasks[end].slot == tasks[i].slot) ++end;
    if (!tasks[i].whole) {
      for (size_t p = i + 1; p < end; ++p) Merge(partials[p], &partials[i]);
      Task all = tasks[i];
      all.key_begin = 0;
      all.key_end = all.work->keys->keys;
      const Job job = MakeJob(all, nullptr);
      RowsOf(all, &out_rows, &weight_rows);
      Finish(job, partials[i], out_rows.data(), all.work->weights ? weight_rows.data() : nullptr);
    }
    i = end;
  }
  return absl::OkStatus();
}

}  // namespace attend::tile
