#include "client/cli/args.h"

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "client/cli/format.h"

namespace attend::cli {

absl::StatusOr<Args> Args::Parse(const std::vector<std::string>& tokens,
                                 const std::vector<FlagSpec>& specs) {
  Args args;
  bool only_positional = false;
  for (size_t i = 0; i < tokens.size(); ++i) {
    const std::string& token = tokens[i];
    if (only_positional || token.size() < 3 || token.rfind("--", 0) != 0) {
      if (token == "--") {
        only_positional = true;
        continue;
      }
      args.positional_.push_back(token);
      continue;
    }
    std::string name = token.substr(2);
    std::optional<std::string> value;
    if (const size_t eq = name.find('='); eq != std::string::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
    }
    const FlagSpec* spec = nullptr;
    for (const FlagSpec& s : specs) {
      if (s.name == name) spec = &s;
    }
    if (spec == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("unknown flag --", name));
    }
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
