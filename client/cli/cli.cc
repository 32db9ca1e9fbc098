#include "client/cli/cli.h"

#include <algorithm>
#include <cstdlib>
#include <iostream>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/strip.h"
#include "absl/time/time.h"
#include "client/attention_client.h"
#include "client/cli/command.h"
#include "client/cli/completion.h"
#include "client/cli/example_command.h"
#include "client/cli/format.h"
#include "common/version.h"

namespace attend::cli {
namespace {

std::vector<FlagSpec> GlobalFlags() {
  return {
      {"target", "server address (env ATTEND_TARGET)", false, "localhost:50051"},
      {"deadline", "seconds each call may take (env ATTEND_DEADLINE)", false, "30"},
      {"max_message_bytes", "largest message (env ATTEND_MAX_MESSAGE_BYTES)", false, "67108864"},
      {"tls", "connect with TLS (env ATTEND_TLS=1)", true},
      {"ca_cert", "PEM of the CA that signed the server's certificate (env ATTEND_CA_CERT)", false,
       "the system's roots"},
      {"client_cert", "mutual TLS: this client's PEM certificate (env ATTEND_CLIENT_CERT)"},
      {"client_key", "mutual TLS: its PEM private key (env ATTEND_CLIENT_KEY)"},
      {"tls_server_name",
       "name to check the server's certificate against (env "
       "ATTEND_TLS_SERVER_NAME)",
       false, "the target's host"},
      {"token_file",
       "file holding a bearer token, sent as 'authorization: Bearer <token>' "
       "(env ATTEND_TOKEN_FILE)"},
      {"token",
       "the bearer token itself; prefer --token_file or ATTEND_TOKEN, which other "
       "users cannot see in the process list"},
      {"keepalive_seconds",
       "HTTP/2 keepalive ping interval, 0 = off, else >= 10 (env "
       "ATTEND_KEEPALIVE_SECONDS)",
       false, "0"},
      {"json",
       "print JSON instead of tables (the same as -o json); 64-bit integers are numbers up to "
       "2^53, strings beyond",
       true},
      {"output",
       "-o: table, json (the same as --json) or wide (every column of a table, however wide)",
       false,
       "table",
       {"table", "json", "wide"}},
      {"no_headers", "tables without their header line (and without notes below them)", true},
      {"help", "show help", true},
      {"version", "print the client's version and commit ('attend version' adds the server's)",
       true},
  };
}

std::string Env(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

// A string option: the flag, else the environment variable, else "".
std::string FlagOrEnv(const Args& args, const char* flag, const char* env) {
  return args.Has(flag) ? args.GetString(flag) : Env(env);
}

// --tls, the PEM files of --ca_cert, --client_cert and --client_key (which need --tls), and
// --tls_server_name, each else from its ATTEND_* variable. Returns kExitOk, or reports the
// problem and returns its exit code.
int TlsFromFlags(Context& c) {
  const Args& args = c.args;
  client::TlsOptions& tls_options = c.connection.tls;
  if (args.Has("tls")) {
    tls_options.enabled = args.GetBool("tls");
  } else if (!Env("ATTEND_TLS").empty()) {
    const std::string tls = absl::AsciiStrToLower(Env("ATTEND_TLS"));
    if (tls != "1" && tls != "0" && tls != "true" && tls != "false") {
      return UsageError(c, absl::InvalidArgumentError("ATTEND_TLS must be 1, 0, true or false"));
    }
    tls_options.enabled = tls == "1" || tls == "true";
  }
  for (const auto& [flag, env, target] :
       {std::tuple{"ca_cert", "ATTEND_CA_CERT", &tls_options.ca_cert_pem},
        std::tuple{"client_cert", "ATTEND_CLIENT_CERT", &tls_options.client_cert_pem},
        std::tuple{"client_key", "ATTEND_CLIENT_KEY", &tls_options.client_key_pem}}) {
    const std::string path = FlagOrEnv(args, flag, env);
    if (path.empty()) continue;
    if (!tls_options.enabled) {
      return UsageError(
          c, absl::InvalidArgumentError(absl::StrCat("--", flag, " (or ", env, ") needs --tls")));
    }
    absl::StatusOr<std::string> pem = client::ReadPemFile(path, absl::StrCat("--", flag));
    if (!pem.ok()) return LocalError(c, pem.status());
    *target = *std::move(pem);
  }
  tls_options.server_name = FlagOrEnv(args, "tls_server_name", "ATTEND_TLS_SERVER_NAME");
  return kExitOk;
}

// The bearer token: read from --token_file, or --token itself, each else from its ATTEND_*
// variable; giving both is a usage error. Returns kExitOk, or reports the problem and returns its
// exit code.
int TokenFromFlags(Context& c) {
  const Args& args = c.args;
  client::ConnectionOptions& o = c.connection;
  const std::string token_file = FlagOrEnv(args, "token_file", "ATTEND_TOKEN_FILE");
  const std::string token = args.Has("token") ? args.GetString("token") : Env("ATTEND_TOKEN");
  if (!token_file.empty() && !token.empty()) {
    return UsageError(c, absl::InvalidArgumentError(
                             "give the token once: --token_file (ATTEND_TOKEN_FILE) or --token "
                             "(ATTEND_TOKEN)"));
  }
  if (!token_file.empty()) {
    absl::StatusOr<std::string> read = client::ReadTokenFile(token_file);
    if (!read.ok()) return LocalError(c, read.status());
    o.bearer_token = *std::move(read);
  } else {
    o.bearer_token = token;
  }
  return kExitOk;
}

// host:port targets whose port gRPC would misread: a port past 65535 wraps around to another
// one (118947 reaches 53411), and an empty target fails as a "secure channel" error. Targets
// with a scheme (unix:, dns:///) are gRPC's to check.
absl::Status CheckTarget(const std::string& target) {
  if (target.empty()) {
    return absl::InvalidArgumentError("--target is empty; give host:port (e.g. localhost:50051)");
  }
  if (absl::StrContains(target, "://") || absl::StartsWith(target, "unix:")) {
    return absl::OkStatus();
  }
  const size_t colon = target.rfind(':');
  if (colon == std::string::npos || target.back() == ']') return absl::OkStatus();  // no port
  const std::string port = target.substr(colon + 1);
  int64_t value = 0;
  if (port.empty() || !absl::SimpleAtoi(port, &value) || value < 0 || value > 65535 ||
      port.find_first_not_of("0123456789") != std::string::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("--target ", target, ": the port must be a number in [0, 65535]"));
  }
  return absl::OkStatus();
}

// The connection options from the global flags and their ATTEND_* variables (a flag wins).
// Returns kExitOk, or reports the problem and returns its exit code: usage for flags that do
// not fit together, local error for files that cannot be read.
int ConnectionFromFlags(Context& c) {
  const Args& args = c.args;
  client::ConnectionOptions& o = c.connection;
  o.target = args.Has("target") ? args.GetString("target")
                                : (Env("ATTEND_TARGET").empty() ? o.target : Env("ATTEND_TARGET"));
  if (absl::Status s = CheckTarget(o.target); !s.ok()) return UsageError(c, s);
  double deadline_seconds = 30;
  if (!Env("ATTEND_DEADLINE").empty() && !ParseDecimal(Env("ATTEND_DEADLINE"), &deadline_seconds)) {
    return UsageError(c, absl::InvalidArgumentError("ATTEND_DEADLINE must be a number of seconds"));
  }
  absl::StatusOr<double> deadline = args.GetDouble("deadline", deadline_seconds);
  if (!deadline.ok()) return UsageError(c, deadline.status());
  if (!(*deadline > 0) || *deadline > 1e9) {
    return UsageError(c, absl::InvalidArgumentError("--deadline must be positive"));
  }
  o.deadline = absl::Seconds(*deadline);
  int64_t max_message = o.max_message_bytes;
  if (!Env("ATTEND_MAX_MESSAGE_BYTES").empty() &&
      !absl::SimpleAtoi(Env("ATTEND_MAX_MESSAGE_BYTES"), &max_message)) {
    return UsageError(c, absl::InvalidArgumentError("ATTEND_MAX_MESSAGE_BYTES must be an integer"));
  }
  absl::StatusOr<int64_t> max = args.GetInt("max_message_bytes", max_message);
  if (!max.ok()) return UsageError(c, max.status());
  if (*max < 1)
    return UsageError(c, absl::InvalidArgumentError("--max_message_bytes must be >= 1"));
  o.max_message_bytes = *max;

  if (int code = TlsFromFlags(c); code != kExitOk) return code;
  if (int code = TokenFromFlags(c); code != kExitOk) return code;

  double keepalive = 0;
  if (!Env("ATTEND_KEEPALIVE_SECONDS").empty() &&
      !ParseDecimal(Env("ATTEND_KEEPALIVE_SECONDS"), &keepalive)) {
    return UsageError(
        c, absl::InvalidArgumentError("ATTEND_KEEPALIVE_SECONDS must be a number of seconds"));
  }
  absl::StatusOr<double> keepalive_flag = args.GetDouble("keepalive_seconds", keepalive);
  if (!keepalive_flag.ok()) return UsageError(c, keepalive_flag.status());
  if (!(*keepalive_flag >= 0) || *keepalive_flag > 1e9) {
    return UsageError(c, absl::InvalidArgumentError("--keepalive_seconds must be >= 0"));
  }
  o.keepalive = absl::Seconds(*keepalive_flag);
  if (absl::Status s = client::ValidateConnectionOptions(o); !s.ok()) return UsageError(c, s);
  return kExitOk;
}

std::string Overview(const std::vector<Command>& commands) {
  std::string out =
      "attend: talk to an attend server (attention, KV caches, capacity planning).\n\n"
      "usage: attend [global flags] <command> [flags] [args]\n\ncommands:\n";
  for (const Command& c : commands) {
    absl::StrAppend(&out, PadRight("  " + c.name, 12), " ", c.summary, "\n");
  }
  absl::StrAppend(&out, "\nglobal flags:\n", FlagsHelp(GlobalFlags()),
                  "\nexit codes: 0 ok, 1 local file error, 2 usage, 3 server unreachable, "
                  "4 server error, 5 not serving\n"
                  "Run 'attend help <command>' (or 'attend <command> --help') for a command's "
                  "flags and examples.\n");
  return out;
}

std::string CommandHelp(const Command& c) {
  return absl::StrCat(c.summary, "\n\nusage: ", c.usage, "\n\n", c.details, "\nflags:\n",
                      FlagsHelp(c.flags), "\nglobal flags:\n", FlagsHelp(GlobalFlags()));
}

// "unknown <what> '<word>'", with "; did you mean '<name>'?" when one of `commands` is close.
std::string Unknown(absl::string_view what, const std::string& word,
                    const std::vector<Command>& commands, absl::string_view prefix = "") {
  std::vector<std::string> names;
  for (const Command& c : commands) names.emplace_back(absl::StripPrefix(c.name, prefix));
  const std::string guess = DidYouMean(word, names);
  return absl::StrCat("unknown ", what, " '", word, "'",
                      guess.empty() ? "" : absl::StrCat("; did you mean '", guess, "'?"));
}

// `attend help [<command> [<subcommand>]]`.
int RunHelp(Context& c, const std::vector<Command>& commands) {
  const std::vector<std::string>& words = c.args.positional();
  if (words.empty()) {
    *c.out << Overview(commands);
    return kExitOk;
  }
  const auto command = std::find_if(commands.begin(), commands.end(),
                                    [&](const Command& x) { return x.name == words[0]; });
  if (command == commands.end()) {
    return UsageError(c, absl::InvalidArgumentError(Unknown("command", words[0], commands)));
  }
  if (words.size() == 1) {
    *c.out << CommandHelp(*command);
    return kExitOk;
  }
  const std::string name = command->name + " " + words[1];
  for (const Command& sub : command->subcommands) {
    if (sub.name == name) {
      *c.out << CommandHelp(sub);
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

// `attend completion bash|zsh`.
int RunCompletion(Context& c, const std::vector<Command>& commands) {
  const std::vector<std::string>& shell = c.args.positional();
  if (shell.size() == 1 && shell[0] == "bash") {
    *c.out << BashCompletion(commands, GlobalFlags());
  } else if (shell.size() == 1 && shell[0] == "zsh") {
    *c.out << ZshCompletion(commands, GlobalFlags());
  } else {
    return UsageError(c, absl::InvalidArgumentError(absl::StrCat(
                             "give a shell: attend completion bash|zsh",
                             shell.empty() ? "" : absl::StrCat("; got '", shell[0], "'"))));
  }
  return kExitOk;
}

// help, version and completion: commands of the CLI itself, which run without a server.
// `commands` is the whole table, these included, which help and completion describe.
std::vector<Command> CliCommands(const std::vector<Command>* commands) {
  std::vector<Command> cli = {
      {"help",
       "the overview, or a command's help: attend help [<command> [<subcommand>]]",
       "attend help [<command> [<subcommand>]]",
       "The same as 'attend --help' and 'attend <command> [<subcommand>] --help'.\n"
       "Examples:\n  attend help\n  attend help plan\n  attend help seq create\n",
       {},
       [commands](Context& c) { return RunHelp(c, *commands); },
       {},
       2},
      {"version",
       "print the client's version and, when it answers, the server's",
       "attend version",
       "The client's version line, then the server's, which every attend-server response\n"
       "carries in its initial metadata (attend-server-version), read here from one\n"
       "Health/Check of at most 2 s. An unreachable server is reported on its line and the\n"
       "exit code is still 0. --version prints the client's line alone, without a call.\n"
       "Examples:\n  attend version\n  attend version --json\n",
       {},
       RunVersion},
      {"completion",
       "print a bash or zsh completion script: source <(attend completion bash)",
       "attend completion bash|zsh",
       "Completes command names, subcommands, flags, the values of flags that take a few\n"
       "(-o table|json|wide, --example, ...) and the names of 'attend example'.\n"
       "Examples:\n  source <(attend completion bash)\n"
       "  attend completion zsh > \"${fpath[1]}/_attend\"\n",
       {},
       [commands](Context& c) { return RunCompletion(c, *commands); },
       {},
       1},
  };
  for (Command& c : cli) c.connects = c.name == "version";
  return cli;
}

// The token with `-` read as `_` in a flag's name ("--n-q=a-b" is "--n_q=a-b").
std::string NormalFlag(const std::string& token) {
  const size_t eq = token.find('=');
  return absl::StrCat(absl::StrReplaceAll(token.substr(0, eq), {{"-", "_"}}),
                      eq == std::string::npos ? "" : token.substr(eq));
}

// "'attend <command>' takes no arguments; unexpected '<first stray>' ..." when `args` has more
// positional arguments than `command` takes; "" otherwise.
std::string StrayArgument(const Command& command, const Args& args) {
  const int max = command.max_positional;
  if (max == kAnyPositional || args.positional().size() <= static_cast<size_t>(max)) return "";
  return absl::StrCat(
      "'attend ", command.name, "' takes ",
      max == 0 ? "no arguments"
               : absl::StrCat("at most ", max, max == 1 ? " argument" : " arguments"),
      "; unexpected '", args.positional()[max], "' (attend help ", command.name, ")");
}

// -o / --output and --json: sets context.json for either. Returns kExitOk, or reports a value
// other than table, json or wide, or a --json that -o contradicts, as a usage error.
int OutputFromFlags(Context& c) {
  c.json = c.args.GetBool("json");
  if (!c.args.Has("output")) return kExitOk;
  const std::string output = c.args.GetString("output");
  if (output != "table" && output != "json" && output != "wide") {
    return UsageError(c, absl::InvalidArgumentError(
                             absl::StrCat("-o/--output: '", output, "'; use table, json or wide")));
  }
  if (c.json && output != "json") {
    return UsageError(c, absl::InvalidArgumentError(
                             absl::StrCat("--json contradicts -o ", output, "; give one")));
  }
  c.json = output == "json";
  return kExitOk;
}

}  // namespace

int RunCli(const std::vector<std::string>& tokens, std::ostream& out, std::ostream& err,
           const CliOptions& options) {
  std::vector<Command> commands = HealthCommands();
  for (Command& c : AttentionCommands()) commands.push_back(std::move(c));
  for (Command& c : PlannerCommands()) commands.push_back(std::move(c));
  for (Command& c : SeqCommands()) commands.push_back(std::move(c));
  for (Command& c : BenchCommands()) commands.push_back(std::move(c));
  for (Command& c : ExampleCommands()) commands.push_back(std::move(c));
  for (Command& c : CliCommands(&commands)) commands.push_back(std::move(c));
  const std::vector<FlagSpec> globals = GlobalFlags();

  // The command is the first token that is neither a flag nor a global flag's value.
  const Command* command = nullptr;
  std::vector<std::string> rest;
  for (size_t i = 0; i < tokens.size(); ++i) {
    const std::string& t = tokens[i];
    if (command == nullptr && t.size() >= 2 && t[0] == '-') {  // Args::Parse reads it
      rest.push_back(t);
      if (t == "-o" && i + 1 < tokens.size()) rest.push_back(tokens[++i]);  // -o json
      if (t.rfind("--", 0) != 0) continue;
      const std::string name = NormalFlag(t).substr(
          2, t.find('=') == std::string::npos ? std::string::npos : t.find('=') - 2);
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
        err << "usage error: " << Unknown("command", t, commands)
            << "\nRun 'attend help' for the commands.\n";
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
  if (args->GetBool("version")) {
    out << VersionLine("attend") << "\n";
    return kExitOk;
  }
  if (command == nullptr) {
    out << Overview(commands);
    return args->GetBool("help") ? kExitOk : kExitUsage;
  }
  if (args->GetBool("help")) {
    // A command group documents each subcommand: `attend seq append --help`.
    if (!command->subcommands.empty() && !args->positional().empty()) {
      std::vector<std::string> names;
      for (const Command& sub : command->subcommands) {
        if (sub.name == command->name + " " + args->positional()[0]) {
          out << CommandHelp(sub);
          return kExitOk;
        }
        names.push_back(sub.name.substr(command->name.size() + 1));
      }
      // Help for a subcommand that does not exist is a usage error, as running it is.
      err << "usage error: unknown subcommand '" << args->positional()[0] << "'; use one of "
          << absl::StrJoin(names, ", ") << "\n";
      return kExitUsage;
    }
    out << CommandHelp(*command);
    return kExitOk;
  }
  if (const std::string stray = StrayArgument(*command, *args); !stray.empty()) {
    err << "usage error: " << stray << "\n";
    return kExitUsage;
  }

  Context context;
  context.out = &out;
  context.err = &err;
  context.err_is_terminal = options.err_is_terminal;
  context.working_note_after = options.working_note_after;
  context.args = *std::move(args);
  if (int code = OutputFromFlags(context); code != kExitOk) return code;
  if (command->connects) {
    if (int code = ConnectionFromFlags(context); code != kExitOk) return code;
  }
  return command->run(context);
}

}  // namespace attend::cli
