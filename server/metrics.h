// Prometheus metrics of the server: the common gRPC server metrics for every call (through a
// gRPC interceptor, so health and reflection calls count too) and attend's own counters.
// Families are created once at construction; label sets are bounded (services, methods and
// codes; never sequences or clients). grpc_method is the method's short name ("Attend").
//
//   grpc_server_started_total{grpc_service,grpc_method,grpc_type}
//   grpc_server_handled_total{grpc_service,grpc_method,grpc_type,grpc_code}
//   grpc_server_handling_seconds{grpc_service,grpc_method,grpc_type}   histogram
//   attend_requests_in_flight                                           gauge
//   attend_requests_queued          gauge: tasks submitted to the worker pool and not yet picked
//                                   up by a worker (unary calls and DecodeStream messages)
//   attend_queue_seconds{grpc_method}   histogram: submission to the pool until a worker picks
//                                   the task up; observed for every task a worker picks up
//                                   (also those then found cancelled), not for refused ones
//   attend_worker_rejections_total                                      counter (queue full)
//   attend_auth_rejections_total{reason}                                calls refused by the
//                                                                       token check (they never
//                                                                       reach grpc_server_*)
//   attend_attention_flops_total{grpc_method}                           useful FLOPs computed
//   attend_attention_pairs_total{grpc_method}                           attended (query, key) pairs
//   attend_attention_compute_seconds{grpc_method}                       histogram
//   attend_tokens_appended_total{grpc_method}   tokens written to cached sequences by successful
//                                   Append, DecodeBatch and DecodeStream requests. Counted per
//                                   layer, as the cache stores them: a token appended to each of
//                                   32 layers counts 32 (the same unit as attend_kv_cache_tokens)
//   attend_tokens_decoded_total{grpc_method}    decode steps of successful DecodeBatch requests
//                                   and DecodeStream messages: one per sequence per request, and
//                                   so also per layer (a request is one layer's step)
//   attend_decode_step_seconds{grpc_method}     histogram: one successful DecodeBatch call, or
//                                   one successful DecodeStream message, from its receipt by the
//                                   handler to its reply (queue wait included); failed steps are
//                                   left out so that fast refusals do not flatter the latency
//   attend_build_info{version,commit,cpu_isa,bf16_matmul}                      gauge = 1
//   attend_snapshot_restored_sequences / _skipped_files / _bytes / _seconds   gauges: what the
//                                   start-up restore of --snapshot_dir did (0 without one; the
//                                   skipped files and why are in the start-up log)
//   attend_sequences_moved_total{direction}   counter: sequences handed to another replica
//                                   ("out", HandOff) or received from one ("in", ImportSequence)
//   attend_sequence_transfer_bytes_total{direction}   counter: snapshot bytes of those moves,
//                                   and of ExportSequence streams ("out")
//   attend_handoff_failures_total   counter: sequences a HandOff could not move (they stay)
//   attend_snapshot_checksum_failures_total   counter: snapshots refused as damaged (DATA_LOSS:
//                                   a checksum, a torn or truncated stream, foreign bytes) by
//                                   LoadSequence, ImportSequence or the start-up restore
//
// Thread-safety: all methods are thread-safe.
#ifndef ATTEND_SERVER_METRICS_H_
#define ATTEND_SERVER_METRICS_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/strings/string_view.h"
#include "core/attention/attention.h"
#include "core/base/mutex.h"
#include "grpcpp/support/server_interceptor.h"
#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"

namespace attend::server {

class Metrics {
 public:
  Metrics();

  std::shared_ptr<prometheus::Registry> registry() const { return registry_; }

  // `full_method` is gRPC's "/package.Service/Method".
  void RpcStarted(absl::string_view full_method, absl::string_view type);
  void RpcHandled(absl::string_view full_method, absl::string_view type, int code, double seconds);
  void WorkerRejected();
  // `reason`: "missing_token", "malformed_header" or "token_not_accepted".
  void AuthRejected(absl::string_view reason);
  void AttentionComputed(absl::string_view method, const AttentionStats& stats);

  // The worker pool's queue: QueueEntered() before a task is submitted (it may start before
  // TrySubmit returns), QueueLeft() when a worker picks it up or the pool refuses it, and
  // QueueWaited() with the seconds it waited once picked up.
  void QueueEntered();
  void QueueLeft();
  void QueueWaited(absl::string_view method, double seconds);

  // A successful Append, DecodeBatch or DecodeStream step (see the header comment for units).
  void TokensAppended(absl::string_view method, int64_t tokens);
  void TokensDecoded(absl::string_view method, int64_t steps);
  void DecodeStepDone(absl::string_view method, double seconds);
  // What the start-up restore did (server/snapshot_store.h).
  void SnapshotRestored(int64_t sequences, int64_t skipped, int64_t bytes, double seconds);
  // A sequence moved to (`out`) or from another replica, and its snapshot bytes.
  void SequenceMoved(bool out, int64_t bytes);
  // Snapshot bytes streamed out by an ExportSequence.
  void SequenceExported(int64_t bytes);
  void HandOffFailed();
  // `count` snapshots refused as damaged (DATA_LOSS).
  void SnapshotDamaged(int64_t count = 1);

  // A factory for the interceptor that feeds RpcStarted/RpcHandled; the server owns it.
  std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface> NewInterceptorFactory();

 private:
  struct MethodSeries {
    prometheus::Counter* started = nullptr;
    prometheus::Histogram* seconds = nullptr;
    absl::flat_hash_map<int, prometheus::Counter*> handled;  // by code
  };
  MethodSeries& Series(absl::string_view full_method, absl::string_view type)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  std::shared_ptr<prometheus::Registry> registry_;
  prometheus::Family<prometheus::Counter>* started_;
  prometheus::Family<prometheus::Counter>* handled_;
  prometheus::Family<prometheus::Histogram>* handling_seconds_;
  prometheus::Gauge* in_flight_;
  prometheus::Counter* rejections_;
  prometheus::Family<prometheus::Counter>* auth_rejections_;
  prometheus::Family<prometheus::Counter>* flops_;
  prometheus::Family<prometheus::Counter>* pairs_;
  prometheus::Family<prometheus::Histogram>* compute_seconds_;
  prometheus::Gauge* queued_;
  prometheus::Family<prometheus::Histogram>* queue_seconds_;
  prometheus::Family<prometheus::Counter>* tokens_appended_;
  prometheus::Family<prometheus::Counter>* tokens_decoded_;
  prometheus::Family<prometheus::Histogram>* decode_step_seconds_;
  prometheus::Gauge* restored_sequences_;
  prometheus::Gauge* restore_skipped_;
  prometheus::Gauge* restored_bytes_;
  prometheus::Gauge* restore_seconds_;
  prometheus::Family<prometheus::Counter>* moved_;
  prometheus::Family<prometheus::Counter>* transfer_bytes_;
  prometheus::Counter* handoff_failures_;
  prometheus::Counter* checksum_failures_;

  Mutex mu_;  // attend::Mutex: visible to TSan (core/base/mutex.h)
  absl::flat_hash_map<std::string, MethodSeries> series_ ABSL_GUARDED_BY(mu_);
};

}  // namespace attend::server

#endif  // ATTEND_SERVER_METRICS_H_
