#include "client/cli/framework/command.h"

#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "client/npy.h"

namespace attend::cli {

std::shared_ptr<grpc::Channel> Context::Channel() {
  if (!channel_) channel_ = client::Connect(connection);
  return channel_;
}

int UsageError(Context& context, const absl::Status& status) {
  *context.err << "usage error: " << status.message() << "\n";
  return kExitUsage;
}

int LocalError(Context& context, const absl::Status& status) {
  *context.err << "error: " << status.message() << "\n";
  return kExitLocalError;
}

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

absl::StatusOr<v1::Precision> ParsePrecision(const std::string& p) {
  if (p.empty()) return v1::PRECISION_UNSPECIFIED;
  if (p == "f32" || p == "float32") return v1::PRECISION_FLOAT32;
  if (p == "bf16" || p == "bfloat16") return v1::PRECISION_BFLOAT16;
  return absl::InvalidArgumentError(absl::StrCat("--precision: '", p, "'; use f32 or bf16"));
}

void DeclarePrecision(Flags& f, std::string* precision) {
  f.Add("precision", precision, "f32 or bf16 products").Shown("f32 (bf16 when inputs are bf16)");
}

void DeclareWire(Flags& f, std::string* wire) {
  f.Add("wire", wire, "how tensors travel: f32, bf16, f16 or values");
}

client::FloatTensor RandomTensor(std::mt19937_64& rng, std::vector<int64_t> shape, float stddev) {
  client::FloatTensor t;
  t.shape = std::move(shape);
  std::normal_distribution<float> normal(0.0f, stddev);
  t.values.resize(static_cast<size_t>(t.size()));
  for (float& x : t.values) x = normal(rng);
  return t;
}

}  // namespace attend::cli
