// Typed client of attend.v1.KvCache: per-sequence paged KV caches held by the server, and the
// attention of each layer's new queries over everything cached for that layer. Every call
// returns absl::Status / StatusOr carrying the server's canonical code and message.
//
// Sticky routing. The cache of a sequence lives in one server process, so every call about a
// sequence must reach the same server. Each call that names a sequence therefore sends the
// metadata
//
//   x-attend-sequence-key: <the sequence's routing key>
//
// for the fleet's proxy to hash on (nginx `hash ... consistent`; Envoy's ring hash on the header
// works the same). A sequence's routing key is its id up to the first '/' (or the whole id),
// so that it follows from the id alone (common/sequence_key.h has the rule). The key is that of
// the sequence id for CreateSequence, Append, Truncate, Release, GetSequence, SaveSequence and
// ExportSequence; of the *source* id for Fork (the fork shares the source's blocks, so it lives
// beside it: name forks "<source key>/..."); of the new id for LoadSequence (none when the
// sequence keeps its saved id, which only the server's file holds) and ImportSequence (the id in
// the snapshot's header when it keeps that one); and of the steps' ids for DecodeBatch,
// AppendBatch and DecodeStream (the first message's, for a stream: the server refuses a later
// message of another key, so a stream whose batches will mix keys should start with one that
// mixes them, which sends none). A Fork whose new_id routes by another key, or a batch whose
// steps do not share one key, sends no key: one server serves it, and through the fleet's proxy
// the server refuses it with the reason, since no one replica is sure to hold them all. A
// CreateSequence without an id gets an id generated here ("seq-" and 16 random hex digits), so
// that it routes like any other. ListSequences and Stats name no sequence, send no key, and
// describe whichever server the call reached; HandOff sends none either, and acts on that
// server's sequences. A key that is not a valid header value (empty, or outside printable ASCII)
// is not sent; the server refuses such ids anyway.
//
// Retries. Only the idempotent reads GetSequence, ListSequences (each page) and Stats are
// retried, and only on UNAVAILABLE (the call did not reach a server, or the connection broke),
// with capped exponential backoff (RetryPolicy; by default 3 attempts, waiting 50 ms then
// 100 ms, plus up to as long again while a broken connection is re-established). All attempts
// of one call share its deadline: no retry starts when its backoff would end past the deadline
// (the call then returns the last UNAVAILABLE), and a retry that runs out of time returns
// DEADLINE_EXCEEDED, as gRPC's own retries do. Calls that change the cache (CreateSequence,
// Append, DecodeBatch, DecodeStream, Fork, Truncate, Release, SaveSequence, LoadSequence,
// ImportSequence, HandOff) are never retried: an UNAVAILABLE one may have been applied before
// the connection broke, and a second Append would append the same tokens twice (ExportSequence
// is not retried either: its sink took what came before the failure). The caller decides, e.g.
// by checking GetSequence's layer_tokens. Before each retry the channel's reconnect backoff is
// reset (grpc::experimental::ChannelResetConnectionBackoff) and the retry waits for the
// reconnection: a channel whose connection attempt failed otherwise waits out gRPC's reconnect
// backoff (1 s, growing) and fails every call at once meanwhile, so that retries 50 and 150 ms
// later could never reach a server that came back.
//
// Thread-safety: a KvCacheClient may be used from many threads at once. A DecodeStream is
// used by one thread at a time.
#ifndef ATTEND_CLIENT_KV_CACHE_CLIENT_H_
#define ATTEND_CLIENT_KV_CACHE_CLIENT_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "attend/v1/kv_cache.grpc.pb.h"
#include "client/connection.h"
#include "client/tensor.h"
#include "common/sequence_key.h"

namespace attend::client {

// The metadata key that carries a call's routing key (common/sequence_key.h).
using ::attend::kSequenceKeyMetadata;

// A new sequence id, "seq-" and 16 random hex digits, for a CreateSequence that names none.
std::string GenerateSequenceId();

// The sequence id in the header of snapshot bytes (an ExportSequence stream's, or a file
// SaveSequence wrote): "ATTNSNAP", u32 format version, u32 header length, then the header,
// which starts with the id as u32 length and bytes (core/kv_cache/snapshot_format.h), all
// little-endian. `data` needs only those first 20 + length bytes. INVALID_ARGUMENT when it does
// not start as a snapshot does.
absl::StatusOr<std::string> SnapshotSequenceId(absl::string_view data);

// Receives a stream's bytes in order; an error stops the stream.
using ByteSink = std::function<absl::Status(absl::string_view bytes)>;
// Fills up to `n` bytes of `dst` and returns how many: fewer than `n` only at the end.
using ByteSource = std::function<absl::StatusOr<size_t>(char* dst, size_t n)>;

// The most snapshot bytes one ImportSequence message carries (less when the connection's
// max_message_bytes / 2 is less).
inline constexpr int64_t kImportPieceBytes = int64_t{512} << 10;

// What an ExportSequence delivered.
struct ExportResult {
  int64_t bytes = 0;
  int64_t chunks = 0;
};

// How idempotent reads are retried on UNAVAILABLE. Attempt i + 1 waits
// b = min(initial_backoff * multiplier^(i - 1), max_backoff) after attempt i, then up to b more
// for the channel to reconnect when it is not connected; no attempt starts after the call's
// deadline.
struct RetryPolicy {
  int max_attempts = 3;  // 1 = no retries
  absl::Duration initial_backoff = absl::Milliseconds(50);
  double multiplier = 2.0;
  absl::Duration max_backoff = absl::Seconds(1);
};

// One layer's new tokens for one sequence (prefill when many, decode when one).
struct AppendInput {
  std::string sequence_id;
  int32_t layer = 0;
  std::optional<FloatTensor> q;  // [n_new, n_head, head_dim]; absent: only append k/v
  FloatTensor k;                 // [n_new, n_head_kv, head_dim]
  FloatTensor v;                 // [n_new, n_head_kv, head_dim_v]
  v1::Precision precision = v1::PRECISION_UNSPECIFIED;
  bool return_weights = false;  // needs q
  // How q/k/v travel; the output comes back the same way (float32 for kValues).
  Wire wire = Wire::kFloat32;
};

struct AppendOutput {
  // [n_new, n_head, head_dim_v]: causal attention of the new queries over the layer's cached
  // tokens (the new ones included). Empty (no shape, no values) when the input had no q.
  FloatTensor output;
  std::optional<FloatTensor> weights;  // [n_head, n_new, layer_tokens] when asked for
  int64_t first_position = 0;          // position of the first appended token
  int64_t layer_tokens = 0;            // tokens in this layer after the append
  v1::ComputeStats stats;              // empty when the input had no q
};

// One layer's new tokens for several sequences (each at most once, all of one shape), packed:
// sequence i's tokens are rows [sum(token_counts[:i]), sum(token_counts[:i+1])) of q, k and v.
// Counts may differ (prompts of different lengths, decode steps, or both).
struct AppendBatchInput {
  int32_t layer = 0;
  std::vector<std::string> sequence_ids;
  std::vector<int64_t> token_counts;  // each >= 1; their sum is the rows of q, k and v
  std::optional<FloatTensor> q;       // [sum, n_head, head_dim]; absent: only append k/v
  FloatTensor k;                      // [sum, n_head_kv, head_dim]
  FloatTensor v;                      // [sum, n_head_kv, head_dim_v]
  v1::Precision precision = v1::PRECISION_UNSPECIFIED;
  Wire wire = Wire::kFloat32;
};

struct AppendBatchOutput {
  FloatTensor output;  // [sum, n_head, head_dim_v], packed like the input; empty without q
  std::vector<int64_t> first_positions;  // per sequence
  std::vector<int64_t> layer_tokens;     // per sequence, after the call
  v1::ComputeStats stats;
};

// One sequence's new token in a decode batch.
struct DecodeStep {
  std::string sequence_id;
  FloatTensor q;  // [1, n_head, head_dim]
  FloatTensor k;  // [1, n_head_kv, head_dim]
  FloatTensor v;  // [1, n_head_kv, head_dim_v]
};

// One layer's step for several sequences (each at most once), computed as one batch.
struct DecodeBatchInput {
  int32_t layer = 0;
  std::vector<DecodeStep> steps;
  v1::Precision precision = v1::PRECISION_UNSPECIFIED;
  Wire wire = Wire::kFloat32;
  // Echoed in the response. In a DecodeStream, 0 means "number it": the stream's messages are
  // then numbered 1, 2, 3, ... in the order written.
  uint64_t request_id = 0;
};

struct DecodeResult {
  std::string sequence_id;
  FloatTensor output;  // [1, n_head, head_dim_v]
  int64_t layer_tokens = 0;
};

struct DecodeBatchOutput {
  std::vector<DecodeResult> results;  // in the order of the steps
  v1::ComputeStats stats;
  uint64_t request_id = 0;
};

// One response of a DecodeStream.
struct DecodeStreamReply {
  uint64_t request_id = 0;
  // The message's outcome: its results, or the error that failed it (nothing of that message
  // was applied; the stream goes on).
  absl::StatusOr<DecodeBatchOutput> result;
};

// A bidirectional DecodeStream: write decode messages, read one response per message in the
// order written. Obtain one from KvCacheClient::OpenDecodeStream; the client must outlive it.
//
// The call starts with the first Write, whose first step's id becomes the stream's sequence
// key. The server answers one message at a time, so writing a few messages ahead of reading
// (e.g. every layer of one decode step) pipelines them; writing far ahead without reading only
// fills flow-control windows.
//
// Thread-safety: not thread-safe; use one stream from one thread at a time.
class DecodeStream {
 public:
  DecodeStream(const DecodeStream&) = delete;
  DecodeStream& operator=(const DecodeStream&) = delete;
  // Cancels the call when it was not finished.
  ~DecodeStream();

  // Sends one message; returns its request id (numbered when input.request_id is 0). When the
  // stream has failed, returns the stream's status (e.g. RESOURCE_EXHAUSTED when the server's
  // stream limit refused it, UNAVAILABLE, DEADLINE_EXCEEDED); responses still owed stay
  // readable. FAILED_PRECONDITION after WritesDone or Finish.
  absl::StatusOr<uint64_t> Write(const DecodeBatchInput& input);

  // The response to the oldest message not yet answered. A failed message is a reply whose
  // `result` holds the message's error. The error of Read itself is the stream's failure; after
  // every response was read, OUT_OF_RANGE; FAILED_PRECONDITION when no message awaits a response
  // (reading would block for ever).
  absl::StatusOr<DecodeStreamReply> Read();

  // Tells the server that no more messages follow. Idempotent.
  absl::Status WritesDone();

  // Ends the stream: WritesDone, then waits for every response still owed (they stay
  // readable through Read) and returns the stream's final status. Idempotent.
  absl::Status Finish();

  // Messages written whose responses were not read yet.
  int64_t pending() const { return written_ - read_; }

 private:
  friend class KvCacheClient;
  DecodeStream(v1::KvCache::Stub* stub, absl::Duration deadline);

  // Reads every response still on the wire into `buffered_` and finishes the call.
  void Drain();

  v1::KvCache::Stub* stub_;
  absl::Duration deadline_;
  std::unique_ptr<grpc::ClientContext> context_;
  std::unique_ptr<grpc::ClientReaderWriter<v1::DecodeBatchRequest, v1::DecodeBatchResponse>>
      stream_;
  std::deque<DecodeStreamReply> buffered_;  // read by Drain, not yet returned by Read
  bool writes_done_ = false;
  bool finished_ = false;
  absl::Status final_status_;
  int64_t written_ = 0;
  int64_t read_ = 0;
};

class KvCacheClient {
 public:
  KvCacheClient(std::shared_ptr<grpc::Channel> channel, ConnectionOptions options,
                RetryPolicy retry = RetryPolicy());

  // A new sequence of the shape `config`. `sequence_id` empty: the server generates one.
  // ALREADY_EXISTS for an id in use, INVALID_ARGUMENT for a bad shape or id,
  // RESOURCE_EXHAUSTED when the sequence limit or the reservation does not fit.
  absl::StatusOr<v1::SequenceInfo> CreateSequence(const v1::SequenceConfig& config,
                                                  const std::string& sequence_id = "",
                                                  int64_t reserve_tokens = 0) const;

  // Appends one layer's new tokens and returns the attention of their queries. NOT_FOUND for an
  // unknown (or evicted: the message says so) sequence; INVALID_ARGUMENT for shapes that do
  // not match the sequence; RESOURCE_EXHAUSTED when the cache has no room (nothing changed).
  absl::StatusOr<AppendOutput> Append(const AppendInput& input) const;

  // One layer's decode step for several sequences, all or nothing.
  absl::StatusOr<DecodeBatchOutput> DecodeBatch(const DecodeBatchInput& input) const;
  // Many sequences' new tokens for one layer in one call (KvCache.AppendBatch); all or nothing.
  // Sends the sequences' common routing key, or none when they have none in common.
  absl::StatusOr<AppendBatchOutput> AppendBatch(const AppendBatchInput& input) const;

  // A stream for many decode messages over one call. `deadline` bounds the whole stream
  // (default: the connection's per-call deadline).
  std::unique_ptr<DecodeStream> OpenDecodeStream(
      std::optional<absl::Duration> deadline = std::nullopt) const;

  // A new sequence sharing the first `tokens` of `source_id` copy-on-write (default: all the
  // tokens every layer holds). `new_id` empty: generated. OUT_OF_RANGE past a layer's end.
  absl::StatusOr<v1::SequenceInfo> Fork(const std::string& source_id,
                                        const std::string& new_id = "",
                                        std::optional<int64_t> tokens = std::nullopt) const;

  // Drops every token at or after `tokens` in every layer; OUT_OF_RANGE past a layer's end.
  absl::StatusOr<v1::SequenceInfo> Truncate(const std::string& sequence_id, int64_t tokens) const;

  // Removes the sequence; returns the bytes returned to the pool (shared blocks are freed by
  // their last user, so a fork's release may free less than its `bytes`).
  absl::StatusOr<int64_t> Release(const std::string& sequence_id) const;

  // Retried on UNAVAILABLE.
  absl::StatusOr<v1::SequenceInfo> GetSequence(const std::string& sequence_id) const;

  // One page of sequences in id order (page_size 0 = the server's default of 100, at most
  // 1000). Retried on UNAVAILABLE.
  absl::StatusOr<v1::ListSequencesResponse> ListSequences(int32_t page_size = 0,
                                                          const std::string& page_token = "") const;

  // Every sequence, following next_page_token page after page (each page a call with its own
  // deadline and retries). A concurrent change may make the pages inconsistent with each other:
  // each sequence appears at most once, as it was when its page was read. INTERNAL when the
  // server repeats a page token.
  absl::StatusOr<std::vector<v1::SequenceInfo>> ListAllSequences(int32_t page_size = 0) const;

  // The cache's capacity, usage and eviction counters. Retried on UNAVAILABLE.
  absl::StatusOr<v1::CacheStats> Stats() const;

  // Writes the sequence to the server's snapshot directory as `name` (default: the id).
  // FAILED_PRECONDITION when the server has no --snapshot_dir.
  absl::StatusOr<v1::SaveSequenceResponse> SaveSequence(const std::string& sequence_id,
                                                        const std::string& name = "") const;

  // Adds the sequence saved as `name`, under `sequence_id` (default: the id it was saved from).
  // NOT_FOUND without such a file, DATA_LOSS for a damaged one, ALREADY_EXISTS,
  // RESOURCE_EXHAUSTED. Through a fleet's proxy give `sequence_id`: without it the call sends
  // no key, and the proxy's replica refuses it.
  absl::StatusOr<v1::SequenceInfo> LoadSequence(const std::string& name,
                                                const std::string& sequence_id = "") const;

  // The sequence's snapshot bytes, handed to `sink` chunk by chunk in order; returns how many
  // bytes and chunks. `chunk_bytes` 0: the connection's max_message_bytes / 2, within the
  // server's 4 KiB .. 1 MiB. NOT_FOUND for an unknown id; an error of `sink` cancels the call
  // and is returned as it is. The deadline bounds the whole stream. Not retried: `sink` has
  // taken what came before a failure.
  absl::StatusOr<ExportResult> ExportSequence(const std::string& sequence_id, const ByteSink& sink,
                                              int64_t chunk_bytes = 0) const;

  // Adds the sequence of the snapshot bytes `source` yields (an ExportSequence stream's, or a
  // saved file's), sent in pieces of at most kImportPieceBytes, under `sequence_id` (default:
  // the id it was exported from). `share_with_source` false copies the leading tokens a fork
  // shared with its source instead of sharing them again (default: share). INVALID_ARGUMENT
  // without a call when `sequence_id` is empty and the bytes do not start as a snapshot (their
  // id is the routing key); the server's DATA_LOSS for damaged or truncated bytes, ALREADY_EXISTS,
  // RESOURCE_EXHAUSTED. An error of `source` cancels the call and is returned as it is.
  absl::StatusOr<v1::SequenceInfo> ImportSequence(
      const ByteSource& source, const std::string& sequence_id = "",
      std::optional<bool> share_with_source = std::nullopt) const;

  // HandOff on the server this client reaches (send it to one replica, not through the proxy):
  // moves its sequences to the replicas its --handoff_target maps their keys to. A sequence
  // that could not move is in `failed`, and the call still succeeds. FAILED_PRECONDITION
  // without --handoff_target.
  absl::StatusOr<v1::HandOffResponse> HandOff() const;

 private:
  // Runs an idempotent unary call `call(context, response)` with retries on UNAVAILABLE.
  template <typename Response, typename Call>
  absl::StatusOr<Response> Retried(const std::string& key, Call call) const;

  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::KvCache::Stub> stub_;
  ConnectionOptions options_;
  RetryPolicy retry_;
};

}  // namespace attend::client

#endif  // ATTEND_CLIENT_KV_CACHE_CLIENT_H_
