// The mutex of attend's core: std::mutex with Abseil's thread-safety annotations.
//
// Why not absl::Mutex: Debian's Abseil is a prebuilt library without ThreadSanitizer
// annotations, so TSan cannot see its synchronisation and reports every guarded access as a
// race. std::mutex goes through pthread, which TSan intercepts (and checks for lock-order
// inversions), while the annotations keep clang's -Wthread-safety analysis meaningful.
//
// Thread-safety: a Mutex is, of course, safe to use from any thread.
#ifndef ATTEND_CORE_BASE_MUTEX_H_
#define ATTEND_CORE_BASE_MUTEX_H_

#include <condition_variable>
#include <mutex>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/time/time.h"

namespace attend {

class ABSL_LOCKABLE Mutex {
 public:
  void Lock() ABSL_EXCLUSIVE_LOCK_FUNCTION() { mu_.lock(); }
  void Unlock() ABSL_UNLOCK_FUNCTION() { mu_.unlock(); }
  bool TryLock() ABSL_EXCLUSIVE_TRYLOCK_FUNCTION(true) { return mu_.try_lock(); }
  // For the analysis only: tells it that the caller holds the lock.
  void AssertHeld() const ABSL_ASSERT_EXCLUSIVE_LOCK() {}

 private:
  friend class CondVar;
  std::mutex mu_;
};

class ABSL_SCOPED_LOCKABLE MutexLock {
 public:
  explicit MutexLock(Mutex* mu) ABSL_EXCLUSIVE_LOCK_FUNCTION(mu) : mu_(mu) { mu_->Lock(); }
  ~MutexLock() ABSL_UNLOCK_FUNCTION() { mu_->Unlock(); }

  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

 private:
  Mutex* const mu_;
};

// A condition variable to wait on with a Mutex held (std::condition_variable underneath, for
// the same reason as Mutex: TSan sees through it).
class CondVar {
 public:
  // Releases `mu`, blocks until `done()` is true (checked with `mu` held), and returns holding
  // `mu` again.
  template <typename Predicate>
  void Wait(Mutex* mu, Predicate done) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    std::unique_lock<std::mutex> lock(mu->mu_, std::adopt_lock);
    cv_.wait(lock, std::move(done));
    lock.release();  // the caller's MutexLock unlocks it
  }
  // As Wait, but gives up after `timeout`; returns done().
  template <typename Predicate>
  bool WaitFor(Mutex* mu, absl::Duration timeout, Predicate done)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    if (timeout == absl::InfiniteDuration()) {
      Wait(mu, std::move(done));
      return true;
    }
    std::unique_lock<std::mutex> lock(mu->mu_, std::adopt_lock);
    const bool result = cv_.wait_for(lock, absl::ToChronoNanoseconds(timeout), std::move(done));
    lock.release();
    return result;
  }
  void Signal() { cv_.notify_one(); }
  void SignalAll() { cv_.notify_all(); }

 private:
  std::condition_variable cv_;
};

// A one-time event (absl::Notification's contract, on Mutex and CondVar for TSan).
class Notification {
 public:
  void Notify() {
    {
      MutexLock lock(&mu_);
      notified_ = true;
    }
    cv_.SignalAll();
  }
  bool HasBeenNotified() const {
    MutexLock lock(&mu_);
    return notified_;
  }
  // True when notified within `timeout`.
  bool WaitForNotificationWithTimeout(absl::Duration timeout) const {
    MutexLock lock(&mu_);
    return cv_.WaitFor(&mu_, timeout,
                       [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return notified_; });
  }

 private:
  mutable Mutex mu_;
  mutable CondVar cv_;
  bool notified_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace attend

#endif  // ATTEND_CORE_BASE_MUTEX_H_
