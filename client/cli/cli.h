// The attend command line as a function, so that tests can run commands without a process.
//
//   attend [--target=host:port] [--deadline=seconds] [--tls --ca_cert=ca.pem ...] [--json]
//          <command> [args]
//
// Global flags may come before or after the command. The connection's (target, deadline,
// max_message_bytes, tls, ca_cert, client_cert, client_key, tls_server_name, token,
// token_file, keepalive_seconds) also read ATTEND_<FLAG> from the environment; a flag given on
// the command line wins.
//
// Thread-safety: RunCli keeps no state between calls; calls may run concurrently when each has
// its own streams and nothing changes the environment meanwhile.
#ifndef ATTEND_CLIENT_CLI_CLI_H_
#define ATTEND_CLIENT_CLI_CLI_H_

#include <ostream>
#include <string>
#include <vector>

#include "absl/time/time.h"

namespace attend::cli {

// What RunCli cannot tell from the streams it is given.
struct CliOptions {
  // Whether `err` is a terminal (main: isatty of stderr). Progress lines and "working..." notes
  // are drawn only on one.
  bool err_is_terminal = false;
  // How long a call may take before its "working..." note.
  absl::Duration working_note_after = absl::Seconds(1);
};

// Runs the command line `tokens` (argv without the program name); returns the exit code
// (see ExitCode in client/cli/framework/command.h).
int RunCli(const std::vector<std::string>& tokens, std::ostream& out, std::ostream& err,
           const CliOptions& options = CliOptions());

}  // namespace attend::cli

#endif  // ATTEND_CLIENT_CLI_CLI_H_
