// `attend bench`: the server's latency and throughput as a client sees them. Requests go through
// the client library from --concurrency threads sharing one channel; each request's wall time
// is set beside the compute and queue times the server reports in its stats, so that what the
// RPC itself costs (encoding, transport, decoding, scheduling) shows as the difference.
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
#include "client/cli/command.h"
#include "client/cli/format.h"
#include "client/kv_cache_client.h"

namespace attend::cli {
namespace {

using client::FloatTensor;

// One request's times in seconds; the server's parts are absent for RPCs without stats.
struct Sample {
  double latency = 0;
  std::optional<double> compute;
  std::optional<double> queue;
  int64_t flops = 0;
};

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

// What one benchmark run sends: a call per request, made by worker `w`.
struct Workload {
  std::string rpc;    // "Attend", "DecodeBatch", "Softmax"
  std::string shape;  // for the report
  std::function<absl::StatusOr<Sample>(int w)> call;
  std::function<void()> cleanup = [] {};
};

double Since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

Sample FromStats(double latency, const v1::ComputeStats& stats) {
  return {latency, stats.compute_seconds(), stats.queue_seconds(), stats.attention_flops()};
}

// The command line of a benchmark run.
struct BenchOptions {
  std::string rpc;  // attend, decode or softmax
  int64_t requests = 100, warmup = 5;
  int workers = 1;  // --concurrency
  int64_t n_q = 1, n_kv = 1024, heads = 8, heads_kv = 8, head_dim = 64, batch = 1;
  int64_t seed = 1;
  bool causal = false;
  v1::Precision precision = v1::PRECISION_UNSPECIFIED;
  client::Wire wire = client::Wire::kFloat32;
  std::string kv_dtype;  // bf16, f32 or int8
};

// The integer flag --<flag>, or its older name --<alias> (IntFlag's checks either way);
// INVALID_ARGUMENT when both are given.
absl::StatusOr<int64_t> AliasedIntFlag(const Args& args, const std::string& flag,
                                       const std::string& alias, int64_t fallback, int64_t min,
                                       int64_t max) {
  if (args.Has(flag) && args.Has(alias)) {
    return absl::InvalidArgumentError(
        absl::StrCat("give --", flag, " or its alias --", alias, ", not both"));
  }
  return IntFlag(args, args.Has(alias) ? alias : flag, fallback, min, max);
}

// The bench flags; INVALID_ARGUMENT for the first that is wrong or does not go with --rpc.
absl::StatusOr<BenchOptions> ParseBenchFlags(const Args& args) {
  BenchOptions o;
  o.rpc = args.GetString("rpc", "attend");
  if (o.rpc != "attend" && o.rpc != "decode" && o.rpc != "softmax") {
    return absl::InvalidArgumentError(
        absl::StrCat("--rpc: '", o.rpc, "'; use attend, decode or softmax"));
  }
  if (!args.positional().empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("'attend bench' takes flags only; unexpected '", args.positional()[0], "'"));
  }
  absl::StatusOr<int64_t> requests = IntFlag(args, "requests", 100, 1, int64_t{1} << 30);
  absl::StatusOr<int64_t> concurrency = IntFlag(args, "concurrency", 1, 1, 1024);
  absl::StatusOr<int64_t> warmup = IntFlag(args, "warmup", 5, 0, int64_t{1} << 20);
  absl::StatusOr<int64_t> n_q = IntFlag(args, "n_q", 1, 1, 1 << 20);
  absl::StatusOr<int64_t> n_kv = IntFlag(args, "n_kv", 1024, 1, 1 << 24);
  absl::StatusOr<int64_t> heads = AliasedIntFlag(args, "n_head", "heads", 8, 1, 1 << 16);
  absl::StatusOr<int64_t> seed = IntFlag(args, "seed", 1, 0, INT64_MAX);
  for (const auto* v : {&requests, &concurrency, &warmup, &n_q, &n_kv, &heads, &seed}) {
    if (!v->ok()) return v->status();
  }
  absl::StatusOr<int64_t> heads_kv =
      AliasedIntFlag(args, "n_head_kv", "heads_kv", *heads, 1, 1 << 16);
  absl::StatusOr<int64_t> head_dim = IntFlag(args, "head_dim", 64, 1, 1 << 16);
  absl::StatusOr<int64_t> batch = IntFlag(args, "batch", 1, 1, 4096);
  for (const auto* v : {&heads_kv, &head_dim, &batch}) {
    if (!v->ok()) return v->status();
  }
  if (o.rpc != "decode" && args.Has("batch")) {
    return absl::InvalidArgumentError("--batch is for --rpc decode");
  }
  if (o.rpc == "decode" && args.Has("n_q")) {
    return absl::InvalidArgumentError(
        "--rpc decode sends one query per sequence; --n_q is for attend");
  }
  absl::StatusOr<v1::Precision> precision = ParsePrecision(args);
  if (!precision.ok()) return precision.status();
  absl::StatusOr<client::Wire> wire = client::ParseWire(args.GetString("wire", "f32"));
  if (!wire.ok()) return wire.status();
  o.kv_dtype = args.GetString("kv_dtype", "bf16");
  if (o.kv_dtype != "bf16" && o.kv_dtype != "f32" && o.kv_dtype != "int8") {
    return absl::InvalidArgumentError("--kv_dtype: use bf16, f32 or int8");
  }
  o.requests = *requests;
  o.workers = static_cast<int>(*concurrency);
  o.warmup = *warmup;
  o.n_q = *n_q;
  o.n_kv = *n_kv;
  o.heads = *heads;
  o.seed = *seed;
  o.heads_kv = *heads_kv;
  o.head_dim = *head_dim;
  o.batch = *batch;
  o.causal = args.GetBool("causal");
  o.precision = *precision;
  o.wire = *wire;
  return o;
}

// The workloads make their inputs once, before any timing: the requests measure the server and
// the RPC, not the random number generator. The clients they call must outlive them.

// Attend calls on one random q/k/v.
Workload AttendWorkload(const BenchOptions& o, const client::AttentionClient& attention,
                        std::mt19937_64& rng) {
  auto input = std::make_shared<client::AttendInput>();
  input->q = RandomTensor(rng, {o.n_q, o.heads, o.head_dim});
  input->k = RandomTensor(rng, {o.n_kv, o.heads_kv, o.head_dim});
  input->v = RandomTensor(rng, {o.n_kv, o.heads_kv, o.head_dim});
  input->mask.causal = o.causal;
  input->precision = o.precision;
  input->wire = o.wire;
  Workload work;
  work.rpc = "Attend";
  work.shape =
      absl::StrCat("q [", o.n_q, ", ", o.heads, ", ", o.head_dim, "], k/v [", o.n_kv, ", ",
                   o.heads_kv, ", ", o.head_dim, "]", input->mask.causal ? ", causal" : "");
  work.call = [&attention, input](int) -> absl::StatusOr<Sample> {
    const auto start = std::chrono::steady_clock::now();
    absl::StatusOr<client::AttendOutput> r = attention.Attend(*input);
    const double latency = Since(start);
    if (!r.ok()) return r.status();
    return FromStats(latency, r->stats);
  };
  return work;
}

// Softmax calls on --n_kv random scores.
Workload SoftmaxWorkload(const BenchOptions& o, const client::AttentionClient& attention,
                         std::mt19937_64& rng) {
  auto logits = std::make_shared<std::vector<double>>();
  std::normal_distribution<double> normal;
  for (int64_t i = 0; i < o.n_kv; ++i) logits->push_back(normal(rng));
  Workload work;
  work.rpc = "Softmax";
  work.shape = absl::StrCat(Count(o.n_kv), " scores (--n_kv); Softmax reports no server times");
  work.call = [&attention, logits](int) -> absl::StatusOr<Sample> {
    const auto start = std::chrono::steady_clock::now();
    absl::StatusOr<v1::SoftmaxResponse> r = attention.Softmax(*logits, false);
    const double latency = Since(start);
    if (!r.ok()) return r.status();
    return Sample{latency, std::nullopt, std::nullopt, 0};
  };
  return work;
}

// Sequences of one decode benchmark: each worker owns `batch` sequences of one layer, prefilled
// with n_kv tokens, and each of its requests is one DecodeBatch step over all of them. Workers
// never share a sequence: the server serialises requests on one sequence.
struct DecodeSetup {
  std::vector<std::vector<std::string>> ids;    // [worker][batch]
  std::vector<client::DecodeBatchInput> steps;  // [worker]
};

// Creates and prefills worker `w`'s sequences (recording each in setup->ids as it is created)
// and makes its decode step.
absl::Status PrefillWorker(const BenchOptions& o, const client::KvCacheClient& kv,
                           const v1::SequenceConfig& config, const std::string& prefix,
                           int64_t chunk, int w, std::mt19937_64& rng, DecodeSetup* setup) {
  setup->ids.emplace_back();
  client::DecodeBatchInput step;
  step.layer = 0;
  step.precision = o.precision;
  step.wire = o.wire;
  for (int64_t b = 0; b < o.batch; ++b) {
    const std::string id = absl::StrCat(prefix, "-w", w, "-", b);
    absl::StatusOr<v1::SequenceInfo> created = kv.CreateSequence(config, id);
    if (!created.ok()) return created.status();
    setup->ids.back().push_back(id);
    for (int64_t done = 0; done < o.n_kv; done += chunk) {
      const int64_t n = std::min(chunk, o.n_kv - done);
      client::AppendInput prefill;
      prefill.sequence_id = id;
      prefill.k = RandomTensor(rng, {n, o.heads_kv, o.head_dim});
      prefill.v = RandomTensor(rng, {n, o.heads_kv, o.head_dim});
      prefill.wire = o.wire;
      if (absl::StatusOr<client::AppendOutput> r = kv.Append(prefill); !r.ok()) return r.status();
    }
    step.steps.push_back({id, RandomTensor(rng, {1, o.heads, o.head_dim}),
                          RandomTensor(rng, {1, o.heads_kv, o.head_dim}),
                          RandomTensor(rng, {1, o.heads_kv, o.head_dim})});
  }
  setup->steps.push_back(std::move(step));
  return absl::OkStatus();
}

// DecodeBatch steps over each worker's own prefilled sequences, which the cleanup releases.
// When setting up fails, what was created is released before the error returns.
absl::StatusOr<Workload> DecodeWorkload(const BenchOptions& o, const client::KvCacheClient& kv,
                                        int64_t max_message_bytes, std::mt19937_64& rng) {
  v1::SequenceConfig config;
  config.set_layers(1);
  config.set_n_head(static_cast<int32_t>(o.heads));
  config.set_n_head_kv(static_cast<int32_t>(o.heads_kv));
  config.set_head_dim(static_cast<int32_t>(o.head_dim));
  config.set_head_dim_v(static_cast<int32_t>(o.head_dim));
  config.set_kv_dtype(o.kv_dtype == "f32"    ? v1::FLOAT32
                      : o.kv_dtype == "int8" ? v1::INT8
                                             : v1::BFLOAT16);
  const std::string prefix = absl::StrFormat("bench-%016x", std::random_device()() ^ rng());
  auto setup = std::make_shared<DecodeSetup>();
  Workload work;
  // Whatever was created is released on every way out.
  work.cleanup = [&kv, setup] {
    for (const auto& ids : setup->ids) {
      for (const std::string& id : ids) (void)kv.Release(id);
    }
  };
  // Prefill in chunks that keep each Append under a quarter of the message limit.
  const int64_t token_bytes = 2 * o.heads_kv * o.head_dim * 4;
  const int64_t chunk = std::max<int64_t>(1, std::min(o.n_kv, max_message_bytes / 4 / token_bytes));
  for (int w = 0; w < o.workers; ++w) {
    if (absl::Status s = PrefillWorker(o, kv, config, prefix, chunk, w, rng, setup.get());
        !s.ok()) {
      work.cleanup();
      return s;
    }
  }
  work.rpc = "DecodeBatch";
  work.shape = absl::StrCat(Plural(o.batch, "sequence", "sequences"), " per call (", o.kv_dtype,
                            " cache, prefilled with ", Count(o.n_kv), " tokens), ", o.heads,
                            " heads, ", o.heads_kv, " kv heads, head_dim ", o.head_dim);
  work.call = [&kv, setup](int w) -> absl::StatusOr<Sample> {
    const auto start = std::chrono::steady_clock::now();
    absl::StatusOr<client::DecodeBatchOutput> r = kv.DecodeBatch(setup->steps[w]);
    const double latency = Since(start);
    if (!r.ok()) return r.status();
    return FromStats(latency, r->stats);
  };
  return work;
}

// The measured calls of a run, by worker, and the wall time they took together.
struct Measurement {
  std::vector<std::vector<Sample>> samples;  // [worker]
  double wall = 0;
};

// --warmup calls that are not measured (the connection, server-side primitives and caches),
// then --requests calls from --concurrency threads. The first failure ends the run: a benchmark
// of failing calls measures nothing.
absl::StatusOr<Measurement> Measure(const Workload& work, const BenchOptions& o) {
  for (int64_t i = 0; i < o.warmup; ++i) {
    if (absl::StatusOr<Sample> s = work.call(0); !s.ok()) return s.status();
  }
  Measurement m;
  m.samples.resize(static_cast<size_t>(o.workers));
  std::atomic<int64_t> next{0};
  std::atomic<bool> failed{false};
  std::mutex error_mu;
  absl::Status first_error;
  const auto wall_start = std::chrono::steady_clock::now();
  std::vector<std::thread> threads;
  for (int w = 0; w < o.workers; ++w) {
    threads.emplace_back([&, w] {
      while (!failed.load() && next.fetch_add(1) < o.requests) {
        absl::StatusOr<Sample> s = work.call(w);
        if (!s.ok()) {
          std::lock_guard<std::mutex> lock(error_mu);
          if (first_error.ok()) first_error = s.status();
          failed.store(true);
          return;
        }
        m.samples[static_cast<size_t>(w)].push_back(*s);
      }
    });
  }
  for (std::thread& t : threads) t.join();
  m.wall = Since(wall_start);
  if (!first_error.ok()) return first_error;
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

void PrintBenchJson(Context& c, const Workload& work, const BenchOptions& o, const BenchResult& r) {
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
  *c.out << "}\n";
}

void PrintBenchText(Context& c, const Workload& work, const BenchOptions& o, const BenchResult& r) {
  *c.out << "bench " << work.rpc << " on " << c.connection.target << ": "
         << Plural(r.done, "request", "requests") << " (after " << o.warmup << " warm-up), "
         << Plural(o.workers, "concurrent caller", "concurrent callers") << "\n"
         << work.shape << "\n\n";
  Table table({"", "mean", "p50", "p90", "p99", "max"});
  table.AddRow(SummaryRow("latency (client)", r.latency));
  if (r.server_times) {
    table.AddRow(SummaryRow("server compute", r.compute));
    table.AddRow(SummaryRow("server queue", r.queue));
    table.AddRow(SummaryRow("overhead", r.overhead));
  }
  *c.out << table.Render() << "\n"
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
}

int RunBench(Context& c) {
  absl::StatusOr<BenchOptions> options = ParseBenchFlags(c.args);
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
    work = DecodeWorkload(*options, kv, c.connection.max_message_bytes, rng);
  }
  if (!work.ok()) return ReportError(c, work.status());
  absl::StatusOr<Measurement> measured = Measure(*work, *options);
  work->cleanup();
  if (!measured.ok()) return ReportError(c, measured.status());
  const BenchResult result = Tally(*measured);
  if (c.json) {
    PrintBenchJson(c, *work, *options, result);
  } else {
    PrintBenchText(c, *work, *options, result);
  }
  return kExitOk;
}

}  // namespace

std::vector<Command> BenchCommands() {
  return {
      {"bench",
       "measure the server from here: latency percentiles, requests/s, server compute",
       "attend bench [--rpc attend|decode|softmax] [--n_q N] [--n_kv N] [--n_head H] "
       "[--requests N] [--concurrency C] [--warmup N]",
       "Sends --requests calls from --concurrency threads over one channel, after --warmup\n"
       "calls that are not measured, and prints the client's latency percentiles (p50, p90, p99:\n"
       "nearest rank), requests per second, and the compute and queue times the server reports,\n"
       "so that the RPC's own cost shows as the difference ('overhead'). The inputs are random\n"
       "and made before the clock starts. --rpc decode creates --batch sequences per caller\n"
       "(one layer each), prefills --n_kv tokens, times DecodeBatch steps (each adds a token) and\n"
       "releases the sequences at the end. The run stops at the first failed call and reports it.\n"
       "Examples:\n  attend bench\n"
       "  attend bench --rpc attend --n_q 1 --n_kv 4096 --n_head 32 --n_head_kv 8 --head_dim 128\n"
       "  attend bench --rpc decode --n_kv 2048 --batch 4 --concurrency 2 --requests 200\n"
       "  attend bench --rpc softmax --n_kv 8 --requests 1000 --json\n",
       {{"rpc", "attend (Attend), decode (DecodeBatch over the KV cache) or softmax", false,
         "attend"},
        {"requests", "measured calls", false, "100"},
        {"concurrency", "callers at once (threads sharing the channel)", false, "1"},
        {"warmup", "calls before measuring", false, "5"},
        {"n_q", "attend: queries", false, "1"},
        {"n_kv", "attend: keys; decode: prefilled tokens; softmax: scores", false, "1024"},
        {"n_head", "query heads", false, "8"},
        {"n_head_kv", "key/value heads (divides n_head)", false, "n_head"},
        {"heads", "alias of --n_head"},
        {"heads_kv", "alias of --n_head_kv"},
        {"head_dim", "head size", false, "64"},
        {"batch", "decode: sequences per DecodeBatch call", false, "1"},
        {"causal", "attend: causal mask", true},
        {"kv_dtype", "decode: the cache's storage, bf16, f32 or int8", false, "bf16"},
        PrecisionFlag(),
        WireFlag(),
        {"seed", "seed of the random inputs", false, "1"}},
       RunBench},
  };
}

}  // namespace attend::cli
