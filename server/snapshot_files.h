// The file operations of the snapshot directory (server/snapshot_store.h): OS errors as
// statuses with canonical codes, opening only regular files (never waiting on a FIFO), writing a
// file whole or not at all under a temporary name of its own, and removing what killed writes
// left. The store's format and policy (generations, CURRENT, KERNELS) stay in snapshot_store.cc.
//
// Thread-safety: every function may run on any thread; WriteAtomically calls of one name at once
// each rename a whole file (the last one stays).
#ifndef ATTEND_SERVER_SNAPSHOT_FILES_H_
#define ATTEND_SERVER_SNAPSHOT_FILES_H_

#include <sys/types.h>
#include <unistd.h>

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/base/cancellation.h"
#include "core/kv_cache/snapshot_format.h"

namespace attend::server::snapshot_files {

// An OS error as a status whose code says whose problem it is: a full disk or quota is a limit
// (RESOURCE_EXHAUSTED), a path that is a directory where a file belongs or the other way round is
// the directory's state (FAILED_PRECONDITION); anything else is the server's (INTERNAL).
absl::Status Errno(absl::string_view what, const std::string& path);

// Closes a file descriptor when it goes out of scope.
class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  Fd(Fd&& other) noexcept : fd_(other.release()) {}
  Fd& operator=(Fd&& other) noexcept {
    if (this != &other) {
      if (fd_ >= 0) close(fd_);
      fd_ = other.release();
    }
    return *this;
  }
  ~Fd() {
    if (fd_ >= 0) close(fd_);
  }
  int get() const { return fd_; }
  int release() { return std::exchange(fd_, -1); }

 private:
  int fd_;
};

// What a file that is not a regular file is, for the errors that refuse it.
const char* FileKind(mode_t mode);

// fsync of the directory `dir`, so that a rename or a new file in it survives a crash.
absl::Status SyncDir(const std::string& dir);

// Creates `dir` unless it exists; INVALID_ARGUMENT when what is there is not a directory.
absl::Status MakeDir(const std::string& dir);

// The names in `dir` (not . and ..), sorted; none when it cannot be read.
std::vector<std::string> ListDir(const std::string& dir);

// "<pid>-<random>": this process's pid and 64 bits drawn from the kernel for each name, so that
// nobody who saw earlier names can plant a file at the next one.
std::string TemporaryTag();

// Opens `path` for reading if it is a regular file (or a link to one). A FIFO would block open()
// until a writer came, and opening a device may do anything, so stat refuses those unopened and
// the open cannot block (O_NONBLOCK) on what may have replaced the file since; fstat checks what
// was opened. NOT_FOUND when nothing is there; DATA_LOSS naming the path and what is there
// instead; Errno's codes for the rest.
absl::StatusOr<Fd> OpenRegular(const std::string& path);

// Removes the temporary files in `dir` that a save which was killed left: those that no writer
// holds (a save in progress, of this server or another one sharing the directory, holds its
// file's lock until it renames it). What is not a regular file is no save's and goes too.
void RemoveAbandoned(const std::string& dir);

// Writes dir/name through `produce` (which gets a sink) as a temporary file of its own
// (dir/name.<TemporaryTag()>.tmp, locked while it is written), fsync, rename, fsync of dir. On any
// failure the temporary file is removed and nothing is renamed (also when `cancel` is set before
// the rename: a call that was cancelled or passed its deadline while the disk synced leaves the old
// file). Returns the bytes. Writes of one name at once each rename a whole file (the last one
// stays). The file is created new (O_EXCL, no link followed), so that nothing found at its name, a
// FIFO say, can block the write.
absl::StatusOr<int64_t> WriteAtomically(
    const std::string& dir, const std::string& name,
    const std::function<absl::Status(const kv::ByteSink&)>& produce,
    const Cancellation* cancel = nullptr);

// A ByteSource reading the open file `fd`, adding the bytes read to *bytes; CANCELLED once
// `cancel` is set.
kv::ByteSource FileSource(int fd, int64_t* bytes, const Cancellation* cancel = nullptr);

}  // namespace attend::server::snapshot_files

#endif  // ATTEND_SERVER_SNAPSHOT_FILES_H_
