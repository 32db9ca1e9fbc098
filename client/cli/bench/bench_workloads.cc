#include "client/cli/bench/bench_workloads.h"

#include <algorithm>
#include <chrono>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "client/cli/framework/command.h"
#include "client/cli/render/format.h"
#include "client/cli/tensors/tensor_flags.h"
#include "grpc/health/v1/health.grpc.pb.h"

namespace attend::cli {
namespace {

double Since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

Sample FromStats(double latency, const v1::ComputeStats& stats) {
  return {latency, stats.compute_seconds(), stats.queue_seconds(), stats.attention_flops()};
}

}  // namespace

// The workloads make their inputs once, before any timing: the requests measure the server and
// the RPC, not the random number generator.

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

Workload HealthWorkload(const std::shared_ptr<grpc::Channel>& channel, absl::Duration deadline) {
  std::shared_ptr<grpc::health::v1::Health::Stub> stub = grpc::health::v1::Health::NewStub(channel);
  Workload work;
  work.rpc = "Health/Check";
  work.shape = "grpc.health.v1.Health/Check of the server: the empty unary";
  work.call = [stub, deadline](int) -> absl::StatusOr<Sample> {
    const auto start = std::chrono::steady_clock::now();
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + deadline));
    grpc::health::v1::HealthCheckResponse response;
    const grpc::Status status = stub->Check(&context, {}, &response);
    const double latency = Since(start);
    if (!status.ok()) return client::FromGrpcStatus(status);
    return Sample{latency, std::nullopt, std::nullopt, 0};
  };
  return work;
}

namespace {

// Sequences of one decode benchmark, and each worker's step over its own.
struct DecodeSetup {
  std::vector<std::vector<std::string>> ids;                   // [worker][batch]
  std::vector<client::DecodeBatchInput> steps;                 // [worker]
  std::vector<std::unique_ptr<client::DecodeStream>> streams;  // [worker], when streaming
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

// One step of `stream`: `step` written and its response read.
absl::StatusOr<client::DecodeBatchOutput> StreamStep(client::DecodeStream& stream,
                                                     const client::DecodeBatchInput& step) {
  if (absl::StatusOr<uint64_t> id = stream.Write(step); !id.ok()) return id.status();
  absl::StatusOr<client::DecodeStreamReply> reply = stream.Read();
  if (!reply.ok()) return reply.status();
  return std::move(reply->result);
}

// Opens worker `w`'s stream and sends its first step.
absl::Status OpenStream(const client::KvCacheClient& kv, absl::Duration deadline, int w,
                        DecodeSetup* setup) {
  setup->streams.push_back(kv.OpenDecodeStream(deadline));
  return StreamStep(*setup->streams.back(), setup->steps[static_cast<size_t>(w)]).status();
}

}  // namespace

absl::StatusOr<Workload> DecodeWorkload(const BenchOptions& o, const client::KvCacheClient& kv,
                                        int64_t max_message_bytes, absl::Duration deadline,
                                        bool stream, std::mt19937_64& rng) {
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
  // Whatever was created is released on every way out, the streams ended first.
  work.cleanup = [&kv, setup] {
    for (const auto& s : setup->streams) (void)s->Finish();
    for (const auto& ids : setup->ids) {
      for (const std::string& id : ids) (void)kv.Release(id);
    }
  };
  // Prefill in chunks that keep each Append under a quarter of the message limit.
  const int64_t token_bytes = 2 * o.heads_kv * o.head_dim * 4;
  const int64_t chunk = std::max<int64_t>(1, std::min(o.n_kv, max_message_bytes / 4 / token_bytes));
  for (int w = 0; w < o.workers; ++w) {
    absl::Status s = PrefillWorker(o, kv, config, prefix, chunk, w, rng, setup.get());
    if (s.ok() && stream) {
      s = OpenStream(kv, deadline * static_cast<double>(o.warmup + o.requests + 1), w, setup.get());
    }
    if (!s.ok()) {
      work.cleanup();
      return s;
    }
  }
  work.rpc = stream ? "DecodeStream" : "DecodeBatch";
  work.shape = absl::StrCat(Plural(o.batch, "sequence", "sequences"),
                            stream ? " per step, one stream per caller (" : " per call (",
                            o.kv_dtype, " cache, prefilled with ", Count(o.n_kv), " tokens), ",
                            o.heads, " heads, ", o.heads_kv, " kv heads, head_dim ", o.head_dim);
  work.call = [&kv, setup, stream](int w) -> absl::StatusOr<Sample> {
    const client::DecodeBatchInput& step = setup->steps[static_cast<size_t>(w)];
    const auto start = std::chrono::steady_clock::now();
    absl::StatusOr<client::DecodeBatchOutput> r =
        stream ? StreamStep(*setup->streams[static_cast<size_t>(w)], step) : kv.DecodeBatch(step);
    const double latency = Since(start);
    if (!r.ok()) return r.status();
    return FromStats(latency, r->stats);
  };
  return work;
}

}  // namespace attend::cli
