#include "server/stats_log.h"

#include <algorithm>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "prometheus/metric_family.h"

namespace attend::server {
namespace {

bool NeedsQuotes(const std::string& value) {
  if (value.empty()) return true;
  return std::any_of(value.begin(), value.end(), [](unsigned char c) {
    return c <= ' ' || c == '"' || c == '=' || c == '\\' || c == 0x7f;
  });
}

std::string Quote(const std::string& value) {
  std::string out = "\"";
  for (const unsigned char c : value) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c < ' ' || c == 0x7f) {
      absl::StrAppend(&out, absl::StrFormat("\\x%02x", c));
    } else {
      out += static_cast<char>(c);
    }
  }
  return out + "\"";
}

std::string Number(double value) { return absl::StrFormat("%.6g", value); }

}  // namespace

std::string LogLine(const std::string& event,
                    const std::vector<std::pair<std::string, std::string>>& fields) {
  std::string line = absl::StrCat("attend-server: event=", event);
  for (const auto& [key, value] : fields) {
    absl::StrAppend(&line, " ", key, "=", NeedsQuotes(value) ? Quote(value) : value);
  }
  return line;
}

void CountRequests(const prometheus::Registry& registry, StatsSample* sample) {
  sample->handled = sample->failed = sample->in_flight = 0;
  for (const prometheus::MetricFamily& family : registry.Collect()) {
    if (family.name == "attend_requests_in_flight") {
      for (const prometheus::ClientMetric& m : family.metric) {
        sample->in_flight += static_cast<int64_t>(m.gauge.value);
      }
      continue;
    }
    if (family.name != "grpc_server_handled_total") continue;
    for (const prometheus::ClientMetric& m : family.metric) {
      bool attend = false, ok = false;
      for (const prometheus::ClientMetric::Label& l : m.label) {
        if (l.name == "grpc_service") attend = absl::StartsWith(l.value, "attend.v1.");
        if (l.name == "grpc_code") ok = l.value == "OK";
      }
      if (!attend) continue;
      const auto count = static_cast<int64_t>(m.counter.value);
      sample->handled += count;
      if (!ok) sample->failed += count;
    }
  }
}

std::string StatsLine(const StatsSample& before, const StatsSample& now) {
  const double seconds = std::max(1e-9, absl::ToDoubleSeconds(now.at - before.at));
  const int64_t handled = now.handled - before.handled;
  const int64_t failed = now.failed - before.failed;
  const double capacity = static_cast<double>(now.kv.capacity_bytes);
  return LogLine(
      "stats",
      {{"interval_seconds", Number(seconds)},
       {"requests", absl::StrCat(handled)},
       {"requests_per_second", Number(static_cast<double>(handled) / seconds)},
       {"error_ratio", Number(handled > 0 ? static_cast<double>(failed) / handled : 0.0)},
       {"in_flight", absl::StrCat(now.in_flight)},
       {"kv_used_bytes", absl::StrCat(now.kv.used_bytes)},
       {"kv_capacity_bytes", absl::StrCat(now.kv.capacity_bytes)},
       {"kv_usage", Number(capacity > 0 ? static_cast<double>(now.kv.used_bytes) / capacity : 0.0)},
       {"sequences", absl::StrCat(now.kv.sequences)},
       {"tokens", absl::StrCat(now.kv.tokens)},
       {"evictions", absl::StrCat(now.kv.evictions - before.kv.evictions)},
       {"rejections", absl::StrCat(now.kv.rejections - before.kv.rejections)}});
}

StatsLogger::StatsLogger(std::function<StatsSample()> sample, absl::Duration interval,
                         std::function<void(const std::string&)> emit)
    : thread_([this, sample = std::move(sample), interval, emit = std::move(emit)] {
        StatsSample before = sample();
        while (!stop_.WaitForNotificationWithTimeout(interval)) {
          StatsSample now = sample();
          emit(StatsLine(before, now));
          before = std::move(now);
        }
      }) {}

StatsLogger::~StatsLogger() {
  stop_.Notify();
  thread_.join();
}

}  // namespace attend::server
