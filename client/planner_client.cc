#include "client/planner_client.h"

#include <utility>

namespace attend::client {

PlannerClient::PlannerClient(std::shared_ptr<grpc::Channel> channel, ConnectionOptions options)
    : stub_(v1::Planner::NewStub(std::move(channel))), options_(std::move(options)) {}

absl::StatusOr<v1::ListModelsResponse> PlannerClient::ListModels() const {
  v1::ListModelsResponse response;
  auto context = NewContext(options_.deadline);
  absl::Status status =
      FromGrpcStatus(stub_->ListModels(context.get(), v1::ListModelsRequest(), &response));
  if (!status.ok()) return status;
  return response;
}

absl::StatusOr<v1::ModelSpec> PlannerClient::GetModel(const std::string& name) const {
  v1::GetModelRequest request;
  request.set_name(name);
  v1::ModelSpec response;
  auto context = NewContext(options_.deadline);
  absl::Status status = FromGrpcStatus(stub_->GetModel(context.get(), request, &response));
  if (!status.ok()) return status;
  return response;
}

absl::StatusOr<v1::ModelSpec> PlannerClient::ImportHfConfig(const std::string& config_json,
                                                            const std::string& name) const {
  v1::ImportModelRequest request;
  request.set_hf_config_json(config_json);
  request.set_name(name);
  return Import(request);
}

absl::StatusOr<v1::ModelSpec> PlannerClient::ImportGguf(const std::string& gguf_bytes,
                                                        const std::string& name) const {
  v1::ImportModelRequest request;
  request.set_gguf(gguf_bytes);
  request.set_name(name);
  return Import(request);
}

absl::StatusOr<v1::ModelSpec> PlannerClient::Import(const v1::ImportModelRequest& request) const {
  v1::ModelSpec response;
  auto context = NewContext(options_.deadline);
  absl::Status status = FromGrpcStatus(stub_->ImportModel(context.get(), request, &response));
  if (!status.ok()) return status;
  return response;
}

absl::StatusOr<v1::PlanKvCacheResponse> PlannerClient::PlanKvCache(
    const v1::PlanKvCacheRequest& request) const {
  v1::PlanKvCacheResponse response;
  auto context = NewContext(options_.deadline);
  absl::Status status = FromGrpcStatus(stub_->PlanKvCache(context.get(), request, &response));
  if (!status.ok()) return status;
  return response;
}

absl::StatusOr<v1::EstimateCostResponse> PlannerClient::EstimateCost(
    const v1::EstimateCostRequest& request) const {
  v1::EstimateCostResponse response;
  auto context = NewContext(options_.deadline);
  absl::Status status = FromGrpcStatus(stub_->EstimateCost(context.get(), request, &response));
  if (!status.ok()) return status;
  return response;
}

}  // namespace attend::client
