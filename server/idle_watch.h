// IdleWatch: ends streams that go quiet. A transfer stream (ImportSequence, ExportSequence)
// holds its share of the server's transfer budget while it is open; a client that stops sending
// (or reading) without closing would otherwise hold it, and block every hand-off, for as long as
// it likes.
//
// Thread-safety: every method may be called from any thread. `expire` callbacks run on the
// watch's own thread with the watch's lock held: they must not call back into the watch, and
// they should be short (ending a call is). Remove returns only once the entry's callback is not
// running and will not run, so an owner may destroy what its callback uses right after.
#ifndef ATTEND_SERVER_IDLE_WATCH_H_
#define ATTEND_SERVER_IDLE_WATCH_H_

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>

#include "absl/container/flat_hash_map.h"
#include "absl/time/time.h"

namespace attend::server {

class IdleWatch {
 public:
  // Calls an entry's `expire` once it has gone `timeout` without Touch. Checks every
  // min(timeout / 4, 1 s), so an entry expires within timeout and a quarter of it (at most a
  // second more).
  explicit IdleWatch(absl::Duration timeout);
  ~IdleWatch();

  IdleWatch(const IdleWatch&) = delete;
  IdleWatch& operator=(const IdleWatch&) = delete;

  absl::Duration timeout() const { return timeout_; }

  // Watches a new entry, active now; returns its ticket.
  int64_t Add(std::function<void()> expire);
  // The entry was active now. No effect on a ticket removed or expired.
  void Touch(int64_t ticket);
  // Stops watching; idempotent. See the thread-safety note above.
  void Remove(int64_t ticket);

 private:
  struct Entry {
    std::function<void()> expire;
    absl::Time last;
  };
  void Run();

  const absl::Duration timeout_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  int64_t next_ = 1;
  absl::flat_hash_map<int64_t, Entry> entries_;
  std::thread thread_;  // last: started after the fields it uses
};

}  // namespace attend::server

#endif  // ATTEND_SERVER_IDLE_WATCH_H_
