// The attend server: gRPC services (Attention, KvCache, Planner), the standard health service,
// server reflection and the Prometheus exposer, wired from ServerOptions.
//
// Security: plaintext by default; TLS, mutual TLS and bearer tokens from ServerOptions (see
// server/auth.h). Clients may send HTTP/2 keepalive pings every 10 s (client::kMinKeepalive)
// or less often, also between calls; faster pingers are disconnected, as gRPC servers do.
//
// Lifecycle: Start() binds and serves; Shutdown() marks every service NOT_SERVING (health keeps
// answering), refuses new attend calls with UNAVAILABLE, lets the calls in flight finish until
// the grace period ends, then cancels what is left (its work stops between tiles) and closes
// every connection; with a snapshot directory it then saves the KV cache, which Start restores
// (server/snapshot_store.h). Thread-safety: Shutdown() and Wait() may be called from any thread.
#ifndef ATTEND_SERVER_SERVER_H_
#define ATTEND_SERVER_SERVER_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "core/kernels/onednn.h"
#include "core/kv_cache/kv_cache.h"
#include "grpcpp/grpcpp.h"
#include "server/auth.h"
#include "server/hand_off.h"
#include "server/service_support.h"
#include "server/snapshot_store.h"
#include "server/stats_log.h"

namespace attend::server {

struct ServerOptions {
  std::string address = "0.0.0.0:50051";         // port 0 picks a free port
  std::string metrics_address = "0.0.0.0:9464";  // empty disables the exposer
  int worker_threads = 0;                        // request workers; 0 = DefaultThreads()
  int compute_threads = 0;  // OpenMP threads per attention call; 0 = DefaultThreads()
  int64_t max_queued_requests = 256;
  ServiceLimits limits;
  // The KV cache: capacity (0 = half of the machine's memory), block size, eviction, sequence
  // limit. Its attention limits and compute threads come from `limits` and compute_threads.
  kv::KvCacheOptions kv_cache;
  int64_t max_concurrent_streams = 1024;  // open DecodeStreams
  // oneDNN matmul primitives kept for reuse (process-wide; see core/kernels/onednn.h).
  int64_t matmul_cache_entries = onednn::kDefaultMatmulCacheCapacity;
  // TLS of the gRPC port (mutual TLS with a client CA); default plaintext. See server/auth.h.
  TlsServerOptions tls;
  // Accepted bearer tokens; empty: no token is asked for. Needs TLS. Health stays open.
  std::vector<std::string> auth_tokens;
  // KV-cache persistence (server/snapshot_store.h); empty: none. With it, Start restores the
  // last clean shutdown's sequences before the port opens, Shutdown saves every sequence after
  // the drain, in at most `snapshot_grace`, and SaveSequence / LoadSequence work.
  std::string snapshot_dir;
  absl::Duration snapshot_grace = absl::Seconds(60);
  // The fleet's proxy (host:port, plaintext), through which HandOff moves sequences to the
  // replicas their keys map to (server/hand_off.h); empty: HandOff is refused. With it, the
  // drain on Shutdown also hands off (in at most `snapshot_grace`) before any snapshot: a
  // replica taken out of the proxy's ring first gives its sequences away, one still in it
  // keeps them.
  std::string handoff_target;
  // An ExportSequence or ImportSequence stream that moves no byte for this long is ended
  // (DEADLINE_EXCEEDED), so that the snapshot bytes it holds do not block other transfers.
  absl::Duration transfer_idle_timeout = absl::Seconds(60);
};

// Half of the memory this process may use (physical memory, or its cgroup's limit when lower,
// as in a container): the KV cache's default capacity. Memory is taken block by block as
// sequences grow, not up front.
int64_t DefaultKvCacheBytes();

// The CPUs this process may use (its affinity, or its cgroup's CPU quota rounded up when lower):
// the default request workers and compute threads.
int DefaultThreads();

class AttendServer {
 public:
  static absl::StatusOr<std::unique_ptr<AttendServer>> Start(const ServerOptions& options);
  ~AttendServer();

  // The bound gRPC port and metrics port (0 when metrics are disabled).
  int port() const { return port_; }
  int metrics_port() const { return metrics_port_; }
  // OpenMP threads per attention call, as resolved from the options (0 = DefaultThreads()).
  int compute_threads() const { return compute_threads_; }
  // A channel to this server without the network, for tests. It bypasses the port's TLS and
  // token check.
  std::shared_ptr<grpc::Channel> InProcessChannel();

  // The counters of the periodic stats line (server/stats_log.h). Thread-safe.
  StatsSample SampleStats() const;

  // Drains (see the file comment), then, with a snapshot_dir, saves every sequence.
  void Shutdown(absl::Duration grace);
  void Wait();

  // With a snapshot_dir: what Start restored, and what Shutdown saved (its error when the new
  // generation could not be made current); empty before then, or without a snapshot_dir.
  const std::optional<SnapshotReport>& restored() const;
  // With a snapshot_dir: why Start could not record the kernel sets in KERNELS (OK when it did,
  // and without a snapshot_dir). Start serves anyway: see server.cc.
  const absl::Status& kernels_record() const;
  const std::optional<absl::StatusOr<SnapshotReport>>& saved() const;
  // With a handoff_target: what the drain's hand-off did; empty before then or without one.
  const std::optional<absl::StatusOr<HandOffReport>>& handed_off() const;
  // A random id of this process, sent by ImportSequence (server/hand_off.h).
  const std::string& instance() const;

 private:
  AttendServer();
  struct Parts;
  std::unique_ptr<Parts> parts_;
  int port_ = 0;
  int metrics_port_ = 0;
  int compute_threads_ = 0;
};

// Services whose health is reported (besides the overall "" entry).
extern const char* const kServiceNames[3];

}  // namespace attend::server

#endif  // ATTEND_SERVER_SERVER_H_
