// The attend command line as a function, so that tests can run commands without a process.
//
//   attend [--target=host:port] [--deadline=seconds] [--json] <command> [args]
//
// Global flags may come before or after the command and also read ATTEND_TARGET,
// ATTEND_DEADLINE and ATTEND_MAX_MESSAGE_BYTES from the environment.
#ifndef ATTEND_CLIENT_CLI_CLI_H_
#define ATTEND_CLIENT_CLI_CLI_H_

#include <ostream>
#include <string>
#include <vector>

namespace attend::cli {

// Runs the command line `tokens` (argv without the program name); returns the exit code
// (see ExitCode in command.h).
int RunCli(const std::vector<std::string>& tokens, std::ostream& out, std::ostream& err);

}  // namespace attend::cli

#endif  // ATTEND_CLIENT_CLI_CLI_H_
