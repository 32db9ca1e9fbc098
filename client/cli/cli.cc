#include "client/cli/cli.h"

#include <cstdlib>
#include <iostream>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "client/cli/command.h"

namespace attend::cli {
namespace {

std::vector<FlagSpec> GlobalFlags() {
  return {
      {"target", "server address (env ATTEND_TARGET)", false, "localhost:50051"},
      {"deadline", "seconds each call may take (env ATTEND_DEADLINE)", false, "30"},
      {"max_message_bytes", "largest message (env ATTEND_MAX_MESSAGE_BYTES)", false, "67108864"},
      {"json", "print JSON instead of tables", true},
      {"help", "show help", true},
  };
}

std::string Overview(const std::vector<Command>& commands) {
  std::string out =
      "attend: talk to an attend server (attention, KV caches, capacity planning).\n\n"
      "usage: attend [global flags] <command> [flags] [args]\n\ncommands:\n";
  for (const Command& c : commands) {
    std::string name = "  " + c.name;
    if (name.size() < 12) name.resize(12, ' ');
    absl::StrAppend(&out, name, " ", c.summary, "\n");
  }
  absl::StrAppend(&out, "\nglobal flags:\n", FlagsHelp(GlobalFlags()),
                  "\nexit codes: 0 ok, 1 local file error, 2 usage, 3 server unreachable, "
                  "4 server error, 5 not serving\n"
                  "Run 'attend <command> --help' for a command's flags and examples.\n");
  return out;
}

std::string CommandHelp(const Command& c) {
  return absl::StrCat(c.summary, "\n\nusage: ", c.usage, "\n\n", c.details, "\nflags:\n",
                      FlagsHelp(c.flags), "\nglobal flags:\n", FlagsHelp(GlobalFlags()));
}

}  // namespace

int RunCli(const std::vector<std::string>& tokens, std::ostream& out, std::ostream& err) {
  std::vector<Command> commands = AttentionCommands();
  for (Command& c : PlannerCommands()) commands.push_back(std::move(c));
  for (Command& c : SeqCommands()) commands.push_back(std::move(c));
  const std::vector<FlagSpec> globals = GlobalFlags();

  // The command is the first token that is neither a flag nor a global flag's value.
  const Command* command = nullptr;
  std::vector<std::string> rest;
  for (size_t i = 0; i < tokens.size(); ++i) {
    const std::string& t = tokens[i];
    if (command == nullptr && t.rfind("--", 0) == 0) {
      rest.push_back(t);
      const std::string name =
          t.substr(2, t.find('=') == std::string::npos ? std::string::npos : t.find('=') - 2);
      for (const FlagSpec& g : globals) {
        if (g.name == name && !g.is_bool && t.find('=') == std::string::npos &&
            i + 1 < tokens.size()) {
          rest.push_back(tokens[++i]);
        }
      }
      continue;
    }
    if (command == nullptr) {
      for (const Command& c : commands) {
        if (c.name == t) command = &c;
      }
      if (command == nullptr) {
        err << "usage error: unknown command '" << t << "'\n\n" << Overview(commands);
        return kExitUsage;
      }
      continue;
    }
    rest.push_back(t);
  }

  std::vector<FlagSpec> specs = globals;
  if (command) specs.insert(specs.end(), command->flags.begin(), command->flags.end());
  absl::StatusOr<Args> args = Args::Parse(rest, specs);
  if (!args.ok()) {
    err << "usage error: " << args.status().message() << "\n";
    return kExitUsage;
  }
  if (command == nullptr) {
    out << Overview(commands);
    return args->GetBool("help") ? kExitOk : kExitUsage;
  }
  if (args->GetBool("help")) {
    // A command group documents each subcommand: `attend seq append --help`.
    if (!command->subcommands.empty() && !args->positional().empty()) {
      for (const Command& sub : command->subcommands) {
        if (sub.name == command->name + " " + args->positional()[0]) {
          out << CommandHelp(sub);
          return kExitOk;
        }
      }
    }
    out << CommandHelp(*command);
    return kExitOk;
  }

  Context context;
  context.out = &out;
  context.err = &err;
  context.args = *std::move(args);
  context.json = context.args.GetBool("json");
  auto env = [](const char* name) -> std::string {
    const char* v = std::getenv(name);
    return v ? v : "";
  };
  context.connection.target = context.args.GetString(
      "target", env("ATTEND_TARGET").empty() ? "localhost:50051" : env("ATTEND_TARGET"));
  double deadline_seconds = 30;
  if (!env("ATTEND_DEADLINE").empty() &&
      !absl::SimpleAtod(env("ATTEND_DEADLINE"), &deadline_seconds)) {
    return UsageError(context,
                      absl::InvalidArgumentError("ATTEND_DEADLINE must be a number of seconds"));
  }
  absl::StatusOr<double> deadline = context.args.GetDouble("deadline", deadline_seconds);
  if (!deadline.ok()) return UsageError(context, deadline.status());
  if (!(*deadline > 0)) {
    return UsageError(context, absl::InvalidArgumentError("--deadline must be positive"));
  }
  context.connection.deadline = absl::Seconds(*deadline);
  int64_t max_message = context.connection.max_message_bytes;
  if (!env("ATTEND_MAX_MESSAGE_BYTES").empty() &&
      !absl::SimpleAtoi(env("ATTEND_MAX_MESSAGE_BYTES"), &max_message)) {
    return UsageError(context,
                      absl::InvalidArgumentError("ATTEND_MAX_MESSAGE_BYTES must be an integer"));
  }
  absl::StatusOr<int64_t> max = context.args.GetInt("max_message_bytes", max_message);
  if (!max.ok()) return UsageError(context, max.status());
  context.connection.max_message_bytes = *max;
  return command->run(context);
}

}  // namespace attend::cli
