#include "core/kv_cache/paged_attention.h"

#include <omp.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>

#include "absl/strings/str_cat.h"
#include "core/half.h"
#include "core/mutex.h"
#include "core/onednn.h"
#include "core/status_macros.h"

namespace attend::kv {
namespace {

using dt = dnnl::memory::data_type;

// Rows of the folded query matrix per task: enough for the matmuls to be efficient, few enough
// that the accumulators stay in cache.
constexpr int64_t kRowsPerTask = 64;

struct Arithmetic {
  dt matmul;        // f32, or bf16 when the CPU multiplies bf16 natively
  bool round_bf16;  // bf16 semantics: operands and probabilities rounded to bf16
};

struct Task {
  const PagedProblem* problem;
  int64_t head_kv;
  int64_t row_begin;  // new-token rows [row_begin, row_end)
  int64_t row_end;
  Arithmetic arithmetic;
};

template <typename T>
T* Buffer(std::vector<T>& buffer, int64_t elements) {
  if (buffer.size() < static_cast<size_t>(elements)) buffer.resize(static_cast<size_t>(elements));
  return buffer.data();
}

float RoundBf16(float x) { return Bf16ToFloat(FloatToBf16(x)); }

// A [rows, cols] block operand in the matmul's dtype: the block memory itself when it already
// is, otherwise a converted thread-local copy.
const void* BlockOperand(const char* data, DType stored, int64_t elements, const Arithmetic& a,
                         std::vector<float>& f32, std::vector<uint16_t>& bf16) {
  if (a.matmul == dt::bf16) {
    if (stored == DType::kBFloat16) return data;
    uint16_t* out = Buffer(bf16, elements);
    const auto* in = reinterpret_cast<const float*>(data);
    for (int64_t i = 0; i < elements; ++i) out[i] = FloatToBf16(in[i]);
    return out;
  }
  if (stored == DType::kFloat32 && !a.round_bf16) return data;
  float* out = Buffer(f32, elements);
  if (stored == DType::kBFloat16) {
    const auto* in = reinterpret_cast<const uint16_t*>(data);
    for (int64_t i = 0; i < elements; ++i) out[i] = Bf16ToFloat(in[i]);
  } else {
    const auto* in = reinterpret_cast<const float*>(data);
    for (int64_t i = 0; i < elements; ++i) out[i] = RoundBf16(in[i]);
  }
  return out;
}

absl::Status RunTask(const Task& task) {
  const PagedProblem& p = *task.problem;
  const BlockLayout& layout = *p.layout;
  const int64_t group = p.n_head / layout.n_head_kv;
  const int64_t rows = task.row_end - task.row_begin;
  const int64_t m = rows * group;  // folded rows: (token, head in group)
  const int64_t d = layout.head_dim, dv = layout.head_dim_v, tpb = layout.tokens_per_block;
  const Arithmetic& a = task.arithmetic;

  thread_local std::vector<float> q_f32, scores, acc, tmp, row_max, row_sum, k_f32, v_f32;
  thread_local std::vector<uint16_t> q_bf16, p_bf16, k_bf16, v_bf16;

  // Pack the group's queries, pre-scaled: row (r, j) is query head task.head_kv * group + j.
  float* qp = Buffer(q_f32, m * d);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t j = 0; j < group; ++j) {
      const float* src = p.q + ((task.row_begin + r) * p.n_head + task.head_kv * group + j) * d;
      float* dst = qp + (r * group + j) * d;
      for (int64_t c = 0; c < d; ++c) {
        dst[c] = a.round_bf16 ? RoundBf16(src[c] * p.scale) : src[c] * p.scale;
      }
    }
  }
  const void* q_operand = qp;
  if (a.matmul == dt::bf16) {
    uint16_t* qb = Buffer(q_bf16, m * d);
    for (int64_t i = 0; i < m * d; ++i) qb[i] = FloatToBf16(qp[i]);
    q_operand = qb;
  }

  float* s = Buffer(scores, m * tpb);
  float* accumulator = Buffer(acc, m * dv);
  float* partial = Buffer(tmp, m * dv);
  float* mx = Buffer(row_max, m);
  float* sum = Buffer(row_sum, m);
  std::fill_n(accumulator, m * dv, 0.0f);
  std::fill_n(mx, m, -std::numeric_limits<float>::infinity());
  std::fill_n(sum, m, 0.0f);

  const int64_t first = task.row_begin;
  const KeyRange first_range = VisibleKeys(p.mask, p.n, p.tokens, first);
  const KeyRange last_range = VisibleKeys(p.mask, p.n, p.tokens, task.row_end - 1);
  const int64_t kb = first_range.begin;
  const int64_t ke = std::max(kb, last_range.end);

  onednn::MatmulSpec qk;
  qk.src = {m, d, d, 1, a.matmul};
  qk.weights = {d, tpb, 1, d, a.matmul};
  qk.dst = {m, tpb, tpb, 1, dt::f32};
  onednn::MatmulSpec pv;
  pv.src = {m, tpb, tpb, 1, a.matmul};
  pv.weights = {tpb, dv, dv, 1, a.matmul};
  pv.dst = {m, dv, dv, 1, dt::f32};

  if (p.weights != nullptr) {
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t j = 0; j < group; ++j) {
        float* w = p.weights + ((task.head_kv * group + j) * p.n + first + r) * p.tokens;
        std::fill_n(w, p.tokens, 0.0f);
      }
    }
  }

  for (int64_t b = kb / tpb; ke > kb && b <= (ke - 1) / tpb; ++b) {
    const char* block = (*p.blocks)[static_cast<size_t>(b)]->data;
    const int64_t block_start = b * tpb;
    const void* k_operand = BlockOperand(block + layout.key_offset(task.head_kv, 0), layout.dtype,
                                         tpb * d, a, k_f32, k_bf16);
    ATTEND_RETURN_IF_ERROR(onednn::RunMatmul(qk, q_operand, k_operand, s));

    for (int64_t i = 0; i < m; ++i) {
      const int64_t r = i / group;
      const KeyRange range = VisibleKeys(p.mask, p.n, p.tokens, first + r);
      const int64_t lo = std::clamp(range.begin - block_start, int64_t{0}, tpb);
      const int64_t hi = std::clamp(range.end - block_start, lo, tpb);
      float* row = s + i * tpb;
      if (p.weights != nullptr && hi > lo) {
        float* w = p.weights + ((task.head_kv * group + i % group) * p.n + first + r) * p.tokens;
        std::copy(row + lo, row + hi, w + block_start + lo);
      }
      float block_max = -std::numeric_limits<float>::infinity();
      for (int64_t j = lo; j < hi; ++j) block_max = std::max(block_max, row[j]);
      const float new_max = std::max(mx[i], block_max);
      float alpha = 1.0f;
      float row_total = 0.0f;
      if (new_max != -std::numeric_limits<float>::infinity()) {
        alpha = std::exp(mx[i] - new_max);  // 0 when the old max was -inf
        for (int64_t j = lo; j < hi; ++j) {
          row[j] = std::exp(row[j] - new_max);
          row_total += row[j];
          if (a.round_bf16) row[j] = RoundBf16(row[j]);
        }
      }
      std::fill(row, row + lo, 0.0f);
      std::fill(row + hi, row + tpb, 0.0f);
      mx[i] = new_max;
      sum[i] = sum[i] * alpha + row_total;
      float* out = accumulator + i * dv;
      if (alpha != 1.0f) {
        for (int64_t c = 0; c < dv; ++c) out[c] *= alpha;
      }
    }

    const void* p_operand = s;
    if (a.matmul == dt::bf16) {
      uint16_t* pb = Buffer(p_bf16, m * tpb);
      for (int64_t i = 0; i < m * tpb; ++i) pb[i] = FloatToBf16(s[i]);
      p_operand = pb;
    }
    const void* v_operand = BlockOperand(block + layout.value_offset(task.head_kv, 0), layout.dtype,
                                         tpb * dv, a, v_f32, v_bf16);
    ATTEND_RETURN_IF_ERROR(onednn::RunMatmul(pv, p_operand, v_operand, partial));
    for (int64_t i = 0; i < m * dv; ++i) accumulator[i] += partial[i];
  }

  for (int64_t i = 0; i < m; ++i) {
    const int64_t r = i / group;
    const int64_t h = task.head_kv * group + i % group;
    float* out = p.output + ((first + r) * p.n_head + h) * dv;
    const float inv = sum[i] > 0.0f ? 1.0f / sum[i] : 0.0f;
    for (int64_t c = 0; c < dv; ++c) out[c] = accumulator[i * dv + c] * inv;
    if (p.weights != nullptr) {
      const KeyRange range = VisibleKeys(p.mask, p.n, p.tokens, first + r);
      float* w = p.weights + (h * p.n + first + r) * p.tokens;
      for (int64_t j = range.begin; j < range.end; ++j) w[j] = std::exp(w[j] - mx[i]) * inv;
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status RunPagedAttention(absl::Span<const PagedProblem> problems, Precision precision,
                               int threads, AttentionStats* stats) {
  const auto start = std::chrono::steady_clock::now();
  std::vector<Task> tasks;
  int64_t pairs = 0, flops = 0;
  bool any_bf16 = false, any_emulated = false;
  for (const PagedProblem& p : problems) {
    const BlockLayout& layout = *p.layout;
    if (p.n == 0) continue;
    const bool bf16 = precision == Precision::kBFloat16 ||
                      (precision == Precision::kAuto && layout.dtype == DType::kBFloat16);
    const bool native = bf16 && onednn::HasBf16Matmul();
    any_bf16 |= bf16;
    any_emulated |= bf16 && !native;
    const Arithmetic arithmetic{native ? dt::bf16 : dt::f32, bf16};
    const int64_t group = p.n_head / layout.n_head_kv;
    const int64_t rows_per_task = std::max<int64_t>(1, kRowsPerTask / group);
    for (int64_t g = 0; g < layout.n_head_kv; ++g) {
      for (int64_t r = 0; r < p.n; r += rows_per_task) {
        tasks.push_back({&p, g, r, std::min(p.n, r + rows_per_task), arithmetic});
      }
    }
    const int64_t visible = VisiblePairs(p.mask, p.n, p.tokens) * p.n_head;
    pairs += visible;
    flops += visible * 2 * (layout.head_dim + layout.head_dim_v);
  }

  const int max_threads = threads > 0 ? threads : omp_get_max_threads();
  absl::Status status;
  if (tasks.size() == 1 || max_threads == 1) {
    for (const Task& t : tasks) {
      status = RunTask(t);
      if (!status.ok()) break;
    }
  } else {
    Mutex mu;
    std::atomic<bool> failed{false};
#pragma omp parallel for schedule(dynamic, 1) num_threads(max_threads)
    for (size_t i = 0; i < tasks.size(); ++i) {
      if (failed.load(std::memory_order_relaxed)) continue;
      absl::Status task_status = RunTask(tasks[i]);
      if (!task_status.ok()) {
        MutexLock lock(&mu);
        if (status.ok()) status = task_status;
        failed.store(true, std::memory_order_relaxed);
      }
    }
  }
  ATTEND_RETURN_IF_ERROR(status);
  for (const PagedProblem& p : problems) {
    const int64_t elements = p.n * p.n_head * p.layout->head_dim_v;
    for (int64_t i = 0; i < elements; ++i) {
      if (!std::isfinite(p.output[i])) {
        return absl::InvalidArgumentError(
            "attention output is not finite: q.k * scale overflowed float32; the inputs' "
            "magnitudes are too large");
      }
    }
  }
  if (stats != nullptr) {
    stats->attended_pairs += pairs;
    stats->attention_flops += flops;
    stats->compute_seconds +=
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    stats->engine =
        absl::StrCat("onednn-paged/", any_bf16 ? "bf16" : "f32", any_emulated ? "-emulated" : "");
  }
  return absl::OkStatus();
}

}  // namespace attend::kv
