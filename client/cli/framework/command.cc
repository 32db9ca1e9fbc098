#include "client/cli/framework/command.h"

#include "absl/status/status.h"

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

}  // namespace attend::cli
