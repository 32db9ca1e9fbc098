#include "server/cgroup_limits.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <sstream>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace attend::server {
namespace {

// The first line of a file, without surrounding whitespace; empty when unreadable.
std::string FirstLine(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  if (!in || !std::getline(in, line)) return "";
  return std::string(absl::StripAsciiWhitespace(line));
}

// Values at or above this are v1's way of saying "unlimited" (page-rounded LONG_MAX).
constexpr int64_t kUnlimited = int64_t{1} << 62;

int64_t ParseBytes(const std::string& text) {
  int64_t bytes = 0;
  if (text.empty() || text == "max" || !absl::SimpleAtoi(text, &bytes)) return 0;
  return bytes > 0 && bytes < kUnlimited ? bytes : 0;
}

double ParseCpus(int64_t quota, int64_t period) {
  return quota > 0 && period > 0 ? static_cast<double>(quota) / static_cast<double>(period) : 0.0;
}

// The smaller of two limits where 0 means none.
template <typename T>
T Tighter(T a, T b) {
  if (a <= 0) return b;
  if (b <= 0) return a;
  return std::min(a, b);
}

// Directories to look in for a controller's files: the process's own cgroup, then the root of
// the mount (a container with its own cgroup namespace sees its cgroup there).
std::vector<std::string> Directories(const std::string& mount, const std::string& path) {
  std::vector<std::string> dirs;
  if (!path.empty() && path != "/") dirs.push_back(mount + path);
  dirs.push_back(mount);
  return dirs;
}

}  // namespace

CgroupLimits ReadCgroupLimits(const std::string& root) {
  // /proc/self/cgroup: "0::/path" for v2; "N:controller[,controller]:/path" for v1.
  std::string v2_path, v1_memory_path, v1_cpu_path;
  bool has_v2 = false;
  {
    std::ifstream in(root + "/proc/self/cgroup");
    std::string line;
    while (std::getline(in, line)) {
      const std::vector<std::string> parts = absl::StrSplit(line, absl::MaxSplits(':', 2));
      if (parts.size() != 3) continue;
      if (parts[0] == "0" && parts[1].empty()) {
        has_v2 = true;
        v2_path = parts[2];
        continue;
      }
      for (absl::string_view controller : absl::StrSplit(parts[1], ',')) {
        if (controller == "memory") v1_memory_path = parts[2];
        if (controller == "cpu") v1_cpu_path = parts[2];
      }
    }
  }

  CgroupLimits limits;
  const std::string mount = root + "/sys/fs/cgroup";
  if (has_v2) {
    // Every level of the hierarchy may limit; the process's own level and the namespace root
    // are the ones a process can see.
    for (const std::string& dir : Directories(mount, v2_path)) {
      limits.memory_bytes =
          Tighter(limits.memory_bytes, ParseBytes(FirstLine(dir + "/memory.max")));
      const std::vector<std::string> cpu = absl::StrSplit(FirstLine(dir + "/cpu.max"), ' ');
      int64_t quota = 0, period = 0;
      if (cpu.size() == 2 && absl::SimpleAtoi(cpu[0], &quota) &&
          absl::SimpleAtoi(cpu[1], &period)) {
        limits.cpus = Tighter(limits.cpus, ParseCpus(quota, period));
      }
    }
  }
  for (const std::string& dir : Directories(mount + "/memory", v1_memory_path)) {
    limits.memory_bytes =
        Tighter(limits.memory_bytes, ParseBytes(FirstLine(dir + "/memory.limit_in_bytes")));
  }
  for (const std::string& dir : Directories(mount + "/cpu", v1_cpu_path)) {
    int64_t quota = 0, period = 0;
    if (absl::SimpleAtoi(FirstLine(dir + "/cpu.cfs_quota_us"), &quota) &&
        absl::SimpleAtoi(FirstLine(dir + "/cpu.cfs_period_us"), &period)) {
      limits.cpus = Tighter(limits.cpus, ParseCpus(quota, period));
    }
  }
  return limits;
}

int64_t AvailableMemoryBytes(const CgroupLimits& limits) {
  const long pages = sysconf(_SC_PHYS_PAGES);
  const long page_size = sysconf(_SC_PAGE_SIZE);
  const int64_t physical =
      pages > 0 && page_size > 0 ? static_cast<int64_t>(pages) * page_size : int64_t{0};
  return Tighter(physical, limits.memory_bytes);
}

int AvailableCpus(const CgroupLimits& limits, int cpus) {
  cpus = std::max(1, cpus);
  if (limits.cpus <= 0) return cpus;
  return std::clamp(static_cast<int>(std::ceil(limits.cpus - 1e-9)), 1, cpus);
}

}  // namespace attend::server
