// A request's cancellation. Whoever learns that a request's result is no longer wanted (the
// client cancelled, its deadline passed, the server's shutdown grace ended) sets it; long
// computations poll it between tiles and stop with CANCELLED, after undoing what they changed.
//
// Why a flag that computations poll rather than a callback: the work runs on OpenMP threads in
// the middle of tiles, where the only safe place to stop is between them.
//
// Thread-safety: Cancel() and cancelled() may be called from any thread at any time.
#ifndef ATTEND_CORE_BASE_CANCELLATION_H_
#define ATTEND_CORE_BASE_CANCELLATION_H_

#include <atomic>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace attend {

class Cancellation {
 public:
  void Cancel() { cancelled_.store(true, std::memory_order_relaxed); }
  bool cancelled() const { return cancelled_.load(std::memory_order_relaxed); }

 private:
  std::atomic<bool> cancelled_{false};
};

// True when `cancel` is set (a null `cancel` never is).
inline bool IsCancelled(const Cancellation* cancel) {
  return cancel != nullptr && cancel->cancelled();
}

// CANCELLED saying that `what` stopped, when `cancel` is set; OK otherwise.
inline absl::Status CheckCancelled(const Cancellation* cancel, absl::string_view what) {
  if (!IsCancelled(cancel)) return absl::OkStatus();
  return absl::CancelledError(
      absl::StrCat(what,
                   " stopped: the request was cancelled (by the client, its deadline, or "
                   "the server's shutdown)"));
}

}  // namespace attend

#endif  // ATTEND_CORE_BASE_CANCELLATION_H_
