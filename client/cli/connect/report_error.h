// How the commands report a call to the server that failed: "error: <CODE>: <message>", the
// exit code for the status (kExitConnection when the server could not be reached, UNAVAILABLE;
// else kExitServerError, DEADLINE_EXCEEDED included), and a "hint:" line when the status shows
// what to try: a TLS or credentials flag, a message size limit, a server to start or point
// --target at, or a longer --deadline.
//
// Thread-safety: ReportError writes to the Context's err stream alone; see command.h.
#ifndef ATTEND_CLIENT_CLI_CONNECT_REPORT_ERROR_H_
#define ATTEND_CLIENT_CLI_CONNECT_REPORT_ERROR_H_

#include "absl/status/status.h"
#include "client/cli/framework/command.h"

namespace attend::cli {

// Prints "error: <CODE>: <message>" and returns the exit code for `status`.
int ReportError(Context& context, const absl::Status& status);

}  // namespace attend::cli

#endif  // ATTEND_CLIENT_CLI_CONNECT_REPORT_ERROR_H_
