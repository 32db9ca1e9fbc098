// Transport security and bearer-token authentication of attend-server.
//
// Tokens: every call must carry "authorization: Bearer <token>" with one of the accepted tokens,
// or it fails UNAUTHENTICATED before reaching a service, except the standard health service
// (grpc.health.v1.Health), which stays open so that load balancers and Kubernetes probes work
// without the secret. The check runs in gRPC's server auth filter (an AuthMetadataProcessor),
// which gRPC only runs on secure ports: tokens therefore need TLS, and a token never travels
// in clear text. Tokens are compared in constant time and never logged; the authorization
// header is consumed, so that no service or interceptor behind the check sees it.
//
// Thread-safety: TokenAuthProcessor is immutable after construction and safe for concurrent
// calls; the other functions are pure or read only the file they are given.
#ifndef ATTEND_SERVER_AUTH_H_
#define ATTEND_SERVER_AUTH_H_

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "grpcpp/security/auth_metadata_processor.h"
#include "grpcpp/security/server_credentials.h"

namespace attend::server {

// TLS of the listening port, as PEM texts. Empty cert_chain_pem: plaintext.
struct TlsServerOptions {
  std::string cert_chain_pem;  // the server's certificate (and intermediates)
  std::string private_key_pem;
  // Mutual TLS: clients must present a certificate signed by this CA. Empty: no client
  // certificate is asked for.
  std::string client_ca_pem;
};

// Whether `a` equals `b`, in time that depends on b's length only (b is the secret).
bool ConstantTimeEquals(absl::string_view a, absl::string_view b);

// The accepted tokens of a token file: one per line, surrounding white space ignored, empty
// lines and lines starting with '#' skipped (several tokens allow rotation without a restart of
// the clients). INVALID_ARGUMENT when there is none, or one is not printable ASCII without
// spaces (what an HTTP/2 header value can carry).
absl::StatusOr<std::vector<std::string>> ParseTokenFile(absl::string_view text);

// Reads a file of at most 1 MiB (certificates, keys, token files); `what` names it in errors
// ("--tls_cert"). NOT_FOUND / DATA_LOSS naming the path when it cannot be read.
absl::StatusOr<std::string> ReadSecretFile(const std::string& path, absl::string_view what);

// Reads --tls_cert, --tls_key and (optional) --tls_client_ca. INVALID_ARGUMENT when only one of
// the certificate and the key is given, a client CA comes without them, or a file is not PEM.
absl::StatusOr<TlsServerOptions> LoadTlsFiles(const std::string& cert_path,
                                              const std::string& key_path,
                                              const std::string& client_ca_path);

// Called with the reason of each refused call: "missing_token", "malformed_header" or
// "token_not_accepted". Refused calls never reach a service or the metrics interceptor, so this
// is how they are counted. Must be thread-safe and cheap.
using AuthRejectionHook = std::function<void(absl::string_view reason)>;

// Accepts calls that carry one of `tokens` as a bearer token, and health checks without one.
class TokenAuthProcessor : public grpc::AuthMetadataProcessor {
 public:
  // REQUIRES: `tokens` not empty. `on_reject` may be empty.
  explicit TokenAuthProcessor(std::vector<std::string> tokens, AuthRejectionHook on_reject = {});

  // The check is a few comparisons: run it on the call's thread.
  bool IsBlocking() const override { return false; }

  grpc::Status Process(const InputMetadata& auth_metadata, grpc::AuthContext* context,
                       OutputMetadata* consumed_auth_metadata,
                       OutputMetadata* response_metadata) override;

 private:
  grpc::Status Reject(absl::string_view reason, const char* message) const;

  const std::vector<std::string> tokens_;
  const AuthRejectionHook on_reject_;
};

// The credentials of the listening port: insecure without TLS, else TLS (mutual when a client
// CA is given) with the token check when `tokens` is not empty, reporting refusals to
// `on_reject`. INVALID_ARGUMENT for tokens without TLS.
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> ServerCredentialsFor(
    const TlsServerOptions& tls, const std::vector<std::string>& tokens,
    AuthRejectionHook on_reject = {});

}  // namespace attend::server

#endif  // ATTEND_SERVER_AUTH_H_
