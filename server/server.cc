#include "server/server.h"

#include <netdb.h>
#include <sched.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <limits>
#include <mutex>
#include <random>
#include <thread>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/version/version.h"
#include "core/attention/attention_engine.h"
#include "core/base/status_macros.h"
#include "core/kernels/simd.h"
#include "core/kv_cache/kv_cache.h"
#include "grpcpp/health_check_service_interface.h"
#include "server/attention_service.h"
#include "server/cgroup_limits.h"
#include "server/kv_cache_metrics.h"
#include "server/kv_cache_service.h"
#include "server/metrics.h"
#include "server/metrics_http.h"
#include "server/parse_errors.h"
#include "server/planner_service.h"
#include "server/process_metrics.h"
#include "server/reflection.h"
#include "server/version_metadata.h"
#include "server/worker_pool.h"

namespace attend::server {

const char* const kServiceNames[3] = {"attend.v1.Attention", "attend.v1.KvCache",
                                      "attend.v1.Planner"};

namespace {

// Calls KvCache::EvictExpired periodically (a quarter of the TTL, between 50 ms and 10 s) until
// destroyed.
class TtlSweeper {
 public:
  TtlSweeper(kv::KvCache* cache, int64_t ttl_ms)
      : thread_([this, cache, interval = std::clamp<int64_t>(ttl_ms / 4, 50, 10000)] {
          std::unique_lock<std::mutex> lock(mu_);
          while (!stop_) {
            cv_.wait_for(lock, std::chrono::milliseconds(interval));
            if (stop_) break;
            lock.unlock();
            cache->EvictExpired();
            lock.lock();
          }
        }) {}
  ~TtlSweeper() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::thread thread_;  // last: started after the fields it uses
};

// Why `address` (host:port, [v6]:port) cannot be listened on, found by binding it the way the
// servers do (SO_REUSEADDR, no SO_REUSEPORT): "in use" and the like, or "" when it can be (or
// is not of that form, as a unix: address), in which case the caller's own reason stands.
std::string BindProblem(const std::string& address) {
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos || address.rfind("unix:", 0) == 0) return "";
  std::string host = address.substr(0, colon);
  const std::string port = address.substr(colon + 1);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  if (getaddrinfo(host.empty() ? nullptr : host.c_str(), port.c_str(), &hints, &found) != 0) {
    return "";
  }
  std::string problem;
  for (addrinfo* a = found; a != nullptr && problem.empty(); a = a->ai_next) {
    const int fd = socket(a->ai_family, a->ai_socktype, a->ai_protocol);
    if (fd < 0) continue;
    const int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (bind(fd, a->ai_addr, a->ai_addrlen) != 0) {
      problem = errno == EADDRINUSE ? "the address is in use (is another attend-server running?)"
                                    : std::strerror(errno);
    }
    close(fd);
  }
  freeaddrinfo(found);
  return problem;
}

// OK when `address` (the option `option`) is host:port or [v6]:port with a port from 0 to 65535
// (0: any free port), or a unix: path; gRPC would otherwise take a port like 99999 modulo 65536.
absl::Status CheckListenAddress(absl::string_view option, const std::string& address) {
  if (absl::StartsWith(address, "unix:") || absl::StartsWith(address, "unix-abstract:")) {
    return absl::OkStatus();
  }
  const size_t colon = address.rfind(':');
  const absl::string_view port =
      colon == std::string::npos ? "" : absl::string_view(address).substr(colon + 1);
  int value = 0;
  const bool digits =
      !port.empty() && port.size() <= 5 &&
      std::all_of(port.begin(), port.end(), [](char c) { return c >= '0' && c <= '9'; });
  if (!digits || !absl::SimpleAtoi(port, &value) || value > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat(option, ": '", absl::CHexEscape(address.substr(0, 128)),
                     "' is not host:port with a port from 0 to 65535 (0: any free port)"));
  }
  return absl::OkStatus();
}

// The /metrics endpoint on `address`, serving `collectables`: enough threads that idle or slow
// connections (each holds one until it sends a request or the request timeout ends) cannot keep
// a scrape waiting, and a request timeout well under Prometheus's scrape timeout.
absl::StatusOr<std::unique_ptr<MetricsHttpServer>> StartExposer(
    const std::string& address,
    std::vector<std::shared_ptr<prometheus::Collectable>> collectables) {
  const std::vector<std::string> civetweb_options = {
      "listening_ports", address, "num_threads", "64", "request_timeout_ms", "2000"};
  absl::StatusOr<std::unique_ptr<MetricsHttpServer>> exposer =
      MetricsHttpServer::Start(civetweb_options, std::move(collectables));
  if (exposer.ok()) return exposer;
  const std::string problem = BindProblem(address);
  return absl::UnavailableError(
      absl::StrCat("cannot serve metrics on ", address, ": ",
                   problem.empty() ? exposer.status().message() : problem));
}

// The gRPC server of `services` on options.address with `interceptors`, health and reflection;
// `*port` receives the bound port. UNAVAILABLE saying why when it cannot listen.
absl::StatusOr<std::unique_ptr<grpc::Server>> StartGrpcServer(
    const ServerOptions& options, const std::shared_ptr<grpc::ServerCredentials>& credentials,
    std::initializer_list<grpc::Service*> services,
    std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>>
        interceptors,
    int* port) {
  grpc::EnableDefaultHealthCheckService(true);
  grpc::ServerBuilder builder;
  builder.AddListeningPort(options.address, credentials, port);
  // gRPC sets SO_REUSEPORT by default, which lets a second server share a busy port and split a
  // client's sequences between two processes: refuse the port instead.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  // Keepalive pings from clients: accepted every 10 s, idle connections included, so that a
  // client watching a long DecodeStream (or a quiet channel) is not sent GOAWAY for pinging
  // (gRPC's default allows one every 5 minutes).
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 10000);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  const int max_message = static_cast<int>(
      std::min<int64_t>(options.limits.max_message_bytes, std::numeric_limits<int>::max()));
  builder.SetMaxReceiveMessageSize(max_message);
  builder.SetMaxSendMessageSize(max_message);
  for (grpc::Service* service : services) builder.RegisterService(service);
  builder.experimental().SetInterceptorCreators(std::move(interceptors));
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server && *port != 0) return server;
  const std::string problem = BindProblem(options.address);
  if (!problem.empty()) {
    return absl::UnavailableError(
        absl::StrCat("cannot listen on ", options.address, ": ", problem));
  }
  return absl::UnavailableError(
      absl::StrCat("cannot listen on ", options.address, " (not a valid host:port",
                   options.tls.cert_chain_pem.empty()
                       ? ")"
                       : "; or the TLS certificate and key are not valid PEM or do not match)"));
}

// 16 random hex digits: a process's name among the fleet's replicas (hand_off.h). Random, not
// the address, since a replica behind a proxy or in a pod does not know the address the proxy
// dials.
std::string NewInstanceId() {
  std::random_device device;
  const uint64_t value = (uint64_t{device()} << 32) ^ device();
  return absl::StrFormat("%016x", value);
}

}  // namespace

int64_t DefaultKvCacheBytes() {
  const int64_t available = AvailableMemoryBytes(ReadCgroupLimits());
  return available > 0 ? available / 2 : int64_t{4} << 30;
}

int DefaultThreads() {
  int cpus = static_cast<int>(std::thread::hardware_concurrency());
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) cpus = CPU_COUNT(&set);
  return AvailableCpus(ReadCgroupLimits(), cpus);
}

// Destruction runs in reverse declaration order: the gRPC server first (every call finished),
// the TTL sweeper, the worker pool (drained while the services and the cache its tasks use are
// alive), the services, the exposer (no scrape reads the cache after), the cache, the metrics.
struct AttendServer::Parts {
  std::unique_ptr<Metrics> metrics;
  std::unique_ptr<CallGate> gate;
  std::unique_ptr<kv::KvCache> cache;
  std::shared_ptr<KvCacheCollector> cache_collector;
  std::shared_ptr<MatmulCacheCollector> matmul_collector;
  std::unique_ptr<MetricsHttpServer> exposer;
  std::unique_ptr<AttentionEngine> engine;
  std::unique_ptr<AttentionService> attention;
  std::unique_ptr<KvCacheService> kv_cache;
  // Also owns the background measurement of the "local" hardware profile (joined when the
  // service is destroyed, after the gRPC server).
  std::unique_ptr<PlannerService> planner;
  std::unique_ptr<WorkerPool> pool;
  std::unique_ptr<TtlSweeper> sweeper;
  std::unique_ptr<ReflectionServices> reflection;
  std::unique_ptr<grpc::Server> server;
  std::once_flag shut_down;
  std::optional<SnapshotStore> snapshots;
  absl::Duration snapshot_grace;
  std::optional<SnapshotReport> restored;
  absl::Status kernels_record;
  std::optional<absl::StatusOr<SnapshotReport>> saved;
  std::string instance;
  std::unique_ptr<HandOffRunner> hand_off;
  std::optional<absl::StatusOr<HandOffReport>> handed_off;
};

AttendServer::AttendServer() : parts_(std::make_unique<Parts>()) {}

AttendServer::~AttendServer() { Shutdown(absl::ZeroDuration()); }

StatsSample AttendServer::SampleStats() const {
  StatsSample sample;
  sample.at = absl::Now();
  CountRequests(*parts_->metrics->registry(), &sample);
  sample.kv = parts_->cache->Stats();
  return sample;
}

absl::StatusOr<std::unique_ptr<AttendServer>> AttendServer::Start(const ServerOptions& options) {
  ATTEND_RETURN_IF_ERROR(CheckListenAddress("address", options.address));
  if (!options.metrics_address.empty()) {
    ATTEND_RETURN_IF_ERROR(CheckListenAddress("metrics_address", options.metrics_address));
  }
  std::unique_ptr<AttendServer> self(new AttendServer());
  Parts& p = *self->parts_;
  const int cpus = DefaultThreads();
  // The decode kernel set of each storage type, measured now (up to 50 ms) unless --simd_kernels
  // named them: before attend_build_info names them, and so that no request waits for it.
  simd::ChooseKernels();
  p.metrics = std::make_unique<Metrics>();
  p.gate = std::make_unique<CallGate>();
  // Security next: a misconfiguration is refused before anything listens or starts a thread.
  // The metrics outlive the gRPC server (see Parts), so the hook's pointer stays valid.
  Metrics* metrics = p.metrics.get();
  absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> credentials =
      ServerCredentialsFor(options.tls, options.auth_tokens,
                           [metrics](absl::string_view reason) { metrics->AuthRejected(reason); });
  if (!credentials.ok()) return credentials.status();

  // 0 compute threads lets OpenMP start one per CPU it sees, which a CPU quota does not lower:
  // resolve 0 here, so that a container limited to 2 CPUs computes on 2 threads.
  const int compute_threads = options.compute_threads > 0 ? options.compute_threads : cpus;
  self->compute_threads_ = compute_threads;
  kv::KvCacheOptions cache_options = options.kv_cache;
  cache_options.compute_threads = compute_threads;
  cache_options.limits = options.limits.attention;
  if (cache_options.capacity_bytes <= 0) cache_options.capacity_bytes = DefaultKvCacheBytes();
  p.cache = std::make_unique<kv::KvCache>(cache_options);
  if (!options.snapshot_dir.empty()) {
    // Restored before the port opens: no call sees the cache half loaded.
    ATTEND_ASSIGN_OR_RETURN(SnapshotStore store,
                            SnapshotStore::Open(options.snapshot_dir, compute_threads));
    // What the sequences restored now (and saved by this process) decode with: the next start
    // runs the same sets (main.cc reads it back), so a restart keeps their arithmetic.
    // A record that cannot be written (KERNELS is a directory, the disk is full) costs only the
    // next start's reuse of these sets, which then measures again: not a reason to refuse to
    // serve the sequences restored now. main.cc logs it (kernels_record_failed).
    p.kernels_record = store.RecordKernels(simd::KernelName());
    p.restored = store.RestoreAll(*p.cache);
    p.metrics->SnapshotRestored(p.restored->sequences,
                                static_cast<int64_t>(p.restored->skipped.size()), p.restored->bytes,
                                p.restored->seconds);
    p.metrics->SnapshotDamaged(p.restored->damaged);
    p.snapshots.emplace(std::move(store));
  }
  // The drain's hand-off has it too, with or without a snapshot directory.
  p.snapshot_grace = options.snapshot_grace;
  p.cache_collector = std::make_shared<KvCacheCollector>(p.cache.get());
  p.matmul_collector = std::make_shared<MatmulCacheCollector>();
  onednn::SetMatmulCacheCapacity(options.matmul_cache_entries);
  if (!options.metrics_address.empty()) {
    ATTEND_ASSIGN_OR_RETURN(
        p.exposer, StartExposer(options.metrics_address,
                                {p.metrics->registry(), p.cache_collector, p.matmul_collector,
                                 std::make_shared<ProcessCollector>()}));
    const std::vector<int> ports = p.exposer->ListeningPorts();
    self->metrics_port_ = ports.empty() ? 0 : ports.front();
  }
  p.pool = std::make_unique<WorkerPool>(options.worker_threads > 0 ? options.worker_threads : cpus,
                                        options.max_queued_requests);
  p.engine = std::make_unique<AttentionEngine>(EngineOptions{compute_threads});
  // Warm up oneDNN (library and JIT initialisation, the bf16 probe) before the first request
  // rather than during it.
  {
    const float ones[8] = {1, 1, 1, 1, 1, 1, 1, 1};
    const TensorView t{DType::kFloat32, {2, 1, 4}, ones};
    float out[8];
    absl::Status warm =
        p.engine->Compute(t, t, t, {}, options.limits.attention, absl::MakeSpan(out), {}, nullptr);
    if (!warm.ok()) return warm;
  }
  p.attention = std::make_unique<AttentionService>(options.limits, p.engine.get(), p.pool.get(),
                                                   p.metrics.get(), p.gate.get());
  p.kv_cache =
      std::make_unique<KvCacheService>(options.limits, p.cache.get(), p.pool.get(), p.metrics.get(),
                                       p.gate.get(), options.max_concurrent_streams);
  if (p.snapshots) p.kv_cache->SetSnapshotStore(&*p.snapshots);
  p.instance = NewInstanceId();
  p.kv_cache->SetInstance(p.instance);
  p.kv_cache->SetTransferIdleTimeout(options.transfer_idle_timeout);
  if (!options.handoff_target.empty()) {
    p.hand_off = std::make_unique<HandOffRunner>(options.handoff_target, p.instance,
                                                 std::string(Version()), p.metrics.get());
    p.kv_cache->SetHandOff(p.hand_off.get());
  }
  if (cache_options.eviction == kv::EvictionPolicy::kTtl) {
    p.sweeper = std::make_unique<TtlSweeper>(p.cache.get(), cache_options.idle_ttl_ms);
  }
  // Starts measuring this machine (the "local" cost profile) on its own thread shortly after,
  // so that neither start-up nor health waits for it.
  p.planner = std::make_unique<PlannerService>(p.pool.get(), p.metrics.get(), p.gate.get());

  std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>> creators;
  // In this order: the parse-error interceptor rewrites a status before the metrics count it.
  creators.push_back(p.gate->NewInterceptorFactory());
  creators.push_back(NewParseErrorInterceptorFactory());
  creators.push_back(p.metrics->NewInterceptorFactory());
  creators.push_back(NewVersionMetadataInterceptorFactory());
  // Reflection v1 and v1alpha (ours: gRPC 1.51's plugin serves only v1alpha), listing every
  // service the server serves, libgrpc++'s health service included.
  std::vector<std::string> served(std::begin(kServiceNames), std::end(kServiceNames));
  served.push_back("grpc.health.v1.Health");
  p.reflection = std::make_unique<ReflectionServices>(std::move(served));
  ATTEND_ASSIGN_OR_RETURN(p.server,
                          StartGrpcServer(options, *credentials,
                                          {p.attention.get(), p.kv_cache.get(), p.planner.get(),
                                           p.reflection->v1(), p.reflection->v1alpha()},
                                          std::move(creators), &self->port_));
  grpc::HealthCheckServiceInterface* health = p.server->GetHealthCheckService();
  health->SetServingStatus(true);
  for (const char* name : kServiceNames) health->SetServingStatus(name, true);
  return self;
}

std::shared_ptr<grpc::Channel> AttendServer::InProcessChannel() {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(-1);
  args.SetMaxSendMessageSize(-1);
  return parts_->server->InProcessChannel(args);
}

void AttendServer::Shutdown(absl::Duration grace) {
  Parts& p = *parts_;
  if (!p.server) return;
  std::call_once(p.shut_down, [&] {
    const auto deadline = std::chrono::steady_clock::now() + absl::ToChronoNanoseconds(grace);
    // Health first, so load balancers stop sending. The server keeps answering health checks
    // (NOT_SERVING) while the calls it admitted finish; new attend calls are refused.
    p.server->GetHealthCheckService()->SetServingStatus(false);
    p.gate->Drain();
    p.gate->WaitIdle(deadline);
    // While the port still answers: the proxy then reaches this replica for the keys that map
    // here, which see it draining and stay (a closed port would make the proxy send them to
    // another replica, from which they would not come back when this one restarts).
    if (p.hand_off) {
      p.handed_off = p.hand_off->Run(
          *p.cache, std::chrono::steady_clock::now() + absl::ToChronoNanoseconds(p.snapshot_grace));
    }
    // What is still in flight is cancelled now (its work stops between tiles), and connections
    // are closed instead of waited for: an idle client would otherwise hold the shutdown until
    // it noticed the GOAWAY.
    p.server->Shutdown(std::chrono::system_clock::now());
    p.server->Wait();
    // Every call has ended: the cache holds what the clients were answered.
    if (p.snapshots) {
      p.saved = p.snapshots->SaveAll(
          *p.cache, std::chrono::steady_clock::now() + absl::ToChronoNanoseconds(p.snapshot_grace));
    }
  });
}

const std::optional<SnapshotReport>& AttendServer::restored() const { return parts_->restored; }
const absl::Status& AttendServer::kernels_record() const { return parts_->kernels_record; }

const std::optional<absl::StatusOr<HandOffReport>>& AttendServer::handed_off() const {
  return parts_->handed_off;
}

const std::string& AttendServer::instance() const { return parts_->instance; }

const std::optional<absl::StatusOr<SnapshotReport>>& AttendServer::saved() const {
  return parts_->saved;
}

void AttendServer::Wait() { parts_->server->Wait(); }

}  // namespace attend::server
