#include "server/worker_pool.h"

#include <algorithm>

namespace attend::server {

WorkerPool::WorkerPool(int threads, int64_t max_queued) : max_queued_(max_queued) {
  threads = std::max(threads, 1);
  workers_.reserve(static_cast<size_t>(threads));
  for (int i = 0; i < threads; ++i) workers_.emplace_back([this] { Run(); });
}

WorkerPool::~WorkerPool() {
  {
    MutexLock lock(&mu_);
    stopping_ = true;
  }
  work_or_stop_.SignalAll();
  for (std::thread& t : workers_) t.join();
}

bool WorkerPool::TrySubmit(std::function<void()> task) {
  {
    MutexLock lock(&mu_);
    if (stopping_ || static_cast<int64_t>(queue_.size()) >= max_queued_) return false;
    queue_.push_back(std::move(task));
  }
  work_or_stop_.Signal();
  return true;
}

int64_t WorkerPool::queued() const {
  MutexLock lock(&mu_);
  return static_cast<int64_t>(queue_.size());
}

void WorkerPool::Run() {
  while (true) {
    std::function<void()> task;
    {
      MutexLock lock(&mu_);
      work_or_stop_.Wait(&mu_, [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return stopping_ || !queue_.empty();
      });
      if (queue_.empty()) return;  // stopping and drained
      task = std::move(queue_.front());
      queue_.pop_front();
    }
    task();
  }
}

}  // namespace attend::server
