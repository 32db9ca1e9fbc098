// Helpers shared by attend's tests: Status assertions (abseil 20220623 ships no matchers) and
// seeded random tensors.
#ifndef ATTEND_TESTS_TEST_UTIL_H_
#define ATTEND_TESTS_TEST_UTIL_H_

#include <time.h>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace attend::testing {

inline const absl::Status& GetStatus(const absl::Status& status) { return status; }
template <typename T>
const absl::Status& GetStatus(const absl::StatusOr<T>& status_or) {
  return status_or.status();
}

// EXPECT_OK(status_or_statusor), ASSERT_OK(...).
#define EXPECT_OK(expr) \
  EXPECT_TRUE(::attend::testing::GetStatus(expr).ok()) << ::attend::testing::GetStatus(expr)
#define ASSERT_OK(expr) \
  ASSERT_TRUE(::attend::testing::GetStatus(expr).ok()) << ::attend::testing::GetStatus(expr)

MATCHER_P2(StatusIsImpl, code, substrings, "") {
  const absl::Status& status = ::attend::testing::GetStatus(arg);
  if (status.code() != code) {
    *result_listener << "code is " << absl::StatusCodeToString(status.code()) << ": "
                     << status.message();
    return false;
  }
  for (const auto& s : substrings) {
    if (status.message().find(s) == absl::string_view::npos) {
      *result_listener << "message \"" << status.message() << "\" lacks \"" << s << "\"";
      return false;
    }
  }
  return true;
}

// Matches a Status or StatusOr whose code is `code` and whose message contains every substring:
//   EXPECT_THAT(result, StatusIs(absl::StatusCode::kInvalidArgument, {"q.shape", "[2, 3]"}));
inline auto StatusIs(absl::StatusCode code, std::vector<std::string> substrings = {}) {
  return StatusIsImpl(code, std::move(substrings));
}

inline std::vector<float> RandomFloats(std::mt19937_64& rng, int64_t n, float stddev = 1.0f) {
  std::normal_distribution<float> normal(0.0f, stddev);
  std::vector<float> out(static_cast<size_t>(n));
  for (float& x : out) x = normal(rng);
  return out;
}

// CPU time used so far, in seconds: by this process (every thread: an in-process server's and
// the test's), or with CLOCK_THREAD_CPUTIME_ID by the calling thread alone.
inline double CpuSeconds(clockid_t clock = CLOCK_PROCESS_CPUTIME_ID) {
  timespec now{};
  clock_gettime(clock, &now);
  return static_cast<double>(now.tv_sec) + static_cast<double>(now.tv_nsec) * 1e-9;
}

// Spins until this process has used at least `seconds` of CPU time, so that counters with a
// clock tick's resolution (10 ms) have something to show on any machine, fast or slow.
// Returns CpuSeconds() at the end.
inline double SpendProcessCpuSeconds(double seconds) {
  volatile double sink = 0;
  double used = CpuSeconds();
  while (used < seconds) {
    for (int i = 0; i < 100000; ++i) sink = sink + i * 0.5;
    used = CpuSeconds();
  }
  return used;
}

}  // namespace attend::testing

#endif  // ATTEND_TESTS_TEST_UTIL_H_
