// A fixed set of threads that run CPU-heavy request work off gRPC's callback threads, with a
// bounded queue so that overload is refused up front instead of piling up memory and latency.
//
// Thread-safety: all methods are thread-safe.
#ifndef ATTEND_SERVER_WORKER_POOL_H_
#define ATTEND_SERVER_WORKER_POOL_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "core/base/mutex.h"

namespace attend::server {

class WorkerPool {
 public:
  // Starts `threads` (>= 1) workers; at most `max_queued` tasks wait beyond the running ones.
  WorkerPool(int threads, int64_t max_queued);
  // Runs every task already queued, then joins the workers.
  ~WorkerPool();

  WorkerPool(const WorkerPool&) = delete;
  WorkerPool& operator=(const WorkerPool&) = delete;

  // Queues `task`; false (and `task` not run) when the queue is full or the pool is stopping.
  bool TrySubmit(std::function<void()> task) ABSL_LOCKS_EXCLUDED(mu_);

  int64_t queued() const ABSL_LOCKS_EXCLUDED(mu_);
  int threads() const { return static_cast<int>(workers_.size()); }

 private:
  void Run() ABSL_LOCKS_EXCLUDED(mu_);

  const int64_t max_queued_;
  // attend::Mutex rather than absl::Mutex, whose Await TSan cannot see (core/base/mutex.h).
  mutable Mutex mu_;
  CondVar work_or_stop_;  // signalled when a task is queued or the pool stops
  std::deque<std::function<void()>> queue_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> workers_;
};

}  // namespace attend::server

#endif  // ATTEND_SERVER_WORKER_POOL_H_
