// The /proc parsers of server/process_metrics.h on fixed text, and the live collector's values.
#include "server/process_metrics.h"

#include <sys/resource.h>
#include <unistd.h>

#include <chrono>
#include <map>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/test_util.h"

namespace attend::server {
namespace {

// Fields 3 to 52 of a real line (a 5.x kernel), after "pid (comm)".
constexpr char kRest[] =
    " S 1 4242 4242 0 -1 4194560 2873 0 0 0 150 37 0 0 20 0 9 0 12345 1052672000 5120 "
    "18446744073709551615 1 1 0 0 0 0 0 4096 17922 0 0 0 17 1 0 0 0 0 0 0 0 0 0 0 0 0 0";

TEST(ParseProcStat, ReadsTheFieldsAfterTheCommand) {
  const auto stat = ParseProcStat(std::string("4242 (attend-server)") + kRest);
  ASSERT_TRUE(stat.ok()) << stat.status();
  EXPECT_EQ(stat->utime_ticks, 150);
  EXPECT_EQ(stat->stime_ticks, 37);
  EXPECT_EQ(stat->starttime_ticks, 12345);
  EXPECT_EQ(stat->vsize_bytes, 1052672000);
  EXPECT_EQ(stat->rss_pages, 5120);
}

TEST(ParseProcStat, CommandsWithSpacesAndParenthesesDoNotShiftFields) {
  for (const char* comm : {"(a b)", "(x) 1 2 3 (y)", "())", "( )", "(:-) R 9)"}) {
    const auto stat = ParseProcStat(std::string("7 ") + comm + kRest);
    ASSERT_TRUE(stat.ok()) << comm << ": " << stat.status();
    EXPECT_EQ(stat->utime_ticks, 150) << comm;
    EXPECT_EQ(stat->rss_pages, 5120) << comm;
  }
}

TEST(ParseProcStat, RefusesMalformedText) {
  EXPECT_FALSE(ParseProcStat("").ok());
  EXPECT_FALSE(ParseProcStat("12 attend S 1 2 3").ok());    // no parentheses
  EXPECT_FALSE(ParseProcStat("12 (attend) S 1 2 3").ok());  // too few fields
  EXPECT_FALSE(ParseProcStat(") 12 (attend").ok());         // ')' before '('
  std::string bad = std::string("12 (attend)") + kRest;
  bad.replace(bad.find(" 150 "), 5, " x50 ");  // utime not a number
  const auto stat = ParseProcStat(bad);
  ASSERT_FALSE(stat.ok());
  EXPECT_NE(stat.status().message().find("field 14"), std::string::npos) << stat.status();
}

TEST(ParseBootTime, FindsTheBtimeLine) {
  const auto boot = ParseBootTime(
      "cpu  1 2 3 4\ncpu0 1 2 3 4\nintr 5 6\nctxt 99\nbtime 1700000000\nprocesses 12\n");
  ASSERT_TRUE(boot.ok()) << boot.status();
  EXPECT_EQ(*boot, 1700000000);
  EXPECT_FALSE(ParseBootTime("cpu 1 2\nbtimex 5\nbtime\n").ok());
  EXPECT_FALSE(ParseBootTime("").ok());
}

// name -> value of every family the live collector reports.
std::map<std::string, double> Collected() {
  std::map<std::string, double> values;
  for (const prometheus::MetricFamily& f : ProcessCollector().Collect()) {
    EXPECT_EQ(f.metric.size(), 1u) << f.name;
    if (f.metric.empty()) continue;
    values[f.name] = f.type == prometheus::MetricType::Counter ? f.metric[0].counter.value
                                                               : f.metric[0].gauge.value;
  }
  return values;
}

TEST(ProcessCollector, LiveValuesArePlausible) {
  // Some CPU time to count, whatever the machine's speed.
  const double before = ::attend::testing::SpendProcessCpuSeconds(0.1);
  const std::map<std::string, double> v = Collected();
  const double after = ::attend::testing::CpuSeconds();
  for (const char* name : {"process_cpu_seconds_total", "process_resident_memory_bytes",
                           "process_virtual_memory_bytes", "process_open_fds", "process_max_fds",
                           "process_start_time_seconds"}) {
    EXPECT_EQ(v.count(name), 1u) << name;
  }
  // Within a tick or two of the kernel's own clock for the process.
  EXPECT_GE(v.at("process_cpu_seconds_total"), before - 0.03);
  EXPECT_LE(v.at("process_cpu_seconds_total"), after + 0.03);
  EXPECT_GT(v.at("process_resident_memory_bytes"), 1 << 20);
  EXPECT_GE(v.at("process_virtual_memory_bytes"), v.at("process_resident_memory_bytes"));
  // stdin, stdout and stderr at least; and a new descriptor is counted.
  EXPECT_GE(v.at("process_open_fds"), 3);
  const int fd = dup(2);
  ASSERT_GE(fd, 0);
  EXPECT_EQ(Collected().at("process_open_fds"), v.at("process_open_fds") + 1);
  close(fd);
  rlimit limit{};
  ASSERT_EQ(getrlimit(RLIMIT_NOFILE, &limit), 0);
  EXPECT_EQ(v.at("process_max_fds"), static_cast<double>(limit.rlim_cur));
  EXPECT_LE(v.at("process_open_fds"), v.at("process_max_fds"));
  // This test process started in the last hour, not in the future (btime is whole seconds).
  const double now =
      std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  EXPECT_LE(v.at("process_start_time_seconds"), now + 1);
  EXPECT_GT(v.at("process_start_time_seconds"), now - 3600);
}

}  // namespace
}  // namespace attend::server
