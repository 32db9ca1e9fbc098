#include "client/connection.h"

#include <algorithm>
#include <limits>

namespace attend::client {

std::shared_ptr<grpc::Channel> Connect(const ConnectionOptions& options) {
  grpc::ChannelArguments args;
  const int max_message = static_cast<int>(
      std::min<int64_t>(options.max_message_bytes, std::numeric_limits<int>::max()));
  args.SetMaxReceiveMessageSize(max_message);
  args.SetMaxSendMessageSize(max_message);
  return grpc::CreateCustomChannel(options.target, grpc::InsecureChannelCredentials(), args);
}

absl::Status FromGrpcStatus(const grpc::Status& status) {
  if (status.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()), status.error_message());
}

std::unique_ptr<grpc::ClientContext> NewContext(absl::Duration deadline) {
  auto context = std::make_unique<grpc::ClientContext>();
  context->set_deadline(std::chrono::system_clock::now() + absl::ToChronoNanoseconds(deadline));
  return context;
}

}  // namespace attend::client
