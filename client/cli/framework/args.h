// The attend CLI's flags on CLI11 (CLI/CLI.hpp, included by args.cc, cli.cc and completion.cc
// alone, since it is slow to compile): each command binds its flags to the typed fields of an
// options struct through Flags, so that a flag's default is written once, in the struct, and a
// misspelt field is a compile error. ParseCommandLine adds the habits CLI11 lacks before CLI11
// parses: hyphens in a flag's name read as underscores (`--n-q` is `--n_q`), `-h` is `--help`,
// `-o` is `--output`, negative numbers (-1.5, -inf) are positional arguments, flags may come
// before the subcommand they belong to, and unknown flags are refused with a suggestion when one
// is close.
//
// Thread-safety: Flags, Flag and ParseCommandLine write to the CLI::App and the fields bound to
// it, which belong to one parse on one thread (ParseCommandLine also reads the environment, for
// Flag::Env); the other free functions are pure.
#ifndef ATTEND_CLIENT_CLI_FRAMEWORK_ARGS_H_
#define ATTEND_CLIENT_CLI_FRAMEWORK_ARGS_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/byte_size.h"

namespace CLI {
class App;
class Option;
}  // namespace CLI

namespace attend::cli {

// One flag as help and completion show it, read back from its CLI::App by FlagsOf.
struct FlagSpec {
  std::string name;  // without the dashes: "n_q"
  std::string help;
  bool is_bool = false;
  std::string default_value;  // shown in help; empty = none
  // The values the flag takes, when they are a fixed few: what shell completion offers after it
  // (others complete file names).
  std::vector<std::string> values = {};
};

// A flag declared by Flags, to refine: its range, its few values, its environment variable.
class Flag {
 public:
  explicit Flag(CLI::Option* option) : option_(option) {}
  // Values outside [min, max] are refused: "--<name> must be between <min> and <max>, got <v>".
  Flag& Range(int64_t min, int64_t max);
  // The values shell completion offers after the flag. With `error`, others are refused with it
  // ("<error>" in full, e.g. "-o/--output: 'x'; use table, json or wide", where '%s' is the
  // value given); without, the command checks them.
  Flag& Values(std::vector<std::string> values, std::string error = "");
  // The value when the flag is not given, if `variable` is set in the environment.
  Flag& Env(const std::string& variable);
  // Replaces what help shows as the default (e.g. "n_q" for one that follows another flag).
  Flag& Shown(const std::string& default_text);

 private:
  CLI::Option* option_;
};

// A flag's value (its default until parsed) and whether the command line gave it: for flags
// whose presence matters, e.g. one that conflicts with another.
template <typename T>
struct Given {
  T value;
  bool given = false;
};

// Declares flags on one CLI::App, each bound to a field that must outlive the parse. A field's
// value when declared is the default; help shows it unless it is empty, false or unset (an
// std::optional field is "not given" until parsed: for defaults that follow other flags).
// Integers are decimal (SimpleAtoi: "010" is ten, not octal) and numbers refuse hexadecimal
// ("0x10" is a typo on a command line); their errors name the flag: "--n_q needs an integer, got
// 'eight'".
class Flags {
 public:
  explicit Flags(CLI::App* app) : app_(app) {}
  Flag Add(const std::string& name, bool* value, const std::string& help);
  // Unset unless given: --name (true) or --name=false, to override a setting from elsewhere.
  Flag Add(const std::string& name, std::optional<bool>* value, const std::string& help);
  Flag Add(const std::string& name, std::string* value, const std::string& help);
  Flag Add(const std::string& name, std::optional<std::string>* value, const std::string& help);
  Flag Add(const std::string& name, int64_t* value, const std::string& help);
  Flag Add(const std::string& name, std::optional<int64_t>* value, const std::string& help);
  Flag Add(const std::string& name, Given<int64_t>* value, const std::string& help);
  Flag Add(const std::string& name, double* value, const std::string& help);
  Flag Add(const std::string& name, std::optional<double>* value, const std::string& help);
  // A byte count with an optional unit, as the server's size flags take it ("1MiB", "64 MB",
  // "1e6"; common/byte_size.h), refused with ParseByteSize's message.
  Flag Add(const std::string& name, ByteSize* value, const std::string& help);
  // Comma-separated integers, e.g. "4,64,1024".
  Flag Add(const std::string& name, std::vector<int64_t>* value, const std::string& help);

 private:
  CLI::App* app_;
};

// The flags declared on `app`, in their order.
std::vector<FlagSpec> FlagsOf(const CLI::App& app);

// A command line for `root`, parsed: the apps it names (root, command, maybe a subcommand), and
// the positional arguments. The flags went into their fields.
struct ParsedCommandLine {
  std::vector<CLI::App*> path;
  std::vector<std::string> positional;
};

// Parses `tokens` (argv without the program name) with `root` and its subcommands. The first
// word names the command (unknown: "unknown command 'x'; did you mean 'y'?"); for a command with
// subcommands, the first word after it that names one of them names it. Flags belong to the
// deepest of those apps that declares them; before the command only root's (global) flags may
// come ("--n_q is a flag of 'attend attend'; put it after the command"). INVALID_ARGUMENT for
// unknown flags, missing values, a flag of a sibling subcommand and values CLI11 refuses.
absl::StatusOr<ParsedCommandLine> ParseCommandLine(CLI::App& root,
                                                   const std::vector<std::string>& tokens);

// A decimal number as absl::SimpleAtod reads it ("1.5", "-2e3", "inf"), except that hexadecimal
// ("0x10", which strtod-style parsers accept) is refused: on a command line it is a typo.
bool ParseDecimal(absl::string_view text, double* value);

// The candidate `word` most likely meant: the closest within edit distance 2 (and less than
// `word`'s length; ties go to the first), else the only candidate that starts with `word`; ""
// when none fits.
std::string DidYouMean(absl::string_view word, const std::vector<std::string>& candidates);

// "; did you mean '<candidate>'?" for DidYouMean's candidate, "" when none fits: the one wording
// of every suggestion for a mistyped word (commands, subcommands, example names).
std::string DidYouMeanSuffix(absl::string_view word, const std::vector<std::string>& candidates);

// "--name=<value>  help (default: x)" lines for a command's help.
std::string FlagsHelp(const std::vector<FlagSpec>& specs);

}  // namespace attend::cli

#endif  // ATTEND_CLIENT_CLI_FRAMEWORK_ARGS_H_
