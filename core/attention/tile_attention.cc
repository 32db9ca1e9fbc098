#include "core/attention/tile_attention.h"

#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>
#include <optional>

#include "core/attention/tile_operands.h"
#include "core/base/mutex.h"
#include "core/base/status_macros.h"
#include "core/kernels/onednn.h"
#include "core/kernels/simd.h"

namespace attend::tile {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

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
  // (Exp straight into bf16, fused, measured no faster: the exp's arithmetic bounds both, and
  // the conversion's pass over the row in L1 costs next to nothing.)
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

void State::Reset(int64_t m, int64_t head_dim_v) {
  max.assign(static_cast<size_t>(m), kNegInf);
  sum.assign(static_cast<size_t>(m), 0.0f);
  acc.assign(static_cast<size_t>(m * head_dim_v), 0.0f);
  overflowed.assign(static_cast<size_t>(m), 0);
}

KeyRange JobKeys(const Job& job) {
  const int64_t kb = RowKeys(job, 0).begin;
  return {kb, std::max(kb, RowKeys(job, job.m - 1).end)};
}

int64_t MatmulColumns(const KeyTiles& keys, const KeyRange& range, int64_t t) {
  const int64_t start = t * keys.width, valid = std::min(keys.width, keys.keys - start);
  return std::min(keys.width, (std::min(valid, range.end - start) + 63) / 64 * 64);
}

KeyRange RowKeys(const Job& job, int64_t row) {
  KeyRange r = VisibleKeys(job.mask, job.n_q, job.keys->keys, job.first_token + row / job.group);
  r.begin = std::max(r.begin, job.key_begin);
  r.end = std::max(r.begin, std::min(r.end, job.key_end));
  return r;
}

namespace {

// `rows` advanced by `r` rows.
simd::Rows Advance(simd::Rows rows, int64_t r) {
  rows.data = static_cast<const char*>(rows.data) + r * rows.stride * DTypeSize(rows.dtype);
  if (rows.scales != nullptr) rows.scales += r;
  return rows;
}

// Updates the job's softmax state with the scores of tile `t` (row i's at s + i * cols):
// turns them into probabilities and returns in alpha[i] the factor row i's accumulator must be
// scaled by first. pb: where the probabilities go in bf16 (null: in place).
void UpdateRows(const Job& job, int64_t t, int64_t valid, int64_t cols, float* s, uint16_t* pb,
                float* alpha, State* state) {
  const int64_t start = t * job.keys->width;
  for (int64_t i = 0; i < job.m; ++i) {
    const KeyRange range = RowKeys(job, i);
    const int64_t lo = std::clamp(range.begin - start, int64_t{0}, valid);
    const int64_t hi = std::clamp(range.end - start, lo, valid);
    bool overflowed = false;
    alpha[i] =
        UpdateRow(s + i * cols, lo, hi, cols, job.q_scaled ? 1.0f : job.scale,
                  job.arithmetic.round_bf16, job.weight_rows ? job.weight_rows[i] + start : nullptr,
                  pb ? pb + i * cols : nullptr, &state->max[i], &state->sum[i], &overflowed);
    if (overflowed) state->overflowed[i] = 1;
  }
}

}  // namespace

absl::Status RunKernelJobs(const Job* jobs, State* const* states, int64_t n) {
  if (n <= 0) return absl::OkStatus();
  const int64_t width = jobs[0].keys->width;
  // Per job: its key range, and the thread's buffers for its scores and converted tiles.
  thread_local std::vector<std::vector<float>> scores, alphas, k_f32, v_f32;
  thread_local std::vector<std::vector<uint16_t>> k_bf16, v_bf16;
  for (auto* buffers : {&scores, &alphas, &k_f32, &v_f32}) {
    if (buffers->size() < static_cast<size_t>(n)) buffers->resize(static_cast<size_t>(n));
  }
  for (auto* buffers : {&k_bf16, &v_bf16}) {
    if (buffers->size() < static_cast<size_t>(n)) buffers->resize(static_cast<size_t>(n));
  }
  std::vector<KeyRange> ranges(static_cast<size_t>(n));
  int64_t first_tile = std::numeric_limits<int64_t>::max(), end_tile = 0;
  for (int64_t j = 0; j < n; ++j) {
    ranges[j] = JobKeys(jobs[j]);
    if (ranges[j].size() == 0) continue;
    first_tile = std::min(first_tile, ranges[j].begin / width);
    end_tile = std::max(end_tile, (ranges[j].end - 1) / width + 1);
  }
  std::vector<simd::Rows> k(static_cast<size_t>(n)), v(static_cast<size_t>(n));
  std::vector<float*> s(static_cast<size_t>(n));
  std::vector<int64_t> valid(static_cast<size_t>(n));
  std::vector<bool> active(static_cast<size_t>(n));
  for (int64_t t = first_tile; t < end_tile; ++t) {
    ATTEND_RETURN_IF_ERROR(CheckCancelled(jobs[0].cancel, "attention"));
    const int64_t start = t * width;
    // Jobs over a caller's [n, heads, d] tensor read their heads' pieces of the same token rows:
    // in f32, the tile is read in pieces of kInterleavedRows rows, every job's piece in turn, so
    // that whole token rows are read one after another (Work::key_span). bf16 and int8 tiles are
    // read whole: their kernels convert q or p per call, which costs more than pieces gain.
    bool f32 = true;
    for (int64_t j = 0; j < n; ++j) {
      const Job& job = jobs[j];
      const KeyTiles& keys = *job.keys;
      active[j] = ranges[j].begin < std::min(keys.keys, start + width) && start < ranges[j].end;
      if (!active[j]) continue;
      valid[j] = std::min(width, keys.keys - start);
      k[j] = TileOperand(job, t, /*values=*/false,
                         {keys.Keys(t), keys.dtype, keys.key_stride, keys.KeyScales(t)}, valid[j],
                         valid[j], keys.head_dim, /*kernels=*/true, k_f32[j], k_bf16[j]);
      // The kernels' bf16 dot products flush as a native bf16 matmul does: only where one may run.
      k[j].native_bf16 = job.arithmetic.matmul == DType::kBFloat16;
      v[j] =
          TileOperand(job, t, /*values=*/true,
                      {keys.Values(t), keys.dtype, keys.value_stride, keys.ValueScales(t)},
                      valid[j], valid[j], keys.head_dim_v, /*kernels=*/true, v_f32[j], v_bf16[j]);
      v[j].native_bf16 = k[j].native_bf16;
      // int8 rows are read in place: while q.k reads the keys, memory can bring this tile's
      // values, and while p.v reads them, the next tile's keys (Rows::next). (The bf16 kernels
      // did the same and measured no different: two threads, 4096 and 16384 tokens x 16.)
      if (k[j].data == keys.Keys(t) && v[j].data == keys.Values(t) && k[j].dtype == DType::kInt8) {
        k[j].next = v[j].data;
        k[j].next_bytes = valid[j] * v[j].stride * DTypeSize(v[j].dtype);
        const int64_t following = t + 1;
        if (following < end_tile && following * width < ranges[j].end) {
          v[j].next = keys.Keys(following);
          v[j].next_bytes = std::min(width, keys.keys - following * width) * keys.key_stride *
                            DTypeSize(keys.dtype);
        }
      }
      f32 = f32 && k[j].dtype == DType::kFloat32 && v[j].dtype == DType::kFloat32;
      s[j] = Buffer(scores[j], job.m * valid[j]);
    }
    const int64_t piece = n > 1 && f32 ? kInterleavedRows : width;
    for (int64_t r = 0; r < width; r += piece) {
      for (int64_t j = 0; j < n; ++j) {
        if (!active[j] || r >= valid[j]) continue;
        simd::DotRows(jobs[j].q, jobs[j].m, jobs[j].keys->head_dim, Advance(k[j], r),
                      std::min(piece, valid[j] - r), s[j] + r, valid[j]);
      }
    }
    for (int64_t j = 0; j < n; ++j) {
      if (!active[j]) continue;
      const Job& job = jobs[j];
      const int64_t dv = job.keys->head_dim_v;
      float* alpha = Buffer(alphas[j], job.m);
      UpdateRows(job, t, valid[j], valid[j], s[j], nullptr, alpha, states[j]);
      for (int64_t i = 0; i < job.m; ++i) {
        if (alpha[i] == 1.0f) continue;
        float* acc = &states[j]->acc[i * dv];
        for (int64_t c = 0; c < dv; ++c) acc[c] *= alpha[i];
      }
    }
    for (int64_t r = 0; r < width; r += piece) {
      for (int64_t j = 0; j < n; ++j) {
        if (!active[j] || r >= valid[j]) continue;
        simd::AccumulateRows(s[j] + r, valid[j], jobs[j].m, Advance(v[j], r),
                             std::min(piece, valid[j] - r), jobs[j].keys->head_dim_v,
                             states[j]->acc.data());
      }
    }
  }
  return absl::OkStatus();
}

absl::Status RunTileJob(const Job& job, State* state) {
  if (job.m < kMatmulRows) return RunKernelJobs(&job, &state, 1);
  const KeyTiles& keys = *job.keys;
  const int64_t m = job.m, d = keys.head_dim, dv = keys.head_dim_v, width = keys.width;
  const Arithmetic& a = job.arithmetic;
  const KeyRange range = JobKeys(job);
  if (range.size() == 0) return absl::OkStatus();

  thread_local std::vector<float> q_pad, scores, partial, k_f32, v_f32;
  thread_local std::vector<uint16_t> q_bf16, p_bf16, k_bf16, v_bf16;

  // The matmuls multiply a fixed number of query rows: pad with zero rows.
  const int64_t rows = (m + kQueryTileRows - 1) / kQueryTileRows * kQueryTileRows;
  const void* q_operand = job.q;
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
  float* s = Buffer(scores, rows * width);
  // A native bf16 matmul takes the probabilities in bf16, written by UpdateRow.
  uint16_t* pb = a.matmul == DType::kBFloat16 ? Buffer(p_bf16, rows * width) : nullptr;
  float* tmp = Buffer(partial, rows * dv);
  std::vector<float> alpha(static_cast<size_t>(m));

  for (int64_t t = range.begin / width; t <= (range.end - 1) / width; ++t) {
    ATTEND_RETURN_IF_ERROR(CheckCancelled(job.cancel, "attention"));
    const int64_t valid = std::min(width, keys.keys - t * width);
    const int64_t cols = MatmulColumns(keys, range, t);
    const auto key_operand = [&] {
      return TileOperand(job, t, /*values=*/false,
                         {keys.Keys(t), keys.dtype, keys.key_stride, keys.KeyScales(t)}, valid,
                         cols, d, /*kernels=*/false, k_f32, k_bf16);
    };
    const auto value_operand = [&] {
      return TileOperand(job, t, /*values=*/true,
                         {keys.Values(t), keys.dtype, keys.value_stride, keys.ValueScales(t)},
                         valid, cols, dv, /*kernels=*/false, v_f32, v_bf16);
    };
    // A tile read whole comes packed when PlanPacking marked it and PackMarkedTiles packed it
    // before the jobs ran. (They are packed for kQueryTileRows query rows: a group of more than
    // that many query heads per key/value head makes taller matmuls, which read them plain.)
    const bool whole = cols == width && rows == kQueryTileRows && job.converted != nullptr;
    // One of the tile's matmuls, src x the tile's keys or values (`operand` makes them plain;
    // `spec(stride)` is the matmul over weights rows `stride` apart).
    const auto tile_matmul = [&](bool values, const auto& operand, const auto& spec,
                                 const void* src, float* dst) {
      const void* packed = whole ? job.converted->PackedData(job.work, t, values) : nullptr;
      if (packed != nullptr) return onednn::RunMatmul(Packed(spec(0)), src, packed, dst);
      const simd::Rows w = operand();
      return onednn::RunMatmul(spec(w.stride), src, w.data, dst);
    };
    ATTEND_RETURN_IF_ERROR(tile_matmul(
        /*values=*/false, key_operand,
        [&](int64_t stride) { return ScoresSpec(rows, d, cols, stride, a.matmul); }, q_operand, s));

    UpdateRows(job, t, valid, cols, s, pb, alpha.data(), state);
    // The matmul's padding rows.
    if (pb != nullptr) {
      std::fill(pb + m * cols, pb + rows * cols, uint16_t{0});
    } else {
      std::fill(s + m * cols, s + rows * cols, 0.0f);
    }

    const void* p_operand = pb != nullptr ? static_cast<const void*>(pb) : s;
    ATTEND_RETURN_IF_ERROR(tile_matmul(
        /*values=*/true, value_operand,
        [&](int64_t stride) { return ValuesSpec(rows, cols, dv, stride, a.matmul); }, p_operand,
        tmp));
    for (int64_t i = 0; i < m; ++i) simd::ScaleAdd(&state->acc[i * dv], alpha[i], tmp + i * dv, dv);
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

bool Finish(const Job& job, const State& state, float* const* out_rows, float* const* weight_rows) {
  const int64_t dv = job.keys->head_dim_v;
  bool finite = true;
  for (int64_t i = 0; i < job.m; ++i) {
    if (state.overflowed[i]) {
      std::fill_n(out_rows[i], dv, std::numeric_limits<float>::quiet_NaN());
      finite = false;
      continue;
    }
    const float inv = state.sum[i] > 0.0f ? 1.0f / state.sum[i] : 0.0f;
    finite &= simd::ScaleCopy(&state.acc[i * dv], inv, out_rows[i], dv);
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
  return finite;
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
  const int64_t group_bytes = w.group * d * DTypeSize(w.q_dtype);
  // Token r's rows of this group, contiguous: as Rows, row j of them is query head j's.
  const auto group_rows = [&](int64_t r) {
    simd::Rows rows;
    rows.data =
        static_cast<const char*>(w.q) +
        ((task.first_token + r) * w.n_head + w.head_kv * w.group) * d * DTypeSize(w.q_dtype);
    rows.dtype = w.q_dtype;
    rows.stride = d;
    return rows;
  };
  const auto prefetch = [&](int64_t r) {
    const char* p = static_cast<const char*>(group_rows(r).data);
    for (int64_t b = 0; b < group_bytes; b += 64) __builtin_prefetch(p + b);
  };
  constexpr int64_t kAheadTokens = 4;
  // Whether some q * scale is not finite (a huge q and a scale above 1): the scores may still
  // be, so the rows are then packed unscaled and the scale applied to the scores instead.
  uint32_t scaled_overflow = 0;
  // bf16 queries are bf16 values already: rounding them again changes nothing.
  const bool round = !job.q_scaled && w.q_dtype != DType::kBFloat16;
  for (int64_t r = 0; r < std::min(kAheadTokens, task.tokens); ++r) prefetch(r);
  for (int64_t r = 0; r < task.tokens; ++r) {
    if (r + kAheadTokens < task.tokens) prefetch(r + kAheadTokens);
    const simd::Rows src = group_rows(r);
    for (int64_t j = 0; j < w.group; ++j) {
      float* dst = &(*packed)[static_cast<size_t>((r * w.group + j) * d)];
      simd::RowToFloat(src, j, d, dst);
      if (job.q_scaled) {
        for (int64_t c = 0; c < d; ++c) {
          dst[c] *= w.scale;
          uint32_t bits;
          std::memcpy(&bits, &dst[c], sizeof(bits));
          scaled_overflow |= static_cast<uint32_t>((bits & 0x7fffffffu) >= 0x7f800000u);
        }
      } else if (round) {
        simd::RoundToBf16(dst, d);  // q was checked finite
      }
    }
  }
  if (scaled_overflow != 0) {
    job.q_scaled = false;
    for (int64_t r = 0; r < task.tokens; ++r) {
      const simd::Rows src = group_rows(r);
      for (int64_t j = 0; j < w.group; ++j)
        simd::RowToFloat(src, j, d, &(*packed)[static_cast<size_t>((r * w.group + j) * d)]);
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

// The threads a Run uses: all of OpenMP's when `threads` is not positive, and one when the whole
// call is a small decode, where waking and joining threads costs more than they save
// (kSerialDecodeBytes says how much).
int RunThreads(const std::vector<Work>& works, int threads) {
  if (threads <= 0) threads = omp_get_max_threads();
  if (threads > 1 && SmallDecode(works)) threads = 1;
  return threads;
}

// Whether the tasks run span by span (Work::key_span says why): only when every work asks for
// it and all of them are decode-sized, as RunKernelJobs, which runs a span's tasks as one, is
// for decode only.
bool BySpan(const std::vector<Work>& works) {
  return std::all_of(works.begin(), works.end(),
                     [](const Work& w) { return w.key_span > 0 && UsesKernels(w.n_q, w.group); });
}

// Phase 1, the splits: cuts every work's query tokens into jobs of at most kQueryTileRows folded
// rows, and each job's keys into splits of whole tiles. With fewer than two jobs per thread (decode
// over few heads), a job's keys are split so that every thread gets a share of the stream; span by
// span, each split is at most a span. The tasks come out slot by slot (one slot per job) and,
// within a slot, in key order, which MergeSplits relies on.
std::vector<Task> PlanTasks(const std::vector<Work>& works, int threads, bool by_span) {
  int64_t jobs = 0;
  for (const Work& w : works) {
    const int64_t tokens = std::max<int64_t>(1, kQueryTileRows / w.group);
    jobs += (w.n_q + tokens - 1) / tokens;
  }
  std::vector<Task> tasks;
  int64_t slot = 0;
  for (const Work& w : works) {
    const int64_t tokens_per_job = std::max<int64_t>(1, kQueryTileRows / w.group);
    const int64_t key_tiles = (w.keys->keys + w.keys->width - 1) / w.keys->width;
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
  return tasks;
}

// The tasks in the order they run, cut into units: the tasks of a unit run together, on one
// thread.
struct Units {
  std::vector<size_t> order;  // indices into the tasks, in run order
  std::vector<size_t> begin;  // unit u is order[begin[u], begin[u + 1]); one past the last too
  size_t count() const { return begin.size() - 1; }
};

// About the pairs (query row, key) a task attends, from its first and last rows' visible keys:
// exact where they change linearly from row to row (no mask, causal), an estimate where a
// sliding window stops their growth. Only the order of the units depends on it.
int64_t TaskPairs(const Task& task) {
  const Job job = MakeJob(task, nullptr);
  const int64_t last = job.m - 1;
  return (RowKeys(job, 0).size() + RowKeys(job, last).size()) * job.m / 2;
}

// Phase 2, the units: without spans, each task is a unit of its own, work by work as PlanTasks
// made them, and within a work the costliest first (by TaskPairs; ties in PlanTasks' order).
// Threads take them one at a time as they finish the last, so the run ends on small units: in
// PlanTasks' order a causal prefill ends on the last head's largest query tiles, and with many
// threads one of them left the others idle for up to a tile's time. Across works the order stays:
// consecutive units of one work read the same key and value tiles, from the cache (sorted across
// works, a 32/8-head f32 prefill ran 7% slower on two threads). Span by span, the tasks are ordered
// by their first key (the stable sort keeps the works' order within a span), and a span's tasks
// (every work's piece of the same keys, over tiles of the same width) make one unit, which
// RunKernelJobs reads interleaved: whole token rows of the caller's tensor one after another.
Units GroupUnits(const std::vector<Task>& tasks, bool by_span) {
  Units units;
  units.order.resize(tasks.size());
  for (size_t i = 0; i < units.order.size(); ++i) units.order[i] = i;
  if (by_span) {
    std::stable_sort(units.order.begin(), units.order.end(),
                     [&](size_t a, size_t b) { return tasks[a].key_begin < tasks[b].key_begin; });
  } else {
    std::vector<int64_t> pairs(tasks.size());
    for (size_t i = 0; i < tasks.size(); ++i) pairs[i] = TaskPairs(tasks[i]);
    std::stable_sort(units.order.begin(), units.order.end(), [&](size_t a, size_t b) {
      if (tasks[a].work != tasks[b].work) return tasks[a].work < tasks[b].work;
      return pairs[a] > pairs[b];
    });
  }
  for (size_t i = 0; i < units.order.size(); ++i) {
    const Task& task = tasks[units.order[i]];
    const Task* prev = i > 0 ? &tasks[units.order[i - 1]] : nullptr;
    if (prev == nullptr || !by_span || task.key_begin != prev->key_begin ||
        task.work->keys->width != prev->work->keys->width) {
      units.begin.push_back(i);
    }
  }
  units.begin.push_back(units.order.size());
  return units;
}

// Runs unit `unit`: packs its tasks' queries, runs them (RunTileJob for a unit of one task,
// RunKernelJobs for a span's tasks) and finishes the tasks that cover every key. A split task
// leaves its partial softmax in (*partials)[task index] for MergeSplits; distinct units write
// distinct elements, so units may run on different threads at once. The buffers are the
// thread's own, kept between calls.
absl::Status RunUnit(const std::vector<Work>& works, const std::vector<Task>& tasks,
                     const Units& units, size_t unit, ConvertedTiles* converted,
                     const Cancellation* cancel, std::vector<State>* partials,
                     std::atomic<bool>* finite) {
  const size_t first = units.begin[unit];
  const size_t n = units.begin[unit + 1] - first;
  thread_local std::vector<std::vector<float>> packed;
  thread_local std::vector<std::vector<float*>> out_rows, weight_rows;
  thread_local std::vector<Job> jobs;
  thread_local std::vector<State*> states;
  thread_local State whole_state;
  for (auto* rows : {&out_rows, &weight_rows}) {
    if (rows->size() < n) rows->resize(n);
  }
  if (packed.size() < n) packed.resize(n);
  jobs.resize(n);
  states.resize(n);
  for (size_t j = 0; j < n; ++j) {
    const size_t index = units.order[first + j];
    const Task& task = tasks[index];
    Job& job = jobs[j];
    job = MakeJob(task, &packed[j]);
    job.converted = converted;
    job.work = task.work - works.data();
    job.cancel = cancel;
    RowsOf(task, &out_rows[j], &weight_rows[j]);
    if (task.work->weights != nullptr) job.weight_rows = weight_rows[j].data();
    // A unit's whole tasks need a state each, and every task has one in `partials`.
    states[j] = task.whole && n == 1 ? &whole_state : &(*partials)[index];
    states[j]->Reset(job.m, task.work->keys->head_dim_v);
  }
  ATTEND_RETURN_IF_ERROR(n == 1
                             ? RunTileJob(jobs[0], states[0])
                             : RunKernelJobs(jobs.data(), states.data(), static_cast<int64_t>(n)));
  for (size_t j = 0; j < n; ++j) {
    const Task& task = tasks[units.order[first + j]];
    if (!task.whole) continue;
    if (!Finish(jobs[j], *states[j], out_rows[j].data(),
                task.work->weights ? weight_rows[j].data() : nullptr)) {
      finite->store(false, std::memory_order_relaxed);
    }
  }
  return absl::OkStatus();
}

// The jobs that read a tile whole before it pays to pack it once for all of them: packing a
// 512-key bf16 tile costs about a third of one of its matmuls, and each matmul over packed
// weights saves about 7% of one (BM_PrefillTileMatmul, Zen 4, 2026-12-07), so the break-even is
// 4 to 5 reads.
constexpr int64_t kMinPackedReads = 6;

// Marks for packing the matmul tiles that at least kMinPackedReads jobs read whole (every
// column: RunTileJob's cols reaches the tile's width), the most read first, until the store's
// cap. Decided here, before any job runs, so that every read of a marked tile is of the same
// packed bytes.
void PlanPacking(const std::vector<Work>& works, const std::vector<Task>& tasks,
                 ConvertedTiles* store) {
  // The works that may pack, with their packed tiles' sizes (which depend only on the work's
  // shapes). Asked of every such work, whether or not one of its tiles qualifies, so that the
  // first matmul call of a shape (the KV cache's warm-up) creates the packed primitives too.
  // Decode-sized works run the kernels; more than kQueryTileRows query heads per key/value head
  // make taller matmuls, which read their tiles plain.
  std::vector<std::pair<int64_t, int64_t>> bytes(works.size(), {0, 0});
  std::vector<std::vector<int64_t>> reads(works.size());
  for (size_t i = 0; i < works.size(); ++i) {
    const Work& w = works[i];
    const bool packs = w.packing == TilePacking::kAll ||
                       (w.packing == TilePacking::kBf16 && w.arithmetic.matmul == DType::kBFloat16);
    if (!packs || UsesKernels(w.n_q, w.group) || w.group > kQueryTileRows) continue;
    const int64_t width = w.keys->width;
    bytes[i] = PackedTileBytes(width, w.keys->head_dim, w.keys->head_dim_v, w.arithmetic.matmul);
    // No packed primitive for these shapes: the tiles stay plain.
    if (bytes[i].first <= 0 || bytes[i].second <= 0) continue;
    reads[i].assign(static_cast<size_t>((w.keys->keys + width - 1) / width), 0);
  }
  for (const Task& task : tasks) {
    const size_t i = static_cast<size_t>(task.work - works.data());
    if (reads[i].empty()) continue;
    const Job job = MakeJob(task, nullptr);
    const KeyRange range = JobKeys(job);
    if (range.size() == 0) continue;
    const int64_t width = task.work->keys->width;
    for (int64_t t = range.begin / width; t <= (range.end - 1) / width; ++t) {
      if (MatmulColumns(*task.work->keys, range, t) == width) ++reads[i][static_cast<size_t>(t)];
    }
  }
  struct Candidate {
    int64_t reads, work, tile;
  };
  std::vector<Candidate> candidates;
  for (size_t i = 0; i < works.size(); ++i) {
    for (size_t t = 0; t < reads[i].size(); ++t) {
      if (reads[i][t] >= kMinPackedReads) {
        candidates.push_back({reads[i][t], static_cast<int64_t>(i), static_cast<int64_t>(t)});
      }
    }
  }
  std::stable_sort(candidates.begin(), candidates.end(),
                   [](const Candidate& a, const Candidate& b) { return a.reads > b.reads; });
  for (const Candidate& c : candidates) {
    const auto [key_bytes, value_bytes] = bytes[static_cast<size_t>(c.work)];
    if (!store->MarkPacked(c.work, c.tile, key_bytes, value_bytes)) break;
  }
}

// Packs every tile PlanPacking marked, the tiles spread over `threads` threads, before the jobs
// run. Left to the jobs, every thread started on the same head's largest query tiles, which all
// read its first tiles, and all but one waited while each was packed (on two threads, 1.3% of a
// 2048-token bf16 prefill went to sched_yield; with more threads, more of them wait).
void PackMarkedTiles(const std::vector<Work>& works, const std::vector<Task>& tasks,
                     ConvertedTiles* store, int threads) {
  // A job of each work, for its tiles' geometry and arithmetic.
  std::vector<std::optional<Job>> jobs(works.size());
  for (const Task& task : tasks) {
    const size_t i = static_cast<size_t>(task.work - works.data());
    if (jobs[i]) continue;
    jobs[i] = MakeJob(task, nullptr);
    jobs[i]->converted = store;
    jobs[i]->work = static_cast<int64_t>(i);
  }
  struct Piece {
    size_t work;
    int64_t tile;
    bool values;
  };
  std::vector<Piece> pieces;
  for (size_t i = 0; i < works.size(); ++i) {
    if (!jobs[i]) continue;
    const KeyTiles& keys = *works[i].keys;
    for (int64_t t = 0; t * keys.width < keys.keys; ++t) {
      if (!store->Marked(static_cast<int64_t>(i), t)) continue;
      pieces.push_back({i, t, false});
      pieces.push_back({i, t, true});
    }
  }
  const auto pack = [&](const Piece& p) {
    store->Pack(static_cast<int64_t>(p.work), p.tile, p.values,
                [&](void* out) { return PackTile(*jobs[p.work], p.tile, p.values, out); });
  };
  const int64_t count = static_cast<int64_t>(pieces.size());
  if (count == 0) return;
  if (threads <= 1 || count == 1) {
    const onednn::ScopedThreadLimit limit(1);  // oneDNN's reorders on this thread only
    for (const Piece& p : pieces) pack(p);
    return;
  }
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads)
  for (int64_t i = 0; i < count; ++i) pack(pieces[static_cast<size_t>(i)]);
}

// Phase 3, the run: every unit, on up to `threads` OpenMP threads. The first error stops the
// units not yet started and is returned. Span by span, each thread takes one contiguous run of
// the (equal) spans (Work::key_span says why); otherwise the units are dealt one at a time, as
// their sizes differ.
absl::Status RunUnits(const std::vector<Work>& works, const std::vector<Task>& tasks,
                      const Units& units, bool by_span, int threads, const Cancellation* cancel,
                      std::vector<State>* partials, std::atomic<bool>* finite) {
  // Only the matmul path converts tiles (decode's kernels read every dtype in place).
  std::optional<ConvertedTiles> converted;
  for (const Work& w : works) {
    if (!UsesKernels(w.n_q, w.group)) {
      converted.emplace(works);
      break;
    }
  }
  if (converted) {
    PlanPacking(works, tasks, &*converted);
    PackMarkedTiles(works, tasks, &*converted, threads);
  }
  ConvertedTiles* const shared = converted ? &*converted : nullptr;
  const auto run = [&](size_t unit) {
    return RunUnit(works, tasks, units, unit, shared, cancel, partials, finite);
  };
  const size_t count = units.count();
  absl::Status status;
  if (count == 1 || threads == 1) {
    // Without the cap, a call limited to one thread would run oneDNN's matmuls on every CPU.
    const onednn::ScopedThreadLimit limit(threads);
    for (size_t u = 0; u < count && status.ok(); ++u) status = run(u);
    return status;
  }
  Mutex mu;
  std::atomic<bool> failed{false};
  const auto run_one = [&](size_t u) {
    if (failed.load(std::memory_order_relaxed)) return;
    absl::Status unit_status = run(u);
    if (!unit_status.ok()) {
      MutexLock lock(&mu);
      if (status.ok()) status = unit_status;
      failed.store(true, std::memory_order_relaxed);
    }
  };
  if (by_span) {
#pragma omp parallel for schedule(static) num_threads(threads)
    for (size_t u = 0; u < count; ++u) run_one(u);
  } else {
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads)
    for (size_t u = 0; u < count; ++u) run_one(u);
  }
  return status;
}

// Phase 4, the merge: the tasks of a split slot each hold a partial softmax over their keys;
// combines them in key order (as Merge requires) into the slot's first, then normalises it and
// writes the outputs and weights over every key of the rows. Whole tasks were finished as they
// ran. Returns whether every output value it wrote is finite.
bool MergeSplits(const std::vector<Task>& tasks, std::vector<State>* partials) {
  bool finite = true;
  std::vector<float*> out_rows, weight_rows;
  for (size_t i = 0; i < tasks.size();) {
    size_t end = i + 1;
    while (end < tasks.size() && tasks[end].slot == tasks[i].slot) ++end;
    if (!tasks[i].whole) {
      for (size_t p = i + 1; p < end; ++p) Merge((*partials)[p], &(*partials)[i]);
      Task all = tasks[i];
      all.key_begin = 0;
      all.key_end = all.work->keys->keys;
      const Job job = MakeJob(all, nullptr);
      RowsOf(all, &out_rows, &weight_rows);
      finite &= Finish(job, (*partials)[i], out_rows.data(),
                       all.work->weights ? weight_rows.data() : nullptr);
    }
    i = end;
  }
  return finite;
}

}  // namespace

absl::Status Run(const std::vector<Work>& works, int threads, const Cancellation* cancel,
                 bool* outputs_finite) {
  threads = RunThreads(works, threads);
  const bool by_span = BySpan(works);
  const std::vector<Task> tasks = PlanTasks(works, threads, by_span);
  const Units units = GroupUnits(tasks, by_span);
  std::vector<State> partials(tasks.size());
  std::atomic<bool> finite{true};
  ATTEND_RETURN_IF_ERROR(
      RunUnits(works, tasks, units, by_span, threads, cancel, &partials, &finite));
  const bool merged_finite = MergeSplits(tasks, &partials);
  if (outputs_finite != nullptr) *outputs_finite = merged_finite && finite.load();
  return absl::OkStatus();
}

}  // namespace attend::tile
