// The CLI's command table: each command declares its flags, help and examples, and runs with
// the parsed arguments and a connection. Exit codes are shared by every command.
#ifndef ATTEND_CLIENT_CLI_COMMAND_H_
#define ATTEND_CLIENT_CLI_COMMAND_H_

#include <functional>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "client/cli/args.h"
#include "client/connection.h"

namespace attend::cli {

// Exit codes, distinct per kind of failure so that scripts can tell them apart.
enum ExitCode {
  kExitOk = 0,
  kExitLocalError = 1,   // a local file could not be read or written
  kExitUsage = 2,        // bad command line
  kExitConnection = 3,   // the server could not be reached (UNAVAILABLE, DEADLINE_EXCEEDED)
  kExitServerError = 4,  // the server answered with an error status
  kExitNotServing = 5,   // `attend health`: a service is not SERVING
};

struct Context {
  Args args;
  client::ConnectionOptions connection;
  bool json = false;
  std::ostream* out = &std::cout;
  std::ostream* err = &std::cerr;

  // A channel to connection.target, created on first use.
  std::shared_ptr<grpc::Channel> Channel();

 private:
  std::shared_ptr<grpc::Channel> channel_;
};

struct Command {
  std::string name;
  std::string summary;
  std::string usage;    // e.g. "attend softmax <logit>... [--jacobian]"
  std::string details;  // longer help, examples included
  std::vector<FlagSpec> flags;
  std::function<int(Context&)> run;
};

// Prints "error: <CODE>: <message>" and returns the exit code for `status`.
int ReportError(Context& context, const absl::Status& status);
// For errors in the command line itself.
int UsageError(Context& context, const absl::Status& status);

// Commands of the Attention service and health.
std::vector<Command> AttentionCommands();

}  // namespace attend::cli

#endif  // ATTEND_CLIENT_CLI_COMMAND_H_
