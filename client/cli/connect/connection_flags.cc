#include "client/cli/connect/connection_flags.h"

#include <string>
#include <tuple>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace attend::cli {

void ConnectionFlags::Declare(Flags& f) {
  f.Add("target", &target, "server address (env ATTEND_TARGET)").Env("ATTEND_TARGET");
  f.Add("deadline", &deadline, "seconds each call may take (env ATTEND_DEADLINE)")
      .Env("ATTEND_DEADLINE");
  f.Add("max_message_bytes", &max_message_bytes,
        "largest message, in bytes or with a unit: 64MiB (env ATTEND_MAX_MESSAGE_BYTES)")
      .Env("ATTEND_MAX_MESSAGE_BYTES");
  f.Add("tls", &tls, "connect with TLS (env ATTEND_TLS=1)")
      .Values({"1", "0", "true", "false", "TRUE", "FALSE", "True", "False"},
              "ATTEND_TLS must be 1, 0, true or false")
      .Env("ATTEND_TLS");
  f.Add("ca_cert", &ca_cert,
        "PEM of the CA that signed the server's certificate (env ATTEND_CA_CERT)")
      .Env("ATTEND_CA_CERT")
      .Shown("the system's roots");
  f.Add("client_cert", &client_cert,
        "mutual TLS: this client's PEM certificate (env ATTEND_CLIENT_CERT)")
      .Env("ATTEND_CLIENT_CERT");
  f.Add("client_key", &client_key, "mutual TLS: its PEM private key (env ATTEND_CLIENT_KEY)")
      .Env("ATTEND_CLIENT_KEY");
  f.Add("tls_server_name", &tls_server_name,
        "name to check the server's certificate against (env ATTEND_TLS_SERVER_NAME)")
      .Env("ATTEND_TLS_SERVER_NAME")
      .Shown("the target's host");
  f.Add("token_file", &token_file,
        "file holding a bearer token, sent as 'authorization: Bearer <token>' (env "
        "ATTEND_TOKEN_FILE)")
      .Env("ATTEND_TOKEN_FILE");
  f.Add("token", &token,
        "the bearer token itself; prefer --token_file or ATTEND_TOKEN, which other users "
        "cannot see in the process list")
      .Env("ATTEND_TOKEN");
  f.Add("keepalive_seconds", &keepalive_seconds,
        "HTTP/2 keepalive ping interval, 0 = off, else >= 10 (env ATTEND_KEEPALIVE_SECONDS)")
      .Env("ATTEND_KEEPALIVE_SECONDS");
}

namespace {

// --tls and the PEM files of --ca_cert, --client_cert and --client_key (which need --tls), and
// --tls_server_name. Returns kExitOk, or reports the problem and returns its exit code.
int TlsFromFlags(Context& c, const ConnectionFlags& g) {
  client::TlsOptions& tls_options = c.connection.tls;
  tls_options.enabled = g.tls;
  for (const auto& [flag, env, path, target] :
       {std::tuple{"ca_cert", "ATTEND_CA_CERT", &g.ca_cert, &tls_options.ca_cert_pem},
        std::tuple{"client_cert", "ATTEND_CLIENT_CERT", &g.client_cert,
                   &tls_options.client_cert_pem},
        std::tuple{"client_key", "ATTEND_CLIENT_KEY", &g.client_key,
                   &tls_options.client_key_pem}}) {
    if (path->empty()) continue;
    if (!tls_options.enabled) {
      return UsageError(
          c, absl::InvalidArgumentError(absl::StrCat("--", flag, " (or ", env, ") needs --tls")));
    }
    absl::StatusOr<std::string> pem = client::ReadPemFile(*path, absl::StrCat("--", flag));
    if (!pem.ok()) return LocalError(c, pem.status());
    *target = *std::move(pem);
  }
  tls_options.server_name = g.tls_server_name;
  return kExitOk;
}

// The bearer token: read from --token_file, or --token itself; giving both is a usage error.
// Returns kExitOk, or reports the problem and returns its exit code.
int TokenFromFlags(Context& c, const ConnectionFlags& g) {
  if (!g.token_file.empty() && !g.token.empty()) {
    return UsageError(c, absl::InvalidArgumentError(
                             "give the token once: --token_file (ATTEND_TOKEN_FILE) or --token "
                             "(ATTEND_TOKEN)"));
  }
  c.connection.bearer_token = g.token;
  if (!g.token_file.empty()) {
    absl::StatusOr<std::string> read = client::ReadTokenFile(g.token_file);
    if (!read.ok()) return LocalError(c, read.status());
    c.connection.bearer_token = *std::move(read);
  }
  return kExitOk;
}

// host:port targets whose port gRPC would misread: a port past 65535 wraps around to another
// one (118947 reaches 53411), and an empty target fails as a "secure channel" error. Targets
// with a scheme (unix:, dns:///) are gRPC's to check.
absl::Status CheckTarget(const std::string& target) {
  if (target.empty()) {
    return absl::InvalidArgumentError("--target is empty; give host:port (e.g. localhost:50051)");
  }
  if (absl::StrContains(target, "://") || absl::StartsWith(target, "unix:")) {
    return absl::OkStatus();
  }
  const size_t colon = target.rfind(':');
  if (colon == std::string::npos || target.back() == ']') return absl::OkStatus();  // no port
  const std::string port = target.substr(colon + 1);
  int64_t value = 0;
  if (port.empty() || !absl::SimpleAtoi(port, &value) || value < 0 || value > 65535 ||
      port.find_first_not_of("0123456789") != std::string::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("--target ", target, ": the port must be a number in [0, 65535]"));
  }
  return absl::OkStatus();
}

// Durations go up to 1e9 seconds (about 32 years), which absl::Seconds and gRPC's deadlines
// take without overflow; an infinite one is a typo for "long".
absl::Status CheckFiniteSeconds(absl::string_view flag, double seconds) {
  if (seconds <= 1e9) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(flag, " must be finite: at most 1e9 seconds, got ", seconds));
}

}  // namespace

int ConnectionFromFlags(Context& c, const ConnectionFlags& g) {
  client::ConnectionOptions& o = c.connection;
  o.target = g.target;
  if (absl::Status s = CheckTarget(o.target); !s.ok()) return UsageError(c, s);
  if (!(g.deadline > 0)) {
    return UsageError(c, absl::InvalidArgumentError("--deadline must be positive"));
  }
  if (absl::Status s = CheckFiniteSeconds("--deadline", g.deadline); !s.ok()) {
    return UsageError(c, s);
  }
  o.deadline = absl::Seconds(g.deadline);
  if (g.max_message_bytes.bytes < 1) {
    return UsageError(c, absl::InvalidArgumentError("--max_message_bytes must be >= 1"));
  }
  o.max_message_bytes = g.max_message_bytes.bytes;
  if (int code = TlsFromFlags(c, g); code != kExitOk) return code;
  if (int code = TokenFromFlags(c, g); code != kExitOk) return code;
  if (!(g.keepalive_seconds >= 0)) {
    return UsageError(c, absl::InvalidArgumentError("--keepalive_seconds must be >= 0"));
  }
  if (absl::Status s = CheckFiniteSeconds("--keepalive_seconds", g.keepalive_seconds); !s.ok()) {
    return UsageError(c, s);
  }
  o.keepalive = absl::Seconds(g.keepalive_seconds);
  if (absl::Status s = client::ValidateConnectionOptions(o); !s.ok()) return UsageError(c, s);
  return kExitOk;
}

}  // namespace attend::cli
