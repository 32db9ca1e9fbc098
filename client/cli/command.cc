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

absl::StatusOr<int64_t> ParseByteSize(absl::string_view text, absl::string_view flag) {
  absl::string_view t = absl::StripAsciiWhitespace(text);
  size_t split = 0;
  // The number: digits, sign, point and exponent ("1e9", "1.5E+3"); the unit is the rest.
  while (split < t.size() &&
         (absl::ascii_isdigit(t[split]) || t[split] == '.' || t[split] == '+' || t[split] == '-' ||
          ((t[split] == 'e' || t[split] == 'E') && split > 0 && split + 1 < t.size() &&
           (absl::ascii_isdigit(t[split + 1]) || t[split + 1] == '+' || t[split + 1] == '-')))) {
    ++split;
  }
  const std::string number(t.substr(0, split));
  const std::string unit = absl::AsciiStrToLower(absl::StripAsciiWhitespace(t.substr(split)));
  const auto bad = [&](absl::string_view why) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, ": '", text, "' ", why,
                     "; write a byte count such as 80GiB (2^30), 80GB (10^9), 512MiB or 1e9"));
  };
  double value;
  if (number.empty() || !ParseDecimal(number, &value) || !std::isfinite(value)) {
    return bad("is not a size");
  }
  if (value < 0) return bad("is negative");
  static const std::map<std::string, double> kUnits = {
      {"", 1.0},       {"b", 1.0},      {"kib", 0x1p10}, {"mib", 0x1p20},
      {"gib", 0x1p30}, {"tib", 0x1p40}, {"pib", 0x1p50}, {"kb", 1e3},
      {"mb", 1e6},     {"gb", 1e9},     {"tb", 1e12},    {"pb", 1e15},
  };
  const auto it = kUnits.find(unit);
  if (it == kUnits.end()) {
    const bool ambiguous = unit == "k" || unit == "m" || unit == "g" || unit == "t" || unit == "p";
    return bad(ambiguous ? "has an ambiguous unit (binary GiB or decimal GB?)"
                         : "has an unknown unit");
  }
  const long double bytes = static_cast<long double>(value) * it->second;
  // 2^63 is the first value that does not fit.
  if (bytes >= 0x1p63L) return bad("is over 2^63 - 1 bytes");
  return static_cast<int64_t>(std::llroundl(bytes));
}

}  // namespace attend::cli
