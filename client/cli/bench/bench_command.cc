// `attend bench`: the server's latency and throughput as a client sees them. Requests go through
// the client library from --concurrency threads sharing one channel; each request's wall time
// is set beside the compute and queue times the server reports in its stats, so that what the
// RPC itself costs (encoding, transport, decoding, scheduling) shows as the difference.
// Health/Check (the empty unary), timed on the same channel with as many callers and calls in
// rounds that alternate with the RPC's, gives that cost a yardstick: each RPC's per-call
// overhead is printed as a ratio to it.
#include "client/cli/bench/bench_command.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "client/attention_client.h"
#include "client/cli/bench/bench_workloads.h"
#include "client/cli/connect/report_error.h"
#include "client/cli/framework/command.h"
#include "client/cli/render/format.h"
#include "client/cli/render/terminal_notes.h"
#include "client/cli/tensors/tensor_flags.h"
#include "client/kv_cache_client.h"

namespace attend::cli {
namespace {

// Nearest-rank percentile of sorted values: the smallest value with at least p% at or below it.
double Percentile(const std::vector<double>& sorted, double p) {
  if (sorted.empty()) return 0;
  const double rank = std::ceil(p / 100.0 * static_cast<double>(sorted.size()));
  const size_t index = static_cast<size_t>(std::clamp(rank, 1.0, double(sorted.size()))) - 1;
  return sorted[index];
}

struct Summary {
  double mean = 0, p50 = 0, p90 = 0, p99 = 0, max = 0;
};

Summary Summarise(std::vector<double> values) {
  Summary s;
  if (values.empty()) return s;
  std::sort(values.begin(), values.end());
  double sum = 0;
  for (double v : values) sum += v;
  s.mean = sum / static_cast<double>(values.size());
  s.p50 = Percentile(values, 50);
  s.p90 = Percentile(values, 90);
  s.p99 = Percentile(values, 99);
  s.max = values.back();
  return s;
}

std::string SummaryJson(const Summary& s) {
  return absl::StrCat("{\"mean\": ", JsonNumber(s.mean), ", \"p50\": ", JsonNumber(s.p50),
                      ", \"p90\": ", JsonNumber(s.p90), ", \"p99\": ", JsonNumber(s.p99),
                      ", \"max\": ", JsonNumber(s.max), "}");
}

std::vector<std::string> SummaryRow(const std::string& name, const Summary& s) {
  return {name,           Duration(s.mean), Duration(s.p50), Duration(s.p90), Duration(s.p99),
          Duration(s.max)};
}

// The flags of `attend bench`, with the workload's defaults (BenchOptions).
struct BenchFlags {
  std::string rpc = "attend";
  int64_t requests = BenchOptions().requests;
  int64_t concurrency = BenchOptions().workers;
  int64_t warmup = BenchOptions().warmup;
  Given<int64_t> n_q{BenchOptions().n_q};
  int64_t n_kv = BenchOptions().n_kv;
  Given<int64_t> n_head{BenchOptions().heads};
  std::optional<int64_t> n_head_kv;  // unset: n_head
  std::optional<int64_t> heads;      // older names of --n_head and --n_head_kv
  std::optional<int64_t> heads_kv;
  int64_t head_dim = BenchOptions().head_dim;
  Given<int64_t> batch{BenchOptions().batch};
  bool causal = false;
  std::string kv_dtype = "bf16";
  bool no_empty_unary = false;
  std::string precision;
  std::string wire = "f32";
  int64_t seed = BenchOptions().seed;

  void Declare(Flags& f) {
    f.Add("rpc", &rpc,
          "attend (Attend), decode (DecodeBatch over the KV cache), decode_stream (its steps "
          "over one DecodeStream) or softmax")
        .Values({"attend", "decode", "decode_stream", "softmax"},
                "--rpc: '%s'; use attend, decode, decode_stream or softmax");
    f.Add("requests", &requests, "measured calls").Range(1, int64_t{1} << 30);
    f.Add("concurrency", &concurrency, "callers at once (threads sharing the channel)")
        .Range(1, 1024);
    f.Add("warmup", &warmup, "calls before measuring").Range(0, int64_t{1} << 20);
    f.Add("n_q", &n_q, "attend: queries").Range(1, 1 << 20);
    f.Add("n_kv", &n_kv, "attend: keys; decode, decode_stream: prefilled tokens; softmax: scores")
        .Range(1, 1 << 24);
    f.Add("n_head", &n_head, "query heads").Range(1, 1 << 16);
    f.Add("n_head_kv", &n_head_kv, "key/value heads (divides n_head)")
        .Range(1, 1 << 16)
        .Shown("n_head");
    f.Add("heads", &heads, "alias of --n_head").Range(1, 1 << 16);
    f.Add("heads_kv", &heads_kv, "alias of --n_head_kv").Range(1, 1 << 16);
    f.Add("head_dim", &head_dim, "head size").Range(1, 1 << 16);
    f.Add("batch", &batch, "decode, decode_stream: sequences per step").Range(1, 4096);
    f.Add("causal", &causal, "attend: causal mask");
    f.Add("kv_dtype", &kv_dtype, "decode, decode_stream: the cache's storage, bf16, f32 or int8");
    f.Add("no_empty_unary", &no_empty_unary,
          "do not time Health/Check, the yardstick of the overhead ratio");
    DeclarePrecision(f, &precision);
    DeclareWire(f, &wire);
    f.Add("seed", &seed, "seed of the random inputs").Range(0, INT64_MAX);
  }
};

// The flag's value, or its older name's; INVALID_ARGUMENT when both are given.
absl::StatusOr<int64_t> Aliased(const char* flag, const Given<int64_t>& value, const char* alias,
                                const std::optional<int64_t>& alias_value) {
  if (value.given && alias_value) {
    return absl::InvalidArgumentError(
        absl::StrCat("give --", flag, " or its alias --", alias, ", not both"));
  }
  return alias_value.value_or(value.value);
}

// The workload the flags describe; INVALID_ARGUMENT for flags that do not go with --rpc.
absl::StatusOr<BenchOptions> ParseBenchFlags(const BenchFlags& f) {
  BenchOptions o;
  o.rpc = f.rpc;
  const bool decode = o.rpc == "decode" || o.rpc == "decode_stream";
  absl::StatusOr<int64_t> heads = Aliased("n_head", f.n_head, "heads", f.heads);
  if (!heads.ok()) return heads.status();
  absl::StatusOr<int64_t> heads_kv =
      Aliased("n_head_kv", Given<int64_t>{f.n_head_kv.value_or(*heads), f.n_head_kv.has_value()},
              "heads_kv", f.heads_kv);
  if (!heads_kv.ok()) return heads_kv.status();
  if (!decode && f.batch.given) {
    return absl::InvalidArgumentError("--batch is for --rpc decode and decode_stream");
  }
  if (decode && f.n_q.given) {
    return absl::InvalidArgumentError(
        absl::StrCat("--rpc ", o.rpc, " sends one query per sequence; --n_q is for attend"));
  }
  absl::StatusOr<v1::Precision> precision = ParsePrecision(f.precision);
  if (!precision.ok()) return precision.status();
  absl::StatusOr<client::Wire> wire = client::ParseWire(f.wire);
  if (!wire.ok()) return wire.status();
  o.kv_dtype = f.kv_dtype;
  if (o.kv_dtype != "bf16" && o.kv_dtype != "f32" && o.kv_dtype != "int8") {
    return absl::InvalidArgumentError("--kv_dtype: use bf16, f32 or int8");
  }
  o.requests = f.requests;
  o.workers = static_cast<int>(f.concurrency);
  o.warmup = f.warmup;
  o.n_q = f.n_q.value;
  o.n_kv = f.n_kv;
  o.heads = *heads;
  o.seed = f.seed;
  o.heads_kv = *heads_kv;
  o.head_dim = f.head_dim;
  o.batch = f.batch.value;
  o.causal = f.causal;
  o.empty_unary = !f.no_empty_unary;
  o.precision = *precision;
  o.wire = *wire;
  return o;
}

double Since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// The measured calls of a run, by worker, and the wall time they took together.
struct Measurement {
  std::vector<std::vector<Sample>> samples;  // [worker]
  double wall = 0;
};

// Rounds that the RPC's calls and the empty unary's alternate in. A shared VM drifts: its
// Health/Check latency moved between 150 and 220 us from one run to the next minutes apart, and
// measured one after the other the RPC and its yardstick saw different machines.
constexpr int64_t kRounds = 10, kCallsPerRound = 20;

// `requests` calls of `work` from `workers` threads, added to `m` (samples and wall time), each
// counted in `done`. The first failure ends the round and is returned.
absl::Status MeasureRound(const Workload& work, int workers, int64_t requests,
                          std::atomic<int64_t>* done, Measurement* m) {
  std::atomic<int64_t> next{0};
  std::atomic<bool> failed{false};
  std::mutex error_mu;
  absl::Status first_error;
  const auto wall_start = std::chrono::steady_clock::now();
  std::vector<std::thread> threads;
  for (int w = 0; w < workers; ++w) {
    threads.emplace_back([&, w] {
      while (!failed.load() && next.fetch_add(1) < requests) {
        absl::StatusOr<Sample> s = work.call(w);
        if (!s.ok()) {
          std::lock_guard<std::mutex> lock(error_mu);
          if (first_error.ok()) first_error = s.status();
          failed.store(true);
          return;
        }
        m->samples[static_cast<size_t>(w)].push_back(*s);
        done->fetch_add(1);
      }
    });
  }
  for (std::thread& t : threads) t.join();
  m->wall += Since(wall_start);
  return first_error;
}

// A run's calls, and the empty unary's when it was timed.
struct Measured {
  Measurement work;
  std::optional<Measurement> empty_unary;
  int64_t rounds = 1;
};

// --warmup calls of `work` (and of `empty_unary` when set) that are not measured (the
// connection, server-side primitives and caches), then --requests calls of each from
// --concurrency threads, in up to kRounds alternating rounds of at least kCallsPerRound calls
// per caller, with a progress line on `err` when `progress`. The first failure ends the run: a
// benchmark of failing calls measures nothing.
absl::StatusOr<Measured> Measure(const Workload& work, const Workload* empty_unary,
                                 const BenchOptions& o, std::ostream* err, bool progress) {
  for (int64_t i = 0; i < o.warmup; ++i) {
    if (absl::StatusOr<Sample> s = work.call(0); !s.ok()) return s.status();
    if (empty_unary == nullptr) continue;
    if (absl::StatusOr<Sample> s = empty_unary->call(0); !s.ok()) return s.status();
  }
  Measured m;
  m.work.samples.resize(static_cast<size_t>(o.workers));
  if (empty_unary != nullptr) {
    m.empty_unary.emplace().samples.resize(static_cast<size_t>(o.workers));
    // At least kCallsPerRound calls per caller in each round: callers that run out of calls
    // near a round's end lower its concurrency, and that share stays small.
    m.rounds = std::clamp<int64_t>(o.requests / (o.workers * kCallsPerRound), 1, kRounds);
  }
  std::atomic<int64_t> done{0};
  ProgressLine line(err, progress,
                    absl::StrCat("bench ", work.rpc,
                                 empty_unary != nullptr ? absl::StrCat(" and ", empty_unary->rpc)
                                                        : std::string()),
                    o.requests * (empty_unary != nullptr ? 2 : 1), &done);
  for (int64_t r = 0; r < m.rounds; ++r) {
    const int64_t requests = o.requests * (r + 1) / m.rounds - o.requests * r / m.rounds;
    if (absl::Status s = MeasureRound(work, o.workers, requests, &done, &m.work); !s.ok()) return s;
    if (empty_unary == nullptr) continue;
    if (absl::Status s = MeasureRound(*empty_unary, o.workers, requests, &done, &*m.empty_unary);
        !s.ok()) {
      return s;
    }
  }
  line.Stop();
  return m;
}

// A run's numbers: client latency, and for RPCs with stats the server's compute and queue time
// and what is left of the latency (the overhead).
struct BenchResult {
  int64_t done = 0;
  double wall = 0, rate = 0;  // seconds, requests per second
  Summary latency, compute, queue, overhead;
  bool server_times = false;  // compute, queue and overhead are known
  int64_t flops = 0;
  double compute_total = 0;  // seconds
  int64_t rounds = 1;        // the empty unary's: rounds it alternated with the RPC's calls in
};

BenchResult Tally(const Measurement& m) {
  std::vector<double> latency, compute, queue, overhead;
  BenchResult r;
  for (const auto& per_worker : m.samples) {
    for (const Sample& s : per_worker) {
      latency.push_back(s.latency);
      r.flops += s.flops;
      if (s.compute && s.queue) {
        compute.push_back(*s.compute);
        queue.push_back(*s.queue);
        overhead.push_back(s.latency - *s.compute - *s.queue);
      }
    }
  }
  r.done = static_cast<int64_t>(latency.size());
  r.wall = m.wall;
  r.rate = m.wall > 0 ? static_cast<double>(r.done) / m.wall : 0;
  r.latency = Summarise(latency);
  r.compute = Summarise(compute);
  r.queue = Summarise(queue);
  r.overhead = Summarise(overhead);
  r.server_times = !compute.empty();
  for (double v : compute) r.compute_total += v;
  return r;
}

// The per-call overhead of a run beside the empty unary of the same run: the overhead where the
// server reports its times, else the whole latency (to the client such an RPC is all
// overhead), as a ratio to Health/Check's latency.
struct OverheadRatio {
  Summary per_call;     // seconds
  Summary empty_unary;  // Health/Check latency, seconds
  double p50 = 0, mean = 0;
};

std::optional<OverheadRatio> Ratio(const BenchResult& r, const std::optional<BenchResult>& empty) {
  if (!empty || empty->latency.p50 <= 0 || empty->latency.mean <= 0) return std::nullopt;
  OverheadRatio ratio;
  ratio.per_call = r.server_times ? r.overhead : r.latency;
  ratio.empty_unary = empty->latency;
  ratio.p50 = ratio.per_call.p50 / ratio.empty_unary.p50;
  ratio.mean = ratio.per_call.mean / ratio.empty_unary.mean;
  return ratio;
}

// The most a one-token decode step's overhead should cost in empty unaries: a DecodeBatch call
// carries one sequence's step in a unary of its own, a DecodeStream step rides a call that is
// already open. 0 for other runs.
double OverheadGoal(const BenchOptions& o) {
  if (o.batch != 1) return 0;
  if (o.rpc == "decode") return 1.5;
  if (o.rpc == "decode_stream") return 1.0;
  return 0;
}

void PrintBenchJson(Context& c, const Workload& work, const BenchOptions& o, const BenchResult& r,
                    const std::optional<BenchResult>& empty) {
  *c.out << "{\"rpc\": " << JsonString(work.rpc)
         << ", \"target\": " << JsonString(c.connection.target)
         << ", \"shape\": " << JsonString(work.shape) << ", \"requests\": " << r.done
         << ", \"warmup\": " << o.warmup << ", \"concurrency\": " << o.workers
         << ", \"wall_seconds\": " << JsonNumber(r.wall)
         << ", \"requests_per_second\": " << JsonNumber(r.rate)
         << ", \"latency_seconds\": " << SummaryJson(r.latency);
  if (r.server_times) {
    *c.out << ", \"server_compute_seconds\": " << SummaryJson(r.compute)
           << ", \"server_queue_seconds\": " << SummaryJson(r.queue)
           << ", \"overhead_seconds\": " << SummaryJson(r.overhead)
           << ", \"attention_flops\": " << r.flops << ", \"server_flops_per_second\": "
           << JsonNumber(r.compute_total > 0 ? static_cast<double>(r.flops) / r.compute_total : 0);
  } else {
    *c.out << ", \"server_compute_seconds\": null, \"server_queue_seconds\": null, "
              "\"overhead_seconds\": null";
  }
  const std::optional<OverheadRatio> ratio = Ratio(r, empty);
  if (empty) {
    *c.out << ", \"empty_unary\": {\"rpc\": \"grpc.health.v1.Health/Check\", \"requests\": "
           << empty->done << ", \"rounds\": " << empty->rounds
           << ", \"latency_seconds\": " << SummaryJson(empty->latency) << "}";
  } else {
    *c.out << ", \"empty_unary\": null";
  }
  if (ratio) {
    *c.out << ", \"per_call_overhead_seconds\": " << SummaryJson(ratio->per_call)
           << ", \"overhead_ratio\": {\"p50\": " << JsonNumber(ratio->p50)
           << ", \"mean\": " << JsonNumber(ratio->mean) << "}";
  } else {
    *c.out << ", \"per_call_overhead_seconds\": null, \"overhead_ratio\": null";
  }
  const double goal = OverheadGoal(o);
  *c.out << ", \"overhead_ratio_goal\": " << (goal > 0 ? JsonNumber(goal) : "null") << "}\n";
}

// "per call 212 us = 1.31x the empty unary (Health/Check 162 us), p50s; means 1.28x" and, for a
// one-token decode step, the goal and whether the run met it.
void PrintRatio(std::ostream& out, const BenchOptions& o, const Workload& work,
                const OverheadRatio& ratio) {
  out << "per call " << Duration(ratio.per_call.p50) << " = " << absl::StrFormat("%.2fx", ratio.p50)
      << " the empty unary (Health/Check " << Duration(ratio.empty_unary.p50) << "), p50s; means "
      << absl::StrFormat("%.2fx", ratio.mean) << "\n";
  if (const double goal = OverheadGoal(o); goal > 0) {
    out << "goal for a 1-token " << work.rpc << " step: <= " << absl::StrFormat("%.1fx", goal)
        << " the empty unary: " << (ratio.p50 <= goal ? "met" : "not met") << " at p50\n";
  }
}

void PrintBenchText(Context& c, const Workload& work, const BenchOptions& o, const BenchResult& r,
                    const std::optional<BenchResult>& empty) {
  *c.out << "bench " << work.rpc << " on " << c.connection.target << ": "
         << Plural(r.done, "request", "requests") << " (after " << o.warmup << " warm-up), "
         << Plural(o.workers, "concurrent caller", "concurrent callers") << "\n"
         << work.shape << "\n\n";
  Table table({"", "mean", "p50", "p90", "p99", "max"});
  table.set_drop_order({"max", "p90", "p99", "mean"});
  table.AddRow(SummaryRow("latency (client)", r.latency));
  if (r.server_times) {
    table.AddRow(SummaryRow("server compute", r.compute));
    table.AddRow(SummaryRow("server queue", r.queue));
    table.AddRow(SummaryRow("overhead", r.overhead));
  }
  if (empty) table.AddRow(SummaryRow("empty unary", empty->latency));
  PrintTable(table, TableStyleFromFlags(c.no_headers, c.wide), *c.out, *c.err);
  *c.out << "\n"
         << absl::StrFormat("throughput %.1f requests/s (%s wall)", r.rate, Duration(r.wall));
  if (r.server_times && r.compute_total > 0) {
    *c.out << "; the server computed "
           << Si(static_cast<double>(r.flops) / r.compute_total, "FLOP/s") << " while busy";
  }
  *c.out << "\n";
  if (r.server_times) {
    *c.out << "overhead = latency - server compute - server queue: encoding, transport, "
              "decoding and scheduling of the RPC\n";
  }
  if (empty) {
    *c.out << "empty unary = Health/Check latency on the same channel, as many callers and calls,\n"
           << "  in " << Plural(empty->rounds, "round", "rounds")
           << " alternating with the RPC's\n";
  }
  if (const std::optional<OverheadRatio> ratio = Ratio(r, empty)) {
    PrintRatio(*c.out, o, work, *ratio);
  }
}

int RunBench(Context& c, const BenchFlags& flags) {
  c.wire = flags.wire;
  absl::StatusOr<BenchOptions> options = ParseBenchFlags(flags);
  if (!options.ok()) return UsageError(c, options.status());
  std::mt19937_64 rng(static_cast<uint64_t>(options->seed));
  client::AttentionClient attention(c.Channel(), c.connection);
  client::KvCacheClient kv(c.Channel(), c.connection);
  absl::StatusOr<Workload> work;
  if (options->rpc == "attend") {
    work = AttendWorkload(*options, attention, rng);
  } else if (options->rpc == "softmax") {
    work = SoftmaxWorkload(*options, attention, rng);
  } else {
    work = DecodeWorkload(*options, kv, c.connection.max_message_bytes, c.connection.deadline,
                          options->rpc == "decode_stream", rng);
  }
  if (!work.ok()) return ReportError(c, work.status());
  const Workload health = HealthWorkload(c.Channel(), c.connection.deadline);
  absl::StatusOr<Measured> measured =
      Measure(*work, options->empty_unary ? &health : nullptr, *options, c.err, c.err_is_terminal);
  work->cleanup();
  if (!measured.ok()) return ReportError(c, measured.status());
  const BenchResult result = Tally(measured->work);
  std::optional<BenchResult> empty;
  if (measured->empty_unary) {
    empty = Tally(*measured->empty_unary);
    empty->rounds = measured->rounds;
  }
  if (c.json) {
    PrintBenchJson(c, *work, *options, result, empty);
  } else {
    PrintBenchText(c, *work, *options, result, empty);
  }
  return kExitOk;
}

}  // namespace

std::vector<Command> BenchCommands() {
  Command bench{
      "bench", "measure the server from here: latency percentiles, requests/s, server compute",
      "attend bench [--rpc attend|decode|decode_stream|softmax] [--n_q N] [--n_kv N] "
      "[--n_head H] [--requests N] [--concurrency C] [--warmup N]",
      "Sends --requests calls from --concurrency threads over one channel, after --warmup\n"
      "calls that are not measured, and prints the client's latency percentiles (p50, p90, p99:\n"
      "nearest rank), requests per second, and the compute and queue times the server reports,\n"
      "so that the RPC's own cost shows as the difference ('overhead'). The inputs are random\n"
      "and made before the clock starts. --rpc decode creates --batch sequences per caller\n"
      "(one layer each), prefills --n_kv tokens, times DecodeBatch steps (each adds a token) and\n"
      "releases the sequences at the end; --rpc decode_stream does the same over one "
      "DecodeStream\n"
      "per caller and times each step (message written to response read). Health/Check (the\n"
      "empty unary) is timed on the same channel with as many callers and calls, in up to 10\n"
      "rounds that alternate with the RPC's (each of at least 20 calls per caller) so that both\n"
      "see the machine alike, and each RPC's per-call overhead is printed as a ratio to it\n"
      "(--no_empty_unary skips it).\n"
      "On a terminal a progress line shows on stderr. The run stops at the first failed call\n"
      "and reports it.\n"
      "Examples:\n  attend bench\n"
      "  attend bench --rpc attend --n_q 1 --n_kv 4096 --n_head 32 --n_head_kv 8 --head_dim 128\n"
      "  attend bench --rpc decode --n_kv 2048 --batch 4 --concurrency 2 --requests 200\n"
      "  attend bench --rpc decode_stream --n_kv 2048 --requests 1000\n"
      "  attend bench --rpc softmax --n_kv 8 --requests 1000 --json\n"};
  bench.define = Define(RunBench);
  return {bench};
}

}  // namespace attend::cli
