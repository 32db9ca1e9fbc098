#include "server/process_metrics.h"

#include <dirent.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <sstream>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "server/metric_family.h"

namespace attend::server {
namespace {

// The whole of a /proc file; nullopt when it cannot be read. (Their sizes read as 0, so this
// reads until the end rather than by size.)
std::optional<std::string> ReadFile(const char* path) {
  std::ifstream in(path);
  if (!in) return std::nullopt;
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) return std::nullopt;
  return text.str();
}

// Open descriptors: the entries of /proc/self/fd, less the one reading the directory.
std::optional<int64_t> OpenFds() {
  DIR* dir = opendir("/proc/self/fd");
  if (dir == nullptr) return std::nullopt;
  const std::string own = std::to_string(dirfd(dir));
  int64_t count = 0;
  while (const dirent* entry = readdir(dir)) {
    const char* name = entry->d_name;
    if (std::strcmp(name, ".") == 0 || std::strcmp(name, "..") == 0 || name == own) continue;
    ++count;
  }
  closedir(dir);
  return count;
}

}  // namespace

absl::StatusOr<ProcStat> ParseProcStat(absl::string_view text) {
  const size_t open = text.find('(');
  const size_t close = text.rfind(')');
  if (open == absl::string_view::npos || close == absl::string_view::npos || close < open) {
    return absl::InvalidArgumentError("/proc stat: no command name in parentheses");
  }
  // After "pid (comm) ": field 3 (state) onwards.
  const std::vector<absl::string_view> fields =
      absl::StrSplit(text.substr(close + 1), ' ', absl::SkipWhitespace());
  constexpr size_t kFirst = 3;  // the number of fields[0] in proc(5)
  constexpr size_t kLast = 24;  // rss, the last field read
  if (fields.size() < kLast - kFirst + 1) {
    return absl::InvalidArgumentError(absl::StrCat("/proc stat: ", fields.size() + kFirst - 1,
                                                   " fields, fewer than the ", kLast, " needed"));
  }
  ProcStat stat;
  const struct {
    size_t field;
    int64_t* out;
  } wanted[] = {{14, &stat.utime_ticks},
                {15, &stat.stime_ticks},
                {22, &stat.starttime_ticks},
                {23, &stat.vsize_bytes},
                {24, &stat.rss_pages}};
  for (const auto& w : wanted) {
    if (!absl::SimpleAtoi(fields[w.field - kFirst], w.out)) {
      return absl::InvalidArgumentError(absl::StrCat("/proc stat: field ", w.field,
                                                     " is not a number: '",
                                                     fields[w.field - kFirst].substr(0, 32), "'"));
    }
  }
  return stat;
}

absl::StatusOr<int64_t> ParseBootTime(absl::string_view text) {
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    const std::vector<absl::string_view> words = absl::StrSplit(line, ' ', absl::SkipWhitespace());
    int64_t seconds = 0;
    if (words.size() == 2 && words[0] == "btime" && absl::SimpleAtoi(words[1], &seconds)) {
      return seconds;
    }
  }
  return absl::InvalidArgumentError("/proc/stat: no btime line");
}

ProcessCollector::ProcessCollector() {
  const std::optional<std::string> stat = ReadFile("/proc/self/stat");
  const std::optional<std::string> system = ReadFile("/proc/stat");
  const long ticks = sysconf(_SC_CLK_TCK);
  if (!stat || !system || ticks <= 0) return;
  const absl::StatusOr<ProcStat> parsed = ParseProcStat(*stat);
  const absl::StatusOr<int64_t> boot = ParseBootTime(*system);
  if (!parsed.ok() || !boot.ok()) return;
  start_time_seconds_ =
      static_cast<double>(*boot) + static_cast<double>(parsed->starttime_ticks) / ticks;
}

std::vector<prometheus::MetricFamily> ProcessCollector::Collect() const {
  using prometheus::MetricType;
  std::vector<prometheus::MetricFamily> families;
  const std::optional<std::string> text = ReadFile("/proc/self/stat");
  const absl::StatusOr<ProcStat> stat =
      text ? ParseProcStat(*text) : absl::UnavailableError("cannot read /proc/self/stat");
  const long ticks = sysconf(_SC_CLK_TCK);
  const long page = sysconf(_SC_PAGESIZE);
  if (stat.ok() && ticks > 0 && page > 0) {
    families.push_back(OneSampleFamily(
        "process_cpu_seconds_total", "Total user and system CPU time spent in seconds.",
        MetricType::Counter, static_cast<double>(stat->utime_ticks + stat->stime_ticks) / ticks));
    families.push_back(OneSampleFamily(
        "process_resident_memory_bytes", "Resident memory size in bytes.", MetricType::Gauge,
        static_cast<double>(stat->rss_pages) * static_cast<double>(page)));
    families.push_back(OneSampleFamily("process_virtual_memory_bytes",
                                       "Virtual memory size in bytes.", MetricType::Gauge,
                                       static_cast<double>(stat->vsize_bytes)));
  }
  if (const std::optional<int64_t> fds = OpenFds()) {
    families.push_back(OneSampleFamily("process_open_fds", "Number of open file descriptors.",
                                       MetricType::Gauge, static_cast<double>(*fds)));
  }
  rlimit limit{};
  if (getrlimit(RLIMIT_NOFILE, &limit) == 0) {
    families.push_back(OneSampleFamily("process_max_fds",
                                       "Maximum number of open file descriptors.",
                                       MetricType::Gauge, static_cast<double>(limit.rlim_cur)));
  }
  if (start_time_seconds_) {
    families.push_back(OneSampleFamily("process_start_time_seconds",
                                       "Start time of the process since unix epoch in seconds.",
                                       MetricType::Gauge, *start_time_seconds_));
  }
  return families;
}

}  // namespace attend::server
