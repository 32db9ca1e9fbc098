// The calls `attend bench` times (bench_command.cc): what one run sends, made once before the
// clock starts, and one call per measured request.
//
// Thread-safety: a Workload's `call` may run on many threads at once, each worker `w` from one
// thread; `cleanup` runs once, after every call. The clients a workload was made with must
// outlive it.
#ifndef ATTEND_CLIENT_CLI_BENCH_BENCH_WORKLOADS_H_
#define ATTEND_CLIENT_CLI_BENCH_BENCH_WORKLOADS_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <random>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "attend/v1/tensor.pb.h"
#include "client/attention_client.h"
#include "client/kv_cache_client.h"
#include "client/tensor.h"
#include "grpcpp/channel.h"

namespace attend::cli {

// One request's times in seconds; the server's parts are absent for RPCs without stats.
struct Sample {
  double latency = 0;
  std::optional<double> compute;
  std::optional<double> queue;
  int64_t flops = 0;
};

// What one benchmark run sends: a call per request, made by worker `w` (0 <= w < workers).
struct Workload {
  std::string rpc;    // "Attend", "DecodeBatch", "DecodeStream", "Softmax", "Health/Check"
  std::string shape;  // for the report
  std::function<absl::StatusOr<Sample>(int w)> call;
  std::function<void()> cleanup = [] {};
};

// The command line of a benchmark run.
struct BenchOptions {
  std::string rpc;  // attend, decode, decode_stream or softmax
  int64_t requests = 100, warmup = 5;
  int workers = 1;  // --concurrency
  int64_t n_q = 1, n_kv = 1024, heads = 8, heads_kv = 8, head_dim = 64, batch = 1;
  int64_t seed = 1;
  bool causal = false;
  bool empty_unary = true;  // also time Health/Check, the baseline of the overhead ratio
  v1::Precision precision = v1::PRECISION_UNSPECIFIED;
  client::Wire wire = client::Wire::kFloat32;
  std::string kv_dtype;  // bf16, f32 or int8
};

// Attend calls on one random q/k/v.
Workload AttendWorkload(const BenchOptions& o, const client::AttentionClient& attention,
                        std::mt19937_64& rng);

// Softmax calls on --n_kv random scores.
Workload SoftmaxWorkload(const BenchOptions& o, const client::AttentionClient& attention,
                         std::mt19937_64& rng);

// grpc.health.v1.Health/Check of the whole server on `channel`: the empty unary, the least a
// call costs on that channel; each with `deadline`.
Workload HealthWorkload(const std::shared_ptr<grpc::Channel>& channel, absl::Duration deadline);

// Decode steps over each worker's own sequences of one layer, `batch` of them, prefilled with
// n_kv tokens (Appends each under a quarter of `max_message_bytes`); each request is one step
// over all of them (each adds a token). Workers never share a sequence: the server serialises
// requests on one sequence. The cleanup releases the sequences; when setting up fails, what was
// created is released before the error returns.
//   stream false: a DecodeBatch call per step.
//   stream true: one DecodeStream per worker, each step a message written and its response
//     read. Each stream's first step, which starts the call, is sent while setting up, untimed.
//     A stream's deadline is `deadline` per step of the run.
absl::StatusOr<Workload> DecodeWorkload(const BenchOptions& o, const client::KvCacheClient& kv,
                                        int64_t max_message_bytes, absl::Duration deadline,
                                        bool stream, std::mt19937_64& rng);

}  // namespace attend::cli

#endif  // ATTEND_CLIENT_CLI_BENCH_BENCH_WORKLOADS_H_
