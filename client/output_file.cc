#include "client/output_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"

namespace attend::client {

namespace {

// Writes all of `bytes` to `fd`, retrying short writes and EINTR; false with *error set to the
// errno (0 when write() made no progress without one: reported, never spun on) when refused.
bool WriteAll(int fd, absl::string_view bytes, int* error) {
  while (!bytes.empty()) {
    const ssize_t n = write(fd, bytes.data(), bytes.size());
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      *error = n < 0 ? errno : 0;
      return false;
    }
    bytes.remove_prefix(static_cast<size_t>(n));
  }
  return true;
}

}  // namespace

absl::Status WriteError(const std::string& path, int error) {
  return absl::DataLossError(absl::StrCat(
      "cannot write '", path, "': ", error != 0 ? std::strerror(error) : "write failed"));
}

absl::StatusOr<OutputFile> OutputFile::Open(const std::string& path) {
  int fd;
  do {
    fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
  } while (fd < 0 && errno == EINTR);
  if (fd < 0) return WriteError(path, errno);
  return OutputFile(path, fd);
}

absl::StatusOr<OutputFile> OutputFile::CreateNew(const std::string& path) {
  int fd;
  do {
    fd = open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0666);
  } while (fd < 0 && errno == EINTR);
  if (fd < 0) return WriteError(path, errno);
  return OutputFile(path, fd);
}

OutputFile::OutputFile(OutputFile&& other) noexcept
    : path_(std::move(other.path_)), fd_(std::exchange(other.fd_, -1)) {}

OutputFile& OutputFile::operator=(OutputFile&& other) noexcept {
  if (this != &other) {
    (void)Close();
    path_ = std::move(other.path_);
    fd_ = std::exchange(other.fd_, -1);
  }
  return *this;
}

OutputFile::~OutputFile() { (void)Close(); }

absl::Status OutputFile::Write(absl::string_view bytes) {
  if (fd_ < 0) return WriteError(path_, EBADF);
  int error = 0;
  return WriteAll(fd_, bytes, &error) ? absl::OkStatus() : WriteError(path_, error);
}

absl::Status OutputFile::Close() {
  if (fd_ < 0) return absl::OkStatus();
  // close() is not retried on EINTR: on Linux the descriptor is released either way.
  const int result = close(std::exchange(fd_, -1));
  if (result != 0 && errno != EINTR) return WriteError(path_, errno);
  return absl::OkStatus();
}

absl::Status WriteFile(const std::string& path, absl::string_view bytes) {
  absl::StatusOr<OutputFile> file = OutputFile::Open(path);
  if (!file.ok()) return file.status();
  if (absl::Status s = file->Write(bytes); !s.ok()) return s;
  return file->Close();
}

CheckedStreamBuffer::int_type CheckedStreamBuffer::overflow(int_type c) {
  if (traits_type::eq_int_type(c, traits_type::eof())) {
    return Drain() ? traits_type::not_eof(c) : traits_type::eof();
  }
  const char ch = traits_type::to_char_type(c);
  return Put(&ch, 1) ? c : traits_type::eof();
}

std::streamsize CheckedStreamBuffer::xsputn(const char* s, std::streamsize n) {
  return Put(s, static_cast<size_t>(n)) ? n : 0;
}

int CheckedStreamBuffer::sync() { return Drain() ? 0 : -1; }

bool CheckedStreamBuffer::Put(const char* s, size_t n) {
  pending_.append(s, n);
  const bool line_done = line_buffered_ && std::memchr(s, '\n', n) != nullptr;
  return line_done || pending_.size() >= BUFSIZ ? Drain() : !failed_;
}

bool CheckedStreamBuffer::Drain() {
  if (!failed_ && !WriteAll(fd_, pending_, &error_)) failed_ = true;
  pending_.clear();
  return !failed_;
}

}  // namespace attend::client
