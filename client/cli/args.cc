#include "client/cli/args.h"

#include <algorithm>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "client/cli/format.h"

namespace attend::cli {

namespace {

// "unknown flag <typed>", with "; did you mean --<flag>?" when a flag of `specs` is close to
// `name` (the typed name without its dashes, hyphens read as underscores).
absl::Status UnknownFlag(absl::string_view typed, const std::string& name,
                         const std::vector<FlagSpec>& specs) {
  std::vector<std::string> names;
  for (const FlagSpec& s : specs) names.push_back(s.name);
  const std::string guess = DidYouMean(name, names);
  return absl::InvalidArgumentError(absl::StrCat("unknown flag ", typed,
                                                 guess.empty() ? "" : "; did you mean --", guess,
                                                 guess.empty() ? "" : "?"));
}

// A token of one dash that is a number (or starts like one: "-0x1" is refused as a number later,
// not as a flag): a positional argument such as -1.5 or -inf.
bool IsNegativeNumber(const std::string& token) {
  double unused;
  return token.size() >= 2 &&
         (absl::ascii_isdigit(token[1]) || token[1] == '.' || ParseDecimal(token, &unused));
}

}  // namespace

absl::StatusOr<Args> Args::Parse(const std::vector<std::string>& tokens,
                                 const std::vector<FlagSpec>& specs) {
  Args args;
  bool only_positional = false;
  for (size_t i = 0; i < tokens.size(); ++i) {
    const std::string& token = tokens[i];
    if (only_positional || token.size() < 2 || token[0] != '-' || IsNegativeNumber(token)) {
      args.positional_.push_back(token);
      continue;
    }
    if (token == "--") {
      only_positional = true;
      continue;
    }
    // One dash: -h is --help and -o is --output (-o json, -o=json), else a mistyped flag.
    const bool short_output = token == "-o" || absl::StartsWith(token, "-o=");
    if (token[1] != '-' && !short_output) {
      if (token == "-h") {
        args.values_["help"] = "true";
        continue;
      }
      return UnknownFlag(token, absl::StrReplaceAll(token.substr(1), {{"-", "_"}}), specs);
    }
    std::string name = short_output ? absl::StrCat("output", token.substr(2)) : token.substr(2);
    std::optional<std::string> value;
    if (const size_t eq = name.find('='); eq != std::string::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
    }
    const std::string typed = absl::StrCat("--", name);
    absl::StrReplaceAll({{"-", "_"}}, &name);
    const FlagSpec* spec = nullptr;
    for (const FlagSpec& s : specs) {
      if (s.name == name) spec = &s;
    }
    if (spec == nullptr) return UnknownFlag(typed, name, specs);
    if (spec->is_bool) {
      if (value && *value != "true" && *value != "false") {
        return absl::InvalidArgumentError(
            absl::StrCat("--", name, " takes no value (or =true / =false), got '", *value, "'"));
      }
      args.values_[name] = value.value_or("true");
      continue;
    }
    if (!value) {
      if (i + 1 >= tokens.size()) {
        return absl::InvalidArgumentError(absl::StrCat("--", name, " needs a value"));
      }
      value = tokens[++i];
    }
    args.values_[name] = *value;
  }
  return args;
}

bool Args::GetBool(const std::string& name) const {
  auto it = values_.find(name);
  return it != values_.end() && it->second == "true";
}

std::string Args::GetString(const std::string& name, const std::string& fallback) const {
  auto it = values_.find(name);
  return it == values_.end() ? fallback : it->second;
}

absl::StatusOr<int64_t> Args::GetInt(const std::string& name, int64_t fallback) const {
  auto it = values_.find(name);
  if (it == values_.end()) return fallback;
  int64_t value;
  if (!absl::SimpleAtoi(it->second, &value)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", name, " needs an integer, got '", it->second, "'"));
  }
  return value;
}

bool ParseDecimal(absl::string_view text, double* value) {
  absl::string_view digits = absl::StripAsciiWhitespace(text);
  if (!digits.empty() && (digits[0] == '-' || digits[0] == '+')) digits.remove_prefix(1);
  if (digits.size() >= 2 && digits[0] == '0' && (digits[1] == 'x' || digits[1] == 'X')) {
    return false;
  }
  return absl::SimpleAtod(text, value);
}

absl::StatusOr<double> Args::GetDouble(const std::string& name, double fallback) const {
  auto it = values_.find(name);
  if (it == values_.end()) return fallback;
  double value;
  if (!ParseDecimal(it->second, &value)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", name, " needs a decimal number, got '", it->second, "'"));
  }
  return value;
}

absl::StatusOr<std::vector<int64_t>> Args::GetIntList(const std::string& name) const {
  std::vector<int64_t> out;
  auto it = values_.find(name);
  if (it == values_.end()) return out;
  for (absl::string_view part : absl::StrSplit(it->second, ',', absl::SkipWhitespace())) {
    int64_t value;
    if (!absl::SimpleAtoi(part, &value)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--", name, " needs comma-separated integers, got '", it->second, "'"));
    }
    out.push_back(value);
  }
  return out;
}

namespace {

// Levenshtein distance of `a` and `b`.
size_t EditDistance(absl::string_view a, absl::string_view b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t above = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = above;
    }
  }
  return row[b.size()];
}

}  // namespace

std::string DidYouMean(absl::string_view word, const std::vector<std::string>& candidates) {
  std::string best;
  size_t best_distance = std::min<size_t>(3, word.size());
  for (const std::string& c : candidates) {
    const size_t d = EditDistance(word, c);
    if (d < best_distance) {
      best = c;
      best_distance = d;
    }
  }
  if (!best.empty() || word.empty()) return best;
  std::string prefixed;
  for (const std::string& c : candidates) {
    if (absl::StartsWith(c, word)) {
      if (!prefixed.empty() && prefixed != c) return "";
      prefixed = c;
    }
  }
  return prefixed;
}

std::string FlagsHelp(const std::vector<FlagSpec>& specs) {
  std::string out;
  for (const FlagSpec& s : specs) {
    absl::StrAppend(&out, PadRight(absl::StrCat("  --", s.name, s.is_bool ? "" : "=<value>"), 26),
                    " ", s.help);
    if (!s.default_value.empty()) absl::StrAppend(&out, " (default: ", s.default_value, ")");
    out += "\n";
  }
  return out;
}

}  // namespace attend::cli
