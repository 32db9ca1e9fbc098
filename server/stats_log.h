// The server's log lines for machines: one line per event in logfmt ("key=value", values with
// spaces or quotes quoted), so that log pipelines (Loki, journald, kubectl logs | grep) can parse
// them without a schema:
//
//   attend-server: event=start version=0.1.0 commit=... grpc=0.0.0.0:50051 ...
//   attend-server: event=stats interval_seconds=60 requests_per_second=12.5 error_ratio=0 ...
//   attend-server: event=drain signal=SIGTERM grace_seconds=10 in_flight=3
//   attend-server: event=stop uptime_seconds=3600.2 requests=45000
//
// StatsLogger writes the stats line every interval from the server's own counters: the same
// numbers /metrics exposes, for operators who read logs before dashboards.
#ifndef ATTEND_SERVER_STATS_LOG_H_
#define ATTEND_SERVER_STATS_LOG_H_

#include <cstdint>
#include <functional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/time/time.h"
#include "core/base/mutex.h"
#include "core/kv_cache/kv_cache.h"
#include "prometheus/registry.h"

namespace attend::server {

// "attend-server: event=<event> k=v ..." with each value quoted when it is empty or holds a
// space, '"', '=' or a control character (quotes and backslashes escaped).
std::string LogLine(const std::string& event,
                    const std::vector<std::pair<std::string, std::string>>& fields);

// What one stats line is computed from.
struct StatsSample {
  absl::Time at;
  int64_t handled = 0;    // attend.v1 calls finished, any code (health and reflection excluded)
  int64_t failed = 0;     // of those, not OK
  int64_t in_flight = 0;  // attend_requests_in_flight
  kv::CacheStats kv;
};

// Fills `sample`'s handled, failed and in_flight from the registry's grpc_server_handled_total
// and attend_requests_in_flight.
void CountRequests(const prometheus::Registry& registry, StatsSample* sample);

// The stats line for the interval from `before` to `now`: request rate and error ratio over the
// interval, in-flight requests, KV usage, sequences and tokens at `now`.
std::string StatsLine(const StatsSample& before, const StatsSample& now);

// Writes StatsLine every `interval` on its own thread until destroyed. `sample` and `emit` are
// called from that thread only; the destructor stops it without waiting out the interval.
// Thread-safety: construct and destroy from one thread.
class StatsLogger {
 public:
  StatsLogger(std::function<StatsSample()> sample, absl::Duration interval,
              std::function<void(const std::string&)> emit);
  ~StatsLogger();
  StatsLogger(const StatsLogger&) = delete;
  StatsLogger& operator=(const StatsLogger&) = delete;

 private:
  Notification stop_;
  std::thread thread_;
};

}  // namespace attend::server

#endif  // ATTEND_SERVER_STATS_LOG_H_
