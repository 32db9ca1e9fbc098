// Connecting to an attend server: channel options shared by every client class, and the
// conversion of gRPC statuses into absl::Status.
//
// Thread-safety: a channel is thread-safe and meant to be shared by all clients of a process.
#ifndef ATTEND_CLIENT_CONNECTION_H_
#define ATTEND_CLIENT_CONNECTION_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "grpcpp/grpcpp.h"

namespace attend::client {

struct ConnectionOptions {
  std::string target = "localhost:50051";
  // Per-call deadline.
  absl::Duration deadline = absl::Seconds(30);
  // Largest message sent or received; match the server's --max_message_bytes.
  int64_t max_message_bytes = int64_t{64} << 20;
};

// An insecure channel to options.target with the message limits applied.
std::shared_ptr<grpc::Channel> Connect(const ConnectionOptions& options);

// Same code, same message.
absl::Status FromGrpcStatus(const grpc::Status& status);

// A client context whose deadline is `deadline` from now.
std::unique_ptr<grpc::ClientContext> NewContext(absl::Duration deadline);

}  // namespace attend::client

#endif  // ATTEND_CLIENT_CONNECTION_H_
