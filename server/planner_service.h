// attend.v1.Planner on the gRPC callback API: the model catalog, config.json / GGUF import,
// KV-cache plans and cost estimates. The math lives in planner/ and the proto <-> planner
// conversions in convert/planner.h; the service resolves the model and hardware a request names,
// has every error name the request field (it passes the field's path to the planner, e.g.
// "model.spec.n_head_kv: ..." or "custom.memory_bandwidth_bytes_per_second: ...") and bounds
// imports before parsing them.
//
// The "local" hardware profile is measured once per process (a few hundred milliseconds to a
// second of every core, and a 256 MiB buffer). The service starts that measurement on a thread
// of its own shortly after it is built, so that the first EstimateCost with profile "local"
// finds it done; a request that arrives earlier waits for the same measurement (a
// function-local static in the planner).
//
// Thread-safety: handlers run concurrently; the service holds only immutable state, thread-safe
// collaborators and its measurement thread.
#ifndef ATTEND_SERVER_PLANNER_SERVICE_H_
#define ATTEND_SERVER_PLANNER_SERVICE_H_

#include <cstdint>
#include <thread>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "attend/v1/planner.grpc.pb.h"
#include "core/base/mutex.h"
#include "server/call_gate.h"
#include "server/metrics.h"
#include "server/worker_pool.h"

namespace attend::server {

struct PlannerOptions {
  // How long after construction the background measurement of the "local" profile starts;
  // absl::InfiniteDuration() leaves it to the first request. The delay keeps the measurement
  // (which saturates every core) out of the server's start-up, and lets short-lived servers
  // (in-process test servers above all) stop without paying for it.
  absl::Duration measure_local_after = absl::Seconds(1);
  // ImportModel inputs larger than these are refused with RESOURCE_EXHAUSTED before parsing (the
  // gRPC message limit, --max_message_bytes, applies as well). config.json files are a few KiB;
  // a GGUF header with a 256k-token vocabulary is about 16 MiB.
  int64_t max_hf_config_json_bytes = int64_t{1} << 20;
  int64_t max_gguf_bytes = int64_t{64} << 20;
};

class PlannerService final : public v1::Planner::CallbackService {
 public:
  // The collaborators must outlive the service.
  PlannerService(WorkerPool* pool, Metrics* metrics, CallGate* gate, PlannerOptions options = {});
  // Stops a measurement that has not started yet, and waits for one that has.
  ~PlannerService() override;

  PlannerService(const PlannerService&) = delete;
  PlannerService& operator=(const PlannerService&) = delete;

  grpc::ServerUnaryReactor* ListModels(grpc::CallbackServerContext* context,
                                       const v1::ListModelsRequest* request,
                                       v1::ListModelsResponse* response) override;
  grpc::ServerUnaryReactor* GetModel(grpc::CallbackServerContext* context,
                                     const v1::GetModelRequest* request,
                                     v1::ModelSpec* response) override;
  grpc::ServerUnaryReactor* ImportModel(grpc::CallbackServerContext* context,
                                        const v1::ImportModelRequest* request,
                                        v1::ModelSpec* response) override;
  grpc::ServerUnaryReactor* PlanKvCache(grpc::CallbackServerContext* context,
                                        const v1::PlanKvCacheRequest* request,
                                        v1::PlanKvCacheResponse* response) override;
  grpc::ServerUnaryReactor* EstimateCost(grpc::CallbackServerContext* context,
                                         const v1::EstimateCostRequest* request,
                                         v1::EstimateCostResponse* response) override;

  // True once the background measurement of the "local" profile has finished (false when it
  // was never started). For tests and readiness logs.
  bool local_hardware_measured() const { return local_measured_.HasBeenNotified(); }
  // Waits up to `timeout` for local_hardware_measured().
  bool WaitForLocalHardware(absl::Duration timeout) const {
    return local_measured_.WaitForNotificationWithTimeout(timeout);
  }

 private:
  absl::Status DoImportModel(const v1::ImportModelRequest& request, v1::ModelSpec* response) const;
  absl::Status DoPlanKvCache(const v1::PlanKvCacheRequest& request,
                             v1::PlanKvCacheResponse* response) const;
  absl::Status DoEstimateCost(const v1::EstimateCostRequest& request,
                              v1::EstimateCostResponse* response) const;

  const PlannerOptions options_;
  WorkerPool* pool_;
  Metrics* metrics_;
  CallGate* gate_;
  Notification stop_;            // the service is being destroyed
  Notification local_measured_;  // LocalHardware() has returned on measure_thread_
  std::thread measure_thread_;
};

}  // namespace attend::server

#endif  // ATTEND_SERVER_PLANNER_SERVICE_H_
