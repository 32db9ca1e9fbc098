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
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  for (std::thread& t : workers_) t.join();
}

bool WorkerPool::TrySubmit(std::function<void()> task) {
  absl::MutexLock lock(&mu_);
  if (stopping_ || static_cast<int64_t>(queue_.size()) >= max_queued_) return false;
  queue_.push_back(std::move(task));
  return true;
}

int64_t WorkerPool::queued() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int64_t>(queue_.size());
}

void WorkerPool::Run() {
  while (true) {
    std::function<void()> task;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(
          +[](WorkerPool* pool) ABSL_EXCLUSIVE_LOCKS_REQUIRED(pool->mu_) {
            return pool->stopping_ || !pool->queue_.empty();
          },
          this));
      if (queue_.empty()) return;  // stopping and drained
      task = std::move(queue_.front());
      queue_.pop_front();
    }
    task();
  }
}

}  // namespace attend::server
