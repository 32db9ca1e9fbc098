// attend-server: serves attend.v1 over gRPC and Prometheus metrics over HTTP.
//
// Every flag also reads the environment variable ATTEND_<FLAG> (e.g. ATTEND_ADDRESS); a flag
// given on the command line wins over the environment. SIGTERM or SIGINT drains: health turns
// NOT_SERVING, new calls are refused, in-flight calls get --shutdown_grace to finish, then with
// --snapshot_dir every sequence is saved (for up to --snapshot_grace), exit 0.
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/reflection.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/time.h"
#include "common/byte_size.h"
#include "common/version/version.h"
#include "core/base/large_memory.h"
#include "core/kernels/cpu_features.h"
#include "core/kernels/onednn.h"
#include "core/kernels/simd.h"
#include "server/server.h"
#include "server/snapshot_store.h"

#if defined(__SANITIZE_ADDRESS__)
#define ATTEND_HAS_LSAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define ATTEND_HAS_LSAN 1
#endif
#endif
#if ATTEND_HAS_LSAN
#include <sanitizer/lsan_interface.h>
#endif

ABSL_FLAG(std::string, address, "0.0.0.0:50051", "gRPC listen address (host:port; port 0 = any)");
ABSL_FLAG(std::string, metrics_address, "0.0.0.0:9464",
          "Prometheus /metrics listen address; empty disables metrics");
ABSL_FLAG(int, worker_threads, 0,
          "Threads that run requests, at most 1024; 0 = number of CPUs (the cgroup's CPU quota "
          "when lower)");
ABSL_FLAG(std::string, simd_kernels, "",
          "Decode kernel sets: empty = the fastest this CPU runs for each KV storage type, "
          "measured at start-up (the start-up line names them); or one of scalar, avx2, avx512, "
          "avx512_vnni, avx512_bf16 that this CPU runs, for every type, or one per type as the "
          "start-up line prints them (f32:avx512,bf16:avx2,int8:avx512_vnni), for the same "
          "arithmetic across a fleet of mixed CPUs");
ABSL_FLAG(int, compute_threads, 0,
          "OpenMP threads per attention call, at most 1024; 0 = number of CPUs (the cgroup's CPU "
          "quota when lower)");
ABSL_FLAG(int64_t, max_queued_requests, 256,
          "Requests that may wait for a worker; more are refused with RESOURCE_EXHAUSTED");
ABSL_FLAG(attend::ByteSize, max_message_bytes, attend::ByteSize{int64_t{64} << 20},
          "Largest request or response message (bytes, or with a unit: 64MiB)");
ABSL_FLAG(int64_t, max_tensor_elements, int64_t{1} << 26, "Largest element count of one tensor");
ABSL_FLAG(int64_t, max_score_elements, int64_t{1} << 32,
          "Largest n_head x n_q x n_kv of one attention call");
ABSL_FLAG(absl::Duration, shutdown_grace, absl::Seconds(10),
          "Time in-flight calls get to finish after SIGTERM");
ABSL_FLAG(std::string, snapshot_dir, "",
          "Directory for KV-cache snapshots: every sequence is saved there after the drain on "
          "SIGTERM and restored at the next start, before the port opens; SaveSequence and "
          "LoadSequence use it. Empty: sequences end with the process");
ABSL_FLAG(absl::Duration, snapshot_grace, absl::Seconds(60),
          "Time the save after the drain may take (with --snapshot_dir); sequences it has no "
          "time for are named in the log and lost");
ABSL_FLAG(absl::Duration, transfer_idle_timeout, absl::Seconds(60),
          "An ExportSequence or ImportSequence stream that moves no byte for this long is ended "
          "(DEADLINE_EXCEEDED), so that the snapshot bytes it holds do not block other "
          "transfers, hand-offs included");
ABSL_FLAG(std::string, handoff_target, "",
          "The fleet's proxy (host:port, plaintext): KvCache.HandOff moves sequences through it to "
          "the replicas their keys map to, and the drain after SIGTERM hands off (within "
          "--snapshot_grace) the sequences whose keys no longer map here, before any snapshot. "
          "Empty: HandOff is refused");
ABSL_FLAG(attend::ByteSize, kv_cache_bytes, attend::ByteSize{0},
          "KV-cache capacity (bytes, or with a unit: 10GiB); 0 = half of physical memory, or of "
          "the cgroup's memory "
          "limit when lower (taken as sequences grow)");
ABSL_FLAG(attend::ByteSize, kv_block_bytes, attend::ByteSize{int64_t{1} << 20},
          "KV-cache block size (a multiple of 64 bytes, e.g. 1MiB; one layer's tokens of one "
          "sequence)");
ABSL_FLAG(bool, kv_huge_pages, true,
          "Ask for 2 MiB pages (transparent huge pages, madvise) for the KV cache: decode reads "
          "them faster; false avoids the kernel's memory compaction at a page's first write");
ABSL_FLAG(std::string, kv_eviction, "none",
          "What to do when the KV cache is full: none (refuse), lru (evict the least recently "
          "used idle sequence) or ttl (evict sequences idle longer than --kv_idle_ttl)");
ABSL_FLAG(absl::Duration, kv_idle_ttl, absl::Minutes(10), "Idle time after which ttl evicts");
ABSL_FLAG(int64_t, max_sequences, 65536, "Most sequences the KV cache holds");
ABSL_FLAG(attend::ByteSize, kv_bookkeeping_bytes, attend::ByteSize{0},
          "Most memory the sequences' bookkeeping outside the KV blocks may take (each layer's "
          "block table: about 32 bytes a layer and 16 a block a sequence or fork holds); 0 = "
          "an eighth of --kv_cache_bytes, at least 16MiB");
ABSL_FLAG(int64_t, max_concurrent_streams, 1024, "Most DecodeStreams open at once");
ABSL_FLAG(int64_t, matmul_cache_entries, attend::onednn::kDefaultMatmulCacheCapacity,
          "oneDNN matmul primitives kept for reuse (least recently used dropped beyond); a "
          "prefill configuration uses a few dozen");
ABSL_FLAG(absl::Duration, stats_interval, absl::Seconds(60),
          "How often to log a stats line (requests/s, errors, KV usage, sequences), at least "
          "100ms; 0 = never");
ABSL_FLAG(std::string, tls_cert, "",
          "PEM certificate chain of the server; with --tls_key, the gRPC port speaks TLS");
ABSL_FLAG(std::string, tls_key, "", "PEM private key of --tls_cert");
ABSL_FLAG(std::string, tls_client_ca, "",
          "PEM CA certificate(s): clients must present a certificate it signed (mutual TLS)");
ABSL_FLAG(std::string, auth_token_file, "",
          "File of accepted bearer tokens, one per line ('#' comments); calls without one get "
          "UNAUTHENTICATED, except health checks. Needs TLS");

namespace {

// Most request workers and compute threads: far more than any machine's cores, and few enough
// that creating them cannot exhaust the process's thread limit.
constexpr int kMaxThreads = 1024;

// --help lists attend-server's own flags (absl's default lists only those of a file named
// like the program, i.e. none), --helpfull adds Abseil's and gRPC's; --version prints the
// version and commit instead of absl's "Debug build (NDEBUG not #defined)".
bool IsServerFlagFile(absl::string_view filename) {
  return absl::EndsWith(filename, "server/main.cc");
}

// Applies ATTEND_<NAME> environment variables to this program's flags before the command line
// is parsed, so that the command line still wins.
bool ApplyEnvironment() {
  bool ok = true;
  for (const auto& [name, flag] : absl::GetAllFlags()) {
    if (!IsServerFlagFile(flag->Filename())) continue;
    const std::string env = absl::StrCat("ATTEND_", absl::AsciiStrToUpper(name));
    const char* value = std::getenv(env.c_str());
    if (value == nullptr) continue;
    std::string error;
    if (!flag->ParseFrom(value, &error)) {
      std::cerr << "attend-server: " << env << "=" << value << ": " << error << "\n";
      ok = false;
    }
  }
  return ok;
}

// The flag `name` with its value `value` as an error names them: "ATTEND_<NAME>='<value>'" when
// the environment variable set it (ApplyEnvironment) and the command line gave no other value,
// else "--<name> '<value>'", so that the operator looks where the value came from.
std::string FlagWithValue(absl::string_view name, absl::string_view value) {
  const std::string env = absl::StrCat("ATTEND_", absl::AsciiStrToUpper(name));
  const char* from_env = std::getenv(env.c_str());
  if (from_env != nullptr && value == from_env) {
    return absl::StrCat(env, "='", absl::CHexEscape(value), "'");
  }
  return absl::StrCat("--", name, " '", absl::CHexEscape(value), "'");
}

// The usage texts (see IsServerFlagFile).
void SetUsageConfig() {
  absl::FlagsUsageConfig config;
  config.contains_help_flags = IsServerFlagFile;
  config.contains_helpshort_flags = IsServerFlagFile;
  config.version_string = [] { return attend::VersionLine("attend-server") + "\n"; };
  config.normalize_filename = [](absl::string_view filename) {
    const size_t at = filename.rfind("server/main.cc");
    return std::string(at == absl::string_view::npos ? filename : filename.substr(at));
  };
  absl::SetFlagsUsageConfig(config);
}

// For the start-up line: whether the KV cache's huge-page advice can take effect here.
std::string HugePagesNote(bool requested) {
  if (!requested) return "off (--kv_huge_pages=false)";
  const std::string mode = attend::TransparentHugePageMode();
  if (mode.empty()) return "unavailable (no transparent huge pages)";
  if (mode == "never") return "unavailable (host THP mode never)";
  return absl::StrCat("on (host THP mode ", mode, ")");
}

// The server's options from the flags; INVALID_ARGUMENT naming the flag when one is out of range
// or the TLS or token files cannot be used.
// The log lines (event and fields) saying what the snapshot directory's KERNELS did to the
// kernel choice, none when there was no record. Printed after the start-up line.
struct KernelsEvent {
  std::string event;
  std::vector<std::pair<std::string, std::string>> fields;
};
std::vector<KernelsEvent> g_kernels_events;

// With --snapshot_dir: reads the kernel sets the last start recorded there
// (SnapshotStore::RecordKernels). Without --simd_kernels (`flag` empty) it runs them, so that the
// sequences it restores decode bit for bit as they did before the restart, instead of measuring
// again (which may choose other sets, summing in another order). A record that is not kept
// (damaged, not a regular file, sets this CPU cannot run, other sets than --simd_kernels names) is
// named in the log: this start's sets replace it, and the restored sequences then decode with
// other sums, which the operator should see.
void ReadRecordedKernels(const std::string& snapshot_dir, const std::string& flag) {
  const std::string path = snapshot_dir + "/KERNELS";
  const std::string other_sums =
      "restored sequences may decode with other sums than before the restart";
  absl::StatusOr<std::string> recorded =
      attend::server::SnapshotStore::RecordedKernels(snapshot_dir);
  if (!recorded.ok()) {
    g_kernels_events.push_back(
        {"kernels_record_ignored",
         {{"why", std::string(recorded.status().message())},
          {"effect", absl::StrCat(flag.empty() ? "measured again" : "--simd_kernels chose", "; ",
                                  other_sums)}}});
    return;
  }
  if (recorded->empty()) return;
  if (!flag.empty()) {
    // Both were read by ParseKernels already (RecordedKernels, and the flag's SetKernels): compare
    // what they name, not how ("avx2" is "f32:avx2,bf16:avx2,int8:avx2").
    if (attend::simd::ParseKernels(*recorded).value_or(attend::simd::KernelSets{}) !=
        attend::simd::ParseKernels(flag).value_or(attend::simd::KernelSets{})) {
      g_kernels_events.push_back({"kernels_record_overridden",
                                  {{"was", *recorded},
                                   {"now", attend::simd::KernelName()},
                                   {"from", path},
                                   {"effect", other_sums}}});
    }
    return;
  }
  if (const absl::Status set = attend::simd::SetKernels(*recorded); !set.ok()) {
    g_kernels_events.push_back(
        {"kernels_record_ignored",
         {{"kernels", *recorded},
          {"why", absl::StrCat(path, " holds '", *recorded, "': ", set.message())},
          {"effect", absl::StrCat("measured again; ", other_sums)}}});
    return;
  }
  g_kernels_events.push_back({"kernels_kept", {{"kernels", *recorded}, {"from", path}}});
}

absl::StatusOr<attend::server::ServerOptions> OptionsFromFlags() {
  attend::server::ServerOptions options;
  options.address = absl::GetFlag(FLAGS_address);
  options.metrics_address = absl::GetFlag(FLAGS_metrics_address);
  options.worker_threads = absl::GetFlag(FLAGS_worker_threads);
  options.compute_threads = absl::GetFlag(FLAGS_compute_threads);
  options.max_queued_requests = absl::GetFlag(FLAGS_max_queued_requests);
  options.limits.max_message_bytes = absl::GetFlag(FLAGS_max_message_bytes).bytes;
  options.limits.attention.max_tensor_elements = absl::GetFlag(FLAGS_max_tensor_elements);
  options.limits.attention.max_score_elements = absl::GetFlag(FLAGS_max_score_elements);
  const int64_t kv_cache_bytes = absl::GetFlag(FLAGS_kv_cache_bytes).bytes;
  options.kv_cache.capacity_bytes =
      kv_cache_bytes > 0 ? kv_cache_bytes : attend::server::DefaultKvCacheBytes();
  options.kv_cache.block_bytes = absl::GetFlag(FLAGS_kv_block_bytes).bytes;
  options.kv_cache.huge_pages = absl::GetFlag(FLAGS_kv_huge_pages);
  options.snapshot_dir = absl::GetFlag(FLAGS_snapshot_dir);
  options.snapshot_grace = absl::GetFlag(FLAGS_snapshot_grace);
  options.transfer_idle_timeout = absl::GetFlag(FLAGS_transfer_idle_timeout);
  if (options.transfer_idle_timeout < absl::Milliseconds(100)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--transfer_idle_timeout must be at least 100ms, got ",
                     absl::FormatDuration(options.transfer_idle_timeout)));
  }
  options.handoff_target = absl::GetFlag(FLAGS_handoff_target);
  if (options.snapshot_grace < absl::ZeroDuration()) {
    return absl::InvalidArgumentError("--snapshot_grace must not be negative");
  }
  options.kv_cache.max_sequences = absl::GetFlag(FLAGS_max_sequences);
  options.kv_cache.max_bookkeeping_bytes = absl::GetFlag(FLAGS_kv_bookkeeping_bytes).bytes;
  if (options.kv_cache.max_bookkeeping_bytes < 0) {
    return absl::InvalidArgumentError("--kv_bookkeeping_bytes must not be negative");
  }
  options.kv_cache.idle_ttl_ms = absl::ToInt64Milliseconds(absl::GetFlag(FLAGS_kv_idle_ttl));
  options.max_concurrent_streams = absl::GetFlag(FLAGS_max_concurrent_streams);
  options.matmul_cache_entries = absl::GetFlag(FLAGS_matmul_cache_entries);
  const std::string eviction = absl::GetFlag(FLAGS_kv_eviction);
  if (eviction == "none") {
    options.kv_cache.eviction = attend::kv::EvictionPolicy::kNone;
  } else if (eviction == "lru") {
    options.kv_cache.eviction = attend::kv::EvictionPolicy::kLru;
  } else if (eviction == "ttl") {
    options.kv_cache.eviction = attend::kv::EvictionPolicy::kTtl;
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("--kv_eviction must be none, lru or ttl, got '", eviction, "'"));
  }
  if (options.kv_cache.block_bytes < 64 || options.kv_cache.block_bytes % 64 != 0 ||
      options.kv_cache.block_bytes > (int64_t{1} << 30)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--kv_block_bytes must be a multiple of 64 between 64 and 2^30, got ",
                     options.kv_cache.block_bytes));
  }
  if (options.kv_cache.idle_ttl_ms < 1) {
    return absl::InvalidArgumentError("--kv_idle_ttl must be positive");
  }
  if (kv_cache_bytes > 0 && kv_cache_bytes < options.kv_cache.block_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("--kv_cache_bytes ", attend::FormatByteSize(kv_cache_bytes),
                     " does not hold one block of --kv_block_bytes ",
                     attend::FormatByteSize(options.kv_cache.block_bytes),
                     "; give at least that, or 0 for half "
                     "of the memory"));
  }
  // Threads are created up front (workers) or by OpenMP on the first call (compute): a count
  // the system cannot create would abort the server, at start-up or at its first request.
  for (const auto& [name, value] :
       {std::pair<const char*, int>{"worker_threads", options.worker_threads},
        {"compute_threads", options.compute_threads}}) {
    if (value < 0 || value > kMaxThreads) {
      return absl::InvalidArgumentError(absl::StrCat("--", name, " must be in [0, ", kMaxThreads,
                                                     "] (0 = the CPUs), got ", value));
    }
  }
  const std::string kernels = absl::GetFlag(FLAGS_simd_kernels);
  if (!kernels.empty()) {
    if (const absl::Status set = attend::simd::SetKernels(kernels); !set.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat(FlagWithValue("simd_kernels", kernels), ": ", set.message()));
    }
  }
  if (!options.snapshot_dir.empty()) ReadRecordedKernels(options.snapshot_dir, kernels);
  if (absl::GetFlag(FLAGS_shutdown_grace) < absl::ZeroDuration()) {
    return absl::InvalidArgumentError("--shutdown_grace must not be negative");
  }
  if (const absl::Duration interval = absl::GetFlag(FLAGS_stats_interval);
      interval != absl::ZeroDuration() && interval < absl::Milliseconds(100)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--stats_interval must be 0 (never) or at least 100ms, got ",
                     absl::FormatDuration(interval)));
  }
  for (const auto& [name, value] :
       {std::pair<const char*, int64_t>{"max_queued_requests", options.max_queued_requests},
        {"max_sequences", options.kv_cache.max_sequences},
        {"max_concurrent_streams", options.max_concurrent_streams},
        {"matmul_cache_entries", options.matmul_cache_entries},
        {"max_message_bytes", options.limits.max_message_bytes},
        {"max_tensor_elements", options.limits.attention.max_tensor_elements},
        {"max_score_elements", options.limits.attention.max_score_elements}}) {
    if (value < 1) {
      return absl::InvalidArgumentError(absl::StrCat("--", name, " must be >= 1, got ", value));
    }
  }

  absl::StatusOr<attend::server::TlsServerOptions> tls =
      attend::server::LoadTlsFiles(absl::GetFlag(FLAGS_tls_cert), absl::GetFlag(FLAGS_tls_key),
                                   absl::GetFlag(FLAGS_tls_client_ca));
  if (!tls.ok()) return tls.status();
  options.tls = *std::move(tls);
  if (const std::string path = absl::GetFlag(FLAGS_auth_token_file); !path.empty()) {
    absl::StatusOr<std::string> text = attend::server::ReadSecretFile(path, "--auth_token_file");
    absl::StatusOr<std::vector<std::string>> tokens =
        text.ok() ? attend::server::ParseTokenFile(*text)
                  : absl::StatusOr<std::vector<std::string>>(text.status());
    if (!tokens.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--auth_token_file: ", tokens.status().message()));
    }
    options.auth_tokens = *std::move(tokens);
  }
  if (!options.handoff_target.empty() && !options.auth_tokens.empty()) {
    return absl::InvalidArgumentError(
        "--handoff_target with --auth_token_file: a hand-off sends no token yet; run the fleet's "
        "replicas without tokens behind the proxy, or leave out --handoff_target");
  }

  return options;
}

// The machine-readable start-up line (server/stats_log.h), after the human one.
void LogStart(const attend::server::ServerOptions& options,
              const attend::server::AttendServer& server) {
  const std::string host = options.address.substr(0, options.address.rfind(':'));
  std::string metrics = "off";
  if (server.metrics_port() != 0) {
    metrics = absl::StrCat(options.metrics_address.substr(0, options.metrics_address.rfind(':')),
                           ":", server.metrics_port());
  }
  const char* security = options.tls.cert_chain_pem.empty()
                             ? "plaintext"
                             : (options.tls.client_ca_pem.empty() ? "tls" : "mutual_tls");
  std::cout << attend::server::LogLine(
                   "start",
                   {{"version", std::string(attend::Version())},
                    {"commit", std::string(attend::GitCommit())},
                    {"pid", absl::StrCat(getpid())},
                    {"grpc", absl::StrCat(host, ":", server.port())},
                    {"metrics", metrics},
                    {"security", security},
                    {"bearer_tokens", options.auth_tokens.empty() ? "off" : "required"},
                    {"cpu_isa", attend::CpuIsaName()},
                    {"bf16_matmul", attend::UseBf16Matmul() ? "native" : "emulated"},
                    {"kernels", attend::simd::KernelName()},
                    {"kv_cache_bytes", absl::StrCat(server.SampleStats().kv.capacity_bytes)},
                    {"kv_block_bytes", absl::StrCat(options.kv_cache.block_bytes)},
                    {"kv_eviction", absl::GetFlag(FLAGS_kv_eviction)},
                    {"max_sequences", absl::StrCat(options.kv_cache.max_sequences)},
                    {"kv_bookkeeping_bytes",
                     absl::StrCat(server.SampleStats().kv.bookkeeping_limit_bytes)},
                    {"compute_threads", absl::StrCat(server.compute_threads())},
                    {"stats_interval", absl::FormatDuration(absl::GetFlag(FLAGS_stats_interval))}})
            << std::endl;
}

// What a restore (at start) or a snapshot (at shutdown) did: one line, then one line per
// sequence or file skipped, naming it and why.
void LogSnapshot(const char* event, const attend::server::SnapshotReport& report) {
  std::cout << "attend-server: " << event << ": " << report.sequences << " sequences, "
            << absl::StrFormat("%.1f MiB in %.2f s", static_cast<double>(report.bytes) / (1 << 20),
                               report.seconds)
            << (report.generation.empty() ? "" : absl::StrCat(" (", report.generation, ")"))
            << (report.skipped.empty() ? "" : absl::StrCat(", ", report.skipped.size(), " skipped"))
            << std::endl;
  std::cout << attend::server::LogLine(
                   event, {{"sequences", absl::StrCat(report.sequences)},
                           {"bytes", absl::StrCat(report.bytes)},
                           {"seconds", absl::StrFormat("%.3f", report.seconds)},
                           {"generation", report.generation.empty() ? "none" : report.generation},
                           {"skipped", absl::StrCat(report.skipped.size())}})
            << std::endl;
  for (const std::string& skipped : report.skipped) {
    std::cout << attend::server::LogLine(absl::StrCat(event, "_skipped"), {{"what", skipped}})
              << std::endl;
  }
}

// What the drain's hand-off did: one line, then one per sequence that could not move.
void LogHandOff(const absl::StatusOr<attend::server::HandOffReport>& report) {
  if (!report.ok()) {
    std::cout << attend::server::LogLine("handoff_failed",
                                         {{"error", std::string(report.status().message())}})
              << std::endl;
    return;
  }
  std::cout << "attend-server: hand-off: " << report->moved << " sequences moved, " << report->kept
            << " kept, " << report->failed.size() << " failed"
            << absl::StrFormat(" (%.1f MiB in %.2f s)",
                               static_cast<double>(report->bytes) / (1 << 20), report->seconds)
            << std::endl;
  std::cout << attend::server::LogLine("handoff",
                                       {{"moved", absl::StrCat(report->moved)},
                                        {"kept", absl::StrCat(report->kept)},
                                        {"failed", absl::StrCat(report->failed.size())},
                                        {"bytes", absl::StrCat(report->bytes)},
                                        {"seconds", absl::StrFormat("%.3f", report->seconds)}})
            << std::endl;
  for (const attend::server::HandOffReport::Failure& f : report->failed) {
    std::cout << attend::server::LogLine("handoff_skipped",
                                         {{"sequence_id", f.sequence_id}, {"error", f.error}})
              << std::endl;
  }
}

// The start-up line: where the server listens, its security, and what it runs on. Scripts and
// tests read the ports from it.
void PrintStartupLine(const attend::server::ServerOptions& options,
                      const attend::server::AttendServer& server) {
  const std::string host = options.address.substr(0, options.address.rfind(':'));
  std::cout << "attend-server listening on " << host << ":" << server.port();
  if (server.metrics_port() != 0) {
    const std::string metrics_host =
        options.metrics_address.substr(0, options.metrics_address.rfind(':'));
    std::cout << ", metrics on http://" << metrics_host << ":" << server.metrics_port()
              << "/metrics";
  }
  std::cout << (options.tls.cert_chain_pem.empty()
                    ? ", plaintext"
                    : (options.tls.client_ca_pem.empty() ? ", TLS" : ", mutual TLS"))
            << (options.auth_tokens.empty() ? "" : ", bearer token required (health open)");
  const int compute_threads = server.compute_threads();
  std::cout << " (cpu " << attend::CpuIsaName() << ", bf16 matmul "
            << (attend::UseBf16Matmul() ? "native" : "emulated") << ", kernels "
            << attend::simd::KernelName() << ", KV cache "
            << absl::StrFormat("%.1f", static_cast<double>(options.kv_cache.capacity_bytes) /
                                           static_cast<double>(int64_t{1} << 30))
            << " GiB, huge pages " << HugePagesNote(options.kv_cache.huge_pages) << ", "
            << compute_threads << (compute_threads == 1 ? " compute thread)" : " compute threads)")
            << std::endl;
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "Serves transformer attention, KV caches and capacity planning over gRPC.\n"
      "Every flag can also be set with ATTEND_<FLAG>, e.g. ATTEND_ADDRESS=0.0.0.0:50051.\n"
      "Sizes take units: --kv_cache_bytes 10GiB (2^30) or 10GB (10^9).");
  SetUsageConfig();
  if (!ApplyEnvironment()) return 2;
  absl::ParseCommandLine(argc, argv);

  // Block the shutdown signals in every thread (gRPC's and oneDNN's threads inherit this mask)
  // so that only the sigwait below receives them.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  absl::StatusOr<attend::server::ServerOptions> options = OptionsFromFlags();
  if (!options.ok()) {
    std::cerr << "attend-server: " << options.status().message() << "\n";
    return 2;
  }
  auto server = attend::server::AttendServer::Start(*options);
  if (!server.ok()) {
    std::cerr << "attend-server: " << server.status().message() << "\n";
    // Options that cannot work together (a token without TLS) are usage errors too.
    return server.status().code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
  }
  PrintStartupLine(*options, **server);
  LogStart(*options, **server);
  for (const KernelsEvent& event : g_kernels_events) {
    std::cout << attend::server::LogLine(event.event, event.fields) << std::endl;
  }
  if (const absl::Status& recorded = (*server)->kernels_record(); !recorded.ok()) {
    std::cout << attend::server::LogLine(
                     "kernels_record_failed",
                     {{"error", std::string(recorded.message())},
                      {"effect",
                       absl::StrCat("serving; nothing records these sets, so the next start "
                                    "measures again and its restored sequences may "
                                    "decode with other sums (pin them with "
                                    "--simd_kernels; fix or remove ",
                                    options->snapshot_dir,
                                    "/KERNELS so that starts record them)")}})
              << std::endl;
  }
  if (const auto& restored = (*server)->restored()) LogSnapshot("restore", *restored);
  const absl::Time started = absl::Now();
  std::optional<attend::server::StatsLogger> stats;
  if (const absl::Duration interval = absl::GetFlag(FLAGS_stats_interval);
      interval > absl::ZeroDuration()) {
    attend::server::AttendServer* s = server->get();
    stats.emplace([s] { return s->SampleStats(); }, interval,
                  [](const std::string& line) { std::cout << line << std::endl; });
  }

  int received = 0;
  sigwait(&signals, &received);
  stats.reset();
  const absl::Duration grace = absl::GetFlag(FLAGS_shutdown_grace);
  std::cout << "attend-server: " << (received == SIGTERM ? "SIGTERM" : "SIGINT")
            << ", draining for up to " << absl::FormatDuration(grace) << std::endl;
  std::cout << attend::server::LogLine(
                   "drain", {{"signal", received == SIGTERM ? "SIGTERM" : "SIGINT"},
                             {"grace_seconds", absl::StrCat(absl::ToDoubleSeconds(grace))},
                             {"in_flight", absl::StrCat((*server)->SampleStats().in_flight)}})
            << std::endl;
  (*server)->Shutdown(grace);
  const attend::server::StatsSample last = (*server)->SampleStats();
  int64_t dropped = last.kv.sequences;
  if (const auto& handed = (*server)->handed_off()) LogHandOff(*handed);
  if (const auto& saved = (*server)->saved()) {
    if (saved->ok()) {
      LogSnapshot("snapshot", **saved);
      dropped = static_cast<int64_t>((*saved)->skipped.size());
    } else {
      std::cout << "attend-server: snapshot failed, nothing will be restored: "
                << saved->status().message() << std::endl;
      std::cout << attend::server::LogLine("snapshot_failed",
                                           {{"error", std::string(saved->status().message())}})
                << std::endl;
    }
  }
  std::cout << "attend-server: stopped" << std::endl;
  std::cout << attend::server::LogLine(
                   "stop", {{"uptime_seconds",
                             absl::StrFormat("%.1f", absl::ToDoubleSeconds(absl::Now() - started))},
                            {"requests", absl::StrCat(last.handled)},
                            {"failed", absl::StrCat(last.failed)},
                            {"sequences_dropped", absl::StrCat(dropped)}})
            << std::endl;
  // Every call has ended and gRPC has stopped: nothing is left to finish or to save. Exit now
  // rather than tear down piece by piece, since stopping the metrics HTTP server alone takes up
  // to 2 s (civetweb polls its listening socket every 2 s) and a background measurement of the
  // local hardware profile may be running, either of which would break the promise that the
  // process is gone within --shutdown_grace (plus --snapshot_grace for the hand-off with
  // --handoff_target, and again for the snapshot with --snapshot_dir) plus a
  // second.
  std::fflush(nullptr);
#if ATTEND_HAS_LSAN
  // _Exit skips LeakSanitizer's check at exit; run it here so that the end-to-end tests of a
  // sanitized build find leaks in the real binary too. It exits non-zero when it finds one.
  __lsan_do_leak_check();
#endif
  std::_Exit(0);
}
