#include "client/cli/connect/report_error.h"

#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace attend::cli {
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
               : "the server closed the connection: it stopped or restarted, or it speaks TLS "
                 "(then add --tls, and --ca_cert)";
  }
  return "";
}

// The whole number that follows the first `prefix` in `m`, if any.
std::optional<int64_t> NumberAfter(absl::string_view m, absl::string_view prefix) {
  const size_t at = m.find(prefix);
  if (at == absl::string_view::npos) return std::nullopt;
  absl::string_view rest = m.substr(at + prefix.size());
  size_t digits = 0;
  while (digits < rest.size() && absl::ascii_isdigit(rest[digits])) ++digits;
  int64_t value;
  if (digits == 0 || !absl::SimpleAtoi(rest.substr(0, digits), &value)) return std::nullopt;
  return value;
}

// `bytes` rounded up to whole MiB, as a --max_message_bytes value: "70254592 (67 MiB)".
std::string LimitFor(int64_t bytes) {
  constexpr int64_t kMiB = int64_t{1} << 20;
  const int64_t mib = (bytes + kMiB - 1) / kMiB;
  return absl::StrCat(mib * kMiB, " (", mib, " MiB)");
}

// What to try when a message was over a size limit: gRPC's own refusals ("Sent message larger
// than max (N vs. M)", "Received message larger than max (N vs. M)") and the server's, which
// names its --max_message_bytes. "" for other errors.
std::string MessageSizeHint(const Context& context, const absl::Status& status) {
  if (status.code() != absl::StatusCode::kResourceExhausted) return "";
  const absl::string_view m = status.message();
  const std::string& wire = context.wire;
  const std::string narrower = wire == "bf16" || wire == "f16"
                                   ? ""
                                   : "send the tensors as bf16 with --wire bf16 (half "
                                     "the bytes of f32), or ";
  if (absl::StrContains(m, "Sent message larger than max")) {
    const std::optional<int64_t> size = NumberAfter(m, "larger than max (");
    const std::optional<int64_t> limit = NumberAfter(m, " vs. ");
    return absl::StrCat(
        size && limit ? absl::StrCat("the request is ", *size,
                                     " bytes, over this client's limit of ", *limit, ": ")
                      : "the request is over this client's message limit: ",
        narrower, "raise the limit: --max_message_bytes ", size ? LimitFor(*size) : "N",
        "; the server must take as much (attend-server --max_message_bytes)");
  }
  if (absl::StrContains(m, "Received message larger than max")) {
    const std::optional<int64_t> size = NumberAfter(m, "larger than max (");
    const std::optional<int64_t> limit = NumberAfter(m, " vs. ");
    return absl::StrCat(size && limit
                            ? absl::StrCat("a message of ", *size, " bytes is over a limit of ",
                                           *limit, " (this client's or the server's): ")
                            : "a message is over a size limit (this client's or the server's): ",
                        narrower, "raise both to ", size ? LimitFor(*size) : "N",
                        ": --max_message_bytes here and attend-server --max_message_bytes");
  }
  if (absl::StrContains(m, "--max_message_bytes")) {
    const std::optional<int64_t> bytes = NumberAfter(m, "would hold ");
    const std::optional<int64_t> framing = NumberAfter(m, "and up to ");
    const std::string needed = bytes && framing ? LimitFor(*bytes + *framing) : "N";
    return absl::StrCat(
        "the answer is over the server's message limit: ask for less, or raise the limit to ",
        needed, ": attend-server --max_message_bytes, and --max_message_bytes here");
  }
  return "";
}

// How to get a server to talk to when none answered at the target: connection refused or a
// name that does not resolve. "" for other errors.
std::string UnreachableHint(const Context& context, const absl::Status& status) {
  if (status.code() != absl::StatusCode::kUnavailable) return "";
  const absl::string_view m = status.message();
  const std::string& target = context.connection.target;
  if (absl::StrContains(m, "DNS resolution failed") || absl::StrContains(m, "Name or service") ||
      absl::StrContains(m, "not known") || absl::StrContains(m, "Could not resolve")) {
    return absl::StrCat("the host of ", target,
                        " does not resolve: check --target (or ATTEND_TARGET); for a server on "
                        "this machine, start one with `bash scripts/serve.sh` and give --target "
                        "localhost:50051");
  }
  if (absl::StrContains(m, "Connection refused") ||
      absl::StrContains(m, "failed to connect to all addresses")) {
    return absl::StrCat("no server is listening at ", target,
                        ": start one with `bash scripts/serve.sh` or `attend-server --address ",
                        target, "`, or point --target (or ATTEND_TARGET) at a running server");
  }
  return "";
}

// What to try when a call ran past --deadline. "" for other errors.
std::string DeadlineHint(const Context& context, const absl::Status& status) {
  if (status.code() != absl::StatusCode::kDeadlineExceeded) return "";
  return absl::StrCat("the call did not finish within --deadline ",
                      absl::ToDoubleSeconds(context.connection.deadline),
                      " s: give it longer with --deadline SECONDS (or ATTEND_DEADLINE), or ask "
                      "for less");
}

}  // namespace

int ReportError(Context& context, const absl::Status& status) {
  *context.err << "error: " << absl::StatusCodeToString(status.code()) << ": " << status.message();
  int code = kExitServerError;
  switch (status.code()) {
    case absl::StatusCode::kUnavailable:
      *context.err << " (server " << context.connection.target << ")";
      code = kExitConnection;
      break;
    case absl::StatusCode::kDeadlineExceeded:
      // The server may well be there, working on it: a server error, as the docs' exit codes
      // have it, not "unreachable".
      *context.err << " (server " << context.connection.target << ")";
      break;
    default:
      break;
  }
  *context.err << "\n";
  for (const auto hint_of : {SecurityHint, MessageSizeHint, UnreachableHint, DeadlineHint}) {
    if (const std::string hint = hint_of(context, status); !hint.empty()) {
      *context.err << "hint: " << hint << "\n";
      break;
    }
  }
  return code;
}

}  // namespace attend::cli
