// Moving sequences between the replicas of a fleet (KvCache.HandOff): each sequence goes to the
// replica that the fleet's proxy now sends its routing key to, and leaves this one only once
// that replica holds it.
//
// How a move goes, for one sequence:
//   1. Open an ImportSequence stream through the proxy with the sequence's routing key, and
//      wait for the receiver's initial metadata, which names its instance (x-attend-instance).
//      This replica's own instance: the key still maps here, and the stream is cancelled
//      (the sequence is "kept", never sealed).
//   2. Otherwise seal the sequence (kv::KvCache::Seal: changes are refused with UNAVAILABLE
//      "moving" from now on), stream its snapshot, and finish the stream.
//   3. The receiver answered OK: release it here (ReleaseSealed), once the pass has moved the
//      rest (a fork moved after its source says which blocks it shares with it, which needs the
//      source still here). Anything else: unseal it; it serves here as before and the failure
//      is reported.
// A crash between 2 and 3 leaves the sequence on both replicas or on this one only; never on
// neither, and the copy the receiver has is checked end to end (the snapshot's checksums).
//
// Why the receiver names itself rather than this replica computing the ring: the proxy is the
// one place that knows where a key goes (its hash, its list of replicas, which are down), so the
// move asks it, with the same key every client sends.
//
// Thread-safety: Run may be called from any thread; passes run one at a time (a Run while one
// runs answers FAILED_PRECONDITION).
#ifndef ATTEND_SERVER_HAND_OFF_H_
#define ATTEND_SERVER_HAND_OFF_H_

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "attend/v1/kv_cache.grpc.pb.h"
#include "core/kv_cache/kv_cache.h"
#include "server/metrics.h"

namespace attend::server {

// The metadata a replica's ImportSequence sends at once with its instance id, and the one a
// hand-off sends with its own: a replica refuses to import from itself.
inline constexpr char kInstanceMetadata[] = "x-attend-instance";
inline constexpr char kHandOffFromMetadata[] = "x-attend-handoff-from";

struct HandOffReport {
  int64_t moved = 0;
  int64_t kept = 0;
  struct Failure {
    std::string sequence_id;
    std::string error;
  };
  std::vector<Failure> failed;
  int64_t bytes = 0;
  double seconds = 0.0;
};

class HandOffRunner {
 public:
  // `target`: the fleet's proxy (host:port, plaintext). `instance`: this server's instance id.
  // `metrics` must outlive the HandOff.
  HandOffRunner(std::string target, std::string instance, std::string attend_version,
                Metrics* metrics);

  // Moves every sequence of `cache` whose key the proxy maps elsewhere, oldest first (a fork
  // after its source, so that it shares the source's blocks on the receiver too), until
  // `deadline`: sequences it has no time for stay, and are reported as failed. Sequences
  // created while it runs are looked at only when they sort after the ones seen (by the page
  // order of kv::KvCache::List); run it again to be sure.
  absl::StatusOr<HandOffReport> Run(kv::KvCache& cache,
                                    std::chrono::steady_clock::time_point deadline);

  const std::string& target() const { return target_; }

 private:
  enum class Outcome { kMoved, kKept, kGone };
  // One sequence (the steps of the file comment); adds its bytes to *bytes.
  absl::StatusOr<Outcome> MoveOne(kv::KvCache& cache, const std::string& id,
                                  std::chrono::steady_clock::time_point deadline, int64_t* bytes);

  const std::string target_;
  const std::string instance_;
  const std::string version_;
  Metrics* const metrics_;
  std::unique_ptr<v1::KvCache::Stub> stub_;
  std::atomic<bool> running_{false};
};

}  // namespace attend::server

#endif  // ATTEND_SERVER_HAND_OFF_H_
