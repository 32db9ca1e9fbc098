#include "server/kv_cache_service.h"

#include <algorithm>
#include <chrono>
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/base/status_macros.h"
#include "server/convert/kv_cache.h"
#include "server/convert/tensor.h"
#include "server/parse_errors.h"
#include "server/status_convert.h"

namespace attend::server {
namespace {

double SecondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// The phases of one handler, for ComputeStats' prepare, cache and respond seconds: a client
// subtracts them (and compute and queue) from its wait to see what the transport and gRPC took,
// which is where the offload path's per-call cost was found to go. Three clock reads a call.
// Not thread-safe; one per call.
class CallPhases {
 public:
  CallPhases() : mark_(std::chrono::steady_clock::now()) {}

  void EngineStarts() { prepare_ = Lap(); }
  void EngineEnds() { engine_ = Lap(); }

  // Sets the phase times in `out`; `compute_seconds` is the part of the engine's time that the
  // attention took (AttentionStats), the rest of it is the cache's.
  void Fill(double compute_seconds, v1::ComputeStats* out) {
    out->set_prepare_seconds(prepare_);
    out->set_cache_seconds(std::max(0.0, engine_ - compute_seconds));
    out->set_respond_seconds(Lap());
  }

 private:
  double Lap() {
    const auto now = std::chrono::steady_clock::now();
    const double seconds = std::chrono::duration<double>(now - mark_).count();
    mark_ = now;
    return seconds;
  }

  std::chrono::steady_clock::time_point mark_;
  double prepare_ = 0.0;
  double engine_ = 0.0;
};

}  // namespace

absl::Status RequireId(absl::string_view id, absl::string_view field) {
  if (!id.empty()) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(field, ": empty; give the id CreateSequence (or Fork) returned"));
}

// One DecodeStream: read a message, process it on the worker pool, write its response, read the
// next. Sequential on purpose: responses stay in request order and a stream holds at most one
// worker at a time. A message that does not parse gets an error response (request_id 0, since
// its id could not be read) and the stream goes on.
class KvCacheService::StreamReactor
    : public grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
 public:
  // REQUIRES: the caller counted this stream in open_streams_.
  // `route`: the stream's metadata, which every message's steps must match (a stream opened
  // with a key carries that key's sequences only; one opened without may mix them, off the
  // proxy).
  StreamReactor(KvCacheService* service, Route route)
      : service_(service), route_(std::move(route)) {
    StartRead(&request_bytes_);
  }

  void OnReadDone(bool ok) override {
    if (!ok) {  // the client finished sending (or the call ended)
      Finish(grpc::Status::OK);
      return;
    }
    const auto received = std::chrono::steady_clock::now();
    ++messages_;
    request_.Clear();
    response_.Clear();
    if (!grpc::SerializationTraits<v1::DecodeBatchRequest>::Deserialize(&request_bytes_, &request_)
             .ok()) {
      request_.Clear();
      Answer(absl::InvalidArgumentError(CouldNotParse(absl::StrCat("stream message ", messages_),
                                                      "attend.v1.DecodeBatchRequest")));
      return;
    }
    if (service_->RunsHere(request_)) {
      service_->metrics_->QueueWaited("DecodeStream", 0.0);
      Step(received, 0.0);
      return;
    }
    const bool queued =
        SubmitToPool(service_->pool_, service_->metrics_, "DecodeStream",
                     [this, received](double queue_seconds) { Step(received, queue_seconds); });
    if (!queued) {
      response_.Clear();
      Answer(absl::ResourceExhaustedError(
          "the server is busy (worker queue full); this message was not applied"));
    }
  }

  void OnWriteDone(bool ok) override {
    if (!ok) {
      Finish(grpc::Status(grpc::StatusCode::CANCELLED, "the stream was cancelled"));
      return;
    }
    StartRead(&request_bytes_);
  }

  void OnCancel() override { cancel_.Cancel(); }

  void OnDone() override {
    service_->open_streams_--;
    delete this;
  }

 private:
  // Decodes request_ into response_ and writes it.
  void Step(std::chrono::steady_clock::time_point received, double queue_seconds) {
    const absl::Status status = WithMovingHint(
        route_, service_->DoDecodeBatch(request_, &response_, &cancel_, "DecodeStream", route_));
    if (status.ok()) {
      service_->metrics_->DecodeStepDone("DecodeStream", SecondsSince(received));
      response_.mutable_stats()->set_queue_seconds(queue_seconds);
    }
    Answer(status);
  }

  void Answer(const absl::Status& status) {
    if (!status.ok()) {
      const uint64_t id = request_.request_id();
      response_.Clear();
      response_.mutable_error()->set_code(static_cast<int32_t>(status.code()));
      response_.mutable_error()->set_message(std::string(status.message()));
      response_.set_request_id(id);
    }
    bool own_buffer = false;
    response_bytes_.Clear();  // the previous response's bytes, written by now
    const grpc::Status serialized = grpc::SerializationTraits<v1::DecodeBatchResponse>::Serialize(
        response_, &response_bytes_, &own_buffer);
    if (!serialized.ok()) {
      Finish(grpc::Status(grpc::StatusCode::INTERNAL, "could not serialize a response"));
      return;
    }
    StartWrite(&response_bytes_);
  }

  KvCacheService* service_;
  const Route route_;
  Cancellation cancel_;
  int64_t messages_ = 0;
  grpc::ByteBuffer request_bytes_;
  grpc::ByteBuffer response_bytes_;
  v1::DecodeBatchRequest request_;
  v1::DecodeBatchResponse response_;
};

std::function<absl::Status(const CallWork& call)> KvCacheService::WithMoveHint(
    const grpc::CallbackServerContext& context,
    std::function<absl::Status(const CallWork& call)> work) {
  return [route = RouteOf(context), work = std::move(work)](const CallWork& call) {
    return WithMovingHint(route, work(call));
  };
}

grpc::ServerUnaryReactor* KvCacheService::RunKv(
    grpc::CallbackServerContext* context, absl::string_view method,
    std::function<absl::Status(const CallWork& call)> work) {
  return RunOnPool(context, method, pool_, metrics_, gate_,
                   WithMoveHint(*context, std::move(work)));
}

KvCacheService::KvCacheService(const ServiceLimits& limits, kv::KvCache* cache, WorkerPool* pool,
                               Metrics* metrics, CallGate* gate, int64_t max_streams)
    : limits_(limits),
      cache_(cache),
      pool_(pool),
      metrics_(metrics),
      gate_(gate),
      max_streams_(max_streams),
      transfer_watch_(std::make_unique<IdleWatch>(absl::Seconds(60))) {}

grpc::ServerUnaryReactor* KvCacheService::CreateSequence(grpc::CallbackServerContext* context,
                                                         const v1::CreateSequenceRequest* request,
                                                         v1::SequenceInfo* response) {
  return RunKv(
      context, "CreateSequence",
      [this, request, response, route = RouteOf(*context)](const CallWork&) -> absl::Status {
        if (!request->has_config()) {
          return absl::InvalidArgumentError(
              "config: missing; give layers, n_head, n_head_kv, head_dim and kv_dtype");
        }
        ATTEND_ASSIGN_OR_RETURN(const kv::SequenceConfig config, FromProto(request->config()));
        if (request->sequence_id().empty()) {
          ATTEND_RETURN_IF_ERROR(CheckCreateWithoutId(route));
        } else {
          ATTEND_RETURN_IF_ERROR(CheckRoute(route, request->sequence_id(), "sequence_id"));
        }
        ATTEND_ASSIGN_OR_RETURN(
            const kv::SequenceInfo info,
            cache_->Create(config, request->sequence_id(), request->reserve_tokens(),
                           request->sequence_id().empty() && route.key ? *route.key : ""));
        ToProto(info, response);
        return absl::OkStatus();
      });
}

absl::Status KvCacheService::DoAppend(const v1::AppendRequest& request,
                                      v1::AppendResponse* response, const Cancellation* cancel,
                                      const Route& route) {
  CallPhases phases;
  const int64_t max_elements = limits_.attention.max_tensor_elements;
  if (!request.has_k() || !request.has_v()) {
    return absl::InvalidArgumentError(absl::StrCat(
        request.has_k() ? "v" : "k", ": missing; Append needs the new tokens' k and v"));
  }
  ATTEND_RETURN_IF_ERROR(RequireId(request.sequence_id(), "sequence_id"));
  ATTEND_RETURN_IF_ERROR(CheckRoute(route, request.sequence_id(), "sequence_id"));
  kv::AppendInput input;
  input.id = request.sequence_id();
  bool as_values = false;
  if (request.has_q()) {
    ATTEND_ASSIGN_OR_RETURN(const DecodedTensor q, DecodeTensor(request.q(), "q", max_elements));
    input.q = q.view;
    as_values = q.from_values;
  }
  ATTEND_ASSIGN_OR_RETURN(const DecodedTensor k, DecodeTensor(request.k(), "k", max_elements));
  ATTEND_ASSIGN_OR_RETURN(const DecodedTensor v, DecodeTensor(request.v(), "v", max_elements));
  input.k = k.view;
  input.v = v.view;
  ATTEND_ASSIGN_OR_RETURN(const Precision precision, DecodePrecision(request.precision()));
  ATTEND_ASSIGN_OR_RETURN(const DType out_dtype,
                          DecodeOutputDType(request.output_dtype(), "output_dtype"));
  // The output's size follows from the inputs; what is left of a message bounds the weights.
  int64_t output_elements = 0;
  if (input.q && input.q->rank() == 3 && input.v.rank() == 3) {
    output_elements = input.q->dim(0) * input.q->dim(1) * input.v.dim(2);
  }
  const int64_t output_bytes = EncodedBytes(output_elements, as_values, out_dtype);
  ATTEND_RETURN_IF_ERROR(CheckResponseSize(output_bytes, limits_.max_message_bytes, "output"));
  const int64_t weight_room = (limits_.max_message_bytes - output_bytes - 4096) / 4;

  AttentionStats stats;
  phases.EngineStarts();
  ATTEND_ASSIGN_OR_RETURN(
      kv::AppendResult result,
      cache_->Append(request.layer(), input, precision, request.return_weights() && input.q, &stats,
                     std::max<int64_t>(weight_room, 0), cancel, out_dtype));
  phases.EngineEnds();
  if (input.q) {
    const int64_t n = input.k.dim(0);
    EncodeTensor(result.output, {n, input.q->dim(1), input.v.dim(2)}, as_values, out_dtype,
                 response->mutable_output());
    if (request.return_weights()) {
      EncodeTensor(result.weights, {input.q->dim(1), n, result.layer_tokens}, as_values,
                   DType::kFloat32, response->mutable_weights());
    }
    metrics_->AttentionComputed("Append", stats);
    ToProto(stats, response->mutable_stats());
  }
  metrics_->TokensAppended("Append", input.k.dim(0));
  response->set_first_position(result.first_position);
  response->set_layer_tokens(result.layer_tokens);
  phases.Fill(stats.compute_seconds, response->mutable_stats());
  return absl::OkStatus();
}

grpc::ServerUnaryReactor* KvCacheService::Append(grpc::CallbackServerContext* context,
                                                 const v1::AppendRequest* request,
                                                 v1::AppendResponse* response) {
  return RunKv(context, "Append",
               [this, request, response, route = RouteOf(*context)](const CallWork& call) {
                 absl::Status status = DoAppend(*request, response, call.cancel, route);
                 response->mutable_stats()->set_queue_seconds(call.queue_seconds);
                 return status;
               });
}

absl::Status KvCacheService::DoDecodeBatch(const v1::DecodeBatchRequest& request,
                                           v1::DecodeBatchResponse* response,
                                           const Cancellation* cancel, absl::string_view method,
                                           const Route& route) {
  CallPhases phases;
  const int64_t max_elements = limits_.attention.max_tensor_elements;
  ATTEND_ASSIGN_OR_RETURN(const Precision precision, DecodePrecision(request.precision()));
  ATTEND_ASSIGN_OR_RETURN(const DType out_dtype,
                          DecodeOutputDType(request.output_dtype(), "output_dtype"));
  if (request.steps_size() == 0) {
    return absl::InvalidArgumentError("steps: empty; give one step per sequence");
  }
  std::vector<kv::AppendInput> inputs(static_cast<size_t>(request.steps_size()));
  std::vector<bool> as_values(inputs.size());
  int64_t output_bytes = 0;
  for (int i = 0; i < request.steps_size(); ++i) {
    const v1::DecodeStep& step = request.steps(i);
    const std::string field = absl::StrCat("steps[", i, "]");
    if (!step.has_q() || !step.has_k() || !step.has_v()) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, ": q, k and v are required for a decode step"));
    }
    ATTEND_RETURN_IF_ERROR(RequireId(step.sequence_id(), field + ".sequence_id"));
    ATTEND_RETURN_IF_ERROR(CheckRoute(route, step.sequence_id(), field + ".sequence_id"));
    kv::AppendInput& in = inputs[static_cast<size_t>(i)];
    in.id = step.sequence_id();
    ATTEND_ASSIGN_OR_RETURN(const DecodedTensor q,
                            DecodeTensor(step.q(), field + ".q", max_elements));
    ATTEND_ASSIGN_OR_RETURN(const DecodedTensor k,
                            DecodeTensor(step.k(), field + ".k", max_elements));
    ATTEND_ASSIGN_OR_RETURN(const DecodedTensor v,
                            DecodeTensor(step.v(), field + ".v", max_elements));
    in.q = q.view;
    in.k = k.view;
    in.v = v.view;
    as_values[static_cast<size_t>(i)] = q.from_values;
    if (q.view.rank() == 3 && v.view.rank() == 3) {
      output_bytes += EncodedBytes(q.view.dim(1) * v.view.dim(2), q.from_values, out_dtype);
    }
  }
  ATTEND_RETURN_IF_ERROR(CheckResponseSize(output_bytes, limits_.max_message_bytes, "outputs"));
  AttentionStats stats;
  phases.EngineStarts();
  ATTEND_ASSIGN_OR_RETURN(
      std::vector<kv::AppendResult> results,
      cache_->DecodeBatch(request.layer(), inputs, precision, &stats, cancel, out_dtype));
  phases.EngineEnds();
  for (size_t i = 0; i < results.size(); ++i) {
    v1::DecodeResult* out = response->add_results();
    out->set_sequence_id(inputs[i].id);
    EncodeTensor(results[i].output, {1, inputs[i].q->dim(1), inputs[i].v.dim(2)}, as_values[i],
                 out_dtype, out->mutable_output());
    out->set_layer_tokens(results[i].layer_tokens);
  }
  int64_t appended = 0;
  for (const kv::AppendInput& in : inputs) appended += in.k.dim(0);
  metrics_->AttentionComputed(method, stats);
  metrics_->TokensAppended(method, appended);
  metrics_->TokensDecoded(method, static_cast<int64_t>(results.size()));
  ToProto(stats, response->mutable_stats());
  response->set_request_id(request.request_id());
  phases.Fill(stats.compute_seconds, response->mutable_stats());
  return absl::OkStatus();
}

namespace {

// Rows [from, from + count) of a validated rank-3 tensor, viewed in place.
TensorView Rows(const TensorView& all, int64_t from, int64_t count) {
  const int64_t row = all.dim(1) * all.dim(2) * DTypeSize(all.dtype);
  return TensorView{
      all.dtype, {count, all.dim(1), all.dim(2)}, static_cast<const char*>(all.data) + from * row};
}

// OK when `t` is [rows, *, *].
absl::Status CheckPackedRows(const TensorView& t, absl::string_view field, int64_t rows) {
  if (t.rank() == 3 && t.dim(0) == rows) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      field, ".shape is ", ShapeToString(t.shape), "; expected [", rows,
      " (the sum of token_counts), heads, head_dim]: sequence i's tokens are its rows"));
}

}  // namespace

absl::Status KvCacheService::DoAppendBatch(const v1::AppendBatchRequest& request,
                                           v1::AppendBatchResponse* response,
                                           const Cancellation* cancel, const Route& route) {
  CallPhases phases;
  const int64_t max_elements = limits_.attention.max_tensor_elements;
  const int count = request.sequence_ids_size();
  if (count == 0) {
    return absl::InvalidArgumentError("sequence_ids: empty; give one id per sequence");
  }
  if (request.token_counts_size() != count) {
    return absl::InvalidArgumentError(absl::StrCat("token_counts: ", request.token_counts_size(),
                                                   " counts for ", count,
                                                   " sequence_ids; give one count per sequence"));
  }
  int64_t rows = 0;
  for (int i = 0; i < count; ++i) {
    const int64_t n = request.token_counts(i);
    if (n < 1 || n > max_elements) {
      return absl::InvalidArgumentError(
          absl::StrCat("token_counts[", i, "]: ", n, "; must be between 1 and ", max_elements));
    }
    rows += n;  // at most count * 2^26 or so: no overflow
    const std::string field = absl::StrCat("sequence_ids[", i, "]");
    ATTEND_RETURN_IF_ERROR(RequireId(request.sequence_ids(i), field));
    ATTEND_RETURN_IF_ERROR(CheckRoute(route, request.sequence_ids(i), field));
  }
  if (!request.has_k() || !request.has_v()) {
    return absl::InvalidArgumentError(absl::StrCat(
        request.has_k() ? "v" : "k", ": missing; AppendBatch needs the new tokens' k and v"));
  }
  ATTEND_ASSIGN_OR_RETURN(const DecodedTensor k, DecodeTensor(request.k(), "k", max_elements));
  ATTEND_ASSIGN_OR_RETURN(const DecodedTensor v, DecodeTensor(request.v(), "v", max_elements));
  ATTEND_RETURN_IF_ERROR(CheckPackedRows(k.view, "k", rows));
  ATTEND_RETURN_IF_ERROR(CheckPackedRows(v.view, "v", rows));
  std::optional<DecodedTensor> q;
  if (request.has_q()) {
    ATTEND_ASSIGN_OR_RETURN(q, DecodeTensor(request.q(), "q", max_elements));
    ATTEND_RETURN_IF_ERROR(CheckPackedRows(q->view, "q", rows));
  }
  ATTEND_ASSIGN_OR_RETURN(const Precision precision, DecodePrecision(request.precision()));
  ATTEND_ASSIGN_OR_RETURN(const DType out_dtype,
                          DecodeOutputDType(request.output_dtype(), "output_dtype"));
  const bool as_values = q && q->from_values;
  const int64_t output_elements = q ? rows * q->view.dim(1) * v.view.dim(2) : 0;
  ATTEND_RETURN_IF_ERROR(CheckResponseSize(EncodedBytes(output_elements, as_values, out_dtype),
                                           limits_.max_message_bytes, "output"));
  std::vector<kv::AppendInput> inputs(static_cast<size_t>(count));
  int64_t from = 0;
  for (int i = 0; i < count; ++i) {
    kv::AppendInput& in = inputs[static_cast<size_t>(i)];
    const int64_t n = request.token_counts(i);
    in.id = request.sequence_ids(i);
    in.k = Rows(k.view, from, n);
    in.v = Rows(v.view, from, n);
    if (q) in.q = Rows(q->view, from, n);
    from += n;
  }
  AttentionStats stats;
  phases.EngineStarts();
  ATTEND_ASSIGN_OR_RETURN(
      std::vector<kv::AppendResult> results,
      cache_->AppendBatch(request.layer(), inputs, precision, &stats, cancel, out_dtype));
  phases.EngineEnds();
  if (q) {
    std::vector<absl::Span<const float>> parts;
    parts.reserve(results.size());
    for (const kv::AppendResult& r : results) parts.emplace_back(r.output);
    EncodeTensorParts(parts, {rows, q->view.dim(1), v.view.dim(2)}, as_values, out_dtype,
                      response->mutable_output());
    metrics_->AttentionComputed("AppendBatch", stats);
    ToProto(stats, response->mutable_stats());
  }
  for (const kv::AppendResult& r : results) {
    response->add_first_positions(r.first_position);
    response->add_layer_tokens(r.layer_tokens);
  }
  metrics_->TokensAppended("AppendBatch", rows);
  phases.Fill(stats.compute_seconds, response->mutable_stats());
  return absl::OkStatus();
}

grpc::ServerUnaryReactor* KvCacheService::AppendBatch(grpc::CallbackServerContext* context,
                                                      const v1::AppendBatchRequest* request,
                                                      v1::AppendBatchResponse* response) {
  return RunKv(context, "AppendBatch",
               [this, request, response, route = RouteOf(*context)](const CallWork& call) {
                 absl::Status status = DoAppendBatch(*request, response, call.cancel, route);
                 response->mutable_stats()->set_queue_seconds(call.queue_seconds);
                 return status;
               });
}

bool KvCacheService::RunsHere(const v1::DecodeBatchRequest& request) const {
  // More steps than this go to a worker whatever their size: decoding and encoding each one's
  // tensors is work of its own.
  constexpr int kStepsRunHere = 64;
  if (request.steps_size() > kStepsRunHere) return false;
  std::vector<absl::string_view> ids;
  ids.reserve(static_cast<size_t>(request.steps_size()));
  for (const v1::DecodeStep& step : request.steps()) ids.push_back(step.sequence_id());
  return cache_->DecodeRunsOnCallingThread(ids);
}

grpc::ServerUnaryReactor* KvCacheService::DecodeBatch(grpc::CallbackServerContext* context,
                                                      const v1::DecodeBatchRequest* request,
                                                      v1::DecodeBatchResponse* response) {
  const auto received = std::chrono::steady_clock::now();
  auto work = [this, request, response, received, route = RouteOf(*context)](const CallWork& call) {
    absl::Status status = DoDecodeBatch(*request, response, call.cancel, "DecodeBatch", route);
    if (status.ok()) metrics_->DecodeStepDone("DecodeBatch", SecondsSince(received));
    response->mutable_stats()->set_queue_seconds(call.queue_seconds);
    return status;
  };
  if (RunsHere(*request))
    return RunHere(context, "DecodeBatch", metrics_, gate_, WithMoveHint(*context, work));
  return RunKv(context, "DecodeBatch", std::move(work));
}

grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* KvCacheService::DecodeStream(
    grpc::CallbackServerContext* context) {
  // A draining server refuses streams that start now.
  if (!gate_->Admitted(context)) {
    class Draining : public grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
     public:
      Draining() { Finish(ShuttingDown()); }
      void OnDone() override { delete this; }
    };
    return new Draining();
  }
  // Count first, then check: streams opened at the same moment cannot all slip under the limit.
  if (open_streams_.fetch_add(1) >= max_streams_) {
    open_streams_--;
    // A reactor that only finishes: the limit is reported as the stream's status.
    class Refused : public grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
     public:
      explicit Refused(int64_t limit) {
        Finish(grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                            absl::StrCat(limit,
                                         " decode streams are open, the server's limit "
                                         "(--max_concurrent_streams); retry later")));
      }
      void OnDone() override { delete this; }
    };
    return new Refused(max_streams_);
  }
  return new StreamReactor(this, RouteOf(*context));
}

grpc::ServerUnaryReactor* KvCacheService::Fork(grpc::CallbackServerContext* context,
                                               const v1::ForkRequest* request,
                                               v1::SequenceInfo* response) {
  return RunKv(
      context, "Fork",
      [this, request, response, route = RouteOf(*context)](const CallWork&) -> absl::Status {
        ATTEND_RETURN_IF_ERROR(RequireId(request->source_id(), "source_id"));
        // The fork's name first: a client that knows the rule sends no key for a
        // new_id of another key, and is told how to name the fork.
        ATTEND_RETURN_IF_ERROR(CheckForkId(route, request->source_id(), request->new_id()));
        ATTEND_RETURN_IF_ERROR(CheckRoute(route, request->source_id(), "source_id"));
        std::optional<int64_t> tokens;
        if (request->has_tokens()) tokens = request->tokens();
        ATTEND_ASSIGN_OR_RETURN(const kv::SequenceInfo info,
                                cache_->Fork(request->source_id(), request->new_id(), tokens));
        ToProto(info, response);
        return absl::OkStatus();
      });
}

grpc::ServerUnaryReactor* KvCacheService::Truncate(grpc::CallbackServerContext* context,
                                                   const v1::TruncateRequest* request,
                                                   v1::SequenceInfo* response) {
  return RunKv(
      context, "Truncate",
      [this, request, response, route = RouteOf(*context)](const CallWork&) -> absl::Status {
        ATTEND_RETURN_IF_ERROR(RequireId(request->sequence_id(), "sequence_id"));
        ATTEND_RETURN_IF_ERROR(CheckRoute(route, request->sequence_id(), "sequence_id"));
        ATTEND_ASSIGN_OR_RETURN(const kv::SequenceInfo info,
                                cache_->Truncate(request->sequence_id(), request->tokens()));
        ToProto(info, response);
        return absl::OkStatus();
      });
}

grpc::ServerUnaryReactor* KvCacheService::Release(grpc::CallbackServerContext* context,
                                                  const v1::ReleaseRequest* request,
                                                  v1::ReleaseResponse* response) {
  return RunKv(
      context, "Release",
      [this, request, response, route = RouteOf(*context)](const CallWork&) -> absl::Status {
        ATTEND_RETURN_IF_ERROR(RequireId(request->sequence_id(), "sequence_id"));
        ATTEND_RETURN_IF_ERROR(CheckRoute(route, request->sequence_id(), "sequence_id"));
        ATTEND_ASSIGN_OR_RETURN(const int64_t freed, cache_->Release(request->sequence_id()));
        response->set_freed_bytes(freed);
        return absl::OkStatus();
      });
}

grpc::ServerUnaryReactor* KvCacheService::GetSequence(grpc::CallbackServerContext* context,
                                                      const v1::GetSequenceRequest* request,
                                                      v1::SequenceInfo* response) {
  return RunKv(
      context, "GetSequence",
      [this, request, response, route = RouteOf(*context)](const CallWork&) -> absl::Status {
        ATTEND_RETURN_IF_ERROR(RequireId(request->sequence_id(), "sequence_id"));
        ATTEND_RETURN_IF_ERROR(CheckRoute(route, request->sequence_id(), "sequence_id"));
        ATTEND_ASSIGN_OR_RETURN(const kv::SequenceInfo info, cache_->Get(request->sequence_id()));
        ToProto(info, response);
        return absl::OkStatus();
      });
}

grpc::ServerUnaryReactor* KvCacheService::ListSequences(grpc::CallbackServerContext* context,
                                                        const v1::ListSequencesRequest* request,
                                                        v1::ListSequencesResponse* response) {
  return RunKv(context, "ListSequences",
               [this, request, response](const CallWork&) -> absl::Status {
                 ATTEND_ASSIGN_OR_RETURN(const kv::ListPage page,
                                         cache_->List(request->page_size(), request->page_token()));
                 for (const kv::SequenceInfo& info : page.sequences)
                   ToProto(info, response->add_sequences());
                 response->set_next_page_token(page.next_page_token);
                 return absl::OkStatus();
               });
}

grpc::ServerUnaryReactor* KvCacheService::Stats(grpc::CallbackServerContext* context,
                                                const v1::StatsRequest*, v1::CacheStats* response) {
  // Cheap and lock-light: answered on the callback thread.
  ToProto(cache_->Stats(), response);
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

}  // namespace attend::server
