#include "client/cli/cli.h"

#include <algorithm>
#include <cstdlib>
#include <iostream>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/strip.h"
#include "absl/time/time.h"
#include "client/attention_client.h"
#include "client/cli/bench/bench_command.h"
#include "client/cli/commands/commands.h"
#include "client/cli/connect/connection_flags.h"
#include "client/cli/framework/command.h"
#include "client/cli/framework/completion.h"
#include "client/cli/lessons/example_command.h"
#include "client/cli/render/format.h"
#include "common/version/version.h"

namespace attend::cli {
namespace {

// The global flags: the connection's (connection_flags.h), the output's, --help and --version.
struct GlobalOptions {
  ConnectionFlags connection;
  bool json = false;
  std::optional<std::string> output;  // unset: table; -o table with --json contradicts it
  bool no_headers = false;
  bool help = false;
  bool version = false;

  void Declare(Flags& f) {
    connection.Declare(f);
    f.Add("json", &json,
          "print JSON instead of tables (the same as -o json); 64-bit integers are numbers up to "
          "2^53, strings beyond");
    f.Add("output", &output,
          "-o: table, json (the same as --json) or wide (every column of a table, however wide)")
        .Values({"table", "json", "wide"}, "-o/--output: '%s'; use table, json or wide")
        .Shown("table");
    f.Add("no_headers", &no_headers,
          "tables without their header line (and without notes below them)");
    f.Add("help", &help, "show help");
    f.Add("version", &version,
          "print the client's version and commit ('attend version' adds the server's)");
  }
};

std::string Overview(const std::vector<Command>& commands, const std::vector<FlagSpec>& globals) {
  std::string out =
      "attend: talk to an attend server (attention, KV caches, capacity planning).\n\n"
      "usage: attend [global flags] <command> [flags] [args]\n\ncommands:\n";
  for (const Command& c : commands) {
    absl::StrAppend(&out, PadRight("  " + c.name, 12), " ", c.summary, "\n");
  }
  absl::StrAppend(&out, "\nglobal flags:\n", FlagsHelp(globals),
                  "\nexit codes: 0 ok, 1 local file error, 2 usage, 3 server unreachable, "
                  "4 server error, 5 not serving\n"
                  "Run 'attend help <command>' (or 'attend <command> --help') for a command's "
                  "flags and examples.\n");
  return out;
}

std::string CommandHelp(const Command& c, const std::vector<FlagSpec>& globals) {
  return absl::StrCat(c.summary, "\n\nusage: ", c.usage, "\n\n", c.details, "\nflags:\n",
                      FlagsHelp(c.flags), "\nglobal flags:\n", FlagsHelp(globals));
}

// "unknown <what> '<word>'", with "; did you mean '<name>'?" when one of `commands` is close.
std::string Unknown(absl::string_view what, const std::string& word,
                    const std::vector<Command>& commands, absl::string_view prefix = "") {
  std::vector<std::string> names;
  for (const Command& c : commands) names.emplace_back(absl::StripPrefix(c.name, prefix));
  return absl::StrCat("unknown ", what, " '", word, "'", DidYouMeanSuffix(word, names));
}

// `attend help [<command> [<subcommand>]]`.
int RunHelp(Context& c, const std::vector<Command>& commands,
            const std::vector<FlagSpec>& globals) {
  const std::vector<std::string>& words = c.positional;
  if (words.empty()) {
    *c.out << Overview(commands, globals);
    return kExitOk;
  }
  const auto command = std::find_if(commands.begin(), commands.end(),
                                    [&](const Command& x) { return x.name == words[0]; });
  if (command == commands.end()) {
    return UsageError(c, absl::InvalidArgumentError(Unknown("command", words[0], commands)));
  }
  if (words.size() == 1) {
    *c.out << CommandHelp(*command, globals);
    return kExitOk;
  }
  const std::string name = command->name + " " + words[1];
  for (const Command& sub : command->subcommands) {
    if (sub.name == name) {
      *c.out << CommandHelp(sub, globals);
      return kExitOk;
    }
  }
  if (command->subcommands.empty()) {
    return UsageError(
        c, absl::InvalidArgumentError(absl::StrCat(
               "'attend ", command->name, "' has no subcommands; unexpected '", words[1], "'")));
  }
  return UsageError(c, absl::InvalidArgumentError(Unknown(
                           "subcommand", words[1], command->subcommands, command->name + " ")));
}

// `attend version`: "client: <line>" and "server <target>: <line>", or why the server's line is
// missing; exits 0 either way, since the client's version is what was asked for first.
int RunVersion(Context& c) {
  const std::string client_line = VersionLine("attend");
  const std::string& target = c.connection.target;
  absl::StatusOr<client::ServerProbe> probe =
      client::ProbeServer(c.Channel(), std::min(c.connection.deadline, absl::Seconds(2)));
  const std::string why = probe.ok() ? ""
                                     : absl::StrCat(absl::StatusCodeToString(probe.status().code()),
                                                    ": ", probe.status().message());
  if (c.json) {
    *c.out << "{\"client\": " << JsonString(client_line)
           << ", \"server\": {\"target\": " << JsonString(target) << ", \"version\": "
           << (probe.ok() && !probe->version.empty() ? JsonString(probe->version) : "null")
           << ", \"error\": " << (probe.ok() ? "null" : JsonString(why)) << "}}\n";
    return kExitOk;
  }
  *c.out << "client: " << client_line << "\nserver " << target << ": ";
  if (!probe.ok()) {
    *c.out << "not reachable (" << why << ")\n";
  } else if (probe->version.empty()) {
    *c.out << "reachable, but it sends no version (an attend-server older than the "
              "attend-server-version metadata)\n";
  } else {
    *c.out << probe->version << "\n";
  }
  return kExitOk;
}

// `attend completion bash|zsh`: the scripts for `root`, the CLI::App of `commands`.
int RunCompletion(Context& c, const CLI::App& root, const std::vector<Command>& commands) {
  const std::vector<std::string>& shell = c.positional;
  PositionalWords words;
  for (const Command& command : commands) words[command.name] = command.positional_words;
  if (shell.size() == 1 && shell[0] == "bash") {
    *c.out << BashCompletion(root, words);
  } else if (shell.size() == 1 && shell[0] == "zsh") {
    *c.out << ZshCompletion(root, words);
  } else {
    return UsageError(c, absl::InvalidArgumentError(absl::StrCat(
                             "give a shell: attend completion bash|zsh",
                             shell.empty() ? "" : absl::StrCat("; got '", shell[0], "'"))));
  }
  return kExitOk;
}

// help, version and completion: commands of the CLI itself, which run without a server.
// `commands` is the whole table, these included, which help and completion describe with
// `globals` and `root` (the CLI::App of them all); all are filled in before any runs.
std::vector<Command> CliCommands(const std::vector<Command>* commands,
                                 const std::vector<FlagSpec>* globals, const CLI::App* root) {
  std::vector<Command> cli = {
      {"help",
       "the overview, or a command's help: attend help [<command> [<subcommand>]]",
       "attend help [<command> [<subcommand>]]",
       "The same as 'attend --help' and 'attend <command> [<subcommand>] --help'.\n"
       "Examples:\n  attend help\n  attend help plan\n  attend help seq create\n",
       Define([commands, globals](Context& c) { return RunHelp(c, *commands, *globals); }),
       {},
       2},
      {"version", "print the client's version and, when it answers, the server's", "attend version",
       "The client's version line, then the server's, which every attend-server response\n"
       "carries in its initial metadata (attend-server-version), read here from one\n"
       "Health/Check of at most 2 s. An unreachable server is reported on its line and the\n"
       "exit code is still 0. --version prints the client's line alone, without a call.\n"
       "Examples:\n  attend version\n  attend version --json\n",
       Define(RunVersion)},
      {"completion",
       "print a bash or zsh completion script: source <(attend completion bash)",
       "attend completion bash|zsh",
       "Completes command names, subcommands, flags, the values of flags that take a few\n"
       "(-o table|json|wide, --example, ...) and the names of 'attend example'.\n"
       "Examples:\n  source <(attend completion bash)\n"
       "  attend completion zsh > \"${fpath[1]}/_attend\"\n",
       Define([root, commands](Context& c) { return RunCompletion(c, *root, *commands); }),
       {},
       1},
  };
  for (Command& c : cli) c.connects = c.name == "version";
  return cli;
}

// "'attend <command>' takes no arguments; unexpected '<first stray>' ..." when `positional`
// holds more arguments than `command` takes; "" otherwise.
std::string StrayArgument(const Command& command, const std::vector<std::string>& positional) {
  const int max = command.max_positional;
  if (max == kAnyPositional || positional.size() <= static_cast<size_t>(max)) return "";
  return absl::StrCat("'attend ", command.name, "' takes ",
                      max == 0
                          ? "no arguments"
                          : absl::StrCat("at most ", max, max == 1 ? " argument" : " arguments"),
                      "; unexpected '", positional[max], "' (attend help ", command.name, ")");
}

// The usage error for a group (`seq`) given without one of its subcommands; `positional` holds
// what was given instead, if anything.
std::string MissingSubcommand(const Command& group, const std::vector<std::string>& positional) {
  std::vector<std::string> names;
  for (const Command& sub : group.subcommands) {
    names.emplace_back(absl::StripPrefix(sub.name, group.name + " "));
  }
  if (positional.empty()) {
    return absl::StrCat("give a subcommand: ", absl::StrJoin(names, ", "), " (attend ", group.name,
                        " --help)");
  }
  const std::string guess = DidYouMeanSuffix(positional[0], names);
  return absl::StrCat(
      "unknown subcommand '", positional[0], "'",
      guess.empty() ? absl::StrCat("; use one of ", absl::StrJoin(names, ", ")) : guess);
}

// --json, -o / --output (CLI11 checked its value) and --no_headers into `c`. Returns kExitOk,
// or reports a --json that -o contradicts as a usage error.
int OutputFromFlags(Context& c, const GlobalOptions& g) {
  c.json = g.json;
  c.no_headers = g.no_headers;
  if (!g.output) return kExitOk;
  if (c.json && *g.output != "json") {
    return UsageError(c, absl::InvalidArgumentError(
                             absl::StrCat("--json contradicts -o ", *g.output, "; give one")));
  }
  c.json = *g.output == "json";
  c.wide = *g.output == "wide";
  return kExitOk;
}

// Declares `command`'s flags on `app` (and its subcommands' on subcommands of it), records the
// Runner of each app in `runners`, and fills in Command::flags from the apps for help and
// completion.
void DeclareCommand(CLI::App* app, Command& command,
                    std::map<const CLI::App*, std::pair<Command*, Runner>>& runners) {
  Runner run;
  if (command.define) {
    Flags flags(app);
    run = command.define(flags);
  }
  command.flags = FlagsOf(*app);
  runners[app] = {&command, run};
  for (Command& sub : command.subcommands) {
    const std::string name(absl::StripPrefix(sub.name, command.name + " "));
    DeclareCommand(app->add_subcommand(name, sub.summary), sub, runners);
  }
  if (command.group_flags) command.flags = command.group_flags(command.subcommands);
}

}  // namespace

int RunCli(const std::vector<std::string>& tokens, std::ostream& out, std::ostream& err,
           const CliOptions& options) {
  std::vector<Command> commands = HealthCommands();
  std::vector<FlagSpec> globals;
  for (Command& c : AttentionCommands()) commands.push_back(std::move(c));
  for (Command& c : PlannerCommands()) commands.push_back(std::move(c));
  for (Command& c : SeqCommands()) commands.push_back(std::move(c));
  for (Command& c : BenchCommands()) commands.push_back(std::move(c));
  for (Command& c : ExampleCommands()) commands.push_back(std::move(c));
  CLI::App root("attend", "attend");
  for (Command& c : CliCommands(&commands, &globals, &root)) commands.push_back(std::move(c));

  root.set_help_flag();  // ours: --help, -h, and `attend help`, in the layout of FlagsHelp
  root.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  GlobalOptions g;
  Flags global_flags(&root);
  g.Declare(global_flags);
  globals = FlagsOf(root);
  std::map<const CLI::App*, std::pair<Command*, Runner>> runners;
  for (Command& c : commands) DeclareCommand(root.add_subcommand(c.name, c.summary), c, runners);

  Context context;
  context.out = &out;
  context.err = &err;
  context.err_is_terminal = options.err_is_terminal;
  context.working_note_after = options.working_note_after;
  absl::StatusOr<ParsedCommandLine> parsed = ParseCommandLine(root, tokens);
  if (!parsed.ok()) return UsageError(context, parsed.status());
  if (g.version) {
    out << VersionLine("attend") << "\n";
    return kExitOk;
  }
  if (parsed->path.size() == 1) {
    out << Overview(commands, globals);
    return g.help ? kExitOk : kExitUsage;
  }
  const auto& [command, run] = runners[parsed->path.back()];
  context.positional = parsed->positional;
  if (!command->subcommands.empty() && (!g.help || !context.positional.empty())) {
    return UsageError(context,
                      absl::InvalidArgumentError(MissingSubcommand(*command, context.positional)));
  }
  if (g.help) {
    out << CommandHelp(*command, globals);
    return kExitOk;
  }
  std::string stray = StrayArgument(*command, context.positional);
  if (parsed->path.size() == 3 && !context.positional.empty()) {
    // Subcommands of `seq`, the only group, take flags only; sequences are named by --id.
    stray = absl::StrCat("'attend ", command->name, "' takes flags only; unexpected '",
                         context.positional[0], "' (ids go in --id)");
  }
  if (!stray.empty()) return UsageError(context, absl::InvalidArgumentError(stray));

  if (int code = OutputFromFlags(context, g); code != kExitOk) return code;
  if (command->connects) {
    if (int code = ConnectionFromFlags(context, g.connection); code != kExitOk) return code;
  }
  return run(context);
}

}  // namespace attend::cli
