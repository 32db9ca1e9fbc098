#include "server/worker_pool.h"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace attend::server {
namespace {

// Blocks every task that calls Wait() until Open(); counts the tasks that are waiting. On
// std::mutex, which TSan sees through (absl::Mutex's Await it cannot).
class Gate {
 public:
  void Wait() {
    std::unique_lock<std::mutex> lock(mu_);
    ++waiting_;
    changed_.notify_all();
    changed_.wait(lock, [this] { return open_; });
    --waiting_;
  }
  void Open() {
    std::lock_guard<std::mutex> lock(mu_);
    open_ = true;
    changed_.notify_all();
  }
  // True once `n` tasks are waiting, false if that does not happen within 30 s.
  bool AwaitWaiting(int n) {
    std::unique_lock<std::mutex> lock(mu_);
    return changed_.wait_for(lock, std::chrono::seconds(30), [&] { return waiting_ >= n; });
  }
  int waiting() {
    std::lock_guard<std::mutex> lock(mu_);
    return waiting_;
  }

 private:
  std::mutex mu_;
  std::condition_variable changed_;
  bool open_ = false;
  int waiting_ = 0;
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
    // Lets the destructor start waiting first.
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
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
  std::promise<void> done;
  std::atomic<int> depth{0};
  std::function<void()> step;  // outlives the pool, whose tasks call it
  WorkerPool pool(2, 4);
  step = [&] {
    if (++depth == 50) {
      done.set_value();
      return;
    }
    // The running task has left the queue, so there is room for its successor.
    ASSERT_TRUE(pool.TrySubmit(step));
  };
  std::future<void> finished = done.get_future();
  ASSERT_TRUE(pool.TrySubmit(step));
  ASSERT_EQ(finished.wait_for(std::chrono::seconds(30)), std::future_status::ready);
  EXPECT_EQ(depth.load(), 50);
}

TEST(WorkerPool, RunsTasksInParallelUpToItsThreads) {
  Gate gate;
  WorkerPool pool(3, 10);
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(pool.TrySubmit([&] { gate.Wait(); }));
  ASSERT_TRUE(gate.AwaitWaiting(3));
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_EQ(gate.waiting(), 3) << "no more tasks run at once than there are workers";
  EXPECT_EQ(pool.queued(), 2);
  gate.Open();
}

}  // namespace
}  // namespace attend::server
