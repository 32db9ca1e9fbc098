#include "client/kv_cache_client.h"

#include <algorithm>
#include <random>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"

namespace attend::client {
namespace {

// Header values must be printable ASCII; anything else would fail the call inside gRPC before
// the server could explain what is wrong with the id.
bool IsHeaderValue(const std::string& value) {
  if (value.empty()) return false;
  return std::all_of(value.begin(), value.end(), [](char c) { return c >= 0x20 && c <= 0x7e; });
}

// A context for a call about sequence `id` (empty: none), which sends id's routing key.
std::unique_ptr<grpc::ClientContext> CallContext(absl::Time deadline, const std::string& id) {
  auto context = std::make_unique<grpc::ClientContext>();
  context->set_deadline(absl::ToChronoTime(deadline));
  const std::string key(RoutingKey(id));
  if (IsHeaderValue(key)) context->AddMetadata(kSequenceKeyMetadata, key);
  return context;
}

// The id whose routing key a call about all of `ids` sends: the first, when they all share its
// key; else none (empty). A call without a key works against one server; through the fleet's
// proxy the server refuses it, saying why, since no one replica is sure to hold them all.
std::string CommonKeyId(const std::vector<std::string>& ids) {
  if (ids.empty()) return "";
  const absl::string_view key = RoutingKey(ids[0]);
  for (const std::string& id : ids) {
    if (RoutingKey(id) != key) return "";
  }
  return ids[0];
}

std::string BatchKeyId(const DecodeBatchInput& input) {
  std::vector<std::string> ids;
  ids.reserve(input.steps.size());
  for (const DecodeStep& step : input.steps) ids.push_back(step.sequence_id);
  return CommonKeyId(ids);
}

// The output dtype that matches how the inputs travel (values answer with values anyway).
v1::DType OutputDType(Wire wire) {
  switch (wire) {
    case Wire::kBFloat16:
      return v1::BFLOAT16;
    case Wire::kFloat16:
      return v1::FLOAT16;
    default:
      return v1::FLOAT32;
  }
}

void FillDecodeRequest(const DecodeBatchInput& input, v1::DecodeBatchRequest* request) {
  request->set_layer(input.layer);
  for (const DecodeStep& step : input.steps) {
    v1::DecodeStep* out = request->add_steps();
    out->set_sequence_id(step.sequence_id);
    EncodeTensor(step.q, input.wire, out->mutable_q());
    EncodeTensor(step.k, input.wire, out->mutable_k());
    EncodeTensor(step.v, input.wire, out->mutable_v());
  }
  request->set_precision(input.precision);
  request->set_output_dtype(OutputDType(input.wire));
  request->set_request_id(input.request_id);
}

absl::StatusOr<DecodeBatchOutput> FromDecodeResponse(const v1::DecodeBatchResponse& response) {
  DecodeBatchOutput out;
  out.request_id = response.request_id();
  out.stats = response.stats();
  out.results.reserve(static_cast<size_t>(response.results_size()));
  for (const v1::DecodeResult& result : response.results()) {
    absl::StatusOr<FloatTensor> output = DecodeTensor(result.output());
    if (!output.ok()) return output.status();
    out.results.push_back({result.sequence_id(), *std::move(output), result.layer_tokens()});
  }
  return out;
}

DecodeStreamReply ToReply(const v1::DecodeBatchResponse& response) {
  DecodeStreamReply reply;
  reply.request_id = response.request_id();
  if (response.has_error()) {
    const int code = response.error().code();
    // A server that says "error" with code OK (or a code this client does not know) still
    // failed the message.
    const absl::StatusCode status_code =
        code > 0 && code <= 16 ? static_cast<absl::StatusCode>(code) : absl::StatusCode::kUnknown;
    reply.result = absl::Status(status_code, response.error().message());
  } else {
    reply.result = FromDecodeResponse(response);
  }
  return reply;
}

}  // namespace

absl::StatusOr<std::string> SnapshotSequenceId(absl::string_view data) {
  constexpr absl::string_view kMagic = "ATTNSNAP";
  if (data.size() < 20 || data.substr(0, kMagic.size()) != kMagic) {
    return absl::InvalidArgumentError(
        "not an attend snapshot (it does not start with \"ATTNSNAP\")");
  }
  uint32_t length = 0;
  for (int i = 3; i >= 0; --i) {
    length = (length << 8) | static_cast<uint8_t>(data[16 + static_cast<size_t>(i)]);
  }
  if (length < 1 || length > 128 || data.size() < 20 + static_cast<size_t>(length)) {
    return absl::InvalidArgumentError("the snapshot's header holds no valid sequence id");
  }
  return std::string(data.substr(20, length));
}

std::string GenerateSequenceId() {
  // Seeded once per thread from the system's entropy: ids from different processes (several
  // CLI invocations in a second) must not collide.
  thread_local std::mt19937_64 random(std::random_device{}());
  return absl::StrFormat("seq-%016x", random());
}

// --- DecodeStream -------------------------------------------------------------------------------

DecodeStream::DecodeStream(v1::KvCache::Stub* stub, absl::Duration deadline)
    : stub_(stub), deadline_(deadline) {}

DecodeStream::~DecodeStream() {
  if (stream_ && !finished_) {
    // The sync API needs Finish before the call object goes; cancelling first makes the reads
    // and Finish return at once instead of waiting for the server.
    context_->TryCancel();
    v1::DecodeBatchResponse ignored;
    while (stream_->Read(&ignored)) {
    }
    (void)stream_->Finish();
  }
}

absl::StatusOr<uint64_t> DecodeStream::Write(const DecodeBatchInput& input) {
  if (writes_done_ || finished_) {
    return absl::FailedPreconditionError("DecodeStream: Write after WritesDone or Finish");
  }
  if (!stream_) {
    // The call starts here so that its key can be the first message's steps' key.
    context_ = CallContext(absl::Now() + deadline_, BatchKeyId(input));
    stream_ = stub_->DecodeStream(context_.get());
  }
  v1::DecodeBatchRequest request;
  FillDecodeRequest(input, &request);
  const uint64_t id =
      input.request_id != 0 ? input.request_id : static_cast<uint64_t>(written_) + 1;
  request.set_request_id(id);
  if (!stream_->Write(request)) {
    // The call is over (refused, cancelled, broken). Keep what it still owes readable and
    // report why it ended.
    Drain();
    return final_status_.ok() ? absl::AbortedError("DecodeStream: the server closed the stream")
                              : final_status_;
  }
  ++written_;
  return id;
}

absl::StatusOr<DecodeStreamReply> DecodeStream::Read() {
  if (buffered_.empty() && !finished_) {
    if (!stream_ || (written_ == read_ && !writes_done_)) {
      return absl::FailedPreconditionError(
          "DecodeStream: no message awaits a response (Write one first)");
    }
    v1::DecodeBatchResponse response;
    if (stream_->Read(&response)) {
      ++read_;
      return ToReply(response);
    }
    Drain();  // the server ended the stream: collect its status
  }
  if (!buffered_.empty()) {
    DecodeStreamReply reply = std::move(buffered_.front());
    buffered_.pop_front();
    ++read_;
    return reply;
  }
  if (!final_status_.ok()) return final_status_;
  if (written_ > read_) {
    return absl::InternalError(absl::StrCat("DecodeStream: the server ended the stream with ",
                                            written_ - read_, " messages unanswered"));
  }
  return absl::OutOfRangeError("DecodeStream: the stream has ended and every response was read");
}

absl::Status DecodeStream::WritesDone() {
  if (writes_done_ || finished_) return absl::OkStatus();
  writes_done_ = true;
  // A failed half-close means the call is already over; Read and Finish report why.
  if (stream_) (void)stream_->WritesDone();
  return absl::OkStatus();
}

absl::Status DecodeStream::Finish() {
  Drain();
  return final_status_;
}

void DecodeStream::Drain() {
  if (finished_) return;
  finished_ = true;
  if (!stream_) return;
  if (!writes_done_) {
    writes_done_ = true;
    (void)stream_->WritesDone();
  }
  v1::DecodeBatchResponse response;
  while (stream_->Read(&response)) buffered_.push_back(ToReply(response));
  final_status_ = FromGrpcStatus(stream_->Finish());
}

// --- KvCacheClient ------------------------------------------------------------------------------

KvCacheClient::KvCacheClient(std::shared_ptr<grpc::Channel> channel, ConnectionOptions options,
                             RetryPolicy retry)
    : channel_(std::move(channel)),
      stub_(v1::KvCache::NewStub(channel_)),
      options_(std::move(options)),
      retry_(retry) {}

template <typename Response, typename Call>
absl::StatusOr<Response> KvCacheClient::Retried(const std::string& key, Call call) const {
  const absl::Time deadline = absl::Now() + options_.deadline;
  absl::Duration backoff = retry_.initial_backoff;
  for (int attempt = 1;; ++attempt) {
    Response response;
    auto context = CallContext(deadline, key);
    const absl::Status status = FromGrpcStatus(call(context.get(), &response));
    if (status.ok()) return response;
    if (status.code() != absl::StatusCode::kUnavailable || attempt >= retry_.max_attempts) {
      return status;
    }
    // An attempt that could only start at the deadline would fail DEADLINE_EXCEEDED and hide
    // the real reason; return UNAVAILABLE now.
    if (absl::Now() + backoff >= deadline) return status;
    absl::SleepFor(backoff);
    // A channel whose connection attempt failed waits out gRPC's reconnect backoff (1 s and
    // growing) and meanwhile fails every call at once with the old error, so a plain retry
    // could not reach a server that came back. Reconnect now, and give that attempt up to
    // another backoff to succeed: the channel stays TRANSIENT_FAILURE until it is READY, so a
    // call sent at once would still fail. A channel that is READY (the UNAVAILABLE came from
    // the other side) does not wait.
    grpc::experimental::ChannelResetConnectionBackoff(channel_.get());
    (void)channel_->WaitForConnected(absl::ToChronoTime(std::min(deadline, absl::Now() + backoff)));
    backoff = std::min(backoff * retry_.multiplier, retry_.max_backoff);
  }
}

absl::StatusOr<v1::SequenceInfo> KvCacheClient::CreateSequence(const v1::SequenceConfig& config,
                                                               const std::string& sequence_id,
                                                               int64_t reserve_tokens) const {
  v1::CreateSequenceRequest request;
  *request.mutable_config() = config;
  // Generated here, not by the server: the call must carry the id's key to reach the replica
  // that later calls for the id will reach.
  const std::string id = sequence_id.empty() ? GenerateSequenceId() : sequence_id;
  request.set_sequence_id(id);
  request.set_reserve_tokens(reserve_tokens);
  v1::SequenceInfo response;
  auto context = CallContext(absl::Now() + options_.deadline, id);
  absl::Status status = FromGrpcStatus(stub_->CreateSequence(context.get(), request, &response));
  if (!status.ok()) return status;
  return response;
}

absl::StatusOr<AppendOutput> KvCacheClient::Append(const AppendInput& input) const {
  v1::AppendRequest request;
  request.set_sequence_id(input.sequence_id);
  request.set_layer(input.layer);
  if (input.q) EncodeTensor(*input.q, input.wire, request.mutable_q());
  EncodeTensor(input.k, input.wire, request.mutable_k());
  EncodeTensor(input.v, input.wire, request.mutable_v());
  request.set_precision(input.precision);
  request.set_return_weights(input.return_weights);
  request.set_output_dtype(OutputDType(input.wire));
  v1::AppendResponse response;
  auto context = CallContext(absl::Now() + options_.deadline, input.sequence_id);
  absl::Status status = FromGrpcStatus(stub_->Append(context.get(), request, &response));
  if (!status.ok()) return status;
  AppendOutput out;
  if (response.has_output()) {
    absl::StatusOr<FloatTensor> output = DecodeTensor(response.output());
    if (!output.ok()) return output.status();
    out.output = *std::move(output);
  }
  if (response.has_weights()) {
    absl::StatusOr<FloatTensor> weights = DecodeTensor(response.weights());
    if (!weights.ok()) return weights.status();
    out.weights = *std::move(weights);
  }
  out.first_position = response.first_position();
  out.layer_tokens = response.layer_tokens();
  out.stats = response.stats();
  return out;
}

absl::StatusOr<DecodeBatchOutput> KvCacheClient::DecodeBatch(const DecodeBatchInput& input) const {
  v1::DecodeBatchRequest request;
  FillDecodeRequest(input, &request);
  v1::DecodeBatchResponse response;
  auto context = CallContext(absl::Now() + options_.deadline, BatchKeyId(input));
  absl::Status status = FromGrpcStatus(stub_->DecodeBatch(context.get(), request, &response));
  if (!status.ok()) return status;
  return FromDecodeResponse(response);
}

absl::StatusOr<AppendBatchOutput> KvCacheClient::AppendBatch(const AppendBatchInput& input) const {
  v1::AppendBatchRequest request;
  request.set_layer(input.layer);
  for (const std::string& id : input.sequence_ids) request.add_sequence_ids(id);
  for (int64_t n : input.token_counts) request.add_token_counts(n);
  if (input.q) EncodeTensor(*input.q, input.wire, request.mutable_q());
  EncodeTensor(input.k, input.wire, request.mutable_k());
  EncodeTensor(input.v, input.wire, request.mutable_v());
  request.set_precision(input.precision);
  request.set_output_dtype(OutputDType(input.wire));
  v1::AppendBatchResponse response;
  auto context = CallContext(absl::Now() + options_.deadline, CommonKeyId(input.sequence_ids));
  absl::Status status = FromGrpcStatus(stub_->AppendBatch(context.get(), request, &response));
  if (!status.ok()) return status;
  AppendBatchOutput out;
  if (response.has_output()) {
    absl::StatusOr<FloatTensor> output = DecodeTensor(response.output());
    if (!output.ok()) return output.status();
    out.output = *std::move(output);
  }
  out.first_positions.assign(response.first_positions().begin(), response.first_positions().end());
  out.layer_tokens.assign(response.layer_tokens().begin(), response.layer_tokens().end());
  out.stats = response.stats();
  return out;
}

std::unique_ptr<DecodeStream> KvCacheClient::OpenDecodeStream(
    std::optional<absl::Duration> deadline) const {
  return std::unique_ptr<DecodeStream>(
      new DecodeStream(stub_.get(), deadline.value_or(options_.deadline)));
}

absl::StatusOr<v1::SequenceInfo> KvCacheClient::Fork(const std::string& source_id,
                                                     const std::string& new_id,
                                                     std::optional<int64_t> tokens) const {
  v1::ForkRequest request;
  request.set_source_id(source_id);
  request.set_new_id(new_id);
  if (tokens) request.set_tokens(*tokens);
  v1::SequenceInfo response;
  // A new_id of another key is for one server: behind the proxy the fork could not be found
  // again by its own key, and the server says so.
  auto context = CallContext(absl::Now() + options_.deadline,
                             new_id.empty() ? source_id : CommonKeyId({source_id, new_id}));
  absl::Status status = FromGrpcStatus(stub_->Fork(context.get(), request, &response));
  if (!status.ok()) return status;
  return response;
}

absl::StatusOr<v1::SequenceInfo> KvCacheClient::Truncate(const std::string& sequence_id,
                                                         int64_t tokens) const {
  v1::TruncateRequest request;
  request.set_sequence_id(sequence_id);
  request.set_tokens(tokens);
  v1::SequenceInfo response;
  auto context = CallContext(absl::Now() + options_.deadline, sequence_id);
  absl::Status status = FromGrpcStatus(stub_->Truncate(context.get(), request, &response));
  if (!status.ok()) return status;
  return response;
}

absl::StatusOr<int64_t> KvCacheClient::Release(const std::string& sequence_id) const {
  v1::ReleaseRequest request;
  request.set_sequence_id(sequence_id);
  v1::ReleaseResponse response;
  auto context = CallContext(absl::Now() + options_.deadline, sequence_id);
  absl::Status status = FromGrpcStatus(stub_->Release(context.get(), request, &response));
  if (!status.ok()) return status;
  return response.freed_bytes();
}

absl::StatusOr<v1::SequenceInfo> KvCacheClient::GetSequence(const std::string& sequence_id) const {
  v1::GetSequenceRequest request;
  request.set_sequence_id(sequence_id);
  return Retried<v1::SequenceInfo>(sequence_id,
                                   [&](grpc::ClientContext* context, v1::SequenceInfo* response) {
                                     return stub_->GetSequence(context, request, response);
                                   });
}

absl::StatusOr<v1::ListSequencesResponse> KvCacheClient::ListSequences(
    int32_t page_size, const std::string& page_token) const {
  v1::ListSequencesRequest request;
  request.set_page_size(page_size);
  request.set_page_token(page_token);
  return Retried<v1::ListSequencesResponse>(
      "", [&](grpc::ClientContext* context, v1::ListSequencesResponse* response) {
        return stub_->ListSequences(context, request, response);
      });
}

absl::StatusOr<std::vector<v1::SequenceInfo>> KvCacheClient::ListAllSequences(
    int32_t page_size) const {
  std::vector<v1::SequenceInfo> all;
  std::set<std::string> tokens_seen;
  std::string token;
  while (true) {
    absl::StatusOr<v1::ListSequencesResponse> page = ListSequences(page_size, token);
    if (!page.ok()) return page.status();
    for (v1::SequenceInfo& info : *page->mutable_sequences()) all.push_back(std::move(info));
    token = page->next_page_token();
    if (token.empty()) return all;
    // A server that hands out a token twice would keep this loop going for ever.
    if (!tokens_seen.insert(token).second) {
      return absl::InternalError(
          absl::StrCat("ListSequences: the server returned page token '", token, "' twice"));
    }
  }
}

absl::StatusOr<v1::CacheStats> KvCacheClient::Stats() const {
  const v1::StatsRequest request;
  return Retried<v1::CacheStats>("", [&](grpc::ClientContext* context, v1::CacheStats* response) {
    return stub_->Stats(context, request, response);
  });
}

absl::StatusOr<v1::SaveSequenceResponse> KvCacheClient::SaveSequence(
    const std::string& sequence_id, const std::string& name) const {
  v1::SaveSequenceRequest request;
  request.set_sequence_id(sequence_id);
  request.set_name(name);
  v1::SaveSequenceResponse response;
  auto context = CallContext(absl::Now() + options_.deadline, sequence_id);
  absl::Status status = FromGrpcStatus(stub_->SaveSequence(context.get(), request, &response));
  if (!status.ok()) return status;
  return response;
}

absl::StatusOr<v1::SequenceInfo> KvCacheClient::LoadSequence(const std::string& name,
                                                             const std::string& sequence_id) const {
  v1::LoadSequenceRequest request;
  request.set_name(name);
  request.set_sequence_id(sequence_id);
  v1::SequenceInfo response;
  // Without a new id the sequence keeps the one in the file, which the client cannot know: no
  // key (one server serves it; the fleet's proxy refuses it, saying so).
  auto context = CallContext(absl::Now() + options_.deadline, sequence_id);
  absl::Status status = FromGrpcStatus(stub_->LoadSequence(context.get(), request, &response));
  if (!status.ok()) return status;
  return response;
}

absl::StatusOr<ExportResult> KvCacheClient::ExportSequence(const std::string& sequence_id,
                                                           const ByteSink& sink,
                                                           int64_t chunk_bytes) const {
  v1::ExportSequenceRequest request;
  request.set_sequence_id(sequence_id);
  // Chunks that fit this client's receive limit, within what the server allows.
  request.set_chunk_bytes(chunk_bytes != 0
                              ? chunk_bytes
                              : std::clamp<int64_t>(options_.max_message_bytes / 2,
                                                    int64_t{4} << 10, int64_t{1} << 20));
  auto context = CallContext(absl::Now() + options_.deadline, sequence_id);
  std::unique_ptr<grpc::ClientReader<v1::SequenceChunk>> reader =
      stub_->ExportSequence(context.get(), request);
  ExportResult result;
  absl::Status sunk;
  v1::SequenceChunk chunk;
  while (reader->Read(&chunk)) {
    sunk = sink(chunk.data());
    if (!sunk.ok()) {
      // The sync API needs Finish before the reader goes; cancelling ends the stream at once.
      context->TryCancel();
      while (reader->Read(&chunk)) {
      }
      (void)reader->Finish();
      return sunk;
    }
    result.bytes += static_cast<int64_t>(chunk.data().size());
    ++result.chunks;
  }
  absl::Status status = FromGrpcStatus(reader->Finish());
  if (!status.ok()) return status;
  return result;
}

absl::StatusOr<v1::SequenceInfo> KvCacheClient::ImportSequence(
    const ByteSource& source, const std::string& sequence_id,
    std::optional<bool> share_with_source) const {
  const size_t piece = static_cast<size_t>(
      std::clamp<int64_t>(options_.max_message_bytes / 2, int64_t{4} << 10, kImportPieceBytes));
  // The first piece before the call: without a new id, its header names the key to send.
  v1::ImportSequenceRequest message;
  std::string* data = message.mutable_data();
  data->resize(piece);
  absl::StatusOr<size_t> n = source(data->data(), piece);
  if (!n.ok()) return n.status();
  data->resize(*n);
  std::string key_id = sequence_id;
  if (key_id.empty()) {
    absl::StatusOr<std::string> id = SnapshotSequenceId(*data);
    if (!id.ok()) return id.status();
    key_id = *std::move(id);
  }
  message.set_sequence_id(sequence_id);
  if (share_with_source.has_value()) message.set_share_with_source(*share_with_source);
  bool more = *n == piece;

  v1::SequenceInfo response;
  auto context = CallContext(absl::Now() + options_.deadline, key_id);
  std::unique_ptr<grpc::ClientWriter<v1::ImportSequenceRequest>> writer =
      stub_->ImportSequence(context.get(), &response);
  // A failed Write means the server ended the call (it refused the bytes): Finish says why.
  bool open = writer->Write(message);
  while (open && more) {
    message.Clear();
    data = message.mutable_data();
    data->resize(piece);
    n = source(data->data(), piece);
    if (!n.ok()) {
      context->TryCancel();
      (void)writer->Finish();
      return n.status();
    }
    data->resize(*n);
    more = *n == piece;
    if (*n > 0) open = writer->Write(message);
  }
  if (open) (void)writer->WritesDone();
  absl::Status status = FromGrpcStatus(writer->Finish());
  if (!status.ok()) return status;
  return response;
}

absl::StatusOr<v1::HandOffResponse> KvCacheClient::HandOff() const {
  const v1::HandOffRequest request;
  v1::HandOffResponse response;
  // It acts on this server's sequences: no key.
  auto context = CallContext(absl::Now() + options_.deadline, "");
  absl::Status status = FromGrpcStatus(stub_->HandOff(context.get(), request, &response));
  if (!status.ok()) return status;
  return response;
}

}  // namespace attend::client
