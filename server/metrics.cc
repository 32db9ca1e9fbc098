#include "server/metrics.h"

#include <chrono>

#include "absl/status/status.h"
#include "common/version/version.h"
#include "core/kernels/cpu_features.h"
#include "core/kernels/onednn.h"
#include "core/kernels/simd.h"
#include "google/protobuf/descriptor.h"

namespace attend::server {
namespace {

// Latency buckets from 50 us (an empty unary call on loopback) to 30 s.
prometheus::Histogram::BucketBoundaries LatencyBuckets() {
  return {0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025,
          0.05,    0.1,    0.25,    0.5,    1,     2.5,    5,     10,   30};
}

// Queue waits and decode steps on CPU: an idle pool hands a task over in a few microseconds
// and a decode step of one short sequence takes tens of them, while a batch over long contexts
// takes milliseconds to a second and an overloaded queue holds tasks for seconds (until their
// deadlines). So 10 us to 10 s, 1-2.5-5 per decade: every bucket is 2 to 2.5 times the one
// below, fine enough for p99 estimates without many series per method.
prometheus::Histogram::BucketBoundaries StepBuckets() {
  return {0.00001, 0.000025, 0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01,
          0.025,   0.05,     0.1,     0.25,   0.5,     1,      2.5,   5,      10};
}

// "/attend.v1.Attention/Attend" -> {"attend.v1.Attention", "Attend"}.
std::pair<std::string, std::string> SplitMethod(absl::string_view full_method) {
  if (!full_method.empty() && full_method[0] == '/') full_method.remove_prefix(1);
  const size_t slash = full_method.rfind('/');
  if (slash == absl::string_view::npos) return {"unknown", std::string(full_method)};
  return {std::string(full_method.substr(0, slash)), std::string(full_method.substr(slash + 1))};
}

// The method path when it names a method compiled into this binary; otherwise a fixed
// placeholder, so that clients calling made-up paths cannot grow the label set.
std::string KnownMethod(const char* path) {
  absl::string_view p = path ? path : "";
  // libgrpc++'s health service is not built from generated C++ classes, so its methods are not
  // in the descriptor pool.
  if (p == "/grpc.health.v1.Health/Check" || p == "/grpc.health.v1.Health/Watch") {
    return std::string(p);
  }
  if (!p.empty() && p[0] == '/') p.remove_prefix(1);
  std::string dotted(p);
  const size_t slash = dotted.rfind('/');
  if (slash != std::string::npos) {
    dotted[slash] = '.';
    if (google::protobuf::DescriptorPool::generated_pool()->FindMethodByName(dotted) != nullptr) {
      return std::string(path);
    }
  }
  return "/unknown/unknown";
}

class MetricsInterceptor : public grpc::experimental::Interceptor {
 public:
  MetricsInterceptor(Metrics* metrics, grpc::experimental::ServerRpcInfo* info)
      : metrics_(metrics),
        method_(KnownMethod(info->method())),
        start_(std::chrono::steady_clock::now()) {
    switch (info->type()) {
      case grpc::experimental::ServerRpcInfo::Type::UNARY:
        type_ = "unary";
        break;
      case grpc::experimental::ServerRpcInfo::Type::CLIENT_STREAMING:
        type_ = "client_stream";
        break;
      case grpc::experimental::ServerRpcInfo::Type::SERVER_STREAMING:
        type_ = "server_stream";
        break;
      default:
        type_ = "bidi_stream";
        break;
    }
    metrics_->RpcStarted(method_, type_);
  }

  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(
            grpc::experimental::InterceptionHookPoints::PRE_SEND_STATUS)) {
      const double seconds =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
      metrics_->RpcHandled(method_, type_, methods->GetSendStatus().error_code(), seconds);
    }
    methods->Proceed();
  }

 private:
  Metrics* metrics_;
  std::string method_;
  const char* type_;
  std::chrono::steady_clock::time_point start_;
};

class MetricsInterceptorFactory : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  explicit MetricsInterceptorFactory(Metrics* metrics) : metrics_(metrics) {}
  grpc::experimental::Interceptor* CreateServerInterceptor(
      grpc::experimental::ServerRpcInfo* info) override {
    return new MetricsInterceptor(metrics_, info);
  }

 private:
  Metrics* metrics_;
};

}  // namespace

Metrics::Metrics() : registry_(std::make_shared<prometheus::Registry>()) {
  started_ = &prometheus::BuildCounter()
                  .Name("grpc_server_started_total")
                  .Help("RPCs started on the server")
                  .Register(*registry_);
  handled_ = &prometheus::BuildCounter()
                  .Name("grpc_server_handled_total")
                  .Help("RPCs completed on the server, by status code")
                  .Register(*registry_);
  handling_seconds_ = &prometheus::BuildHistogram()
                           .Name("grpc_server_handling_seconds")
                           .Help("Time from the start of an RPC to its status being sent")
                           .Register(*registry_);
  in_flight_ = &prometheus::BuildGauge()
                    .Name("attend_requests_in_flight")
                    .Help("RPCs started and not yet completed")
                    .Register(*registry_)
                    .Add({});
  rejections_ = &prometheus::BuildCounter()
                     .Name("attend_worker_rejections_total")
                     .Help("Requests refused because the worker queue was full")
                     .Register(*registry_)
                     .Add({});
  auth_rejections_ = &prometheus::BuildCounter()
                          .Name("attend_auth_rejections_total")
                          .Help("Calls refused UNAUTHENTICATED by the bearer-token check")
                          .Register(*registry_);
  // Present from the start (at 0), so that rate() and alerts work before the first refusal.
  for (const char* reason : {"missing_token", "malformed_header", "token_not_accepted"}) {
    auth_rejections_->Add({{"reason", reason}});
  }
  flops_ = &prometheus::BuildCounter()
                .Name("attend_attention_flops_total")
                .Help("Useful attention FLOPs: 2 x (head_dim + head_dim_v) per attended pair")
                .Register(*registry_);
  pairs_ = &prometheus::BuildCounter()
                .Name("attend_attention_pairs_total")
                .Help("Attended (query, key) pairs summed over query heads")
                .Register(*registry_);
  compute_seconds_ = &prometheus::BuildHistogram()
                          .Name("attend_attention_compute_seconds")
                          .Help("Engine time per attention computation")
                          .Register(*registry_);
  queued_ = &prometheus::BuildGauge()
                 .Name("attend_requests_queued")
                 .Help("Requests (unary calls and DecodeStream messages) waiting for a worker")
                 .Register(*registry_)
                 .Add({});
  queue_seconds_ = &prometheus::BuildHistogram()
                        .Name("attend_queue_seconds")
                        .Help(
                            "Time from submission to the worker pool to a worker picking the "
                            "request up (0 for small decode steps, which run on the gRPC thread "
                            "that received them)")
                        .Register(*registry_);
  tokens_appended_ = &prometheus::BuildCounter()
                          .Name("attend_tokens_appended_total")
                          .Help("Tokens appended to cached sequences, counted per layer")
                          .Register(*registry_);
  tokens_decoded_ = &prometheus::BuildCounter()
                         .Name("attend_tokens_decoded_total")
                         .Help(
                             "Decode steps: one per sequence per DecodeBatch request or "
                             "DecodeStream message (so per layer)")
                         .Register(*registry_);
  decode_step_seconds_ = &prometheus::BuildHistogram()
                              .Name("attend_decode_step_seconds")
                              .Help(
                                  "One successful DecodeBatch call or DecodeStream message, "
                                  "receipt to reply")
                              .Register(*registry_);
  // Present from the start (at 0), so that rate() works before the first decode.
  for (const char* method : {"Append", "DecodeBatch", "DecodeStream"}) {
    tokens_appended_->Add({{"grpc_method", method}});
  }
  for (const char* method : {"DecodeBatch", "DecodeStream"}) {
    tokens_decoded_->Add({{"grpc_method", method}});
    decode_step_seconds_->Add({{"grpc_method", method}}, StepBuckets());
  }
  const auto gauge = [this](const char* name, const char* help) {
    return &prometheus::BuildGauge().Name(name).Help(help).Register(*registry_).Add({});
  };
  restored_sequences_ = gauge("attend_snapshot_restored_sequences",
                              "Sequences restored from --snapshot_dir at start");
  restore_skipped_ = gauge("attend_snapshot_restore_skipped_files",
                           "Snapshot files not restored at start (damaged, refused; see the log)");
  restored_bytes_ = gauge("attend_snapshot_restored_bytes", "Snapshot bytes read at start");
  restore_seconds_ = gauge("attend_snapshot_restore_seconds", "Time the start-up restore took");
  moved_ = &prometheus::BuildCounter()
                .Name("attend_sequences_moved_total")
                .Help("Sequences handed to another replica (out) or received from one (in)")
                .Register(*registry_);
  transfer_bytes_ =
      &prometheus::BuildCounter()
           .Name("attend_sequence_transfer_bytes_total")
           .Help("Snapshot bytes of sequences moved or exported (out) and imported (in)")
           .Register(*registry_);
  for (const char* direction : {"in", "out"}) {
    moved_->Add({{"direction", direction}});
    transfer_bytes_->Add({{"direction", direction}});
  }
  handoff_failures_ = &prometheus::BuildCounter()
                           .Name("attend_handoff_failures_total")
                           .Help("Sequences a HandOff could not move (they stay on this replica)")
                           .Register(*registry_)
                           .Add({});
  checksum_failures_ = &prometheus::BuildCounter()
                            .Name("attend_snapshot_checksum_failures_total")
                            .Help(
                                "Snapshots refused as damaged (DATA_LOSS) by a load, an import "
                                "or the start-up restore")
                            .Register(*registry_)
                            .Add({});
  prometheus::BuildGauge()
      .Name("attend_build_info")
      .Help("Version, git commit, the CPU features the engine uses and its decode kernel set")
      .Register(*registry_)
      .Add({{"version", std::string(Version())},
            {"commit", std::string(GitCommit())},
            {"cpu_isa", CpuIsaName()},
            {"bf16_matmul", UseBf16Matmul() ? "native" : "emulated"},
            {"kernels", simd::KernelName()}})
      .Set(1);
}

Metrics::MethodSeries& Metrics::Series(absl::string_view full_method, absl::string_view type) {
  auto it = series_.find(full_method);
  if (it != series_.end()) return it->second;
  const auto [service, method] = SplitMethod(full_method);
  const std::map<std::string, std::string> labels = {
      {"grpc_service", service}, {"grpc_method", method}, {"grpc_type", std::string(type)}};
  MethodSeries series;
  series.started = &started_->Add(labels);
  series.seconds = &handling_seconds_->Add(labels, LatencyBuckets());
  return series_.emplace(std::string(full_method), std::move(series)).first->second;
}

void Metrics::RpcStarted(absl::string_view full_method, absl::string_view type) {
  in_flight_->Increment();
  MutexLock lock(&mu_);
  Series(full_method, type).started->Increment();
}

void Metrics::RpcHandled(absl::string_view full_method, absl::string_view type, int code,
                         double seconds) {
  in_flight_->Decrement();
  MutexLock lock(&mu_);
  MethodSeries& series = Series(full_method, type);
  series.seconds->Observe(seconds);
  auto it = series.handled.find(code);
  if (it == series.handled.end()) {
    const auto [service, method] = SplitMethod(full_method);
    prometheus::Counter* counter = &handled_->Add(
        {{"grpc_service", service},
         {"grpc_method", method},
         {"grpc_type", std::string(type)},
         {"grpc_code", absl::StatusCodeToString(static_cast<absl::StatusCode>(code))}});
    it = series.handled.emplace(code, counter).first;
  }
  it->second->Increment();
}

void Metrics::WorkerRejected() { rejections_->Increment(); }

void Metrics::AuthRejected(absl::string_view reason) {
  auth_rejections_->Add({{"reason", std::string(reason)}}).Increment();
}

void Metrics::AttentionComputed(absl::string_view method, const AttentionStats& stats) {
  const std::map<std::string, std::string> labels = {{"grpc_method", std::string(method)}};
  flops_->Add(labels).Increment(static_cast<double>(stats.attention_flops));
  pairs_->Add(labels).Increment(static_cast<double>(stats.attended_pairs));
  compute_seconds_->Add(labels, LatencyBuckets()).Observe(stats.compute_seconds);
}

void Metrics::QueueEntered() { queued_->Increment(); }

void Metrics::QueueLeft() { queued_->Decrement(); }

void Metrics::QueueWaited(absl::string_view method, double seconds) {
  queue_seconds_->Add({{"grpc_method", std::string(method)}}, StepBuckets()).Observe(seconds);
}

void Metrics::TokensAppended(absl::string_view method, int64_t tokens) {
  tokens_appended_->Add({{"grpc_method", std::string(method)}})
      .Increment(static_cast<double>(tokens));
}

void Metrics::SnapshotRestored(int64_t sequences, int64_t skipped, int64_t bytes, double seconds) {
  restored_sequences_->Set(static_cast<double>(sequences));
  restore_skipped_->Set(static_cast<double>(skipped));
  restored_bytes_->Set(static_cast<double>(bytes));
  restore_seconds_->Set(seconds);
}

void Metrics::SequenceMoved(bool out, int64_t bytes) {
  const std::string direction = out ? "out" : "in";
  moved_->Add({{"direction", direction}}).Increment();
  transfer_bytes_->Add({{"direction", direction}}).Increment(static_cast<double>(bytes));
}

void Metrics::SequenceExported(int64_t bytes) {
  transfer_bytes_->Add({{"direction", "out"}}).Increment(static_cast<double>(bytes));
}

void Metrics::HandOffFailed() { handoff_failures_->Increment(); }

void Metrics::SnapshotDamaged(int64_t count) {
  checksum_failures_->Increment(static_cast<double>(count));
}

void Metrics::TokensDecoded(absl::string_view method, int64_t steps) {
  tokens_decoded_->Add({{"grpc_method", std::string(method)}})
      .Increment(static_cast<double>(steps));
}

void Metrics::DecodeStepDone(absl::string_view method, double seconds) {
  decode_step_seconds_->Add({{"grpc_method", std::string(method)}}, StepBuckets()).Observe(seconds);
}

std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>
Metrics::NewInterceptorFactory() {
  return std::make_unique<MetricsInterceptorFactory>(this);
}

}  // namespace attend::server
