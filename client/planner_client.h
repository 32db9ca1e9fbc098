// Typed client of attend.v1.Planner: the model catalog, model import, KV-cache plans and cost
// estimates. Results are the response protos (they are plain data: counts, bytes, FLOPs and the
// planner's explanation); every call returns absl::Status / StatusOr carrying the server's
// canonical code and message.
//
// Thread-safety: a PlannerClient may be used from many threads at once.
#ifndef ATTEND_CLIENT_PLANNER_CLIENT_H_
#define ATTEND_CLIENT_PLANNER_CLIENT_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "attend/v1/planner.grpc.pb.h"
#include "client/connection.h"

namespace attend::client {

class PlannerClient {
 public:
  PlannerClient(std::shared_ptr<grpc::Channel> channel, ConnectionOptions options);

  // Every preset, in the catalog's order.
  absl::StatusOr<v1::ListModelsResponse> ListModels() const;
  // The preset called `name` (case-insensitive); NOT_FOUND lists the known names.
  absl::StatusOr<v1::ModelSpec> GetModel(const std::string& name) const;
  // A model read from a Hugging Face config.json text, or from the start of a GGUF file (its
  // header and metadata; the tensors are not needed). `name` names the result; empty: from the
  // input.
  absl::StatusOr<v1::ModelSpec> ImportHfConfig(const std::string& config_json,
                                               const std::string& name = "") const;
  absl::StatusOr<v1::ModelSpec> ImportGguf(const std::string& gguf_bytes,
                                           const std::string& name = "") const;
  absl::StatusOr<v1::PlanKvCacheResponse> PlanKvCache(const v1::PlanKvCacheRequest& request) const;
  absl::StatusOr<v1::EstimateCostResponse> EstimateCost(
      const v1::EstimateCostRequest& request) const;

 private:
  absl::StatusOr<v1::ModelSpec> Import(const v1::ImportModelRequest& request) const;

  std::unique_ptr<v1::Planner::Stub> stub_;
  ConnectionOptions options_;
};

}  // namespace attend::client

#endif  // ATTEND_CLIENT_PLANNER_CLIENT_H_
