// What every attend service shares: the limits taken from flags, and running a unary handler's
// work on the worker pool.
#ifndef ATTEND_SERVER_SERVICE_SUPPORT_H_
#define ATTEND_SERVER_SERVICE_SUPPORT_H_

#include <cstdint>
#include <functional>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "core/attention/attention.h"
#include "core/base/cancellation.h"
#include "grpcpp/grpcpp.h"
#include "server/call_gate.h"
#include "server/metrics.h"
#include "server/worker_pool.h"

namespace attend::server {

struct ServiceLimits {
  AttentionLimits attention;
  // Largest request or response message; responses that would be larger are refused up front.
  int64_t max_message_bytes = int64_t{64} << 20;
  // Random draws one ScalingExperiment may make.
  int64_t max_scaling_draws = int64_t{1} << 28;
};

// Bytes a response's protobuf framing may add to its tensors' payload: tags and lengths, shapes,
// stats, parameter counts. Dozens of bytes per tensor in practice; a response's estimate adds
// this so that one within a few hundred bytes of the limit is refused here, before it is
// computed, rather than by gRPC after.
inline constexpr int64_t kResponseFramingBytes = 4096;

// OK when a response whose tensors hold `bytes` fits in a message with its framing;
// RESOURCE_EXHAUSTED saying what to change otherwise.
absl::Status CheckResponseSize(int64_t bytes, int64_t max_message_bytes, absl::string_view what);

// What a unary call's work is given: the seconds it waited for a worker, and the call's
// cancellation, which gRPC sets when the client cancels, the deadline passes or the server's
// shutdown grace ends, and which long computations poll so that they stop.
struct CallWork {
  double queue_seconds = 0.0;
  const Cancellation* cancel = nullptr;
};

// Submits `task` to `pool` and accounts for its queueing in `metrics` (attend_requests_queued,
// and attend_queue_seconds{grpc_method=`method`} once a worker picks it up); `task` is given
// the seconds it waited. False, counted as a worker rejection and `task` not run, when the
// queue is full or the pool stops. `method` must be a string literal (it outlives the task).
bool SubmitToPool(WorkerPool* pool, Metrics* metrics, absl::string_view method,
                  std::function<void(double queue_seconds)> task);

// Runs `work` on `pool` (through SubmitToPool; `method` is the call's short method name, a
// string literal) and finishes the call with its status. A call that `gate` did not
// admit (it started while the server drains) is refused with UNAVAILABLE. Calls cancelled or past
// their deadline while queued are finished without running `work`; a full queue is refused with
// RESOURCE_EXHAUSTED. REQUIRES: `work` must not throw past std::exception (an exception becomes
// INTERNAL).
grpc::ServerUnaryReactor* RunOnPool(grpc::CallbackServerContext* context, absl::string_view method,
                                    WorkerPool* pool, Metrics* metrics, CallGate* gate,
                                    std::function<absl::Status(const CallWork& call)> work);

// As RunOnPool, but runs `work` at once on the calling thread (one of gRPC's), for work too
// small to be worth handing over: waking a worker and the hand back cost tens of microseconds
// on a small VM. It waits for no worker (attend_queue_seconds counts 0 for it, and CallWork's
// queue_seconds is 0). REQUIRES: `work` is short (tens of microseconds): it holds a gRPC thread,
// which neither a full queue nor --worker_threads limits.
grpc::ServerUnaryReactor* RunHere(grpc::CallbackServerContext* context, absl::string_view method,
                                  Metrics* metrics, CallGate* gate,
                                  const std::function<absl::Status(const CallWork& call)>& work);

// The status a draining server refuses new calls with.
grpc::Status ShuttingDown();

}  // namespace attend::server

#endif  // ATTEND_SERVER_SERVICE_SUPPORT_H_
