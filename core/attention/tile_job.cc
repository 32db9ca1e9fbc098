// The tile loop of one job (tile_attention.h): a job's query rows against its keys, tile by tile,
// with the online softmax, on the vector kernels (RunKernelJobs) or on matmuls (RunTileJob), and
// the merge and normalisation of its state. How a call is cut into jobs and run is in
// tile_attention.cc.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "core/attention/tile_attention.h"
#include "core/attention/tile_operands.h"
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

}  // namespace attend::tile
