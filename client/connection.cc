#include "client/connection.h"

#include <algorithm>
#include <fstream>
#include <limits>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "client/input_file.h"
#include "grpc/grpc.h"
#include "grpc/grpc_security_constants.h"

namespace attend::client {
namespace {

absl::StatusOr<std::string> ReadSmallFile(const std::string& path, const std::string& what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(what, ": cannot open '", path, "'"));
  // Certificates, keys and tokens are a few KiB; a bigger file is not one of them. Bounded while
  // reading, so that /dev/zero or an endless FIFO stops here.
  constexpr int64_t kMax = int64_t{1} << 20;
  bool more = false;
  absl::StatusOr<std::string> text = ReadAtMost(in, kMax, &more, absl::StrCat("'", path, "'"));
  if (!text.ok()) {
    return absl::Status(text.status().code(), absl::StrCat(what, ": ", text.status().message()));
  }
  if (more) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": '", path, "' is more than ", kMax,
                     " bytes; certificate, key and token files are limited to 1 MiB (they are "
                     "a few KiB): is it the right file?"));
  }
  return text;
}

}  // namespace

absl::Status ValidateConnectionOptions(const ConnectionOptions& options) {
  const TlsOptions& tls = options.tls;
  if (!tls.enabled) {
    for (const auto& [set, flag] : {std::pair{!options.bearer_token.empty(), "a bearer token"},
                                    {!tls.ca_cert_pem.empty(), "a CA certificate"},
                                    {!tls.client_cert_pem.empty(), "a client certificate"},
                                    {!tls.client_key_pem.empty(), "a client key"},
                                    {!tls.server_name.empty(), "a TLS server name"}}) {
      if (set) {
        return absl::InvalidArgumentError(absl::StrCat(
            flag, " needs TLS (--tls)",
            options.bearer_token.empty() ? "" : ": a token must not travel in clear text"));
      }
    }
  }
  if (tls.client_cert_pem.empty() != tls.client_key_pem.empty()) {
    return absl::InvalidArgumentError(
        "mutual TLS needs both the client certificate (--client_cert) and its key "
        "(--client_key)");
  }
  for (char c : options.bearer_token) {
    if (c <= 0x20 || c >= 0x7f) {
      return absl::InvalidArgumentError(
          "the bearer token must be printable ASCII without spaces (it travels in a header)");
    }
  }
  if (options.keepalive != absl::ZeroDuration() && options.keepalive < kMinKeepalive) {
    return absl::InvalidArgumentError(
        absl::StrCat("keepalive must be 0 (off) or at least ", absl::FormatDuration(kMinKeepalive),
                     " (servers close connections that ping more often), got ",
                     absl::FormatDuration(options.keepalive)));
  }
  if (options.deadline <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("the deadline must be positive");
  }
  if (options.max_message_bytes < 1) {
    return absl::InvalidArgumentError("the message limit must be positive");
  }
  return absl::OkStatus();
}

grpc::ChannelArguments ChannelArgumentsFor(const ConnectionOptions& options) {
  grpc::ChannelArguments args;
  const int max_message = static_cast<int>(
      std::clamp<int64_t>(options.max_message_bytes, 1, std::numeric_limits<int>::max()));
  args.SetMaxReceiveMessageSize(max_message);
  args.SetMaxSendMessageSize(max_message);
  if (options.keepalive > absl::ZeroDuration()) {
    const int interval_ms = static_cast<int>(std::min<int64_t>(
        absl::ToInt64Milliseconds(options.keepalive), std::numeric_limits<int>::max()));
    args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, interval_ms);
    // A ping unanswered for this long (or the interval, if shorter) declares the peer dead.
    args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, std::min(interval_ms, 20000));
    // Also between calls, and without a limit on pings without data: the point is to watch a
    // connection that may sit idle (between decode steps, or a stream waiting on its client).
    args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
    args.SetInt(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
  }
  if (options.tls.enabled && !options.tls.server_name.empty()) {
    args.SetSslTargetNameOverride(options.tls.server_name);
  }
  return args;
}

std::shared_ptr<grpc::ChannelCredentials> CredentialsFor(const ConnectionOptions& options) {
  if (!options.tls.enabled) return grpc::InsecureChannelCredentials();
  grpc::SslCredentialsOptions ssl;
  ssl.pem_root_certs = options.tls.ca_cert_pem;
  ssl.pem_cert_chain = options.tls.client_cert_pem;
  ssl.pem_private_key = options.tls.client_key_pem;
  std::shared_ptr<grpc::ChannelCredentials> credentials = grpc::SslCredentials(ssl);
  if (!options.bearer_token.empty()) {
    // AccessTokenCredentials sends "authorization: Bearer <token>" on every call.
    credentials = grpc::CompositeChannelCredentials(
        credentials, grpc::AccessTokenCredentials(options.bearer_token));
  }
  return credentials;
}

std::shared_ptr<grpc::Channel> Connect(const ConnectionOptions& options) {
  return grpc::CreateCustomChannel(options.target, CredentialsFor(options),
                                   ChannelArgumentsFor(options));
}

absl::StatusOr<std::string> ReadPemFile(const std::string& path, const std::string& what) {
  absl::StatusOr<std::string> text = ReadSmallFile(path, what);
  if (!text.ok()) return text.status();
  if (!absl::StrContains(*text, "-----BEGIN ")) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": '", path, "' is not PEM (no -----BEGIN line)"));
  }
  return text;
}

absl::StatusOr<std::string> ReadTokenFile(const std::string& path) {
  absl::StatusOr<std::string> text = ReadSmallFile(path, "--token_file");
  if (!text.ok()) return text.status();
  const std::string token(absl::StripAsciiWhitespace(*text));
  if (token.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("--token_file: '", path, "' is empty"));
  }
  if (token.find_first_of("\r\n") != std::string::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("--token_file: '", path, "' has more than one line; it holds one token"));
  }
  return token;
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
