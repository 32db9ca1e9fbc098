// IdleWatch: entries expire once after going quiet for the timeout, Touch postpones it, and
// Remove both stops it and waits out a callback that is running (the reactors delete themselves
// right after Remove).
#include "server/idle_watch.h"

#include <atomic>
#include <chrono>
#include <thread>

#include "gtest/gtest.h"

namespace attend::server {
namespace {

using std::chrono::milliseconds;

TEST(IdleWatch, ExpiresOnceAfterTheTimeoutUnlessTouched) {
  IdleWatch watch(absl::Milliseconds(200));
  std::atomic<int> quiet{0}, busy{0};
  watch.Add([&] { ++quiet; });
  const int64_t touched = watch.Add([&] { ++busy; });
  for (int i = 0; i < 10; ++i) {  // 500 ms of touches every 50 ms
    std::this_thread::sleep_for(milliseconds(50));
    watch.Touch(touched);
  }
  EXPECT_EQ(quiet.load(), 1);
  EXPECT_EQ(busy.load(), 0);
  std::this_thread::sleep_for(milliseconds(600));
  EXPECT_EQ(quiet.load(), 1) << "once only";
  EXPECT_EQ(busy.load(), 1);
  watch.Touch(touched);  // expired: no effect, no crash
  watch.Remove(touched);
}

TEST(IdleWatch, RemovedEntriesNeverExpire) {
  IdleWatch watch(absl::Milliseconds(100));
  std::atomic<int> calls{0};
  const int64_t ticket = watch.Add([&] { ++calls; });
  watch.Remove(ticket);
  watch.Remove(ticket);  // idempotent
  std::this_thread::sleep_for(milliseconds(400));
  EXPECT_EQ(calls.load(), 0);
}

TEST(IdleWatch, RemoveWaitsForARunningCallback) {
  IdleWatch watch(absl::Milliseconds(40));
  std::atomic<bool> started{false}, finished{false};
  const int64_t ticket = watch.Add([&] {
    started = true;
    std::this_thread::sleep_for(milliseconds(300));
    finished = true;
  });
  while (!started.load()) std::this_thread::sleep_for(milliseconds(1));
  watch.Remove(ticket);
  EXPECT_TRUE(finished.load()) << "Remove returned while the callback still ran";
}

}  // namespace
}  // namespace attend::server
