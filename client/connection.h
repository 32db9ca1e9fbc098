// Connecting to an attend server: channel options shared by every client class (target,
// deadline, message limits, TLS or mutual TLS, a bearer token, keepalive), and the conversion
// of gRPC statuses into absl::Status.
//
// Thread-safety: a channel is thread-safe and meant to be shared by all clients of a process.
// The functions are pure or read only the files they are given.
#ifndef ATTEND_CLIENT_CONNECTION_H_
#define ATTEND_CLIENT_CONNECTION_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "grpcpp/grpcpp.h"

namespace attend::client {

// TLS towards the server. PEM texts, not paths (ReadPemFile reads them), so that a program may
// hold its credentials however it likes.
struct TlsOptions {
  bool enabled = false;
  // The CA that signed the server's certificate; empty: the system's roots (gRPC's default
  // roots, or the file GRPC_DEFAULT_SSL_ROOTS_FILE_PATH names).
  std::string ca_cert_pem;
  // Mutual TLS: this client's certificate chain and its private key, both or neither.
  std::string client_cert_pem;
  std::string client_key_pem;
  // The name checked against the server's certificate instead of the target's host, e.g. when
  // dialling an IP address or a tunnel whose name the certificate does not carry.
  std::string server_name;
};

struct ConnectionOptions {
  std::string target = "localhost:50051";
  // Per-call deadline.
  absl::Duration deadline = absl::Seconds(30);
  // Largest message sent or received; match the server's --max_message_bytes.
  int64_t max_message_bytes = int64_t{64} << 20;
  TlsOptions tls;
  // Sent on every call as "authorization: Bearer <token>" (health checks included). Needs TLS:
  // gRPC sends call credentials only over a secure channel, and a token must not travel in the
  // clear.
  std::string bearer_token;
  // HTTP/2 keepalive pings this often on an open connection, idle or not, to notice a dead peer
  // (or keep a NAT or proxy mapping open) during long streams; zero: none. attend-server accepts
  // pings every 10 s or less often.
  absl::Duration keepalive = absl::ZeroDuration();
};

// The smallest keepalive interval attend-server accepts (it closes connections that ping more
// often, as gRPC servers do).
inline constexpr absl::Duration kMinKeepalive = absl::Seconds(10);

// INVALID_ARGUMENT naming the option when the combination cannot work: a bearer token, a CA, a
// client certificate or a server name without TLS; a client certificate without its key (or
// the other way round); a token that is not a valid header value (printable ASCII without
// spaces); a keepalive below kMinKeepalive; a non-positive deadline or message limit.
absl::Status ValidateConnectionOptions(const ConnectionOptions& options);

// The channel arguments Connect uses: message limits, keepalive, the TLS server name.
grpc::ChannelArguments ChannelArgumentsFor(const ConnectionOptions& options);

// The credentials Connect uses: insecure, or TLS (with the client certificate for mutual TLS)
// composed with the bearer token when there is one.
std::shared_ptr<grpc::ChannelCredentials> CredentialsFor(const ConnectionOptions& options);

// A channel to options.target. Connection problems show up in the calls (UNAVAILABLE).
// REQUIRES: ValidateConnectionOptions(options).ok(); otherwise the channel may be insecure
// where TLS parts were given, and calls with a token fail UNAUTHENTICATED in gRPC.
std::shared_ptr<grpc::Channel> Connect(const ConnectionOptions& options);

// The text of a PEM file; `what` names it in errors ("--ca_cert"). NOT_FOUND / DATA_LOSS naming
// the path when it cannot be read, INVALID_ARGUMENT when it holds no PEM block.
absl::StatusOr<std::string> ReadPemFile(const std::string& path, const std::string& what);

// The token in a file: its content without surrounding white space (a trailing newline is
// usual). INVALID_ARGUMENT when it is empty or has more than one line.
absl::StatusOr<std::string> ReadTokenFile(const std::string& path);

// Same code, same message.
absl::Status FromGrpcStatus(const grpc::Status& status);

// A client context whose deadline is `deadline` from now.
std::unique_ptr<grpc::ClientContext> NewContext(absl::Duration deadline);

}  // namespace attend::client

#endif  // ATTEND_CLIENT_CONNECTION_H_
