#include "server/hand_off.h"

#include <algorithm>
#include <utility>

#include "absl/cleanup/cleanup.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "common/sequence_key.h"
#include "core/base/status_macros.h"
#include "grpcpp/grpcpp.h"
#include "server/status_convert.h"

namespace attend::server {
namespace {

// Passes over the sequences that appeared since the last one; clients that keep creating
// sequences faster than they move cannot hold a hand-off forever.
constexpr int kMaxRounds = 4;

// Snapshot bytes per ImportSequence message: big enough that framing costs nothing, and half of
// 1 MiB, so that a receiver run with --max_message_bytes as low as 1MiB takes every message.
constexpr size_t kPieceBytes = size_t{512} << 10;

// Seconds since `start`.
double Since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

HandOffRunner::HandOffRunner(std::string target, std::string instance, std::string attend_version,
                             Metrics* metrics)
    : target_(std::move(target)),
      instance_(std::move(instance)),
      version_(std::move(attend_version)),
      metrics_(metrics) {
  grpc::ChannelArguments args;
  args.SetMaxSendMessageSize(-1);
  args.SetMaxReceiveMessageSize(-1);
  stub_ = v1::KvCache::NewStub(
      grpc::CreateCustomChannel(target_, grpc::InsecureChannelCredentials(), args));
}

absl::StatusOr<HandOffReport> HandOffRunner::Run(kv::KvCache& cache,
                                                 std::chrono::steady_clock::time_point deadline) {
  if (running_.exchange(true)) {
    return absl::FailedPreconditionError("a hand-off is already running on this replica");
  }
  const absl::Cleanup done = [this] { running_ = false; };
  const auto start = std::chrono::steady_clock::now();
  HandOffReport report;
  // Moved sequences stay sealed here until the pass ends: a fork moved after its source is
  // saved saying which tokens it shares with it, which needs the source still here.
  std::vector<std::string> moved;
  absl::flat_hash_set<std::string> seen;
  // Rounds: a sequence created while one ran (a fork of one not sealed yet, say) is moved by
  // the next, so that none is left behind unnamed. Each round lists what it has not seen yet.
  for (int round = 0; round < kMaxRounds; ++round) {
    // Every new sequence first, then the moves: oldest first, so that a fork follows its source.
    std::vector<std::pair<int64_t, std::string>> order;
    std::string token;
    do {
      ATTEND_ASSIGN_OR_RETURN(kv::ListPage page, cache.List(1000, token));
      for (const kv::SequenceInfo& info : page.sequences) {
        if (seen.insert(info.id).second) order.emplace_back(info.created_ms, info.id);
      }
      token = page.next_page_token;
    } while (!token.empty());
    if (order.empty()) break;
    std::sort(order.begin(), order.end());
    for (const auto& [created, id] : order) {
      if (std::chrono::steady_clock::now() >= deadline) {
        report.failed.push_back({id, "the hand-off ran out of time before this sequence"});
        metrics_->HandOffFailed();
        continue;
      }
      int64_t bytes = 0;
      absl::StatusOr<Outcome> outcome = MoveOne(cache, id, deadline, &bytes);
      if (!outcome.ok()) {
        report.failed.push_back({id, std::string(outcome.status().message())});
        metrics_->HandOffFailed();
      } else if (*outcome == Outcome::kMoved) {
        moved.push_back(id);
        report.moved++;
        report.bytes += bytes;
        metrics_->SequenceMoved(/*out=*/true, bytes);
      } else if (*outcome == Outcome::kKept) {
        report.kept++;
      }
    }
  }
  for (const std::string& id : moved) {
    // NOT_FOUND: evicted while sealed, which is the cache's choice; the receiver has it.
    const absl::StatusOr<int64_t> released = cache.ReleaseSealed(id);
    (void)released;
  }
  report.seconds = Since(start);
  return report;
}

absl::StatusOr<HandOffRunner::Outcome> HandOffRunner::MoveOne(
    kv::KvCache& cache, const std::string& id, std::chrono::steady_clock::time_point deadline,
    int64_t* bytes) {
  grpc::ClientContext context;
  // gRPC takes system_clock deadlines; the pass keeps steady_clock ones (immune to clock steps).
  context.set_deadline(std::chrono::system_clock::now() +
                       std::chrono::duration_cast<std::chrono::system_clock::duration>(
                           deadline - std::chrono::steady_clock::now()));
  context.AddMetadata("x-attend-sequence-key", std::string(RoutingKey(id)));
  context.AddMetadata(kHandOffFromMetadata, instance_);
  v1::SequenceInfo received;
  std::unique_ptr<grpc::ClientWriter<v1::ImportSequenceRequest>> writer =
      stub_->ImportSequence(&context, &received);
  // Step 1: who receives this key? Initial metadata comes before any data.
  writer->WaitForInitialMetadata();
  const auto& metadata = context.GetServerInitialMetadata();
  const auto it = metadata.find(kInstanceMetadata);
  if (it == metadata.end()) {
    // No receiver answered (the proxy's own error, a deadline): the stream's status says why.
    const grpc::Status status = writer->Finish();
    return absl::UnavailableError(
        absl::StrCat("no replica took it through ", target_, ": ",
                     status.ok() ? "the receiver did not name itself" : status.error_message()));
  }
  if (absl::string_view(it->second.data(), it->second.size()) == instance_) {
    context.TryCancel();
    writer->Finish();
    return Outcome::kKept;
  }
  // Step 2: seal, then stream what it holds now.
  const absl::Status sealed = cache.Seal(id);
  if (!sealed.ok()) {
    context.TryCancel();
    writer->Finish();
    // Released (or evicted) since the listing: nothing to move.
    if (absl::IsNotFound(sealed)) return Outcome::kGone;
    return sealed;
  }
  v1::ImportSequenceRequest piece;
  bool stream_broken = false;
  const auto send = [&]() -> absl::Status {
    *bytes += static_cast<int64_t>(piece.data().size());
    if (!writer->Write(piece)) {
      stream_broken = true;
      return absl::UnavailableError("the receiver ended the stream");
    }
    piece.clear_data();
    return absl::OkStatus();
  };
  absl::Status streamed = cache.Save(
      id,
      [&](absl::string_view data) -> absl::Status {
        while (!data.empty()) {  // exact pieces, however large the writes are
          const size_t n = std::min(data.size(), kPieceBytes - piece.data().size());
          piece.mutable_data()->append(data.data(), n);
          data.remove_prefix(n);
          if (piece.data().size() == kPieceBytes) ATTEND_RETURN_IF_ERROR(send());
        }
        return absl::OkStatus();
      },
      version_);
  if (streamed.ok() && !piece.data().empty()) streamed = send();
  if (streamed.ok() || stream_broken) writer->WritesDone();
  if (!streamed.ok() && !stream_broken) context.TryCancel();
  const grpc::Status finished = writer->Finish();
  // Step 3: released (by Run) only once the receiver has it.
  if (streamed.ok() && finished.ok()) return Outcome::kMoved;
  const absl::Status unsealed = cache.Unseal(id);
  (void)unsealed;  // NOT_FOUND only: evicted while sealed, which is the cache's choice
  if (!finished.ok()) {
    return absl::Status(static_cast<absl::StatusCode>(finished.error_code()),
                        absl::StrCat("the receiver refused it: ", finished.error_message()));
  }
  return streamed;
}

}  // namespace attend::server
