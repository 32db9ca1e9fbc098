#include "server/service_support.h"

#include <chrono>
#include <exception>

#include "absl/strings/str_cat.h"
#include "server/status_convert.h"

namespace attend::server {

absl::Status CheckResponseSize(int64_t bytes, int64_t max_message_bytes, absl::string_view what) {
  if (bytes <= max_message_bytes - kResponseFramingBytes) return absl::OkStatus();
  return absl::ResourceExhaustedError(absl::StrCat(
      "the response would hold ", bytes, " bytes of ", what, " and up to ", kResponseFramingBytes,
      " bytes of message framing, over the maximum message size of ", max_message_bytes,
      " bytes (server flag --max_message_bytes); ask for less"));
}

namespace {

// A unary call's reactor that turns gRPC's cancellation (client cancel, deadline, shutdown) into
// the Cancellation its work polls. gRPC destroys nothing before OnDone, which comes only after
// Finish, so the work may read `cancel` until it finishes the call.
class PoolReactor : public grpc::ServerUnaryReactor {
 public:
  void OnCancel() override { cancel.Cancel(); }
  void OnDone() override { delete this; }
  Cancellation cancel;
};

// Finishes the call with `work`'s status, unless the call was cancelled or its deadline passed
// before the work started (`queue_seconds` after it arrived).
void RunWork(grpc::CallbackServerContext* context, PoolReactor* reactor,
             const std::function<absl::Status(const CallWork& call)>& work, double queue_seconds) {
  if (reactor->cancel.cancelled() || context->IsCancelled()) {
    reactor->Finish(grpc::Status(grpc::StatusCode::CANCELLED,
                                 "the call was cancelled before its work started"));
    return;
  }
  if (context->deadline() < std::chrono::system_clock::now()) {
    reactor->Finish(grpc::Status(
        grpc::StatusCode::DEADLINE_EXCEEDED,
        absl::StrCat("the deadline passed after ", queue_seconds,
                     " s waiting for a worker; the server is busy or the deadline too short")));
    return;
  }
  absl::Status status;
  try {
    status = work(CallWork{queue_seconds, &reactor->cancel});
  } catch (const std::bad_alloc&) {
    status = absl::ResourceExhaustedError("the server ran out of memory for this request");
  } catch (const std::exception& e) {
    status = absl::InternalError(absl::StrCat("unexpected error: ", e.what()));
  }
  reactor->Finish(ToGrpcStatus(status));
}

}  // namespace

grpc::Status ShuttingDown() {
  return grpc::Status(grpc::StatusCode::UNAVAILABLE,
                      "the server is shutting down (draining after SIGTERM); retry, and the call "
                      "reaches another replica or this one restarted");
}

bool SubmitToPool(WorkerPool* pool, Metrics* metrics, absl::string_view method,
                  std::function<void(double queue_seconds)> task) {
  // Counted before submitting: a worker may pick the task up before TrySubmit returns.
  metrics->QueueEntered();
  const auto enqueued = std::chrono::steady_clock::now();
  const bool queued = pool->TrySubmit([metrics, method, task = std::move(task), enqueued] {
    const double queue_seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - enqueued).count();
    metrics->QueueLeft();
    metrics->QueueWaited(method, queue_seconds);
    task(queue_seconds);
  });
  if (!queued) {
    metrics->QueueLeft();
    metrics->WorkerRejected();
  }
  return queued;
}

grpc::ServerUnaryReactor* RunOnPool(grpc::CallbackServerContext* context, absl::string_view method,
                                    WorkerPool* pool, Metrics* metrics, CallGate* gate,
                                    std::function<absl::Status(const CallWork& call)> work) {
  auto* reactor = new PoolReactor();
  if (!gate->Admitted(context)) {
    reactor->Finish(ShuttingDown());
    return reactor;
  }
  const bool queued = SubmitToPool(
      pool, metrics, method, [context, reactor, work = std::move(work)](double queue_seconds) {
        RunWork(context, reactor, work, queue_seconds);
      });
  if (!queued) {
    reactor->Finish(grpc::Status(
        grpc::StatusCode::RESOURCE_EXHAUSTED,
        absl::StrCat("the server is busy: ", pool->queued(),
                     " requests are already queued (--max_queued_requests); retry later")));
  }
  return reactor;
}

grpc::ServerUnaryReactor* RunHere(grpc::CallbackServerContext* context, absl::string_view method,
                                  Metrics* metrics, CallGate* gate,
                                  const std::function<absl::Status(const CallWork& call)>& work) {
  auto* reactor = new PoolReactor();
  if (!gate->Admitted(context)) {
    reactor->Finish(ShuttingDown());
    return reactor;
  }
  metrics->QueueWaited(method, 0.0);
  RunWork(context, reactor, work, 0.0);
  return reactor;
}

}  // namespace attend::server
