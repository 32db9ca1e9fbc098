// Run (tile_attention.h): a call's works cut into jobs (PlanTasks), ordered into units
// (GroupUnits), the shared tiles packed (PlanPacking, PackMarkedTiles), the units run on the
// threads and the key splits merged. One job's tile loop is in tile_job.cc.
#include "core/attention/tile_attention.h"

#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <optional>
#include <utility>
#include <vector>

#include "core/attention/tile_operands.h"
#include "core/base/mutex.h"
#include "core/base/status_macros.h"
#include "core/kernels/onednn.h"
#include "core/kernels/simd.h"

namespace attend::tile {
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

// Marks for packing the matmul tiles that at least kMinPackedReads jobs read whole (their
// MatmulColumns reach the tile's width), the most read first, until the store's
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
