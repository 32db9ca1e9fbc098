#include "server/idle_watch.h"

#include <algorithm>
#include <utility>
#include <vector>

namespace attend::server {

IdleWatch::IdleWatch(absl::Duration timeout) : timeout_(timeout), thread_([this] { Run(); }) {}

IdleWatch::~IdleWatch() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

int64_t IdleWatch::Add(std::function<void()> expire) {
  std::lock_guard<std::mutex> lock(mu_);
  const int64_t ticket = next_++;
  entries_.emplace(ticket, Entry{std::move(expire), absl::Now()});
  return ticket;
}

void IdleWatch::Touch(int64_t ticket) {
  std::lock_guard<std::mutex> lock(mu_);
  if (auto it = entries_.find(ticket); it != entries_.end()) it->second.last = absl::Now();
}

void IdleWatch::Remove(int64_t ticket) {
  // Under the lock: an expire callback, which runs with it held, is not running meanwhile.
  std::lock_guard<std::mutex> lock(mu_);
  entries_.erase(ticket);
}

void IdleWatch::Run() {
  const absl::Duration tick = std::min(timeout_ / 4, absl::Seconds(1));
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_) {
    cv_.wait_for(lock, absl::ToChronoNanoseconds(std::max(tick, absl::Milliseconds(1))));
    if (stop_) break;
    const absl::Time now = absl::Now();
    std::vector<int64_t> expired;
    for (const auto& [ticket, entry] : entries_) {
      if (now - entry.last >= timeout_) expired.push_back(ticket);
    }
    for (const int64_t ticket : expired) {
      auto it = entries_.find(ticket);
      std::function<void()> expire = std::move(it->second.expire);
      entries_.erase(it);  // once: it is not watched any more
      expire();
    }
  }
}

}  // namespace attend::server
