#include "client/cli/command.h"

#include "absl/status/status.h"

namespace attend::cli {

std::shared_ptr<grpc::Channel> Context::Channel() {
  if (!channel_) channel_ = client::Connect(connection);
  return channel_;
}

int ReportError(Context& context, const absl::Status& status) {
  *context.err << "error: " << absl::StatusCodeToString(status.code()) << ": " << status.message();
  switch (status.code()) {
    case absl::StatusCode::kUnavailable:
    case absl::StatusCode::kDeadlineExceeded:
      *context.err << " (server " << context.connection.target << ")\n";
      return kExitConnection;
    default:
      *context.err << "\n";
      return kExitServerError;
  }
}

int UsageError(Context& context, const absl::Status& status) {
  *context.err << "usage error: " << status.message() << "\n";
  return kExitUsage;
}

}  // namespace attend::cli
