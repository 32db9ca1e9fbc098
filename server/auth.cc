#include "server/auth.h"

#include <fstream>
#include <sstream>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace attend::server {
namespace {

constexpr absl::string_view kHealthPrefix = "/grpc.health.v1.Health/";
constexpr absl::string_view kBearer = "Bearer ";

absl::string_view View(const grpc::string_ref& s) { return absl::string_view(s.data(), s.size()); }

bool IsTokenText(absl::string_view token) {
  for (char c : token) {
    if (c <= 0x20 || c >= 0x7f) return false;
  }
  return !token.empty();
}

}  // namespace

bool ConstantTimeEquals(absl::string_view a, absl::string_view b) {
  // Every byte of b is visited whatever a holds, and no branch depends on the bytes: the time
  // tells an attacker the secret's length at most, not how much of a guess was right.
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  for (size_t i = 0; i < b.size(); ++i) {
    const unsigned char x = i < a.size() ? static_cast<unsigned char>(a[i]) : 0;
    diff |= static_cast<unsigned char>(x ^ static_cast<unsigned char>(b[i]));
  }
  return diff == 0;
}

absl::StatusOr<std::vector<std::string>> ParseTokenFile(absl::string_view text) {
  std::vector<std::string> tokens;
  int line_number = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++line_number;
    line = absl::StripAsciiWhitespace(line);
    if (line.empty() || line[0] == '#') continue;
    if (!IsTokenText(line)) {
      // The line itself is not quoted: it may be a secret.
      return absl::InvalidArgumentError(absl::StrCat(
          "token file line ", line_number,
          ": a token is printable ASCII without spaces (it travels in an HTTP/2 header)"));
    }
    tokens.emplace_back(line);
  }
  if (tokens.empty()) return absl::InvalidArgumentError("the token file holds no token");
  return tokens;
}

absl::StatusOr<std::string> ReadSecretFile(const std::string& path, absl::string_view what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(what, ": cannot open '", path, "'"));
  std::ostringstream text;
  char buffer[4096];
  size_t total = 0;
  while (in.read(buffer, sizeof(buffer)) || in.gcount() > 0) {
    total += static_cast<size_t>(in.gcount());
    if (total > (size_t{1} << 20)) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": '", path, "' is larger than 1 MiB; is it the right file?"));
    }
    text.write(buffer, in.gcount());
  }
  if (in.bad()) return absl::DataLossError(absl::StrCat(what, ": cannot read '", path, "'"));
  return text.str();
}

absl::StatusOr<TlsServerOptions> LoadTlsFiles(const std::string& cert_path,
                                              const std::string& key_path,
                                              const std::string& client_ca_path) {
  TlsServerOptions tls;
  if (cert_path.empty() != key_path.empty()) {
    return absl::InvalidArgumentError("--tls_cert and --tls_key go together");
  }
  if (cert_path.empty()) {
    if (!client_ca_path.empty()) {
      return absl::InvalidArgumentError(
          "--tls_client_ca (mutual TLS) needs TLS: give --tls_cert and --tls_key");
    }
    return tls;
  }
  for (const auto& [path, flag, target] :
       {std::tuple{&cert_path, "--tls_cert", &tls.cert_chain_pem},
        std::tuple{&key_path, "--tls_key", &tls.private_key_pem},
        std::tuple{&client_ca_path, "--tls_client_ca", &tls.client_ca_pem}}) {
    if (path->empty()) continue;
    absl::StatusOr<std::string> text = ReadSecretFile(*path, flag);
    if (!text.ok()) return text.status();
    if (!absl::StrContains(*text, "-----BEGIN ")) {
      return absl::InvalidArgumentError(
          absl::StrCat(flag, ": '", *path, "' is not PEM (no -----BEGIN line)"));
    }
    *target = *std::move(text);
  }
  return tls;
}

TokenAuthProcessor::TokenAuthProcessor(std::vector<std::string> tokens, AuthRejectionHook on_reject)
    : tokens_(std::move(tokens)), on_reject_(std::move(on_reject)) {}

grpc::Status TokenAuthProcessor::Reject(absl::string_view reason, const char* message) const {
  if (on_reject_) on_reject_(reason);
  return grpc::Status(grpc::StatusCode::UNAUTHENTICATED, message);
}

grpc::Status TokenAuthProcessor::Process(const InputMetadata& auth_metadata,
                                         grpc::AuthContext* /*context*/,
                                         OutputMetadata* consumed_auth_metadata,
                                         OutputMetadata* /*response_metadata*/) {
  // :path is the method the server routes the call to, so it cannot claim to be a health check
  // and reach another service.
  const auto path = auth_metadata.find(":path");
  const bool health =
      path != auth_metadata.end() && absl::StartsWith(View(path->second), kHealthPrefix);
  const auto header = auth_metadata.find("authorization");
  if (header == auth_metadata.end()) {
    if (health) return grpc::Status::OK;
    return Reject("missing_token",
                  "this server needs a bearer token: send 'authorization: Bearer <token>'");
  }
  const absl::string_view value = View(header->second);
  // Consumed even for health checks: no code behind this check sees the secret.
  consumed_auth_metadata->insert({"authorization", std::string(value)});
  if (health) return grpc::Status::OK;
  if (!absl::StartsWith(value, kBearer)) {
    return Reject("malformed_header", "the authorization header must be 'Bearer <token>'");
  }
  const absl::string_view token = value.substr(kBearer.size());
  // Every accepted token is compared, so that the time does not tell which one came close.
  bool accepted = false;
  for (const std::string& t : tokens_) accepted |= ConstantTimeEquals(token, t);
  if (!accepted) {
    return Reject("token_not_accepted", "the bearer token is not accepted");
  }
  return grpc::Status::OK;
}

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> ServerCredentialsFor(
    const TlsServerOptions& tls, const std::vector<std::string>& tokens,
    AuthRejectionHook on_reject) {
  if (tls.cert_chain_pem.empty()) {
    if (!tokens.empty()) {
      return absl::InvalidArgumentError(
          "bearer tokens (--auth_token_file) need TLS (--tls_cert and --tls_key): a token must "
          "not travel in clear text");
    }
    if (!tls.client_ca_pem.empty()) {
      return absl::InvalidArgumentError("a client CA (mutual TLS) needs a server certificate");
    }
    return grpc::InsecureServerCredentials();
  }
  if (tls.private_key_pem.empty()) {
    return absl::InvalidArgumentError("the TLS certificate needs its private key");
  }
  grpc::SslServerCredentialsOptions ssl(
      tls.client_ca_pem.empty() ? GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE
                                : GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  ssl.pem_root_certs = tls.client_ca_pem;
  ssl.pem_key_cert_pairs.push_back({tls.private_key_pem, tls.cert_chain_pem});
  std::shared_ptr<grpc::ServerCredentials> credentials = grpc::SslServerCredentials(ssl);
  if (!tokens.empty()) {
    credentials->SetAuthMetadataProcessor(
        std::make_shared<TokenAuthProcessor>(tokens, std::move(on_reject)));
  }
  return credentials;
}

}  // namespace attend::server
