#include "client/cli/commands/input_files.h"

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <system_error>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "client/npy.h"

namespace attend::cli {

absl::StatusOr<std::ifstream> OpenForReading(const std::string& path) {
  const std::string what = absl::StrCat("cannot open '", path, "': ");
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) {
    return absl::FailedPreconditionError(
        absl::StrCat(what, "it is a directory; give the path of a file in it"));
  }
  errno = 0;
  std::ifstream in(path, std::ios::binary);
  if (in) return in;
  const int error = errno;
  switch (error) {
    case ENOENT:
      return absl::NotFoundError(absl::StrCat(what, "no such file"));
    case EACCES:
    case EPERM:
      return absl::PermissionDeniedError(
          absl::StrCat(what, "permission denied (this user may not read it)"));
    case ENOTDIR:
      return absl::NotFoundError(absl::StrCat(what, "a part of the path is not a directory"));
    default:
      return absl::UnknownError(
          absl::StrCat(what, error != 0 ? std::strerror(error) : "unknown reason"));
  }
}

absl::StatusOr<client::FloatTensor> ReadNpyFlag(const Context& c, const std::string& flag,
                                                const std::string& path) {
  absl::StatusOr<std::ifstream> opened = OpenForReading(path);
  if (!opened.ok()) return opened.status();
  client::NpyLimits limits;
  limits.max_values = client::MaxNpyValuesForMessage(c.connection.max_message_bytes);
  limits.reason = absl::StrCat("a request of --max_message_bytes ", c.connection.max_message_bytes,
                               " carries no more, even as bf16 at 2 bytes a value");
  return client::ReadNpy(*opened, absl::StrCat("--", flag, " ", path), limits);
}

}  // namespace attend::cli
