// The cgroup limits reader against fake /proc and /sys trees: v2 and v1, a container's view
// (its own cgroup namespace: everything at the mount's root) and a host process's (its path).
#include "server/cgroup_limits.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "gtest/gtest.h"

namespace attend::server {
namespace {

class CgroupLimitsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = std::filesystem::temp_directory_path() /
            ("cgroup_test_" + std::to_string(getpid()) + "_" +
             ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(root_);
  }
  void TearDown() override { std::filesystem::remove_all(root_); }

  void Write(const std::string& path, const std::string& text) {
    const std::filesystem::path file = root_ / path;
    std::filesystem::create_directories(file.parent_path());
    std::ofstream(file) << text;
  }
  CgroupLimits Read() const { return ReadCgroupLimits(root_.string()); }

  std::filesystem::path root_;
};

TEST_F(CgroupLimitsTest, V2ContainerLimits) {
  Write("proc/self/cgroup", "0::/\n");
  Write("sys/fs/cgroup/memory.max", "8589934592\n");
  Write("sys/fs/cgroup/cpu.max", "150000 100000\n");
  const CgroupLimits limits = Read();
  EXPECT_EQ(limits.memory_bytes, int64_t{8} << 30);
  EXPECT_DOUBLE_EQ(limits.cpus, 1.5);
}

TEST_F(CgroupLimitsTest, V2UnlimitedSaysMax) {
  Write("proc/self/cgroup", "0::/\n");
  Write("sys/fs/cgroup/memory.max", "max\n");
  Write("sys/fs/cgroup/cpu.max", "max 100000\n");
  const CgroupLimits limits = Read();
  EXPECT_EQ(limits.memory_bytes, 0);
  EXPECT_EQ(limits.cpus, 0);
}

// A host process in a systemd slice: its own level limits memory, the root has no files.
TEST_F(CgroupLimitsTest, V2ProcessPathAndRootTakeTheTighter) {
  Write("proc/self/cgroup", "0::/system.slice/attend.service\n");
  Write("sys/fs/cgroup/system.slice/attend.service/memory.max", "4294967296\n");
  Write("sys/fs/cgroup/system.slice/attend.service/cpu.max", "400000 100000\n");
  Write("sys/fs/cgroup/cpu.max", "200000 100000\n");
  const CgroupLimits limits = Read();
  EXPECT_EQ(limits.memory_bytes, int64_t{4} << 30);
  EXPECT_DOUBLE_EQ(limits.cpus, 2.0);
}

TEST_F(CgroupLimitsTest, V1MemoryAndCpuControllers) {
  Write("proc/self/cgroup",
        "12:memory:/docker/abc\n11:cpu,cpuacct:/docker/abc\n1:name=systemd:/docker/abc\n");
  Write("sys/fs/cgroup/memory/docker/abc/memory.limit_in_bytes", "2147483648\n");
  Write("sys/fs/cgroup/cpu/docker/abc/cpu.cfs_quota_us", "50000\n");
  Write("sys/fs/cgroup/cpu/docker/abc/cpu.cfs_period_us", "100000\n");
  const CgroupLimits limits = Read();
  EXPECT_EQ(limits.memory_bytes, int64_t{2} << 30);
  EXPECT_DOUBLE_EQ(limits.cpus, 0.5);
}

TEST_F(CgroupLimitsTest, V1UnlimitedValues) {
  Write("proc/self/cgroup", "4:memory:/\n3:cpu,cpuacct:/\n");
  Write("sys/fs/cgroup/memory/memory.limit_in_bytes", "9223372036854771712\n");
  Write("sys/fs/cgroup/cpu/cpu.cfs_quota_us", "-1\n");
  Write("sys/fs/cgroup/cpu/cpu.cfs_period_us", "100000\n");
  const CgroupLimits limits = Read();
  EXPECT_EQ(limits.memory_bytes, 0);
  EXPECT_EQ(limits.cpus, 0);
}

TEST_F(CgroupLimitsTest, NothingReadableMeansNoLimits) {
  const CgroupLimits limits = Read();
  EXPECT_EQ(limits.memory_bytes, 0);
  EXPECT_EQ(limits.cpus, 0);
  Write("proc/self/cgroup", "garbage\n0::/\n");
  Write("sys/fs/cgroup/memory.max", "lots\n");
  Write("sys/fs/cgroup/cpu.max", "100000\n");
  EXPECT_EQ(Read().memory_bytes, 0);
  EXPECT_EQ(Read().cpus, 0);
}

TEST(AvailableResources, CgroupLimitsLowerTheMachinesFigures) {
  const int64_t physical = AvailableMemoryBytes({});
  ASSERT_GT(physical, 0);
  EXPECT_EQ(AvailableMemoryBytes({int64_t{1} << 30, 0}), std::min(physical, int64_t{1} << 30));
  EXPECT_EQ(AvailableMemoryBytes({physical * 4, 0}), physical);

  EXPECT_EQ(AvailableCpus({}, 64), 64);
  EXPECT_EQ(AvailableCpus({0, 2.0}, 64), 2);
  EXPECT_EQ(AvailableCpus({0, 1.5}, 64), 2);   // a partial CPU still gets a thread
  EXPECT_EQ(AvailableCpus({0, 0.25}, 64), 1);  // never 0
  EXPECT_EQ(AvailableCpus({0, 8.0}, 4), 4);    // a quota above the CPUs does not add threads
  EXPECT_EQ(AvailableCpus({}, 0), 1);
}

}  // namespace
}  // namespace attend::server
