// The CLI's command table: each command has its help and examples, declares its flags on a
// CLI::App through an options struct (Define), and runs with them parsed and a connection. Exit
// codes are shared by every command.
//
// Thread-safety: a Context belongs to one run of one command, on one thread. The commands keep
// no state between runs, so runs with their own Contexts may go on concurrently.
#ifndef ATTEND_CLIENT_CLI_FRAMEWORK_COMMAND_H_
#define ATTEND_CLIENT_CLI_FRAMEWORK_COMMAND_H_

#include <functional>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "client/cli/framework/args.h"
#include "client/connection.h"

namespace attend::cli {

// Exit codes, distinct per kind of failure so that scripts can tell them apart.
enum ExitCode {
  kExitOk = 0,
  kExitLocalError = 1,   // a local file could not be read or written
  kExitUsage = 2,        // bad command line
  kExitConnection = 3,   // the server could not be reached (UNAVAILABLE)
  kExitServerError = 4,  // the call failed otherwise: an error status, DEADLINE_EXCEEDED too
  kExitNotServing = 5,   // `attend health`: a service is not SERVING
};

struct Context {
  std::vector<std::string> positional;  // the arguments that are not flags, in order
  client::ConnectionOptions connection;
  bool json = false;        // --json or -o json
  bool wide = false;        // -o wide: every column of a table
  bool no_headers = false;  // --no_headers
  // How the command sends tensors (--wire), for the hint when a message is over a size limit.
  std::string wire = "f32";
  std::ostream* out = &std::cout;
  std::ostream* err = &std::cerr;
  // Whether *err is a terminal: progress lines and "working..." notes (render/terminal_notes.h) are
  // drawn only then.
  bool err_is_terminal = false;
  // How long a call may take before its "working..." note.
  absl::Duration working_note_after = absl::Seconds(1);

  // A channel to connection.target, created on first use.
  std::shared_ptr<grpc::Channel> Channel();

 private:
  std::shared_ptr<grpc::Channel> channel_;
};

// Command::max_positional for commands that check their positional arguments themselves.
inline constexpr int kAnyPositional = -1;

// What runs a command, once its flags are parsed into the options struct it holds.
using Runner = std::function<int(Context&)>;

struct Command {
  std::string name;
  std::string summary;
  std::string usage;    // e.g. "attend softmax <logit>... [--jacobian]"
  std::string details;  // longer help, examples included
  // Declares the command's flags on its CLI::App, bound to an options struct that the returned
  // Runner owns; the Runner runs the command with them parsed. Made by Define. A group's is null:
  // its subcommands run.
  std::function<Runner(Flags&)> define = nullptr;
  // A command group's members, named "<group> <sub>", which RunCli makes CLI11 subcommands.
  std::vector<Command> subcommands = {};
  // How many positional arguments RunCli lets through; more are a usage error naming the first
  // stray one. kAnyPositional leaves them to the command.
  int max_positional = 0;
  // False for the commands that never talk to a server (help, version, completion): RunCli
  // does not read the connection flags for them.
  bool connects = true;
  // What shell completion offers for the first positional argument (e.g. example names).
  std::vector<std::string> positional_words = {};
  // A group's flags as its help lists them, from its subcommands' `flags`.
  std::vector<FlagSpec> (*group_flags)(const std::vector<Command>& subcommands) = nullptr;
  // The flags as help and completion show them: RunCli reads them back from the CLI::App that
  // `define` declared them on (a group's from `group_flags`).
  std::vector<FlagSpec> flags = {};
};

// Command::define for `Options`, a struct of the command's flags with their defaults and a
// `void Declare(Flags&)` that binds them: `run` gets them parsed. The options live as long as
// the Runner, so that CLI11 may write to them while it parses.
template <typename Options>
std::function<Runner(Flags&)> Define(int (*run)(Context&, const Options&)) {
  return [run](Flags& flags) -> Runner {
    auto options = std::make_shared<Options>();
    options->Declare(flags);
    return [run, options](Context& c) { return run(c, *options); };
  };
}

// Command::define for a command without flags of its own.
inline std::function<Runner(Flags&)> Define(Runner run) {
  return [run](Flags&) { return run; };
}

// Errors, printed on Context::err; each returns its exit code. (A call to the server that
// failed is reported by ReportError, client/cli/connect/report_error.h, with hints.)
// For errors in the command line itself: "usage error: <message>", kExitUsage.
int UsageError(Context& context, const absl::Status& status);
// For local files that cannot be read, parsed or written: "error: <message>", kExitLocalError.
int LocalError(Context& context, const absl::Status& status);

}  // namespace attend::cli

#endif  // ATTEND_CLIENT_CLI_FRAMEWORK_COMMAND_H_
