#include "server/snapshot_files.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/random.h>
#include <sys/stat.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/base/status_macros.h"

namespace attend::server::snapshot_files {
namespace {

constexpr size_t kWriteBuffer = size_t{8} << 20;

}  // namespace

absl::Status Errno(absl::string_view what, const std::string& path) {
  const int error = errno;
  const std::string message = absl::StrCat(what, " ", path, ": ", std::strerror(error));
  switch (error) {
    case ENOSPC:
    case EDQUOT:
      return absl::ResourceExhaustedError(message);
    case EISDIR:
    case ENOTDIR:
    case EACCES:
    case EPERM:
    case EROFS:
      return absl::FailedPreconditionError(message);
    default:
      return absl::InternalError(message);
  }
}

const char* FileKind(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISSOCK(mode)) return "a socket";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  return "a special file";
}

absl::Status SyncDir(const std::string& dir) {
  Fd fd(open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (fd.get() < 0) return Errno("open directory", dir);
  if (fsync(fd.get()) != 0) return Errno("fsync directory", dir);
  return absl::OkStatus();
}

absl::Status MakeDir(const std::string& dir) {
  if (mkdir(dir.c_str(), 0755) != 0 && errno != EEXIST) return Errno("mkdir", dir);
  struct stat st;
  if (stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    return absl::InvalidArgumentError(absl::StrCat(dir, " is not a directory"));
  }
  return absl::OkStatus();
}

std::vector<std::string> ListDir(const std::string& dir) {
  std::vector<std::string> names;
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) return names;
  while (const dirent* e = readdir(d)) {
    const std::string name = e->d_name;
    if (name != "." && name != "..") names.push_back(name);
  }
  closedir(d);
  std::sort(names.begin(), names.end());
  return names;
}

std::string TemporaryTag() {
  uint64_t random = 0;
  if (getrandom(&random, sizeof(random), 0) != static_cast<ssize_t>(sizeof(random))) {
    static std::atomic<uint64_t> writes{0};  // no entropy to be had: unique in this process
    random =
        (static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count()) << 16) ^
        writes.fetch_add(1);
  }
  return absl::StrFormat("%d-%016x", getpid(), random);
}

absl::StatusOr<Fd> OpenRegular(const std::string& path) {
  struct stat st;
  const auto refuse = [&path](mode_t mode) {
    return absl::DataLossError(absl::StrCat(path, " is ", FileKind(mode), ", not a regular file"));
  };
  if (stat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) return absl::NotFoundError(absl::StrCat("no snapshot file ", path));
    if (errno == ELOOP) {
      return absl::DataLossError(absl::StrCat(path, " is a loop of symbolic links"));
    }
    return Errno("open", path);
  }
  if (!S_ISREG(st.st_mode)) return refuse(st.st_mode);
  Fd fd(open(path.c_str(), O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC));
  if (fd.get() < 0) {
    if (errno == ENOENT) return absl::NotFoundError(absl::StrCat("no snapshot file ", path));
    return Errno("open", path);
  }
  if (fstat(fd.get(), &st) != 0) return Errno("stat", path);
  if (!S_ISREG(st.st_mode)) return refuse(st.st_mode);
  const int flags = fcntl(fd.get(), F_GETFL);
  if (flags < 0 || fcntl(fd.get(), F_SETFL, flags & ~O_NONBLOCK) != 0) return Errno("open", path);
  return fd;
}

void RemoveAbandoned(const std::string& dir) {
  for (const std::string& name : ListDir(dir)) {
    if (!absl::EndsWith(name, ".tmp")) continue;
    const std::string path = absl::StrCat(dir, "/", name);
    Fd fd(open(path.c_str(), O_RDONLY | O_NONBLOCK | O_NOFOLLOW | O_NOCTTY | O_CLOEXEC));
    struct stat st;
    if (fd.get() >= 0 && fstat(fd.get(), &st) == 0 && S_ISREG(st.st_mode) &&
        flock(fd.get(), LOCK_EX | LOCK_NB) != 0) {
      continue;  // being written
    }
    unlink(path.c_str());
  }
}

absl::StatusOr<int64_t> WriteAtomically(
    const std::string& dir, const std::string& name,
    const std::function<absl::Status(const kv::ByteSink&)>& produce, const Cancellation* cancel) {
  const std::string path = absl::StrCat(dir, "/", name);
  std::string tmp;
  Fd fd(-1);
  // A name nobody else picks (servers sharing a directory may all be pid 1 in their containers),
  // and another one if something is there all the same.
  for (int attempt = 0; attempt < 8 && fd.get() < 0; ++attempt) {
    tmp = absl::StrCat(path, ".", TemporaryTag(), ".tmp");
    fd = Fd(open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644));
    if (fd.get() < 0 && errno != EEXIST) break;
  }
  if (fd.get() < 0) return Errno("create", tmp);
  // Held while the file is written: a server starting on the same directory removes only the
  // temporary files nobody holds (RemoveAbandoned), not this one.
  if (flock(fd.get(), LOCK_EX | LOCK_NB) != 0) {
    absl::Status locked = Errno("lock", tmp);
    unlink(tmp.c_str());
    return locked;
  }
  std::string buffer;
  buffer.reserve(kWriteBuffer);
  int64_t bytes = 0;
  const auto flush = [&]() -> absl::Status {
    size_t done = 0;
    while (done < buffer.size()) {
      const ssize_t n = write(fd.get(), buffer.data() + done, buffer.size() - done);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return Errno("write", tmp);
      done += static_cast<size_t>(n);
    }
    buffer.clear();
    return absl::OkStatus();
  };
  const kv::ByteSink sink = [&](absl::string_view piece) -> absl::Status {
    bytes += static_cast<int64_t>(piece.size());
    if (buffer.size() + piece.size() > kWriteBuffer) ATTEND_RETURN_IF_ERROR(flush());
    if (piece.size() >= kWriteBuffer) {
      buffer.assign(piece.data(), piece.size());
      return flush();
    }
    buffer.append(piece.data(), piece.size());
    return absl::OkStatus();
  };
  absl::Status status = produce(sink);
  if (status.ok()) status = flush();
  if (status.ok() && fsync(fd.get()) != 0) status = Errno("fsync", tmp);
  if (status.ok() && close(fd.release()) != 0) status = Errno("close", tmp);
  if (status.ok()) status = CheckCancelled(cancel, "the write");
  if (status.ok() && rename(tmp.c_str(), path.c_str()) != 0) {
    status = Errno(absl::StrCat("rename ", tmp, " to"), path);
  }
  if (status.ok()) status = SyncDir(dir);
  if (!status.ok()) {
    unlink(tmp.c_str());
    return status;
  }
  return bytes;
}

kv::ByteSource FileSource(int fd, int64_t* bytes, const Cancellation* cancel) {
  return [fd, bytes, cancel](char* dst, size_t n) -> absl::StatusOr<size_t> {
    ATTEND_RETURN_IF_ERROR(CheckCancelled(cancel, "the load"));
    while (true) {
      const ssize_t got = read(fd, dst, n);
      if (got < 0 && errno == EINTR) continue;
      if (got < 0) return absl::InternalError(absl::StrCat("read: ", std::strerror(errno)));
      *bytes += got;
      return static_cast<size_t>(got);
    }
  };
}

}  // namespace attend::server::snapshot_files
