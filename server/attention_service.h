// attend.v1.Attention on the gRPC callback API: Attend, MultiHeadAttend, Softmax and
// ScalingExperiment. Every handler decodes and validates its request completely before
// allocating from it, runs on the worker pool, and answers with the canonical code and a
// message naming the field and shapes. MultiHeadAttend's `init` draws its inputs on the server
// (core/lessons/lesson_init.h), bounded per matrix by max_tensor_elements and together by what
// one request message could carry; `return_scores` (both methods) computes the score tables
// from their definition (core/attention/scores.h) after the weights' limits are checked.
//
// Thread-safety: handlers run concurrently; the service holds only immutable state and
// thread-safe collaborators.
#ifndef ATTEND_SERVER_ATTENTION_SERVICE_H_
#define ATTEND_SERVER_ATTENTION_SERVICE_H_

#include "absl/status/status.h"
#include "attend/v1/attention.grpc.pb.h"
#include "core/attention/attention_engine.h"
#include "server/metrics.h"
#include "server/service_support.h"
#include "server/worker_pool.h"

namespace attend::server {

class AttentionService final : public v1::Attention::CallbackService {
 public:
  // The collaborators must outlive the service.
  AttentionService(const ServiceLimits& limits, const AttentionEngine* engine, WorkerPool* pool,
                   Metrics* metrics, CallGate* gate);

  grpc::ServerUnaryReactor* Attend(grpc::CallbackServerContext* context,
                                   const v1::AttendRequest* request,
                                   v1::AttendResponse* response) override;
  grpc::ServerUnaryReactor* MultiHeadAttend(grpc::CallbackServerContext* context,
                                            const v1::MultiHeadAttendRequest* request,
                                            v1::MultiHeadAttendResponse* response) override;
  grpc::ServerUnaryReactor* Softmax(grpc::CallbackServerContext* context,
                                    const v1::SoftmaxRequest* request,
                                    v1::SoftmaxResponse* response) override;
  grpc::ServerUnaryReactor* ScalingExperiment(grpc::CallbackServerContext* context,
                                              const v1::ScalingExperimentRequest* request,
                                              v1::ScalingExperimentResponse* response) override;

 private:
  absl::Status DoAttend(const v1::AttendRequest& request, v1::AttendResponse* response,
                        const Cancellation* cancel) const;
  absl::Status DoMultiHeadAttend(const v1::MultiHeadAttendRequest& request,
                                 v1::MultiHeadAttendResponse* response,
                                 const Cancellation* cancel) const;
  absl::Status DoSoftmax(const v1::SoftmaxRequest& request, v1::SoftmaxResponse* response) const;
  absl::Status DoScalingExperiment(const v1::ScalingExperimentRequest& request,
                                   v1::ScalingExperimentResponse* response,
                                   const Cancellation* cancel) const;

  const ServiceLimits limits_;
  const AttentionEngine* engine_;
  WorkerPool* pool_;
  Metrics* metrics_;
  CallGate* gate_;
};

}  // namespace attend::server

#endif  // ATTEND_SERVER_ATTENTION_SERVICE_H_
