#include "server/worker_pool.h"

#include <atomic>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"

namespace attend::server {
namespace {

// Blocks every task that calls Wait() until Open(); counts the tasks that are waiting.
class Gate {
 public:
  void Wait() {
    absl::MutexLock lock(&mu_);
    ++waiting_;
    mu_.Await(absl::Condition(&open_));
    --waiting_;
  }
  void Open() {
    absl::MutexLock lock(&mu_);
    open_ = true;
  }
  // True once `n` tasks are waiting, false if that does not happen within 30 s.
  bool AwaitWaiting(int n) {
    absl::MutexLock lock(&mu_);
    auto enough = [this, n]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return waiting_ >= n; };
    return mu_.AwaitWithTimeout(absl::Condition(&enough), absl::Seconds(30));
  }
  int waiting() {
    absl::MutexLock lock(&mu_);
    return waiting_;
  }

 private:
  absl::Mutex mu_;
  bool open_ ABSL_GUARDED_BY(mu_) = false;
  int waiting_ ABSL_GUARDED_BY(mu_) = 0;
};

TEST(WorkerPool, QueueHoldsExactlyMaxQueuedBeyondTheRunningTasks) {
  Gate gate;
  std::atomic<int> ran{0};
  {
    WorkerPool pool(2, 3);
    EXPECT_EQ(pool.threads(), 2);
    for (int i = 0; i < 2; ++i) {
      ASSERT_TRUE(pool.TrySubmit([&] {
        gate.Wait();
        ++ran;
      }));
    }
    ASSERT_TRUE(gate.AwaitWaiting(2));  // both workers busy, queue empty
    EXPECT_EQ(pool.queued(), 0);
    for (int i = 0; i < 3; ++i) EXPECT_TRUE(pool.TrySubmit([&] { ++ran; })) << i;
    EXPECT_EQ(pool.queued(), 3);
    EXPECT_FALSE(pool.TrySubmit([&] { ran += 1000; })) << "one over the bound is refused";
    EXPECT_EQ(pool.queued(), 3);
    gate.Open();
  }
  EXPECT_EQ(ran.load(), 5) << "every accepted task ran once, the refused one never";
}

TEST(WorkerPool, AtLeastOneWorkerEvenWhenAskedForNone) {
  for (int threads : {0, -3}) {
    std::atomic<bool> ran{false};
    {
      WorkerPool pool(threads, 1);
      EXPECT_EQ(pool.threads(), 1);
      EXPECT_TRUE(pool.TrySubmit([&] { ran = true; }));
    }
    EXPECT_TRUE(ran.load()) << threads;
  }
}

TEST(WorkerPool, ZeroQueueRefusesEverything) {
  WorkerPool pool(1, 0);
  EXPECT_FALSE(pool.TrySubmit([] {}));
}

TEST(WorkerPool, DestructorRunsEveryQueuedTaskBeforeJoining) {
  Gate gate;
  std::atomic<int> ran{0};
  auto pool = std::make_unique<WorkerPool>(1, 100);
  ASSERT_TRUE(pool->TrySubmit([&] { gate.Wait(); }));
  ASSERT_TRUE(gate.AwaitWaiting(1));
  for (int i = 0; i < 100; ++i) ASSERT_TRUE(pool->TrySubmit([&] { ++ran; }));
  std::thread opener([&] {
    absl::SleepFor(absl::Milliseconds(50));  // lets the destructor start waiting first
    gate.Open();
  });
  pool.reset();
  opener.join();
  EXPECT_EQ(ran.load(), 100);
}

TEST(WorkerPool, ConcurrentSubmittersEachAcceptedTaskRunsExactlyOnce) {
  constexpr int kSubmitters = 6;
  constexpr int kPerSubmitter = 2000;
  std::vector<std::atomic<int>> runs(kSubmitters * kPerSubmitter);
  std::atomic<int> accepted{0};
  std::vector<char> was_accepted(runs.size(), 0);
  {
    WorkerPool pool(3, 64);
    std::vector<std::thread> submitters;
    for (int s = 0; s < kSubmitters; ++s) {
      submitters.emplace_back([&, s] {
        for (int i = 0; i < kPerSubmitter; ++i) {
          const int id = s * kPerSubmitter + i;
          if (pool.TrySubmit([&runs, id] { runs[id].fetch_add(1); })) {
            was_accepted[id] = 1;  // each id is written by one submitter only
            ++accepted;
          }
          if (i % 16 == 0) std::this_thread::yield();
        }
      });
    }
    for (std::thread& t : submitters) t.join();
  }
  int ran = 0;
  for (size_t id = 0; id < runs.size(); ++id) {
    ASSERT_EQ(runs[id].load(), was_accepted[id] ? 1 : 0) << "task " << id;
    ran += runs[id].load();
  }
  EXPECT_EQ(ran, accepted.load());
  EXPECT_GT(accepted.load(), 0);
}

TEST(WorkerPool, TasksMaySubmitMoreTasks) {
  absl::Notification done;
  std::atomic<int> depth{0};
  std::function<void()> step;  // outlives the pool, whose tasks call it
  WorkerPool pool(2, 4);
  step = [&] {
    if (++depth == 50) {
      done.Notify();
      return;
    }
    // The running task has left the queue, so there is room for its successor.
    ASSERT_TRUE(pool.TrySubmit(step));
  };
  ASSERT_TRUE(pool.TrySubmit(step));
  ASSERT_TRUE(done.WaitForNotificationWithTimeout(absl::Seconds(30)));
  EXPECT_EQ(depth.load(), 50);
}

TEST(WorkerPool, RunsTasksInParallelUpToItsThreads) {
  Gate gate;
  WorkerPool pool(3, 10);
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(pool.TrySubmit([&] { gate.Wait(); }));
  ASSERT_TRUE(gate.AwaitWaiting(3));
  absl::SleepFor(absl::Milliseconds(20));
  EXPECT_EQ(gate.waiting(), 3) << "no more tasks run at once than there are workers";
  EXPECT_EQ(pool.queued(), 2);
  gate.Open();
}

}  // namespace
}  // namespace attend::server
