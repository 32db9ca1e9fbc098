#include "server/attention_service.h"

#include <cmath>
#include <limits>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/base/status_macros.h"
#include "core/lessons/multi_head_attention.h"
#include "core/lessons/scaling_experiment.h"
#include "core/lessons/softmax.h"
#include "server/tensor_codec.h"

namespace attend::server {
namespace {

absl::Status Missing(absl::string_view field, absl::string_view layout) {
  return absl::InvalidArgumentError(absl::StrCat(field, ": missing; expected ", layout));
}

AttentionOptions MaskAndScale(const v1::MaskOptions& mask, bool has_scale, float scale) {
  AttentionOptions options;
  options.mask.causal = mask.causal();
  options.mask.window = mask.window_tokens();
  if (has_scale) options.scale = scale;
  return options;
}

void FillStats(const AttentionStats& stats, double queue_seconds, v1::ComputeStats* out) {
  out->set_attended_pairs(stats.attended_pairs);
  out->set_attention_flops(stats.attention_flops);
  out->set_compute_seconds(stats.compute_seconds);
  out->set_engine(stats.engine);
  out->set_queue_seconds(queue_seconds);
}

}  // namespace

AttentionService::AttentionService(const ServiceLimits& limits, const AttentionEngine* engine,
                                   WorkerPool* pool, Metrics* metrics, CallGate* gate)
    : limits_(limits), engine_(engine), pool_(pool), metrics_(metrics), gate_(gate) {}

grpc::ServerUnaryReactor* AttentionService::Attend(grpc::CallbackServerContext* context,
                                                   const v1::AttendRequest* request,
                                                   v1::AttendResponse* response) {
  return RunOnPool(context, "Attend", pool_, metrics_, gate_,
                   [this, request, response](const CallWork& call) {
                     response->mutable_stats()->set_queue_seconds(call.queue_seconds);
                     return DoAttend(*request, response, call.cancel);
                   });
}

grpc::ServerUnaryReactor* AttentionService::MultiHeadAttend(
    grpc::CallbackServerContext* context, const v1::MultiHeadAttendRequest* request,
    v1::MultiHeadAttendResponse* response) {
  return RunOnPool(context, "MultiHeadAttend", pool_, metrics_, gate_,
                   [this, request, response](const CallWork& call) {
                     response->mutable_stats()->set_queue_seconds(call.queue_seconds);
                     return DoMultiHeadAttend(*request, response, call.cancel);
                   });
}

grpc::ServerUnaryReactor* AttentionService::Softmax(grpc::CallbackServerContext* context,
                                                    const v1::SoftmaxRequest* request,
                                                    v1::SoftmaxResponse* response) {
  return RunOnPool(
      context, "Softmax", pool_, metrics_, gate_,
      [this, request, response](const CallWork&) { return DoSoftmax(*request, response); });
}

grpc::ServerUnaryReactor* AttentionService::ScalingExperiment(
    grpc::CallbackServerContext* context, const v1::ScalingExperimentRequest* request,
    v1::ScalingExperimentResponse* response) {
  return RunOnPool(context, "ScalingExperiment", pool_, metrics_, gate_,
                   [this, request, response](const CallWork& call) {
                     return DoScalingExperiment(*request, response, call.cancel);
                   });
}

absl::Status AttentionService::DoAttend(const v1::AttendRequest& request,
                                        v1::AttendResponse* response,
                                        const Cancellation* cancel) const {
  const int64_t max_elements = limits_.attention.max_tensor_elements;
  if (!request.has_q()) return Missing("q", "a tensor [n_q, n_head, head_dim]");
  if (!request.has_k()) return Missing("k", "a tensor [n_kv, n_head_kv, head_dim]");
  if (!request.has_v()) return Missing("v", "a tensor [n_kv, n_head_kv, head_dim_v]");
  ATTEND_ASSIGN_OR_RETURN(const DecodedTensor q, DecodeTensor(request.q(), "q", max_elements));
  ATTEND_ASSIGN_OR_RETURN(const DecodedTensor k, DecodeTensor(request.k(), "k", max_elements));
  ATTEND_ASSIGN_OR_RETURN(const DecodedTensor v, DecodeTensor(request.v(), "v", max_elements));
  AttentionOptions options = MaskAndScale(request.mask(), request.has_scale(), request.scale());
  ATTEND_ASSIGN_OR_RETURN(options.precision, DecodePrecision(request.precision()));
  ATTEND_ASSIGN_OR_RETURN(const DType out_dtype,
                          DecodeOutputDType(request.output_dtype(), "output_dtype"));
  ATTEND_ASSIGN_OR_RETURN(
      const AttentionProblem problem,
      PrepareAttention(q.view, k.view, v.view, options, limits_.attention, engine_->threads()));
  const AttentionShape& s = problem.shape();

  const int64_t response_bytes =
      EncodedBytes(s.output_elements(), q.from_values, out_dtype) +
      (request.return_weights() ? EncodedBytes(s.weight_elements(), q.from_values, DType::kFloat32)
                                : 0);
  ATTEND_RETURN_IF_ERROR(CheckResponseSize(
      response_bytes, limits_.max_message_bytes,
      request.return_weights() ? "output and weights (try return_weights = false)" : "output"));

  std::vector<float> output(static_cast<size_t>(s.output_elements()));
  std::vector<float> weights(request.return_weights() ? static_cast<size_t>(s.weight_elements())
                                                      : 0);
  AttentionStats stats;
  ATTEND_RETURN_IF_ERROR(
      engine_->Compute(problem, absl::MakeSpan(output), absl::MakeSpan(weights), &stats, cancel));
  metrics_->AttentionComputed("Attend", stats);
  ATTEND_RETURN_IF_ERROR(CheckEncodable(output, out_dtype, "output"));
  EncodeTensor(output, {s.n_q, s.n_head, s.head_dim_v}, q.from_values, out_dtype,
               response->mutable_output());
  if (request.return_weights()) {
    EncodeTensor(weights, {s.n_head, s.n_q, s.n_kv}, q.from_values, DType::kFloat32,
                 response->mutable_weights());
  }
  FillStats(stats, response->stats().queue_seconds(), response->mutable_stats());
  return absl::OkStatus();
}

absl::Status AttentionService::DoMultiHeadAttend(const v1::MultiHeadAttendRequest& request,
                                                 v1::MultiHeadAttendResponse* response,
                                                 const Cancellation* cancel) const {
  const int64_t max_elements = limits_.attention.max_tensor_elements;
  if (!request.has_x()) return Missing("x", "a tensor [n, d_model]");
  if (!request.has_wq()) return Missing("wq", "a tensor [d_model, n_head * head_dim]");
  if (!request.has_wk()) return Missing("wk", "a tensor [d_model, n_head_kv * head_dim]");
  if (!request.has_wv()) return Missing("wv", "a tensor [d_model, n_head_kv * head_dim_v]");
  ATTEND_ASSIGN_OR_RETURN(const DecodedTensor x, DecodeTensor(request.x(), "x", max_elements));
  ATTEND_ASSIGN_OR_RETURN(const DecodedTensor wq, DecodeTensor(request.wq(), "wq", max_elements));
  ATTEND_ASSIGN_OR_RETURN(const DecodedTensor wk, DecodeTensor(request.wk(), "wk", max_elements));
  ATTEND_ASSIGN_OR_RETURN(const DecodedTensor wv, DecodeTensor(request.wv(), "wv", max_elements));
  std::optional<TensorView> wo;
  if (request.has_wo()) {
    ATTEND_ASSIGN_OR_RETURN(const DecodedTensor decoded,
                            DecodeTensor(request.wo(), "wo", max_elements));
    wo = decoded.view;
  }
  AttentionOptions options = MaskAndScale(request.mask(), request.has_scale(), request.scale());
  ATTEND_ASSIGN_OR_RETURN(options.precision, DecodePrecision(request.precision()));
  ATTEND_ASSIGN_OR_RETURN(const DType out_dtype,
                          DecodeOutputDType(request.output_dtype(), "output_dtype"));
  ATTEND_ASSIGN_OR_RETURN(
      const MultiHeadAttention layer,
      MultiHeadAttention::Create(wq.view, wk.view, wv.view, wo, request.n_head(),
                                 request.n_head_kv(), limits_.attention));
  if (x.view.rank() != 2) {
    return absl::InvalidArgumentError(
        absl::StrCat("x.shape ", ShapeToString(x.view.shape), ": expected rank 2 [n, d_model]"));
  }
  const int64_t n = x.view.dim(0);
  // Bound the response (and the weights' memory) before running: weights are n_head x n x n.
  std::optional<int64_t> weight_elements = CheckedMul(layer.n_head(), n);
  if (weight_elements) weight_elements = CheckedMul(*weight_elements, n);
  if (!weight_elements || *weight_elements > limits_.attention.max_score_elements) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "n_head x n x n = ", layer.n_head(), " x ", n, " x ", n,
        " score elements is over the limit of ", limits_.attention.max_score_elements));
  }
  int64_t response_bytes = EncodedBytes(n * layer.d_out(), x.from_values, out_dtype);
  if (request.return_weights()) {
    response_bytes += EncodedBytes(*weight_elements, x.from_values, DType::kFloat32);
  }
  if (request.return_projections()) {
    response_bytes +=
        EncodedBytes(n * (layer.n_head() * layer.head_dim() +
                          layer.n_head_kv() * (layer.head_dim() + layer.head_dim_v())),
                     x.from_values, DType::kFloat32);
  }
  ATTEND_RETURN_IF_ERROR(CheckResponseSize(response_bytes, limits_.max_message_bytes,
                                           "output, weights and projections"));

  ATTEND_ASSIGN_OR_RETURN(
      MultiHeadAttention::Output out,
      layer.Forward(x.view, options, request.return_weights(), request.return_projections(),
                    *engine_, limits_.attention, cancel));
  metrics_->AttentionComputed("MultiHeadAttend", out.stats);
  ATTEND_RETURN_IF_ERROR(CheckEncodable(out.output, out_dtype, "output"));
  EncodeTensor(out.output, {n, layer.d_out()}, x.from_values, out_dtype,
               response->mutable_output());
  if (request.return_weights()) {
    EncodeTensor(out.weights, {layer.n_head(), n, n}, x.from_values, DType::kFloat32,
                 response->mutable_weights());
  }
  if (request.return_projections()) {
    EncodeTensor(out.q, {n, layer.n_head(), layer.head_dim()}, x.from_values, DType::kFloat32,
                 response->mutable_q());
    EncodeTensor(out.k, {n, layer.n_head_kv(), layer.head_dim()}, x.from_values, DType::kFloat32,
                 response->mutable_k());
    EncodeTensor(out.v, {n, layer.n_head_kv(), layer.head_dim_v()}, x.from_values, DType::kFloat32,
                 response->mutable_v());
  }
  const ParameterCounts counts = layer.parameter_counts();
  v1::ParameterCounts* p = response->mutable_parameters();
  p->set_wq(counts.wq);
  p->set_wk(counts.wk);
  p->set_wv(counts.wv);
  p->set_wo(counts.wo);
  p->set_total(counts.total);
  p->set_kv(counts.kv);
  response->set_head_dim(static_cast<int32_t>(layer.head_dim()));
  response->set_head_dim_v(static_cast<int32_t>(layer.head_dim_v()));
  FillStats(out.stats, response->stats().queue_seconds(), response->mutable_stats());
  return absl::OkStatus();
}

absl::Status AttentionService::DoSoftmax(const v1::SoftmaxRequest& request,
                                         v1::SoftmaxResponse* response) const {
  const int64_t n = request.logits_size();
  if (n > limits_.attention.max_tensor_elements) {
    return absl::ResourceExhaustedError(absl::StrCat("logits: ", n, " values, over the limit of ",
                                                     limits_.attention.max_tensor_elements));
  }
  if (request.jacobian()) {
    // n x n doubles: bound the memory and the message before building it.
    if (n > 0 && (n > limits_.attention.max_tensor_elements / n)) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "jacobian: ", n, " x ", n, " entries, over the limit of ",
          limits_.attention.max_tensor_elements, "; ask for the jacobian of a shorter vector"));
    }
    ATTEND_RETURN_IF_ERROR(CheckResponseSize(n * n * 8, limits_.max_message_bytes, "jacobian"));
  }
  const double temperature = request.has_temperature() ? request.temperature() : 1.0;
  ATTEND_ASSIGN_OR_RETURN(SoftmaxResult result, attend::Softmax(request.logits(), temperature));
  response->mutable_probabilities()->Add(result.probabilities.begin(), result.probabilities.end());
  response->set_log_sum_exp(result.log_sum_exp);
  response->set_entropy_nats(result.entropy_nats);
  if (request.jacobian()) {
    const std::vector<double> jacobian = SoftmaxJacobian(result.probabilities);
    response->mutable_jacobian()->Add(jacobian.begin(), jacobian.end());
  }
  return absl::OkStatus();
}

absl::Status AttentionService::DoScalingExperiment(const v1::ScalingExperimentRequest& request,
                                                   v1::ScalingExperimentResponse* response,
                                                   const Cancellation* cancel) const {
  ScalingConfig config;
  if (request.head_dims_size() > 0) {
    config.head_dims.assign(request.head_dims().begin(), request.head_dims().end());
  }
  if (request.pairs() != 0) config.pairs = request.pairs();
  if (request.trials() != 0) config.trials = request.trials();
  if (request.keys() != 0) config.keys = request.keys();
  if (request.has_seed()) config.seed = static_cast<int64_t>(request.seed());
  config.max_draws = limits_.max_scaling_draws;
  config.cancel = cancel;
  ATTEND_ASSIGN_OR_RETURN(const std::vector<ScalingRow> rows, RunScalingExperiment(config));
  for (const ScalingRow& row : rows) {
    v1::ScalingRow* out = response->add_rows();
    out->set_head_dim(static_cast<int32_t>(row.head_dim));
    out->set_score_std(row.score_std);
    out->set_sqrt_head_dim(row.sqrt_head_dim);
    out->set_mean_max_weight_unscaled(row.mean_max_weight_unscaled);
    out->set_mean_max_weight_scaled(row.mean_max_weight_scaled);
  }
  response->set_seed(static_cast<uint64_t>(config.seed));
  return absl::OkStatus();
}

}  // namespace attend::server
