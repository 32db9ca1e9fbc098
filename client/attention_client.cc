#include "client/attention_client.h"

#include <tuple>

#include "common/version/version.h"
#include "grpc/health/v1/health.grpc.pb.h"

namespace attend::client {
namespace {

void FillMask(const MaskSettings& mask, v1::MaskOptions* out) {
  out->set_causal(mask.causal);
  out->set_window_tokens(mask.window_tokens);
}

absl::StatusOr<std::optional<FloatTensor>> DecodeOptional(bool present, const v1::Tensor& t) {
  if (!present) return std::optional<FloatTensor>();
  absl::StatusOr<FloatTensor> decoded = DecodeTensor(t);
  if (!decoded.ok()) return decoded.status();
  return std::optional<FloatTensor>(*std::move(decoded));
}

}  // namespace

bool KeyVisible(const MaskSettings& mask, int64_t n_q, int64_t n_kv, int64_t query, int64_t key) {
  const int64_t position = n_kv - n_q + query;
  if (mask.causal && key > position) return false;
  if (mask.window_tokens > 0) {
    const int64_t distance = position - key;
    if (mask.causal) return distance < mask.window_tokens;
    return (distance < 0 ? -distance : distance) < mask.window_tokens;
  }
  return true;
}

AttentionClient::AttentionClient(std::shared_ptr<grpc::Channel> channel, ConnectionOptions options)
    : stub_(v1::Attention::NewStub(std::move(channel))), options_(std::move(options)) {}

absl::StatusOr<AttendOutput> AttentionClient::Attend(const AttendInput& input) const {
  v1::AttendRequest request;
  EncodeTensor(input.q, input.wire, request.mutable_q());
  EncodeTensor(input.k, input.wire, request.mutable_k());
  EncodeTensor(input.v, input.wire, request.mutable_v());
  FillMask(input.mask, request.mutable_mask());
  if (input.scale) request.set_scale(*input.scale);
  request.set_precision(input.precision);
  request.set_return_weights(input.return_weights);
  request.set_return_scores(input.return_scores);
  switch (input.wire) {
    case Wire::kBFloat16:
      request.set_output_dtype(v1::BFLOAT16);
      break;
    case Wire::kFloat16:
      request.set_output_dtype(v1::FLOAT16);
      break;
    default:
      request.set_output_dtype(v1::FLOAT32);
  }
  v1::AttendResponse response;
  auto context = NewContext(options_.deadline);
  absl::Status status = FromGrpcStatus(stub_->Attend(context.get(), request, &response));
  if (!status.ok()) return status;
  AttendOutput out;
  absl::StatusOr<FloatTensor> output = DecodeTensor(response.output());
  if (!output.ok()) return output.status();
  out.output = *std::move(output);
  absl::StatusOr<std::optional<FloatTensor>> weights =
      DecodeOptional(response.has_weights(), response.weights());
  if (!weights.ok()) return weights.status();
  out.weights = *std::move(weights);
  for (auto [present, tensor, target] :
       {std::tuple{response.has_scores(), &response.scores(), &out.scores},
        std::tuple{response.has_masked_scores(), &response.masked_scores(), &out.masked_scores}}) {
    absl::StatusOr<std::optional<FloatTensor>> decoded = DecodeOptional(present, *tensor);
    if (!decoded.ok()) return decoded.status();
    *target = *std::move(decoded);
  }
  out.stats = response.stats();
  return out;
}

absl::StatusOr<MultiHeadOutput> AttentionClient::MultiHeadAttend(
    const MultiHeadInput& input) const {
  v1::MultiHeadAttendRequest request;
  if (input.init) {
    *request.mutable_init() = *input.init;
  } else {
    EncodeTensor(input.x, input.wire, request.mutable_x());
    EncodeTensor(input.wq, input.wire, request.mutable_wq());
    EncodeTensor(input.wk, input.wire, request.mutable_wk());
    EncodeTensor(input.wv, input.wire, request.mutable_wv());
    if (input.wo) EncodeTensor(*input.wo, input.wire, request.mutable_wo());
  }
  request.set_n_head(input.n_head);
  request.set_n_head_kv(input.n_head_kv);
  FillMask(input.mask, request.mutable_mask());
  if (input.scale) request.set_scale(*input.scale);
  request.set_precision(input.precision);
  request.set_return_weights(input.return_weights);
  request.set_return_projections(input.return_projections);
  request.set_return_scores(input.return_scores);
  request.set_return_inputs(input.return_inputs);
  v1::MultiHeadAttendResponse response;
  auto context = NewContext(options_.deadline);
  absl::Status status = FromGrpcStatus(stub_->MultiHeadAttend(context.get(), request, &response));
  if (!status.ok()) return status;
  MultiHeadOutput out;
  absl::StatusOr<FloatTensor> output = DecodeTensor(response.output());
  if (!output.ok()) return output.status();
  out.output = *std::move(output);
  for (auto [present, tensor, target] :
       {std::tuple{response.has_weights(), &response.weights(), &out.weights},
        std::tuple{response.has_q(), &response.q(), &out.q},
        std::tuple{response.has_k(), &response.k(), &out.k},
        std::tuple{response.has_v(), &response.v(), &out.v},
        std::tuple{response.has_scores(), &response.scores(), &out.scores},
        std::tuple{response.has_masked_scores(), &response.masked_scores(), &out.masked_scores},
        std::tuple{response.has_x(), &response.x(), &out.x},
        std::tuple{response.has_wq(), &response.wq(), &out.wq},
        std::tuple{response.has_wk(), &response.wk(), &out.wk},
        std::tuple{response.has_wv(), &response.wv(), &out.wv},
        std::tuple{response.has_wo(), &response.wo(), &out.wo}}) {
    absl::StatusOr<std::optional<FloatTensor>> decoded = DecodeOptional(present, *tensor);
    if (!decoded.ok()) return decoded.status();
    *target = *std::move(decoded);
  }
  out.parameters = response.parameters();
  out.head_dim = response.head_dim();
  out.head_dim_v = response.head_dim_v();
  out.stats = response.stats();
  return out;
}

absl::StatusOr<v1::SoftmaxResponse> AttentionClient::Softmax(
    const std::vector<double>& logits, bool jacobian, std::optional<double> temperature) const {
  v1::SoftmaxRequest request;
  request.mutable_logits()->Add(logits.begin(), logits.end());
  request.set_jacobian(jacobian);
  if (temperature) request.set_temperature(*temperature);
  v1::SoftmaxResponse response;
  auto context = NewContext(options_.deadline);
  absl::Status status = FromGrpcStatus(stub_->Softmax(context.get(), request, &response));
  if (!status.ok()) return status;
  return response;
}

absl::StatusOr<v1::ScalingExperimentResponse> AttentionClient::ScalingExperiment(
    const v1::ScalingExperimentRequest& request) const {
  v1::ScalingExperimentResponse response;
  auto context = NewContext(options_.deadline);
  absl::Status status = FromGrpcStatus(stub_->ScalingExperiment(context.get(), request, &response));
  if (!status.ok()) return status;
  return response;
}

absl::StatusOr<std::string> CheckHealth(const std::shared_ptr<grpc::Channel>& channel,
                                        const std::string& service, absl::Duration deadline) {
  auto stub = grpc::health::v1::Health::NewStub(channel);
  grpc::health::v1::HealthCheckRequest request;
  request.set_service(service);
  grpc::health::v1::HealthCheckResponse response;
  auto context = NewContext(deadline);
  const grpc::Status status = stub->Check(context.get(), request, &response);
  if (status.error_code() == grpc::StatusCode::NOT_FOUND) return std::string("SERVICE_UNKNOWN");
  if (!status.ok()) return FromGrpcStatus(status);
  return grpc::health::v1::HealthCheckResponse::ServingStatus_Name(response.status());
}

absl::StatusOr<ServerProbe> ProbeServer(const std::shared_ptr<grpc::Channel>& channel,
                                        absl::Duration deadline) {
  auto stub = grpc::health::v1::Health::NewStub(channel);
  grpc::health::v1::HealthCheckResponse response;
  auto context = NewContext(deadline);
  const grpc::Status status = stub->Check(context.get(), {}, &response);
  if (!status.ok()) return FromGrpcStatus(status);
  ServerProbe probe;
  probe.status = grpc::health::v1::HealthCheckResponse::ServingStatus_Name(response.status());
  const auto& metadata = context->GetServerInitialMetadata();
  if (auto it = metadata.find(kServerVersionMetadata); it != metadata.end()) {
    probe.version.assign(it->second.data(), it->second.size());
  }
  return probe;
}

}  // namespace attend::client
