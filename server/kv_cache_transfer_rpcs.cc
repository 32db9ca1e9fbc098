// KvCache's ExportSequence, ImportSequence and HandOff: a sequence moving between servers as a
// stream of snapshot bytes (core/kv_cache/snapshot_format.h), checked end to end by the
// receiver. The rest of the service is in kv_cache_service.cc and kv_cache_snapshot_rpcs.cc.
#include <algorithm>
#include <chrono>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/version/version.h"
#include "core/base/status_macros.h"
#include "core/kv_cache/sequence_registry.h"
#include "core/kv_cache/snapshot_format.h"
#include "server/convert/kv_cache.h"
#include "server/hand_off.h"
#include "server/kv_cache_service.h"
#include "server/status_convert.h"

namespace attend::server {
namespace {

// Snapshot bytes per SequenceChunk: the default and largest, and the smallest a client may ask.
constexpr int64_t kChunkBytes = int64_t{1} << 20;
constexpr int64_t kMinChunkBytes = int64_t{4} << 10;
// What an import may carry beyond the cache's capacity: the header and chunk framing.
constexpr int64_t kImportSlackBytes = int64_t{1} << 20;

// The value of metadata `name` on the call, or empty.
std::string MetadataValue(const grpc::CallbackServerContext& context, absl::string_view name) {
  const auto& metadata = context.client_metadata();
  const auto it = metadata.find(std::string(name));
  return it == metadata.end() ? std::string() : std::string(it->second.data(), it->second.size());
}

}  // namespace

// One ExportSequence: the snapshot is written to memory on a worker (the rows of one moment,
// the sequence serving meanwhile), then sent in pieces of chunk_bytes, each after the last was
// written, so that a slow reader holds no more than the snapshot.
class KvCacheService::ExportReactor : public grpc::ServerWriteReactor<v1::SequenceChunk> {
 public:
  ExportReactor(KvCacheService* service, grpc::CallbackServerContext* context,
                const v1::ExportSequenceRequest* request)
      : service_(service) {
    if (!service_->gate_->Admitted(context)) {
      End(ShuttingDown());
      return;
    }
    const std::string id = request->sequence_id();
    const Route route = RouteOf(*context);
    absl::Status valid = RequireId(id, "sequence_id");
    if (valid.ok()) valid = CheckRoute(route, id, "sequence_id");
    if (valid.ok() && request->chunk_bytes() != 0) {
      if (request->chunk_bytes() < kMinChunkBytes || request->chunk_bytes() > kChunkBytes) {
        valid = absl::InvalidArgumentError(
            absl::StrCat("chunk_bytes: ", request->chunk_bytes(), " is outside ", kMinChunkBytes,
                         "..", kChunkBytes, " (0 means ", kChunkBytes, ")"));
      } else {
        chunk_bytes_ = static_cast<size_t>(request->chunk_bytes());
      }
    }
    if (!valid.ok()) {
      End(ToGrpcStatus(valid));
      return;
    }
    // And within what this server sends in one message (--max_message_bytes), framing aside.
    chunk_bytes_ = std::min<size_t>(
        chunk_bytes_, static_cast<size_t>(std::max<int64_t>(
                          kMinChunkBytes, service_->limits_.max_message_bytes - (4 << 10))));
    const bool queued = SubmitToPool(
        service_->pool_, service_->metrics_, "ExportSequence", [this, id, route](double) {
          // The snapshot is at most the blocks the sequence holds and its header.
          const absl::StatusOr<kv::SequenceInfo> info = service_->cache_->Get(id);
          if (!info.ok()) {
            End(ToGrpcStatus(WithMovingHint(route, info.status())));
            return;
          }
          const int64_t need = info->bytes + kImportSlackBytes;
          if (!service_->ReserveTransfer(need)) {
            End(ToGrpcStatus(service_->TransferBusy(need)));
            return;
          }
          {
            std::lock_guard<std::mutex> lock(end_mu_);
            reserved_ = need;
          }
          data_.reserve(static_cast<size_t>(need));  // grown once, not by doubling
          const absl::Status saved =
              service_->cache_->Save(id, kv::StringSink(&data_), VersionLine("attend-server"));
          if (!saved.ok()) {
            End(ToGrpcStatus(WithMovingHint(route, saved)));
            return;
          }
          service_->metrics_->SequenceExported(static_cast<int64_t>(data_.size()));
          // Watched from the first write: a reader that stops reading is let go.
          ticket_ = service_->transfer_watch_->Add([this] {
            End(grpc::Status(
                grpc::StatusCode::DEADLINE_EXCEEDED,
                absl::StrCat("the export stream was not read for ",
                             absl::FormatDuration(service_->transfer_watch_->timeout()),
                             "; it was ended so that the snapshot it held does not block "
                             "other transfers (read faster, or export again)")));
          });
          WriteNext();
        });
    if (!queued) {
      End(grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                       "the server is busy (worker queue full); retry later"));
    }
  }

  void OnWriteDone(bool ok) override {
    if (ticket_ != 0) service_->transfer_watch_->Touch(ticket_);
    if (!ok) {
      End(grpc::Status(grpc::StatusCode::CANCELLED, "the stream was cancelled"));
      return;
    }
    WriteNext();
  }

  void OnDone() override {
    if (ticket_ != 0) service_->transfer_watch_->Remove(ticket_);
    service_->ReleaseTransfer(reserved_);
    delete this;
  }

 private:
  void WriteNext() {
    if (sent_ >= data_.size()) {
      End(grpc::Status::OK);
      return;
    }
    const size_t n = std::min(chunk_bytes_, data_.size() - sent_);
    chunk_.set_data(data_.data() + sent_, n);
    sent_ += n;
    std::lock_guard<std::mutex> lock(end_mu_);
    if (!ended_) StartWrite(&chunk_);
  }

  // Finish, once: the idle watch's thread may end the call while a write is out. The budget
  // goes back before the client hears the end, so that a caller told "done" may start its next
  // transfer at once. Finish is called outside end_mu_ and is the last use of `this`: OnDone may
  // run (and delete this reactor) on another thread as soon as Finish is called.
  void End(grpc::Status status) {
    {
      std::lock_guard<std::mutex> lock(end_mu_);
      if (ended_) return;
      ended_ = true;
      service_->ReleaseTransfer(reserved_);
      reserved_ = 0;
    }
    Finish(std::move(status));
  }

  KvCacheService* const service_;
  std::mutex end_mu_;
  bool ended_ = false;    // guarded by end_mu_
  int64_t ticket_ = 0;    // in the service's transfer watch, once writing
  int64_t reserved_ = 0;  // of the service's transfer budget; guarded by end_mu_
  size_t chunk_bytes_ = kChunkBytes;
  std::string data_;
  size_t sent_ = 0;
  v1::SequenceChunk chunk_;
};

// One ImportSequence: pieces are gathered (up to the cache's capacity and some framing), then
// loaded on a worker, all or nothing. The server names itself in its initial metadata at once,
// so that a hand-off learns which replica the proxy chose before it sends anything.
class KvCacheService::ImportReactor : public grpc::ServerReadReactor<v1::ImportSequenceRequest> {
 public:
  ImportReactor(KvCacheService* service, grpc::CallbackServerContext* context,
                v1::SequenceInfo* response)
      : service_(service),
        response_(response),
        route_(RouteOf(*context)),
        handed_off_(!MetadataValue(*context, kHandOffFromMetadata).empty()),
        limit_(service->cache_->Stats().capacity_bytes + kImportSlackBytes) {
    context->AddInitialMetadata(kInstanceMetadata, service_->instance_);
    StartSendInitialMetadata();
    if (!service_->gate_->Admitted(context)) {
      End(ShuttingDown());
      return;
    }
    ticket_ = service_->transfer_watch_->Add([this] {
      End(grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED,
                       absl::StrCat("the import stream sent nothing for ",
                                    absl::FormatDuration(service_->transfer_watch_->timeout()),
                                    "; it was ended so that the bytes it held do not block other "
                                    "transfers, and nothing was imported")));
    });
    ReadMore();
  }

  void OnSendInitialMetadataDone(bool) override {}

  void OnReadDone(bool ok) override {
    service_->transfer_watch_->Touch(ticket_);
    if (ok) {
      if (first_) {
        first_ = false;
        id_ = piece_.sequence_id();
        share_ = !piece_.has_share_with_source() || piece_.share_with_source();
      } else if (!piece_.sequence_id().empty() && piece_.sequence_id() != id_) {
        End(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                         "sequence_id: give it in the first message only"));
        return;
      } else if (piece_.has_share_with_source()) {
        End(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                         "share_with_source: give it in the first message only"));
        return;
      }
      if (static_cast<int64_t>(size_ + piece_.data().size()) > limit_) {
        End(grpc::Status(
            grpc::StatusCode::RESOURCE_EXHAUSTED,
            absl::StrCat("the import stream is longer than ", limit_,
                         " bytes: more than this server's whole KV cache could hold")));
        return;
      }
      const auto need = static_cast<int64_t>(piece_.data().size());
      if (!service_->ReserveTransfer(need)) {
        End(ToGrpcStatus(service_->TransferBusy(need)));
        return;
      }
      {
        // Under end_mu_: the idle watch's End gives reserved_ back from its own thread.
        std::lock_guard<std::mutex> lock(end_mu_);
        if (ended_) {
          service_->ReleaseTransfer(need);
          return;
        }
        reserved_ += need;
      }
      // Kept as it came: no copy into one growing buffer (which page-faulted its way through
      // twice the bytes).
      size_ += piece_.data().size();
      pieces_.push_back(std::move(*piece_.mutable_data()));
      piece_.clear_data();
      if (const absl::Status start = CheckStart(); !start.ok()) {
        End(ToGrpcStatus(Refused(start)));
        return;
      }
      ReadMore();
      return;
    }
    // The client finished sending (or the call ended: then End is a no-op). Not watched from
    // here: the load may take a while, and the client waits for it.
    service_->transfer_watch_->Remove(ticket_);
    {
      std::lock_guard<std::mutex> lock(end_mu_);
      if (ended_) return;  // refused, or let go by the watch: nothing to load
    }
    const bool queued = SubmitToPool(service_->pool_, service_->metrics_, "ImportSequence",
                                     [this](double) { End(ToGrpcStatus(Load())); });
    if (!queued) {
      End(grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                       "the server is busy (worker queue full); nothing was imported"));
    }
  }

  void OnDone() override {
    service_->transfer_watch_->Remove(ticket_);
    service_->ReleaseTransfer(reserved_);
    delete this;
  }

 private:
  absl::Status Load() {
    if (size_ == 0) {
      return absl::InvalidArgumentError(
          "the stream carried no snapshot bytes (send an ExportSequence stream's chunks as "
          "data)");
    }
    // The id is checked against the call's route before anything is loaded.
    std::string id = id_;
    if (id.empty()) {
      kv::SnapshotReader header_reader(Source(), "(import stream)");
      absl::StatusOr<kv::SnapshotHeader> header = header_reader.ReadHeader();
      if (!header.ok()) return Refused(header.status());
      id = header->id;
    } else {
      ATTEND_RETURN_IF_ERROR(kv::CheckSequenceId(id, "sequence_id"));
    }
    ATTEND_RETURN_IF_ERROR(
        CheckRoute(route_, id, id_.empty() ? "the imported sequence's id" : "sequence_id"));
    kv::SnapshotReader reader(Source(), "(import stream)");
    absl::StatusOr<kv::SequenceInfo> info = service_->cache_->Load(reader, id_, share_);
    if (share_ && info.status().code() == absl::StatusCode::kFailedPrecondition &&
        absl::StrContains(info.status().message(), "load it without sharing")) {
      // The source here has other rows than the fork shared: sharing is only for the same
      // rows, so the fork gets blocks of its own (as a restore does).
      kv::SnapshotReader again(Source(), "(import stream)");
      info = service_->cache_->Load(again, id_, /*share=*/false);
    }
    if (!info.ok()) return Refused(info.status());
    if (handed_off_) {
      service_->metrics_->SequenceMoved(/*out=*/false, static_cast<int64_t>(size_));
    }
    ToProto(*info, response_);
    return absl::OkStatus();
  }

  // Bytes that are no snapshot (or of a newer format, or with a damaged header) are refused as
  // soon as their header has arrived, not when the stream ends: a stream of garbage would
  // otherwise hold its share of the transfer budget for as long as its sender likes.
  absl::Status CheckStart() {
    constexpr size_t kPreamble = 16;  // magic, format version, header length
    if (header_checked_ || size_ < kPreamble) return absl::OkStatus();
    uint32_t length = 0;
    std::memcpy(&length, Prefix(kPreamble).data() + 12, 4);
    const size_t whole = kPreamble + size_t{length} + 8;       // and the header's checksum
    const std::string start = Prefix(std::min(size_, whole));  // outlives the reader
    kv::SnapshotReader reader(kv::StringSource(start), "(import stream)");
    const absl::StatusOr<kv::SnapshotHeader> header = reader.ReadHeader();
    if (header.ok()) {
      header_checked_ = true;
      return absl::OkStatus();
    }
    // Only a header that has not all arrived yet may still turn out well.
    const bool incomplete = absl::IsDataLoss(header.status()) && size_ < whole &&
                            int64_t{length} <= kv::kMaxSnapshotHeaderBytes;
    return incomplete ? absl::OkStatus() : header.status();
  }

  // The stream's bytes so far, read in order, without joining them.
  kv::ByteSource Source() const {
    struct At {
      size_t piece = 0, offset = 0;
    };
    auto at = std::make_shared<At>();
    return [this, at](char* dst, size_t n) -> absl::StatusOr<size_t> {
      size_t done = 0;
      while (done < n && at->piece < pieces_.size()) {
        const std::string& piece = pieces_[at->piece];
        const size_t take = std::min(n - done, piece.size() - at->offset);
        std::memcpy(dst + done, piece.data() + at->offset, take);
        done += take;
        at->offset += take;
        if (at->offset == piece.size()) {
          ++at->piece;
          at->offset = 0;
        }
      }
      return done;
    };
  }

  // The first `n` bytes of the stream (n <= size_), joined.
  std::string Prefix(size_t n) const {
    std::string out(n, '\0');
    const absl::StatusOr<size_t> got = Source()(out.data(), n);
    out.resize(got.ok() ? *got : 0);
    return out;
  }

  // Finish, once: the idle watch's thread may end the call while a read is out. As in the
  // export: the budget goes back first, and Finish, outside end_mu_, is the last use of `this`.
  void End(grpc::Status status) {
    {
      std::lock_guard<std::mutex> lock(end_mu_);
      if (ended_) return;
      ended_ = true;
      service_->ReleaseTransfer(reserved_);
      reserved_ = 0;
    }
    Finish(std::move(status));
  }
  void ReadMore() {
    std::lock_guard<std::mutex> lock(end_mu_);
    if (!ended_) StartRead(&piece_);
  }

  absl::Status Refused(const absl::Status& status) {
    if (absl::IsDataLoss(status)) service_->metrics_->SnapshotDamaged();
    return status;
  }

  KvCacheService* const service_;
  v1::SequenceInfo* const response_;
  const Route route_;
  const bool handed_off_;
  const int64_t limit_;
  std::mutex end_mu_;
  bool ended_ = false;    // guarded by end_mu_
  int64_t reserved_ = 0;  // of the service's transfer budget; guarded by end_mu_
  int64_t ticket_ = 0;    // in the service's transfer watch
  bool first_ = true;
  bool header_checked_ = false;
  std::string id_;
  bool share_ = true;
  v1::ImportSequenceRequest piece_;
  std::vector<std::string> pieces_;  // the stream's bytes, as they came
  size_t size_ = 0;                  // in all
};

bool KvCacheService::ReserveTransfer(int64_t bytes) {
  const int64_t limit = cache_->Stats().capacity_bytes + kImportSlackBytes;
  if (transfer_bytes_.fetch_add(bytes) + bytes <= limit) return true;
  transfer_bytes_ -= bytes;
  return false;
}

void KvCacheService::ReleaseTransfer(int64_t bytes) { transfer_bytes_ -= bytes; }

void KvCacheService::SetTransferIdleTimeout(absl::Duration timeout) {
  transfer_watch_ = std::make_unique<IdleWatch>(timeout);
}

absl::Status KvCacheService::TransferBusy(int64_t bytes) const {
  return absl::ResourceExhaustedError(
      absl::StrCat("exports and imports in flight hold ", transfer_bytes_.load(),
                   " bytes of this server's memory; ", bytes,
                   " more would pass the KV cache's capacity, which bounds them; retry later"));
}

grpc::ServerWriteReactor<v1::SequenceChunk>* KvCacheService::ExportSequence(
    grpc::CallbackServerContext* context, const v1::ExportSequenceRequest* request) {
  return new ExportReactor(this, context, request);
}

grpc::ServerReadReactor<v1::ImportSequenceRequest>* KvCacheService::ImportSequence(
    grpc::CallbackServerContext* context, v1::SequenceInfo* response) {
  return new ImportReactor(this, context, response);
}

grpc::ServerUnaryReactor* KvCacheService::HandOff(grpc::CallbackServerContext* context,
                                                  const v1::HandOffRequest* /*request*/,
                                                  v1::HandOffResponse* response) {
  // The pass ends by the call's deadline (at most an hour from now).
  const auto left =
      std::max(std::chrono::system_clock::duration::zero(),
               std::min<std::chrono::system_clock::duration>(
                   context->deadline() - std::chrono::system_clock::now(), std::chrono::hours(1)));
  return RunOnPool(context, "HandOff", pool_, metrics_, gate_,
                   [this, response, left](const CallWork&) -> absl::Status {
                     if (hand_off_ == nullptr) {
                       return absl::FailedPreconditionError(
                           "HandOff: this server has no --handoff_target (the fleet's proxy "
                           "address)");
                     }
                     ATTEND_ASSIGN_OR_RETURN(
                         const HandOffReport report,
                         hand_off_->Run(*cache_, std::chrono::steady_clock::now() + left));
                     response->set_moved(static_cast<int32_t>(report.moved));
                     response->set_kept(static_cast<int32_t>(report.kept));
                     for (const HandOffReport::Failure& f : report.failed) {
                       v1::HandOffFailure* out = response->add_failed();
                       out->set_sequence_id(f.sequence_id);
                       out->set_error(f.error);
                     }
                     response->set_bytes(report.bytes);
                     response->set_seconds(report.seconds);
                     return absl::OkStatus();
                   });
}

}  // namespace attend::server
