// Command-line arguments of the attend CLI: `--name=value`, `--name value`, boolean `--name`,
// and positional arguments (which may be negative numbers such as -1.5). Each command declares
// its flags; unknown flags are usage errors, with a suggestion when one is close. Hyphens in a
// flag's name read as underscores (`--n-q` is `--n_q`), `-h` is `--help`, `-o` is
// `--output`, and any other token of one dash that is not a number is an unknown flag.
//
// Thread-safety: Args and FlagSpec are values; Parse and FlagsHelp are pure functions.
#ifndef ATTEND_CLIENT_CLI_ARGS_H_
#define ATTEND_CLIENT_CLI_ARGS_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace attend::cli {

struct FlagSpec {
  FlagSpec(std::string name, std::string help, bool is_bool = false, std::string default_value = "",
           std::vector<std::string> values = {})
      : name(std::move(name)),
        help(std::move(help)),
        is_bool(is_bool),
        default_value(std::move(default_value)),
        values(std::move(values)) {}

  std::string name;
  std::string help;
  bool is_bool = false;
  std::string default_value;  // shown in help; empty = none
  // The values the flag takes, when they are a fixed few: what shell completion offers after
  // it (others complete file names). Parsing does not check them; the command does.
  std::vector<std::string> values;
};

class Args {
 public:
  // Parses `tokens` against `specs`. INVALID_ARGUMENT for unknown flags or missing values.
  static absl::StatusOr<Args> Parse(const std::vector<std::string>& tokens,
                                    const std::vector<FlagSpec>& specs);

  bool Has(const std::string& name) const { return values_.count(name) > 0; }
  bool GetBool(const std::string& name) const;
  std::string GetString(const std::string& name, const std::string& fallback = "") const;
  absl::StatusOr<int64_t> GetInt(const std::string& name, int64_t fallback) const;
  absl::StatusOr<double> GetDouble(const std::string& name, double fallback) const;
  // Comma-separated integers, e.g. "4,64,1024".
  absl::StatusOr<std::vector<int64_t>> GetIntList(const std::string& name) const;
  const std::vector<std::string>& positional() const { return positional_; }

 private:
  std::map<std::string, std::string> values_;
  std::vector<std::string> positional_;
};

// A decimal number as absl::SimpleAtod reads it ("1.5", "-2e3", "inf"), except that hexadecimal
// ("0x10", which strtod-style parsers accept) is refused: on a command line it is a typo.
bool ParseDecimal(absl::string_view text, double* value);

// The candidate `word` most likely meant: the closest within edit distance 2 (and less than
// `word`'s length; ties go to the first), else the only candidate that starts with `word`; ""
// when none fits.
std::string DidYouMean(absl::string_view word, const std::vector<std::string>& candidates);

// "--name=<value>  help (default: x)" lines for a command's help.
std::string FlagsHelp(const std::vector<FlagSpec>& specs);

}  // namespace attend::cli

#endif  // ATTEND_CLIENT_CLI_ARGS_H_
