// The standard Prometheus process metrics, which prometheus-cpp does not provide, read from
// /proc/self at scrape time (Linux only):
//   process_cpu_seconds_total       counter: user + system CPU time of every thread
//   process_resident_memory_bytes   gauge: resident set size
//   process_virtual_memory_bytes    gauge: virtual memory size
//   process_open_fds                gauge: open file descriptors (entries of /proc/self/fd)
//   process_max_fds                 gauge: the soft RLIMIT_NOFILE
//   process_start_time_seconds      gauge: start of the process, seconds since the Unix epoch
// A family whose source cannot be read is left out of the scrape rather than reported as 0.
//
// Thread-safety: Collect() may run concurrently with itself; the parsers are pure functions.
#ifndef ATTEND_SERVER_PROCESS_METRICS_H_
#define ATTEND_SERVER_PROCESS_METRICS_H_

#include <cstdint>
#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "prometheus/collectable.h"
#include "prometheus/metric_family.h"

namespace attend::server {

// The fields of /proc/<pid>/stat the process metrics use (see proc(5)).
struct ProcStat {
  int64_t utime_ticks = 0;      // field 14, in clock ticks
  int64_t stime_ticks = 0;      // field 15
  int64_t starttime_ticks = 0;  // field 22, clock ticks after boot
  int64_t vsize_bytes = 0;      // field 23
  int64_t rss_pages = 0;        // field 24
};

// Parses the one line of /proc/<pid>/stat. The second field, the command name in parentheses,
// may itself hold spaces and parentheses, so fields are counted from after the last ')'.
// INVALID_ARGUMENT when the text is not of that form.
absl::StatusOr<ProcStat> ParseProcStat(absl::string_view text);

// The boot time (the "btime" line, seconds since the epoch) from the text of /proc/stat.
absl::StatusOr<int64_t> ParseBootTime(absl::string_view text);

class ProcessCollector : public prometheus::Collectable {
 public:
  // Reads the start time once: it is fixed, and computing it per scrape from btime (which the
  // kernel derives from the wall clock) could make it jitter by a second.
  ProcessCollector();
  std::vector<prometheus::MetricFamily> Collect() const override;

 private:
  std::optional<double> start_time_seconds_;
};

}  // namespace attend::server

#endif  // ATTEND_SERVER_PROCESS_METRICS_H_
