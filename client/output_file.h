// Writing the files a user names (--out, --weights_out, --heatmap, --plot, seq export's --out)
// so that no failure goes unseen: every system call's result is checked, close() included (a
// full disk or a quota may refuse the bytes only then), and each error carries the system's
// reason. A buffered std::ofstream destroyed without close() would drop such an error.
//
// Thread-safety: an OutputFile or a CheckedStreamBuffer belongs to one thread; WriteFile is a
// function of its arguments and the file system.
#ifndef ATTEND_CLIENT_OUTPUT_FILE_H_
#define ATTEND_CLIENT_OUTPUT_FILE_H_

#include <streambuf>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace attend::client {

// "cannot write '<path>': <strerror(error)>" (DATA_LOSS), the error of every write here.
absl::Status WriteError(const std::string& path, int error);

// A file opened for writing, truncated (created with mode 0666 less the umask). Write as many
// times as needed, then Close; a file destroyed unclosed is closed and its errors dropped (for
// the paths that already failed).
class OutputFile {
 public:
  // WriteError when it cannot be opened: a missing directory, a directory, no permission.
  static absl::StatusOr<OutputFile> Open(const std::string& path);
  // A new regular file at `path`: WriteError (EEXIST) when anything is there already, a link or
  // a FIFO included, so that a temporary file is never one somebody planted.
  static absl::StatusOr<OutputFile> CreateNew(const std::string& path);

  OutputFile(OutputFile&& other) noexcept;
  OutputFile& operator=(OutputFile&& other) noexcept;
  OutputFile(const OutputFile&) = delete;
  OutputFile& operator=(const OutputFile&) = delete;
  ~OutputFile();

  // Writes all of `bytes` (retrying short writes and EINTR); WriteError when the system refuses.
  absl::Status Write(absl::string_view bytes);
  // Closes the file; WriteError when close() reports a failed write. Idempotent.
  absl::Status Close();

  const std::string& path() const { return path_; }

 private:
  OutputFile(std::string path, int fd) : path_(std::move(path)), fd_(fd) {}

  std::string path_;
  int fd_ = -1;
};

// Open, Write(bytes) and Close: the file at `path` holds exactly `bytes`, or an error says why
// not.
absl::Status WriteFile(const std::string& path, absl::string_view bytes);

// A stream buffer over an open file descriptor (the CLI's stdout) that remembers the first
// failed write(2) and its errno. Output to a full disk or a closed pipe fails only when a buffer
// is written out, and std::cout (through C stdio) keeps neither the failure reliably in its state
// nor its reason, so a command would exit 0 with its output lost. Buffered as stdio buffers
// stdout, so that it interleaves with stderr as before: by line when `line_buffered` (a
// terminal), else in blocks of BUFSIZ. What a failed write held is dropped, as stdio drops it.
class CheckedStreamBuffer : public std::streambuf {
 public:
  CheckedStreamBuffer(int fd, bool line_buffered) : fd_(fd), line_buffered_(line_buffered) {}

  // Whether a write has failed, and the errno of the first that did (0 when it gave none).
  bool failed() const { return failed_; }
  int error() const { return error_; }

 protected:
  // No put area: every character comes to overflow or xsputn, which decide when to write.
  int_type overflow(int_type c) override;
  std::streamsize xsputn(const char* s, std::streamsize n) override;
  int sync() override;

 private:
  bool Put(const char* s, size_t n);
  bool Drain();  // writes out what is pending; false (remembering why) when refused

  const int fd_;
  const bool line_buffered_;
  std::string pending_;
  int error_ = 0;
  bool failed_ = false;
};

}  // namespace attend::client

#endif  // ATTEND_CLIENT_OUTPUT_FILE_H_
