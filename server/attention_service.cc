#include "server/attention_service.h"

#include <cmath>
#include <limits>
#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/attention/scores.h"
#include "core/base/status_macros.h"
#include "core/lessons/lesson_init.h"
#include "core/lessons/multi_head_attention.h"
#include "core/lessons/scaling_experiment.h"
#include "core/lessons/softmax.h"
#include "server/convert/tensor.h"

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

// Both score tables of `problem` into `response`'s scores and masked_scores fields.
template <typename Response>
absl::Status AddScores(const AttentionProblem& problem, bool as_values, int threads,
                       const Cancellation* cancel, Response* response) {
  const AttentionShape& s = problem.shape();
  std::vector<float> scores(static_cast<size_t>(s.weight_elements()));
  std::vector<float> masked(scores.size());
  ATTEND_RETURN_IF_ERROR(
      ComputeScores(problem, absl::MakeSpan(scores), absl::MakeSpan(masked), cancel, threads));
  EncodeTensor(scores, {s.n_head, s.n_q, s.n_kv}, as_values, DType::kFloat32,
               response->mutable_scores());
  EncodeTensor(masked, {s.n_head, s.n_q, s.n_kv}, as_values, DType::kFloat32,
               response->mutable_masked_scores());
  return absl::OkStatus();
}

// The inputs of one MultiHeadAttend call: decoded from the request, or drawn by its init (then
// `drawn` owns the floats the views point at; it is never moved after the views are taken).
struct LayerInputs {
  std::optional<LessonInputs> drawn;
  TensorView x, wq, wk, wv;
  std::optional<TensorView> wo;
  bool from_values = false;
};

LessonInitSpec ToSpec(const v1::MultiHeadAttendRequest& request) {
  const v1::LessonInit& init = request.init();
  LessonInitSpec spec;
  spec.seed = init.seed();
  if (init.has_stddev()) spec.stddev = init.stddev();
  spec.n = init.n();
  spec.d_model = init.d_model();
  spec.head_dim = init.head_dim();
  spec.with_wo = init.with_wo();
  spec.d_out = init.d_out();
  spec.n_head = request.n_head();
  spec.n_head_kv = request.n_head_kv();
  return spec;
}

absl::Status DrawInputs(const v1::MultiHeadAttendRequest& request, const ServiceLimits& limits,
                        const Cancellation* cancel, LayerInputs* in) {
  for (const auto& [field, present] : {std::pair<const char*, bool>{"x", request.has_x()},
                                       {"wq", request.has_wq()},
                                       {"wk", request.has_wk()},
                                       {"wv", request.has_wv()},
                                       {"wo", request.has_wo()}}) {
    if (present) {
      return absl::InvalidArgumentError(
          absl::StrCat("init and ", field, " are both set; init draws x, wq, wk, wv (and wo) on ",
                       "the server, so send either init or the tensors"));
    }
  }
  // No more float32 elements than a request message could have carried as tensors.
  ATTEND_ASSIGN_OR_RETURN(in->drawn, DrawLessonInputs(ToSpec(request), limits.attention,
                                                      limits.max_message_bytes / 4, cancel));
  in->x = in->drawn->x_view();
  in->wq = in->drawn->wq_view();
  in->wk = in->drawn->wk_view();
  in->wv = in->drawn->wv_view();
  in->wo = in->drawn->wo_view();
  // Nothing came as `data`, so answer as a hand-written call would be answered.
  in->from_values = true;
  return absl::OkStatus();
}

absl::Status DecodeInputs(const v1::MultiHeadAttendRequest& request, int64_t max_elements,
                          LayerInputs* in) {
  if (request.return_inputs()) {
    return absl::InvalidArgumentError(
        "return_inputs: only with init (without it the inputs are the request's own)");
  }
  if (!request.has_x()) return Missing("x", "a tensor [n, d_model] (or set init)");
  if (!request.has_wq()) return Missing("wq", "a tensor [d_model, n_head * head_dim]");
  if (!request.has_wk()) return Missing("wk", "a tensor [d_model, n_head_kv * head_dim]");
  if (!request.has_wv()) return Missing("wv", "a tensor [d_model, n_head_kv * head_dim_v]");
  ATTEND_ASSIGN_OR_RETURN(const DecodedTensor x, DecodeTensor(request.x(), "x", max_elements));
  ATTEND_ASSIGN_OR_RETURN(const DecodedTensor wq, DecodeTensor(request.wq(), "wq", max_elements));
  ATTEND_ASSIGN_OR_RETURN(const DecodedTensor wk, DecodeTensor(request.wk(), "wk", max_elements));
  ATTEND_ASSIGN_OR_RETURN(const DecodedTensor wv, DecodeTensor(request.wv(), "wv", max_elements));
  if (request.has_wo()) {
    ATTEND_ASSIGN_OR_RETURN(const DecodedTensor wo, DecodeTensor(request.wo(), "wo", max_elements));
    in->wo = wo.view;
  }
  in->x = x.view;
  in->wq = wq.view;
  in->wk = wk.view;
  in->wv = wv.view;
  in->from_values = x.from_values;
  return absl::OkStatus();
}

void AddInputs(const LessonInputs& drawn, v1::MultiHeadAttendResponse* response) {
  EncodeTensor(drawn.x, drawn.x_shape, true, DType::kFloat32, response->mutable_x());
  EncodeTensor(drawn.wq, drawn.wq_shape, true, DType::kFloat32, response->mutable_wq());
  EncodeTensor(drawn.wk, drawn.wk_shape, true, DType::kFloat32, response->mutable_wk());
  EncodeTensor(drawn.wv, drawn.wv_shape, true, DType::kFloat32, response->mutable_wv());
  if (!drawn.wo_shape.empty()) {
    EncodeTensor(drawn.wo, drawn.wo_shape, true, DType::kFloat32, response->mutable_wo());
  }
}

int64_t InputElements(const LessonInputs& drawn) {
  return static_cast<int64_t>(drawn.x.size() + drawn.wq.size() + drawn.wk.size() + drawn.wv.size() +
                              drawn.wo.size());
}

void FillLayerInfo(const MultiHeadAttention& layer, v1::MultiHeadAttendResponse* response) {
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
}

void FillStats(const AttentionStats& stats, double queue_seconds, v1::ComputeStats* out) {
  ToProto(stats, out);
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

  const int64_t weight_bytes = EncodedBytes(s.weight_elements(), q.from_values, DType::kFloat32);
  const int64_t response_bytes = EncodedBytes(s.output_elements(), q.from_values, out_dtype) +
                                 (request.return_weights() ? weight_bytes : 0) +
                                 (request.return_scores() ? 2 * weight_bytes : 0);
  ATTEND_RETURN_IF_ERROR(CheckResponseSize(
      response_bytes, limits_.max_message_bytes,
      request.return_scores()    ? "output, weights and scores (try return_scores = false)"
      : request.return_weights() ? "output and weights (try return_weights = false)"
                                 : "output"));

  std::vector<float> output(static_cast<size_t>(s.output_elements()));
  std::vector<float> weights(request.return_weights() ? static_cast<size_t>(s.weight_elements())
                                                      : 0);
  AttentionStats stats;
  ATTEND_RETURN_IF_ERROR(
      engine_->Compute(problem, absl::MakeSpan(output), absl::MakeSpan(weights), &stats, cancel));
  metrics_->AttentionComputed("Attend", stats);
  // An answer in `values` is float32 whatever output_dtype says: only raw bytes are narrowed.
  if (!q.from_values) ATTEND_RETURN_IF_ERROR(CheckEncodable(output, out_dtype, "output"));
  EncodeTensor(output, {s.n_q, s.n_head, s.head_dim_v}, q.from_values, out_dtype,
               response->mutable_output());
  if (request.return_weights()) {
    EncodeTensor(weights, {s.n_head, s.n_q, s.n_kv}, q.from_values, DType::kFloat32,
                 response->mutable_weights());
  }
  if (request.return_scores()) {
    ATTEND_RETURN_IF_ERROR(AddScores(problem, q.from_values, engine_->threads(), cancel, response));
  }
  FillStats(stats, response->stats().queue_seconds(), response->mutable_stats());
  return absl::OkStatus();
}

absl::Status AttentionService::DoMultiHeadAttend(const v1::MultiHeadAttendRequest& request,
                                                 v1::MultiHeadAttendResponse* response,
                                                 const Cancellation* cancel) const {
  LayerInputs in;
  ATTEND_RETURN_IF_ERROR(request.has_init()
                             ? DrawInputs(request, limits_, cancel, &in)
                             : DecodeInputs(request, limits_.attention.max_tensor_elements, &in));
  AttentionOptions options = MaskAndScale(request.mask(), request.has_scale(), request.scale());
  ATTEND_ASSIGN_OR_RETURN(options.precision, DecodePrecision(request.precision()));
  ATTEND_ASSIGN_OR_RETURN(const DType out_dtype,
                          DecodeOutputDType(request.output_dtype(), "output_dtype"));
  ATTEND_ASSIGN_OR_RETURN(const MultiHeadAttention layer,
                          MultiHeadAttention::Create(in.wq, in.wk, in.wv, in.wo, request.n_head(),
                                                     request.n_head_kv(), limits_.attention));
  if (in.x.rank() != 2) {
    return absl::InvalidArgumentError(
        absl::StrCat("x.shape ", ShapeToString(in.x.shape), ": expected rank 2 [n, d_model]"));
  }
  const int64_t n = in.x.dim(0);
  // Bound the response (and the weights' memory) before running: weights are n_head x n x n.
  std::optional<int64_t> weight_elements = CheckedMul(layer.n_head(), n);
  if (weight_elements) weight_elements = CheckedMul(*weight_elements, n);
  if (!weight_elements || *weight_elements > limits_.attention.max_score_elements) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "n_head x n x n = ", layer.n_head(), " x ", n, " x ", n,
        " score elements is over the limit of ", limits_.attention.max_score_elements));
  }
  const bool as_values = in.from_values;
  int64_t response_bytes = EncodedBytes(n * layer.d_out(), as_values, out_dtype);
  const int64_t weight_bytes = EncodedBytes(*weight_elements, as_values, DType::kFloat32);
  if (request.return_weights()) response_bytes += weight_bytes;
  if (request.return_scores()) response_bytes += 2 * weight_bytes;
  if (request.return_projections()) {
    response_bytes +=
        EncodedBytes(n * (layer.n_head() * layer.head_dim() +
                          layer.n_head_kv() * (layer.head_dim() + layer.head_dim_v())),
                     as_values, DType::kFloat32);
  }
  if (request.return_inputs()) {
    response_bytes += EncodedBytes(InputElements(*in.drawn), true, DType::kFloat32);
  }
  ATTEND_RETURN_IF_ERROR(CheckResponseSize(response_bytes, limits_.max_message_bytes,
                                           "output, weights, scores, projections and inputs"));

  // The scores are computed from the projections, so keep them when either is asked for.
  const bool keep_projections = request.return_projections() || request.return_scores();
  ATTEND_ASSIGN_OR_RETURN(MultiHeadAttention::Output out,
                          layer.Forward(in.x, options, request.return_weights(), keep_projections,
                                        *engine_, limits_.attention, cancel));
  metrics_->AttentionComputed("MultiHeadAttend", out.stats);
  if (!as_values) ATTEND_RETURN_IF_ERROR(CheckEncodable(out.output, out_dtype, "output"));
  const Shape q_shape = {n, layer.n_head(), layer.head_dim()};
  const Shape k_shape = {n, layer.n_head_kv(), layer.head_dim()};
  const Shape v_shape = {n, layer.n_head_kv(), layer.head_dim_v()};
  if (request.return_scores()) {
    ATTEND_ASSIGN_OR_RETURN(const AttentionProblem problem,
                            PrepareAttention(TensorView{DType::kFloat32, q_shape, out.q.data()},
                                             TensorView{DType::kFloat32, k_shape, out.k.data()},
                                             TensorView{DType::kFloat32, v_shape, out.v.data()},
                                             options, limits_.attention, engine_->threads()));
    ATTEND_RETURN_IF_ERROR(AddScores(problem, as_values, engine_->threads(), cancel, response));
  }
  EncodeTensor(out.output, {n, layer.d_out()}, as_values, out_dtype, response->mutable_output());
  if (request.return_weights()) {
    EncodeTensor(out.weights, {layer.n_head(), n, n}, as_values, DType::kFloat32,
                 response->mutable_weights());
  }
  if (request.return_projections()) {
    EncodeTensor(out.q, q_shape, as_values, DType::kFloat32, response->mutable_q());
    EncodeTensor(out.k, k_shape, as_values, DType::kFloat32, response->mutable_k());
    EncodeTensor(out.v, v_shape, as_values, DType::kFloat32, response->mutable_v());
  }
  if (request.return_inputs()) AddInputs(*in.drawn, response);
  FillLayerInfo(layer, response);
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
