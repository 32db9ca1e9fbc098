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

#include <mutex>

#include "absl/base/thread_annotations.h"

namespace attend {

class ABSL_LOCKABLE Mutex {
 public:
  void Lock() ABSL_EXCLUSIVE_LOCK_FUNCTION() { mu_.lock(); }
  void Unlock() ABSL_UNLOCK_FUNCTION() { mu_.unlock(); }
  bool TryLock() ABSL_EXCLUSIVE_TRYLOCK_FUNCTION(true) { return mu_.try_lock(); }
  // For the analysis only: tells it that the caller holds the lock.
  void AssertHeld() const ABSL_ASSERT_EXCLUSIVE_LOCK() {}

 private:
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

}  // namespace attend

#endif  // ATTEND_CORE_BASE_MUTEX_H_
