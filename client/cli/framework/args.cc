#include "client/cli/framework/args.h"

#include <algorithm>
#include <utility>

#include "CLI/CLI.hpp"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"

namespace attend::cli {
namespace {

// A validator with our message: `check` returns "" for a good value, else the whole message.
// CLI11 prefixes it with the flag's name and ": ", which ParseCommandLine strips again.
CLI::Validator Check(std::function<std::string(const std::string&)> check) {
  return CLI::Validator([check](std::string& value) { return check(value); }, "");
}

// The integers of "4,64,1024" into *out; false when an item is no integer or empty ("4,,64" is a
// typo, not the list 4, 64), with *why saying which item was empty, if one was.
bool ParseIntList(const std::string& text, std::vector<int64_t>* out, std::string* why) {
  out->clear();
  for (absl::string_view part : absl::StrSplit(text, ',')) {
    if (absl::StripAsciiWhitespace(part).empty()) {
      *why = absl::StrCat(" (item ", out->size() + 1, " is empty)");
      return false;
    }
    int64_t value;
    if (!absl::SimpleAtoi(part, &value)) return false;
    out->push_back(value);
  }
  return true;
}

// An option of `app` whose callback parses its value with `parse` into *value; values `parse`
// refuses are "--<name> needs <what>, got '<value>'". Our parsers rather than CLI11's: its
// integers are strtoll's of base 0 ("010" is eight) and its decimals take hexadecimal.
template <typename T, typename Parse>
CLI::Option* Parsed(CLI::App* app, const std::string& name, const std::string& help,
                    const char* what, Parse parse, std::function<void(const T&)> store) {
  const std::string flag = "--" + name;
  CLI::Option* option = app->add_option_function<std::string>(
      flag,
      [parse, store](const std::string& text) {
        T value{};
        parse(text, &value);
        store(value);
      },
      help);
  option->check(Check([parse, flag, what](const std::string& text) {
    T value{};
    return parse(text, &value) ? "" : absl::StrCat(flag, " needs ", what, ", got '", text, "'");
  }));
  return option;
}

const auto kInt = [](const std::string& s, int64_t* v) { return absl::SimpleAtoi(s, v); };
const auto kDecimal = [](const std::string& s, double* v) { return ParseDecimal(s, v); };

// "-1.5", "-inf", "-.5": a positional argument, not a flag. "-0x1" counts too (refused as a
// number later, not as a flag).
bool IsNegativeNumber(const std::string& token) {
  double unused;
  return token.size() >= 2 && token[0] == '-' &&
         (absl::ascii_isdigit(token[1]) || token[1] == '.' || ParseDecimal(token, &unused));
}

bool IsFlagToken(const std::string& token) {
  return token.size() >= 2 && token[0] == '-' && !IsNegativeNumber(token);
}

// The index in `path` of the nearest app that declares --<name>, and the option; -1 and nullptr
// when none does.
std::pair<int, const CLI::Option*> FindOption(const std::vector<CLI::App*>& path,
                                              const std::string& name) {
  for (int i = static_cast<int>(path.size()) - 1; i >= 0; --i) {
    if (const CLI::Option* o = path[i]->get_option_no_throw("--" + name)) return {i, o};
  }
  return {-1, nullptr};
}

std::vector<CLI::App*> SubcommandsOf(CLI::App* app) {
  return app->get_subcommands([](CLI::App*) { return true; });
}

CLI::App* SubcommandNamed(CLI::App* app, const std::string& name) {
  for (CLI::App* sub : SubcommandsOf(app)) {
    if (sub->get_name() == name) return sub;
  }
  return nullptr;
}

// A subcommand of `app`'s subcommands that declares --<name>, for the message that it is not a
// flag of the one given.
bool SiblingHas(CLI::App* parent, const std::string& name) {
  for (CLI::App* sub : SubcommandsOf(parent)) {
    if (sub->get_option_no_throw("--" + name) != nullptr) return true;
  }
  return false;
}

// A flag token split: "--n-q=4" is {"n_q", "4", "--n-q"}; -h is --help and -o is --output.
// Other tokens of one dash are no flag at all (`unknown`), whatever their name.
struct FlagToken {
  std::string name;
  std::optional<std::string> value;
  std::string typed;  // as given, without the value, for messages
  bool unknown = false;
};

FlagToken SplitFlag(const std::string& token) {
  FlagToken f;
  if (token == "-h") return FlagToken{"help", std::nullopt, token};
  const bool short_output = token == "-o" || absl::StartsWith(token, "-o=");
  if (token[1] != '-' && !short_output) {
    return {absl::StrReplaceAll(token.substr(1), {{"-", "_"}}), std::nullopt, token, true};
  }
  f.name = short_output ? absl::StrCat("output", token.substr(2)) : token.substr(2);
  if (const size_t eq = f.name.find('='); eq != std::string::npos) {
    f.value = f.name.substr(eq + 1);
    f.name = f.name.substr(0, eq);
  }
  f.typed = absl::StrCat("--", f.name);
  absl::StrReplaceAll({{"-", "_"}}, &f.name);
  return f;
}

absl::Status UnknownFlag(const std::string& typed, const std::string& name,
                         const std::vector<CLI::App*>& path) {
  std::vector<CLI::App*> apps = path;
  if (path.size() >= 2) {  // a group's flags are its subcommands'
    for (CLI::App* sub : SubcommandsOf(path.back())) apps.push_back(sub);
  }
  std::vector<std::string> names;
  for (CLI::App* app : apps) {
    for (const FlagSpec& f : FlagsOf(*app)) names.push_back(f.name);
  }
  const std::string guess = DidYouMean(name, names);
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown flag ", typed, guess.empty() ? "" : absl::StrCat("; did you mean --", guess, "?")));
}

// "attend <command> [<subcommand>]" of each app under `root` (commands, then subcommands, in
// their order) that declares --<name>.
std::vector<std::string> CommandsWithFlag(CLI::App* root, const std::string& name) {
  std::vector<std::string> commands;
  for (CLI::App* command : SubcommandsOf(root)) {
    if (command->get_option_no_throw("--" + name) != nullptr) {
      commands.push_back(absl::StrCat("attend ", command->get_name()));
    }
    for (CLI::App* sub : SubcommandsOf(command)) {
      if (sub->get_option_no_throw("--" + name) != nullptr) {
        commands.push_back(absl::StrCat("attend ", command->get_name(), " ", sub->get_name()));
      }
    }
  }
  return commands;
}

// The error for flag `f` given before the command when `root` does not declare it: the commands
// it belongs to, if any (it cannot be parsed there: whether the next word is its value or the
// command depends on the command), else an unknown flag with a global flag's suggestion.
absl::Status FlagBeforeCommand(CLI::App* root, const FlagToken& f) {
  const std::vector<std::string> owners =
      f.unknown ? std::vector<std::string>() : CommandsWithFlag(root, f.name);
  if (owners.empty()) return UnknownFlag(f.typed, f.name, {root});
  std::string others;
  if (owners.size() > 4) {
    others = absl::StrCat(" (and ", owners.size() - 1, " more)");
  } else if (owners.size() > 1) {
    others = absl::StrCat(" (and '", absl::StrJoin(owners.begin() + 1, owners.end(), "', '"), "')");
  }
  return absl::InvalidArgumentError(absl::StrCat(f.typed, " is a flag of '", owners[0], "'", others,
                                                 "; put it after the command"));
}

// Whether --<name> takes a value in any app of `path` or below its last one (flags may come
// before the subcommand they belong to: `attend seq --id x create`).
bool TakesValue(const std::vector<CLI::App*>& path, const std::string& name) {
  std::vector<CLI::App*> apps = path;
  for (size_t i = 0; i < apps.size(); ++i) {
    if (i + 1 >= path.size() && path.size() > 1) {  // before the command: global flags only
      for (CLI::App* sub : SubcommandsOf(apps[i])) apps.push_back(sub);
    }
  }
  for (CLI::App* app : apps) {
    const CLI::Option* o = app->get_option_no_throw("--" + name);
    if (o != nullptr) return o->get_expected_min() > 0;
  }
  return false;
}

}  // namespace

Flag& Flag::Range(int64_t min, int64_t max) {
  const CLI::Validator range = CLI::Range(min, max);
  const std::string flag = option_->get_name();
  option_->check(Check([range, min, max, flag](const std::string& text) {
    int64_t value;
    std::string canonical = absl::StrCat(absl::SimpleAtoi(text, &value) ? value : 0);
    if (range(canonical).empty()) return std::string();
    return absl::StrCat(flag, " must be between ", min, " and ", max, ", got ", value);
  }));
  return *this;
}

Flag& Flag::Values(std::vector<std::string> values, std::string error) {
  // The type's name is what CLI11's own help would show as the value: here the few values.
  option_->type_name(absl::StrJoin(values, "|"));
  if (!error.empty()) {
    const CLI::Validator member = CLI::IsMember(values);
    option_->check(Check([member, error](const std::string& text) {
      std::string copy = text;
      return member(copy).empty() ? "" : absl::StrReplaceAll(error, {{"%s", text}});
    }));
  }
  return *this;
}

Flag& Flag::Env(const std::string& variable) {
  option_->envname(variable);
  return *this;
}

Flag& Flag::Shown(const std::string& default_text) {
  option_->default_str(default_text);
  return *this;
}

Flag Flags::Add(const std::string& name, bool* value, const std::string& help) {
  return Flag(app_->add_flag("--" + name, *value, help));
}

Flag Flags::Add(const std::string& name, std::optional<bool>* value, const std::string& help) {
  return Flag(app_->add_flag_function(
      "--" + name, [value](int64_t count) { *value = count > 0; }, help));
}

Flag Flags::Add(const std::string& name, std::string* value, const std::string& help) {
  return Flag(app_->add_option("--" + name, *value, help)->default_str(*value));
}

Flag Flags::Add(const std::string& name, std::optional<std::string>* value,
                const std::string& help) {
  return Flag(app_->add_option_function<std::string>(
      "--" + name, [value](const std::string& v) { *value = v; }, help));
}

Flag Flags::Add(const std::string& name, int64_t* value, const std::string& help) {
  return Flag(Parsed<int64_t>(app_, name, help, "an integer", kInt, [value](const int64_t& v) {
                *value = v;
              })->default_str(absl::StrCat(*value)));
}

Flag Flags::Add(const std::string& name, std::optional<int64_t>* value, const std::string& help) {
  return Flag(Parsed<int64_t>(app_, name, help, "an integer", kInt,
                              [value](const int64_t& v) { *value = v; }));
}

Flag Flags::Add(const std::string& name, Given<int64_t>* value, const std::string& help) {
  return Flag(Parsed<int64_t>(app_, name, help, "an integer", kInt, [value](const int64_t& v) {
                value->value = v;
                value->given = true;
              })->default_str(absl::StrCat(value->value)));
}

Flag Flags::Add(const std::string& name, double* value, const std::string& help) {
  return Flag(
      Parsed<double>(app_, name, help, "a decimal number", kDecimal, [value](const double& v) {
        *value = v;
      })->default_str(absl::StrCat(*value)));
}

Flag Flags::Add(const std::string& name, std::optional<double>* value, const std::string& help) {
  return Flag(Parsed<double>(app_, name, help, "a decimal number", kDecimal,
                             [value](const double& v) { *value = v; }));
}

Flag Flags::Add(const std::string& name, ByteSize* value, const std::string& help) {
  const std::string flag = "--" + name;
  CLI::Option* option = app_->add_option_function<std::string>(
      flag, [value, flag](const std::string& text) { value->bytes = *ParseByteSize(text, flag); },
      help);
  option->check(Check([flag](const std::string& text) {
    const absl::StatusOr<int64_t> bytes = ParseByteSize(text, flag);
    return bytes.ok() ? "" : std::string(bytes.status().message());
  }));
  return Flag(option->default_str(absl::StrCat(value->bytes)));
}

Flag Flags::Add(const std::string& name, std::vector<int64_t>* value, const std::string& help) {
  const std::string flag = "--" + name;
  CLI::Option* option = app_->add_option_function<std::string>(
      flag,
      [value](const std::string& text) {
        std::string unused;
        ParseIntList(text, value, &unused);  // the check below refused what does not parse
      },
      help);
  option->check(Check([flag](const std::string& text) {
    std::vector<int64_t> values;
    std::string why;
    if (ParseIntList(text, &values, &why)) return std::string();
    return absl::StrCat(flag, " needs comma-separated integers, got '", text, "'", why);
  }));
  return Flag(option->default_str(absl::StrJoin(*value, ",")));
}

std::vector<FlagSpec> FlagsOf(const CLI::App& app) {
  std::vector<FlagSpec> out;
  for (const CLI::Option* o : app.get_options()) {
    FlagSpec f;
    f.name = o->get_lnames().empty() ? "" : o->get_lnames()[0];
    if (f.name.empty()) continue;
    f.help = o->get_description();
    f.is_bool = o->get_expected_min() == 0;
    f.default_value = f.is_bool ? "" : o->get_default_str();
    if (!f.is_bool && absl::StrContains(o->get_type_name(), "|")) {
      f.values = absl::StrSplit(o->get_type_name(), '|');
    }
    out.push_back(std::move(f));
  }
  return out;
}

absl::StatusOr<ParsedCommandLine> ParseCommandLine(CLI::App& root,
                                                   const std::vector<std::string>& tokens) {
  ParsedCommandLine parsed;
  parsed.path = {&root};
  // First the command and subcommand: the first words that are neither flags nor their values.
  std::vector<bool> is_path(tokens.size(), false);
  bool only_positional = false;
  for (size_t i = 0; i < tokens.size(); ++i) {
    const std::string& t = tokens[i];
    if (!only_positional && t == "--") {
      only_positional = true;
    } else if (!only_positional && IsFlagToken(t)) {
      const FlagToken f = SplitFlag(t);
      if (parsed.path.size() == 1 &&
          (f.unknown || root.get_option_no_throw("--" + f.name) == nullptr)) {
        return FlagBeforeCommand(&root, f);
      }
      if (!f.unknown && !f.value && TakesValue(parsed.path, f.name)) ++i;
    } else {
      CLI::App* leaf = parsed.path.back();
      const std::vector<CLI::App*> subs = SubcommandsOf(leaf);
      if (subs.empty()) break;
      CLI::App* sub = SubcommandNamed(leaf, t);
      if (sub == nullptr && leaf != &root) break;  // the group reports it (cli.cc)
      if (sub == nullptr) {
        std::vector<std::string> names;
        for (CLI::App* s : subs) names.push_back(s->get_name());
        return absl::InvalidArgumentError(absl::StrCat("unknown command '", t, "'",
                                                       DidYouMeanSuffix(t, names),
                                                       "\nRun 'attend help' for the commands."));
      }
      parsed.path.push_back(sub);
      is_path[i] = true;
    }
  }
  // Then the flags, each into the tokens of the app that declares it, as "--name value" (which
  // CLI11 reads whatever the value looks like, "-1" and "" included) or "--name=true|false".
  std::vector<std::vector<std::string>> by_app(parsed.path.size());
  only_positional = false;
  for (size_t i = 0; i < tokens.size(); ++i) {
    const std::string& t = tokens[i];
    if (is_path[i]) continue;
    if (only_positional || !IsFlagToken(t)) {
      parsed.positional.push_back(t);
      continue;
    }
    if (t == "--") {
      only_positional = true;
      continue;
    }
    FlagToken f = SplitFlag(t);
    const auto [owner, option] = f.unknown ? std::pair<int, const CLI::Option*>{-1, nullptr}
                                           : FindOption(parsed.path, f.name);
    if (option == nullptr) {
      // A group's flags belong to its subcommands: without one, the group says to give one.
      if (!f.unknown && parsed.path.size() >= 2 && SiblingHas(parsed.path.back(), f.name)) {
        if (!f.value && TakesValue(parsed.path, f.name)) ++i;
        continue;
      }
      if (!f.unknown && parsed.path.size() >= 3 &&
          SiblingHas(parsed.path[parsed.path.size() - 2], f.name)) {
        const std::string command = absl::StrCat("attend ", parsed.path[1]->get_name(), " ",
                                                 parsed.path.back()->get_name());
        return absl::InvalidArgumentError(
            absl::StrCat("--", f.name, " is not a flag of '", command, "' (", command, " --help)"));
      }
      return UnknownFlag(f.typed, f.name, parsed.path);
    }
    if (option->get_expected_min() == 0) {
      if (f.value && *f.value != "true" && *f.value != "false") {
        return absl::InvalidArgumentError(absl::StrCat(
            "--", f.name, " takes no value (or =true / =false), got '", *f.value, "'"));
      }
      by_app[owner].push_back(absl::StrCat("--", f.name, "=", f.value.value_or("true")));
      continue;
    }
    if (!f.value) {
      if (i + 1 >= tokens.size()) {
        return absl::InvalidArgumentError(absl::StrCat("--", f.name, " needs a value"));
      }
      f.value = tokens[++i];
    }
    by_app[owner].push_back("--" + f.name);
    by_app[owner].push_back(*f.value);
  }
  std::vector<std::string> args;
  for (size_t a = 0; a < parsed.path.size(); ++a) {
    if (a > 0) args.push_back(parsed.path[a]->get_name());
    args.insert(args.end(), by_app[a].begin(), by_app[a].end());
  }
  std::reverse(args.begin(), args.end());       // CLI11 takes them from the back
  const std::vector<std::string> given = args;  // parse consumes `args`
  try {
    root.parse(args);
  } catch (const CLI::ParseError& e) {
    std::string message = e.what();
    const size_t colon = message.find(": ");
    if (dynamic_cast<const CLI::ValidationError*>(&e) == nullptr || colon == std::string::npos) {
      return absl::InvalidArgumentError(message);
    }
    // Our validators' messages are whole; CLI11 put "--name: " before them. A value that came
    // from the environment is named by its variable.
    const std::string flag = message.substr(0, colon);
    message = message.substr(colon + 2);
    const CLI::Option* option = FindOption(parsed.path, flag.substr(2)).second;
    if (option != nullptr && !option->get_envname().empty() &&
        std::none_of(given.begin(), given.end(), [&](const std::string& a) {
          return a == flag || absl::StartsWith(a, flag + "=");
        })) {
      absl::StrReplaceAll({{flag, option->get_envname()}}, &message);
    }
    return absl::InvalidArgumentError(message);
  }
  return parsed;
}

bool ParseDecimal(absl::string_view text, double* value) {
  absl::string_view digits = absl::StripAsciiWhitespace(text);
  if (!digits.empty() && (digits[0] == '-' || digits[0] == '+')) digits.remove_prefix(1);
  if (digits.size() >= 2 && digits[0] == '0' && (digits[1] == 'x' || digits[1] == 'X')) {
    return false;
  }
  return absl::SimpleAtod(text, value);
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

std::string DidYouMeanSuffix(absl::string_view word, const std::vector<std::string>& candidates) {
  const std::string guess = DidYouMean(word, candidates);
  return guess.empty() ? "" : absl::StrCat("; did you mean '", guess, "'?");
}

std::string FlagsHelp(const std::vector<FlagSpec>& specs) {
  std::string out;
  for (const FlagSpec& s : specs) {
    std::string left = absl::StrCat("  --", s.name, s.is_bool ? "" : "=<value>");
    left.resize(std::max<size_t>(left.size(), 26), ' ');
    absl::StrAppend(&out, left, " ", s.help);
    if (!s.default_value.empty()) absl::StrAppend(&out, " (default: ", s.default_value, ")");
    out += "\n";
  }
  return out;
}

}  // namespace attend::cli
