#include "server/stats_log.h"

#include <atomic>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "core/base/mutex.h"
#include "gtest/gtest.h"
#include "server/metrics.h"

namespace attend::server {
namespace {

TEST(LogLine, QuotesOnlyWhatLogfmtNeeds) {
  EXPECT_EQ(LogLine("start", {{"version", "0.1.0"}, {"grpc", "0.0.0.0:50051"}}),
            "attend-server: event=start version=0.1.0 grpc=0.0.0.0:50051");
  EXPECT_EQ(LogLine("x", {{"empty", ""}, {"space", "a b"}, {"eq", "k=v"}}),
            "attend-server: event=x empty=\"\" space=\"a b\" eq=\"k=v\"");
  // Quotes, backslashes and control characters cannot break the line or forge a field.
  EXPECT_EQ(LogLine("x", {{"q", "say \"hi\""}, {"b", "c:\\d"}, {"nl", "a\nevent=forged"}}),
            "attend-server: event=x q=\"say \\\"hi\\\"\" b=\"c:\\\\d\" nl=\"a\\x0aevent=forged\"");
}

TEST(CountRequests, SumsAttendCallsByCodeAndSkipsHealth) {
  Metrics metrics;
  const struct {
    const char* method;
    const char* type;
    int code;
  } calls[] = {{"/attend.v1.Attention/Attend", "unary", 0},
               {"/attend.v1.Attention/Attend", "unary", 0},
               {"/attend.v1.KvCache/Append", "unary", 5},  // NOT_FOUND
               {"/attend.v1.KvCache/DecodeStream", "bidi_stream", 0},
               {"/grpc.health.v1.Health/Check", "unary", 0}};  // not counted
  for (const auto& c : calls) {
    metrics.RpcStarted(c.method, c.type);
    metrics.RpcHandled(c.method, c.type, c.code, 0.001);
  }
  metrics.RpcStarted("/attend.v1.Attention/Attend", "unary");  // still running
  StatsSample s;
  CountRequests(*metrics.registry(), &s);
  EXPECT_EQ(s.handled, 4);
  EXPECT_EQ(s.failed, 1);
  EXPECT_EQ(s.in_flight, 1);
}

TEST(StatsLine, RatesOverTheInterval) {
  StatsSample before, now;
  before.at = absl::UnixEpoch();
  now.at = before.at + absl::Seconds(10);
  before.handled = 100;
  before.failed = 10;
  now.handled = 150;
  now.failed = 15;
  now.in_flight = 2;
  now.kv.capacity_bytes = 1000;
  now.kv.used_bytes = 250;
  now.kv.sequences = 3;
  now.kv.tokens = 4096;
  before.kv.evictions = 1;
  now.kv.evictions = 4;
  EXPECT_EQ(StatsLine(before, now),
            "attend-server: event=stats interval_seconds=10 requests=50 requests_per_second=5 "
            "error_ratio=0.1 in_flight=2 kv_used_bytes=250 kv_capacity_bytes=1000 kv_usage=0.25 "
            "sequences=3 tokens=4096 evictions=3 rejections=0");
  // No calls, no capacity: zeros, not NaN.
  const std::string idle = StatsLine(now, now);
  EXPECT_EQ(idle.find("nan"), std::string::npos) << idle;
  EXPECT_NE(idle.find("error_ratio=0 "), std::string::npos) << idle;
}

TEST(StatsLogger, EmitsEachIntervalAndStopsAtOnce) {
  std::atomic<int> samples{0};
  Mutex mu;
  std::vector<std::string> lines;
  {
    StatsLogger logger(
        [&] {
          StatsSample s;
          s.at = absl::Now();
          s.handled = 10 * samples++;
          return s;
        },
        absl::Milliseconds(20),
        [&](const std::string& line) {
          MutexLock lock(&mu);
          lines.push_back(line);
        });
    absl::SleepFor(absl::Milliseconds(150));
  }
  MutexLock lock(&mu);
  ASSERT_GE(lines.size(), 2u);
  EXPECT_NE(lines[0].find("requests=10 "), std::string::npos) << lines[0];
  // A logger with a long interval is destroyed without waiting it out.
  const absl::Time begin = absl::Now();
  {
    StatsLogger idle([] { return StatsSample{}; }, absl::Hours(1), [](const std::string&) {});
  }
  EXPECT_LT(absl::Now() - begin, absl::Seconds(1));
}

}  // namespace
}  // namespace attend::server
