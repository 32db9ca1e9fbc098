#include "client/cli/command.h"

#include <cmath>
#include <map>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"

namespace attend::cli {

std::shared_ptr<grpc::Channel> Context::Channel() {
  if (!channel_) channel_ = client::Connect(connection);
  return channel_;
}

namespace {

// What to try when a connection or a call failed for a reason of TLS or credentials; "" when
// the message shows none. gRPC's messages name the symptom (a closed socket, an OpenSSL error);
// the flag that fixes it is the CLI's to say.
std::string SecurityHint(const Context& context, const absl::Status& status) {
  const absl::string_view m = status.message();
  const bool tls = context.connection.tls.enabled;
  if (status.code() == absl::StatusCode::kUnauthenticated) {
    return context.connection.bearer_token.empty()
               ? "the server wants a bearer token: --token_file FILE (or ATTEND_TOKEN_FILE)"
               : "the server refused this token: check --token_file / ATTEND_TOKEN";
  }
  if (status.code() != absl::StatusCode::kUnavailable) return "";
  if (absl::StrContains(m, "certificate verify failed")) {
    return "the server's certificate is not signed by a CA this client trusts: give that CA "
           "with --ca_cert";
  }
  if (absl::StrContains(m, "not in peer certificate")) {
    return "the server's certificate does not name the host of --target: connect by a name it "
           "carries, or set --tls_server_name";
  }
  if (absl::StrContains(m, "wrong version number")) {
    return "the server does not speak TLS: drop --tls (and ATTEND_TLS)";
  }
  if (absl::StrContains(m, "Socket closed")) {
    return tls ? "the server closed the TLS connection: if it asks for a client certificate "
                 "(mutual TLS), give --client_cert and --client_key"
               : "the server closed the connection: if it speaks TLS, add --tls (and --ca_cert)";
  }
  return "";
}

}  // namespace

int ReportError(Context& context, const absl::Status& status) {
  *context.err << "error: " << absl::StatusCodeToString(status.code()) << ": " << status.message();
  int code = kExitServerError;
  switch (status.code()) {
    case absl::StatusCode::kUnavailable:
    case absl::StatusCode::kDeadlineExceeded:
      *context.err << " (server " << context.connection.target << ")";
      code = kExitConnection;
      break;
    default:
      break;
  }
  *context.err << "\n";
  if (const std::string hint = SecurityHint(context, status); !hint.empty()) {
    *context.err << "hint: " << hint << "\n";
  }
  return code;
}

int UsageError(Context& context, const absl::Status& status) {
  *context.err << "usage error: " << status.message() << "\n";
  return kExitUsage;
}

int LocalError(Context& context, const absl::Status& status) {
  *context.err << "error: " << status.message() << "\n";
  return kExitLocalError;
}

absl::StatusOr<int64_t> IntFlag(const Args& args, const std::string& flag, int64_t fallback,
                                int64_t min, int64_t max) {
  absl::StatusOr<int64_t> value = args.GetInt(flag, fallback);
  if (!value.ok()) return value.status();
  if (*value < min || *value > max) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", flag, " must be between ", min, " and ", max, ", got ", *value));
  }
  return *value;
}

absl::StatusOr<v1::Precision> ParsePrecision(const Args& args) {
  const std::string p = args.GetString("precision", "");
  if (p.empty()) return v1::PRECISION_UNSPECIFIED;
  if (p == "f32" || p == "float32") return v1::PRECISION_FLOAT32;
  if (p == "bf16" || p == "bfloat16") return v1::PRECISION_BFLOAT16;
  return absl::InvalidArgumentError(absl::StrCat("--precision: '", p, "'; use f32 or bf16"));
}

FlagSpec PrecisionFlag() {
  return {"precision", "f32 or bf16 products", false, "f32 (bf16 when inputs are bf16)"};
}

FlagSpec WireFlag() {
  return {"wire", "how tensors travel: f32, bf16, f16 or values", false, "f32"};
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
