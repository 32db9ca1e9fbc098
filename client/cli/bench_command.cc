// `attend bench`: the server's latency and throughput as a client sees them. Requests go through
// the client library from --concurrency threads sharing one channel; each request's wall time
// is set beside the compute and queue times the server reports in its stats, so that what the
// RPC itself costs (encoding, transport, decoding, scheduling) shows as the difference.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <functional>
#include <mutex>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

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

// Sequences of one decode benchmark: each worker owns `batch` sequences of one layer, prefilled
// with n_kv tokens, and each of its requests is one DecodeBatch step over all of them. Workers
// never share a sequence: the server serialises requests on one sequence.
struct DecodeSetup {
  std::vector<std::vector<std::string>> ids;    // [worker][batch]
  std::vector<client::DecodeBatchInput> steps;  // [worker]
};

int RunBench(Context& c) {
  const std::string rpc = c.args.GetString("rpc", "attend");
  if (rpc != "attend" && rpc != "decode" && rpc != "softmax") {
    return UsageError(c, absl::InvalidArgumentError(
                             absl::StrCat("--rpc: '", rpc, "'; use attend, decode or softmax")));
  }
  if (!c.args.positional().empty()) {
    return UsageError(
        c, absl::InvalidArgumentError(absl::StrCat("'attend bench' takes flags only; unexpected '",
                                                   c.args.positional()[0], "'")));
  }
  absl::StatusOr<int64_t> requests = IntFlag(c.args, "requests", 100, 1, int64_t{1} << 30);
  absl::StatusOr<int64_t> concurrency = IntFlag(c.args, "concurrency", 1, 1, 1024);
  absl::StatusOr<int64_t> warmup = IntFlag(c.args, "warmup", 5, 0, int64_t{1} << 20);
  absl::StatusOr<int64_t> n_q = IntFlag(c.args, "n_q", 1, 1, 1 << 20);
  absl::StatusOr<int64_t> n_kv = IntFlag(c.args, "n_kv", 1024, 1, 1 << 24);
  absl::StatusOr<int64_t> heads = IntFlag(c.args, "heads", 8, 1, 1 << 16);
  absl::StatusOr<int64_t> seed = IntFlag(c.args, "seed", 1, 0, INT64_MAX);
  for (const auto* v : {&requests, &concurrency, &warmup, &n_q, &n_kv, &heads, &seed}) {
    if (!v->ok()) return UsageError(c, v->status());
  }
  absl::StatusOr<int64_t> heads_kv = IntFlag(c.args, "heads_kv", *heads, 1, 1 << 16);
  absl::StatusOr<int64_t> head_dim = IntFlag(c.args, "head_dim", 64, 1, 1 << 16);
  absl::StatusOr<int64_t> batch = IntFlag(c.args, "batch", 1, 1, 4096);
  for (const auto* v : {&heads_kv, &head_dim, &batch}) {
    if (!v->ok()) return UsageError(c, v->status());
  }
  if (rpc != "decode" && c.args.Has("batch")) {
    return UsageError(c, absl::InvalidArgumentError("--batch is for --rpc decode"));
  }
  if (rpc == "decode" && c.args.Has("n_q")) {
    return UsageError(c, absl::InvalidArgumentError(
                             "--rpc decode sends one query per sequence; --n_q is for attend"));
  }
  absl::StatusOr<v1::Precision> precision = ParsePrecision(c.args);
  if (!precision.ok()) return UsageError(c, precision.status());
  absl::StatusOr<client::Wire> wire = client::ParseWire(c.args.GetString("wire", "f32"));
  if (!wire.ok()) return UsageError(c, wire.status());
  const std::string kv_dtype = c.args.GetString("kv_dtype", "bf16");
  if (kv_dtype != "bf16" && kv_dtype != "f32" && kv_dtype != "int8") {
    return UsageError(c, absl::InvalidArgumentError("--kv_dtype: use bf16, f32 or int8"));
  }
  const int workers = static_cast<int>(*concurrency);
  std::mt19937_64 rng(static_cast<uint64_t>(*seed));

  client::AttentionClient attention(c.Channel(), c.connection);
  client::KvCacheClient kv(c.Channel(), c.connection);
  Workload work;
  // Inputs are made once, before any timing: the requests measure the server and the RPC, not
  // the random number generator.
  client::AttendInput attend_input;
  std::vector<double> logits;
  DecodeSetup decode;
  if (rpc == "attend") {
    attend_input.q = RandomTensor(rng, {*n_q, *heads, *head_dim});
    attend_input.k = RandomTensor(rng, {*n_kv, *heads_kv, *head_dim});
    attend_input.v = RandomTensor(rng, {*n_kv, *heads_kv, *head_dim});
    attend_input.mask.causal = c.args.GetBool("causal");
    attend_input.precision = *precision;
    attend_input.wire = *wire;
    work.rpc = "Attend";
    work.shape =
        absl::StrCat("q [", *n_q, ", ", *heads, ", ", *head_dim, "], k/v [", *n_kv, ", ", *heads_kv,
                     ", ", *head_dim, "]", attend_input.mask.causal ? ", causal" : "");
    work.call = [&](int) -> absl::StatusOr<Sample> {
      const auto start = std::chrono::steady_clock::now();
      absl::StatusOr<client::AttendOutput> r = attention.Attend(attend_input);
      const double latency = Since(start);
      if (!r.ok()) return r.status();
      return FromStats(latency, r->stats);
    };
  } else if (rpc == "softmax") {
    std::normal_distribution<double> normal;
    for (int64_t i = 0; i < *n_kv; ++i) logits.push_back(normal(rng));
    work.rpc = "Softmax";
    work.shape = absl::StrCat(Count(*n_kv), " scores (--n_kv); Softmax reports no server times");
    work.call = [&](int) -> absl::StatusOr<Sample> {
      const auto start = std::chrono::steady_clock::now();
      absl::StatusOr<v1::SoftmaxResponse> r = attention.Softmax(logits, false);
      const double latency = Since(start);
      if (!r.ok()) return r.status();
      return Sample{latency, std::nullopt, std::nullopt, 0};
    };
  } else {
    v1::SequenceConfig config;
    config.set_layers(1);
    config.set_n_head(static_cast<int32_t>(*heads));
    config.set_n_head_kv(static_cast<int32_t>(*heads_kv));
    config.set_head_dim(static_cast<int32_t>(*head_dim));
    config.set_head_dim_v(static_cast<int32_t>(*head_dim));
    config.set_kv_dtype(kv_dtype == "f32"    ? v1::FLOAT32
                        : kv_dtype == "int8" ? v1::INT8
                                             : v1::BFLOAT16);
    const std::string prefix = absl::StrFormat("bench-%016x", std::random_device()() ^ rng());
    // Whatever was created is released on every way out.
    work.cleanup = [&] {
      for (const auto& ids : decode.ids) {
        for (const std::string& id : ids) (void)kv.Release(id);
      }
    };
    // Prefill in chunks that keep each Append under a quarter of the message limit.
    const int64_t token_bytes = 2 * *heads_kv * *head_dim * 4;
    const int64_t chunk =
        std::max<int64_t>(1, std::min(*n_kv, c.connection.max_message_bytes / 4 / token_bytes));
    for (int w = 0; w < workers; ++w) {
      decode.ids.emplace_back();
      client::DecodeBatchInput step;
      step.layer = 0;
      step.precision = *precision;
      step.wire = *wire;
      for (int64_t b = 0; b < *batch; ++b) {
        const std::string id = absl::StrCat(prefix, "-w", w, "-", b);
        absl::StatusOr<v1::SequenceInfo> created = kv.CreateSequence(config, id);
        if (!created.ok()) {
          work.cleanup();
          return ReportError(c, created.status());
        }
        decode.ids.back().push_back(id);
        for (int64_t done = 0; done < *n_kv; done += chunk) {
          const int64_t n = std::min(chunk, *n_kv - done);
          client::AppendInput prefill;
          prefill.sequence_id = id;
          prefill.k = RandomTensor(rng, {n, *heads_kv, *head_dim});
          prefill.v = RandomTensor(rng, {n, *heads_kv, *head_dim});
          prefill.wire = *wire;
          if (absl::StatusOr<client::AppendOutput> r = kv.Append(prefill); !r.ok()) {
            work.cleanup();
            return ReportError(c, r.status());
          }
        }
        step.steps.push_back({id, RandomTensor(rng, {1, *heads, *head_dim}),
                              RandomTensor(rng, {1, *heads_kv, *head_dim}),
                              RandomTensor(rng, {1, *heads_kv, *head_dim})});
      }
      decode.steps.push_back(std::move(step));
    }
    work.rpc = "DecodeBatch";
    work.shape = absl::StrCat(Plural(*batch, "sequence", "sequences"), " per call (", kv_dtype,
                              " cache, prefilled with ", Count(*n_kv), " tokens), ", *heads,
                              " heads, ", *heads_kv, " kv heads, head_dim ", *head_dim);
    work.call = [&](int w) -> absl::StatusOr<Sample> {
      const auto start = std::chrono::steady_clock::now();
      absl::StatusOr<client::DecodeBatchOutput> r = kv.DecodeBatch(decode.steps[w]);
      const double latency = Since(start);
      if (!r.ok()) return r.status();
      return FromStats(latency, r->stats);
    };
  }

  // Warm-up (not measured): connection, server-side primitives and caches.
  for (int64_t i = 0; i < *warmup; ++i) {
    if (absl::StatusOr<Sample> s = work.call(0); !s.ok()) {
      work.cleanup();
      return ReportError(c, s.status());
    }
  }
  std::vector<std::vector<Sample>> samples(static_cast<size_t>(workers));
  std::atomic<int64_t> next{0};
  std::atomic<bool> failed{false};
  std::mutex error_mu;
  absl::Status first_error;
  const auto wall_start = std::chrono::steady_clock::now();
  std::vector<std::thread> threads;
  for (int w = 0; w < workers; ++w) {
    threads.emplace_back([&, w] {
      while (!failed.load() && next.fetch_add(1) < *requests) {
        absl::StatusOr<Sample> s = work.call(w);
        if (!s.ok()) {
          // The first failure ends the run: a benchmark of failing calls measures nothing.
          std::lock_guard<std::mutex> lock(error_mu);
          if (first_error.ok()) first_error = s.status();
          failed.store(true);
          return;
        }
        samples[static_cast<size_t>(w)].push_back(*s);
      }
    });
  }
  for (std::thread& t : threads) t.join();
  const double wall = Since(wall_start);
  work.cleanup();
  if (!first_error.ok()) return ReportError(c, first_error);

  std::vector<double> latency, compute, queue, overhead;
  int64_t flops = 0;
  for (const auto& per_worker : samples) {
    for (const Sample& s : per_worker) {
      latency.push_back(s.latency);
      flops += s.flops;
      if (s.compute && s.queue) {
        compute.push_back(*s.compute);
        queue.push_back(*s.queue);
        overhead.push_back(s.latency - *s.compute - *s.queue);
      }
    }
  }
  const int64_t done = static_cast<int64_t>(latency.size());
  const double rate = wall > 0 ? static_cast<double>(done) / wall : 0;
  const Summary lat = Summarise(latency), comp = Summarise(compute), que = Summarise(queue),
                over = Summarise(overhead);
  double compute_total = 0;
  for (double v : compute) compute_total += v;

  if (c.json) {
    *c.out << "{\"rpc\": " << JsonString(work.rpc)
           << ", \"target\": " << JsonString(c.connection.target)
           << ", \"shape\": " << JsonString(work.shape) << ", \"requests\": " << done
           << ", \"warmup\": " << *warmup << ", \"concurrency\": " << workers
           << ", \"wall_seconds\": " << JsonNumber(wall)
           << ", \"requests_per_second\": " << JsonNumber(rate)
           << ", \"latency_seconds\": " << SummaryJson(lat);
    if (!compute.empty()) {
      *c.out << ", \"server_compute_seconds\": " << SummaryJson(comp)
             << ", \"server_queue_seconds\": " << SummaryJson(que)
             << ", \"overhead_seconds\": " << SummaryJson(over)
             << ", \"attention_flops\": " << flops << ", \"server_flops_per_second\": "
             << JsonNumber(compute_total > 0 ? static_cast<double>(flops) / compute_total : 0);
    } else {
      *c.out << ", \"server_compute_seconds\": null, \"server_queue_seconds\": null, "
                "\"overhead_seconds\": null";
    }
    *c.out << "}\n";
    return kExitOk;
  }
  *c.out << "bench " << work.rpc << " on " << c.connection.target << ": "
         << Plural(done, "request", "requests") << " (after " << *warmup << " warm-up), "
         << Plural(workers, "concurrent caller", "concurrent callers") << "\n"
         << work.shape << "\n\n";
  Table table({"", "mean", "p50", "p90", "p99", "max"});
  table.AddRow(SummaryRow("latency (client)", lat));
  if (!compute.empty()) {
    table.AddRow(SummaryRow("server compute", comp));
    table.AddRow(SummaryRow("server queue", que));
    table.AddRow(SummaryRow("overhead", over));
  }
  *c.out << table.Render() << "\n"
         << absl::StrFormat("throughput %.1f requests/s (%s wall)", rate, Duration(wall));
  if (!compute.empty() && compute_total > 0) {
    *c.out << "; the server computed " << Si(static_cast<double>(flops) / compute_total, "FLOP/s")
           << " while busy";
  }
  *c.out << "\n";
  if (!compute.empty()) {
    *c.out << "overhead = latency - server compute - server queue: encoding, transport, "
              "decoding and scheduling of the RPC\n";
  }
  return kExitOk;
}

}  // namespace

std::vector<Command> BenchCommands() {
  return {
      {"bench",
       "measure the server from here: latency percentiles, requests/s, server compute",
       "attend bench [--rpc attend|decode|softmax] [--n_q N] [--n_kv N] [--heads H] "
       "[--requests N] [--concurrency C] [--warmup N]",
       "Sends --requests calls from --concurrency threads over one channel, after --warmup\n"
       "calls that are not measured, and prints the client's latency percentiles (p50, p90, p99:\n"
       "nearest rank), requests per second, and the compute and queue times the server reports,\n"
       "so that the RPC's own cost shows as the difference ('overhead'). The inputs are random\n"
       "and made before the clock starts. --rpc decode creates --batch sequences per caller\n"
       "(one layer each), prefills --n_kv tokens, times DecodeBatch steps (each adds a token) and\n"
       "releases the sequences at the end. The run stops at the first failed call and reports it.\n"
       "Examples:\n  attend bench\n"
       "  attend bench --rpc attend --n_q 1 --n_kv 4096 --heads 32 --heads_kv 8 --head_dim 128\n"
       "  attend bench --rpc decode --n_kv 2048 --batch 4 --concurrency 2 --requests 200\n"
       "  attend bench --rpc softmax --n_kv 8 --requests 1000 --json\n",
       {{"rpc", "attend (Attend), decode (DecodeBatch over the KV cache) or softmax", false,
         "attend"},
        {"requests", "measured calls", false, "100"},
        {"concurrency", "callers at once (threads sharing the channel)", false, "1"},
        {"warmup", "calls before measuring", false, "5"},
        {"n_q", "attend: queries", false, "1"},
        {"n_kv", "attend: keys; decode: prefilled tokens; softmax: scores", false, "1024"},
        {"heads", "query heads", false, "8"},
        {"heads_kv", "key/value heads (divides --heads)", false, "--heads"},
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
