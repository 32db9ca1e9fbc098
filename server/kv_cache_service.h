// attend.v1.KvCache on the gRPC callback API: per-sequence paged KV caches and attention over
// them. Unary calls run on the worker pool; DecodeStream processes one message at a time per
// stream (so responses come in order), and a bad message fails that message (its `error`), not
// the stream.
//
// Thread-safety: handlers run concurrently; the cache serialises work per sequence.
#ifndef ATTEND_SERVER_KV_CACHE_SERVICE_H_
#define ATTEND_SERVER_KV_CACHE_SERVICE_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "attend/v1/kv_cache.grpc.pb.h"
#include "core/kv_cache/kv_cache.h"
#include "server/hand_off.h"
#include "server/idle_watch.h"
#include "server/metrics.h"
#include "server/routing.h"
#include "server/service_support.h"
#include "server/snapshot_store.h"
#include "server/worker_pool.h"

namespace attend::server {

// The id check of every KvCache call that names a sequence, shared by the service's files
// (kv_cache_service.cc, kv_cache_snapshot_rpcs.cc, kv_cache_transfer_rpcs.cc): INVALID_ARGUMENT
// naming `field` when `id` is empty, OK otherwise. Empty is a missing field (ids have 1 to 128
// characters), not an unknown sequence.
absl::Status RequireId(absl::string_view id, absl::string_view field);

// KvCache's callback service with DecodeStream on raw bytes, which the stream parses itself:
// gRPC's own parsing ends a read with the same `false` for a message that does not parse as for
// a client that closed the stream, so the stream would end OK and the client would never learn
// that its message was dropped.
using KvCacheCallbackService = v1::KvCache::WithCallbackMethod_CreateSequence<
    v1::KvCache::WithCallbackMethod_Append<v1::KvCache::WithCallbackMethod_DecodeBatch<
        v1::KvCache::WithCallbackMethod_AppendBatch<v1::KvCache::WithRawCallbackMethod_DecodeStream<
            v1::KvCache::WithCallbackMethod_Fork<v1::KvCache::WithCallbackMethod_Truncate<
                v1::KvCache::WithCallbackMethod_Release<v1::KvCache::WithCallbackMethod_GetSequence<
                    v1::KvCache::WithCallbackMethod_ListSequences<
                        v1::KvCache::WithCallbackMethod_Stats<
                            v1::KvCache::WithCallbackMethod_SaveSequence<
                                v1::KvCache::WithCallbackMethod_LoadSequence<
                                    v1::KvCache::WithCallbackMethod_ExportSequence<
                                        v1::KvCache::WithCallbackMethod_ImportSequence<
                                            v1::KvCache::WithCallbackMethod_HandOff<
                                                v1::KvCache::Service>>>>>>>>>>>>>>>>;

class KvCacheService final : public KvCacheCallbackService {
 public:
  // The collaborators must outlive the service. At most `max_streams` DecodeStreams are open.
  KvCacheService(const ServiceLimits& limits, kv::KvCache* cache, WorkerPool* pool,
                 Metrics* metrics, CallGate* gate, int64_t max_streams);

  // Where SaveSequence and LoadSequence put and find files; without one they answer
  // FAILED_PRECONDITION. REQUIRES: `store` outlives the service; set before serving.
  void SetSnapshotStore(const SnapshotStore* store) { snapshots_ = store; }
  // This server's instance id, which ImportSequence sends in its initial metadata
  // (server/hand_off.h). Set before serving.
  void SetInstance(std::string instance) { instance_ = std::move(instance); }
  // What HandOff runs; without one it answers FAILED_PRECONDITION. REQUIRES: `hand_off`
  // outlives the service; set before serving.
  void SetHandOff(HandOffRunner* hand_off) { hand_off_ = hand_off; }
  // Transfer streams that move no byte for `timeout` are ended (default 60 s). Before serving.
  void SetTransferIdleTimeout(absl::Duration timeout);

  grpc::ServerUnaryReactor* CreateSequence(grpc::CallbackServerContext* context,
                                           const v1::CreateSequenceRequest* request,
                                           v1::SequenceInfo* response) override;
  grpc::ServerUnaryReactor* Append(grpc::CallbackServerContext* context,
                                   const v1::AppendRequest* request,
                                   v1::AppendResponse* response) override;
  grpc::ServerUnaryReactor* DecodeBatch(grpc::CallbackServerContext* context,
                                        const v1::DecodeBatchRequest* request,
                                        v1::DecodeBatchResponse* response) override;
  grpc::ServerUnaryReactor* AppendBatch(grpc::CallbackServerContext* context,
                                        const v1::AppendBatchRequest* request,
                                        v1::AppendBatchResponse* response) override;
  // Messages are attend.v1.DecodeBatchRequest / DecodeBatchResponse bytes.
  grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* DecodeStream(
      grpc::CallbackServerContext* context) override;
  grpc::ServerUnaryReactor* Fork(grpc::CallbackServerContext* context,
                                 const v1::ForkRequest* request,
                                 v1::SequenceInfo* response) override;
  grpc::ServerUnaryReactor* Truncate(grpc::CallbackServerContext* context,
                                     const v1::TruncateRequest* request,
                                     v1::SequenceInfo* response) override;
  grpc::ServerUnaryReactor* Release(grpc::CallbackServerContext* context,
                                    const v1::ReleaseRequest* request,
                                    v1::ReleaseResponse* response) override;
  grpc::ServerUnaryReactor* GetSequence(grpc::CallbackServerContext* context,
                                        const v1::GetSequenceRequest* request,
                                        v1::SequenceInfo* response) override;
  grpc::ServerUnaryReactor* ListSequences(grpc::CallbackServerContext* context,
                                          const v1::ListSequencesRequest* request,
                                          v1::ListSequencesResponse* response) override;
  grpc::ServerUnaryReactor* Stats(grpc::CallbackServerContext* context,
                                  const v1::StatsRequest* request,
                                  v1::CacheStats* response) override;
  grpc::ServerUnaryReactor* SaveSequence(grpc::CallbackServerContext* context,
                                         const v1::SaveSequenceRequest* request,
                                         v1::SaveSequenceResponse* response) override;
  grpc::ServerUnaryReactor* LoadSequence(grpc::CallbackServerContext* context,
                                         const v1::LoadSequenceRequest* request,
                                         v1::SequenceInfo* response) override;
  grpc::ServerWriteReactor<v1::SequenceChunk>* ExportSequence(
      grpc::CallbackServerContext* context, const v1::ExportSequenceRequest* request) override;
  grpc::ServerReadReactor<v1::ImportSequenceRequest>* ImportSequence(
      grpc::CallbackServerContext* context, v1::SequenceInfo* response) override;
  grpc::ServerUnaryReactor* HandOff(grpc::CallbackServerContext* context,
                                    const v1::HandOffRequest* request,
                                    v1::HandOffResponse* response) override;

  // The work of one DecodeBatch (also one DecodeStream message), counted in the attend_*
  // metrics under grpc_method=`method` ("DecodeBatch" or "DecodeStream"). Every step's
  // sequence must match the call's `route` (server/routing.h).
  absl::Status DoDecodeBatch(const v1::DecodeBatchRequest& request,
                             v1::DecodeBatchResponse* response, const Cancellation* cancel,
                             absl::string_view method, const Route& route);

 private:
  class StreamReactor;

  // RunOnPool for this service, with WithMovingHint (server/routing.h) on the status.
  grpc::ServerUnaryReactor* RunKv(grpc::CallbackServerContext* context, absl::string_view method,
                                  std::function<absl::Status(const CallWork& call)> work);
  static std::function<absl::Status(const CallWork& call)> WithMoveHint(
      const grpc::CallbackServerContext& context,
      std::function<absl::Status(const CallWork& call)> work);
  class ExportReactor;
  class ImportReactor;

  // Snapshot bytes that exports and imports hold in memory at once are bounded by the cache's
  // capacity (and a header's slack): each reserves what it will hold before holding it, and
  // gives it back when its call ends. False when `bytes` more would pass the bound.
  bool ReserveTransfer(int64_t bytes);
  void ReleaseTransfer(int64_t bytes);
  // RESOURCE_EXHAUSTED for a reservation of `bytes` that did not fit.
  absl::Status TransferBusy(int64_t bytes) const;

  absl::Status DoAppend(const v1::AppendRequest& request, v1::AppendResponse* response,
                        const Cancellation* cancel, const Route& route);
  // One AppendBatch: the packed tensors are decoded once and each sequence's rows are viewed in
  // place (no copy per sequence).
  absl::Status DoAppendBatch(const v1::AppendBatchRequest& request,
                             v1::AppendBatchResponse* response, const Cancellation* cancel,
                             const Route& route);
  // Whether a decode request is small enough to run on the gRPC thread that received it: at
  // most 64 steps, which the cache would compute on the calling thread anyway
  // (kv::KvCache::DecodeRunsOnCallingThread). Reads the cache's estimate; waits for no sequence.
  bool RunsHere(const v1::DecodeBatchRequest& request) const;

  const ServiceLimits limits_;
  kv::KvCache* cache_;
  WorkerPool* pool_;
  Metrics* metrics_;
  CallGate* gate_;
  const int64_t max_streams_;
  std::atomic<int64_t> open_streams_{0};
  const SnapshotStore* snapshots_ = nullptr;
  std::string instance_;
  std::atomic<int64_t> transfer_bytes_{0};
  std::unique_ptr<IdleWatch> transfer_watch_;
  HandOffRunner* hand_off_ = nullptr;
};

}  // namespace attend::server

#endif  // ATTEND_SERVER_KV_CACHE_SERVICE_H_
