// The memory and CPU limits the kernel enforces on this process through its cgroup, so that
// defaults sized from "the machine" (KV-cache capacity, thread counts) follow a container's
// limits rather than the host's: in a container limited to 8 GiB and 2 CPUs on a 512 GiB,
// 64-core host, physical memory and the CPU count describe the host.
//
// Reads cgroup v2 (the unified hierarchy: memory.max, cpu.max) and, failing that, cgroup v1
// (memory.limit_in_bytes, cpu.cfs_quota_us / cpu.cfs_period_us), at the process's own cgroup
// path from /proc/self/cgroup and at the mount's root (what a container with its own cgroup
// namespace sees). Anything missing or unreadable means "no limit".
//
// Thread-safety: reads files; safe to call from any thread.
#ifndef ATTEND_SERVER_CGROUP_LIMITS_H_
#define ATTEND_SERVER_CGROUP_LIMITS_H_

#include <cstdint>
#include <string>

namespace attend::server {

struct CgroupLimits {
  int64_t memory_bytes = 0;  // 0: no memory limit
  double cpus = 0;           // CPU quota in CPUs (quota / period); 0: no quota
};

// `root` prefixes every path ("" reads the real /proc and /sys; tests pass a fake tree).
CgroupLimits ReadCgroupLimits(const std::string& root = "");

// Physical memory, or the cgroup's memory limit when lower; 0 when neither is known.
int64_t AvailableMemoryBytes(const CgroupLimits& limits);

// The CPUs this process may use: `cpus` (the scheduler's count, affinity included), or the
// cgroup's CPU quota rounded up when lower. At least 1.
int AvailableCpus(const CgroupLimits& limits, int cpus);

}  // namespace attend::server

#endif  // ATTEND_SERVER_CGROUP_LIMITS_H_
