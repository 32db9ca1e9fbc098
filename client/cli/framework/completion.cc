#include "client/cli/framework/completion.h"

#include <map>
#include <set>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "client/cli/framework/args.h"

namespace attend::cli {
namespace {

// A command (or subcommand) as completion sees it, read from its CLI::App.
struct Node {
  std::string name;
  std::vector<FlagSpec> flags;
  std::vector<Node> subcommands;
  std::vector<std::string> positional_words;
};

Node NodeOf(const CLI::App& app, const PositionalWords& words) {
  Node node{app.get_name(), FlagsOf(app), {}, {}};
  if (auto it = words.find(node.name); it != words.end()) node.positional_words = it->second;
  for (const CLI::App* sub : app.get_subcommands([](const CLI::App*) { return true; })) {
    node.subcommands.push_back(NodeOf(*sub, words));
  }
  // A group without flags of its own (`seq`) takes its subcommands': each once, where it first
  // appears.
  std::set<std::string> seen;
  for (const Node& sub : node.flags.empty() ? node.subcommands : std::vector<Node>()) {
    for (const FlagSpec& f : sub.flags) {
      if (seen.insert(f.name).second) node.flags.push_back(f);
    }
  }
  return node;
}

// `a` and `b` with a space between, or the one that is not empty.
std::string Words(const std::string& a, const std::string& b) {
  return a.empty() || b.empty() ? a + b : absl::StrCat(a, " ", b);
}

// "--a --b" for `flags`.
std::string FlagWords(const std::vector<FlagSpec>& flags) {
  std::vector<std::string> words;
  for (const FlagSpec& f : flags) words.push_back("--" + f.name);
  return absl::StrJoin(words, " ");
}

// "--target|--deadline|...": every flag of `globals` and `commands` that takes a value (and
// -o, --output's short name), as a case pattern; the word after one is its value, not a command.
std::string ValueFlagPattern(const std::vector<Node>& commands,
                             const std::vector<FlagSpec>& globals) {
  std::set<std::string> names;
  const auto add = [&names](const FlagSpec& f) {
    if (f.is_bool) return;
    names.insert("--" + f.name);
    if (f.name == "output") names.insert("-o");
  };
  for (const FlagSpec& f : globals) add(f);
  for (const Node& c : commands) {
    for (const FlagSpec& f : c.flags) add(f);
  }
  return absl::StrJoin(names, "|");
}

// For each flag with FlagSpec::values, a case pattern ("--output|-o") and the values offered
// after it; a name that several commands declare offers the values of all of them.
std::map<std::string, std::set<std::string>> FlagValues(const std::vector<Node>& commands,
                                                        const std::vector<FlagSpec>& globals) {
  std::map<std::string, std::set<std::string>> out;
  const auto add = [&out](const FlagSpec& f) {
    if (f.values.empty()) return;
    const std::string pattern = f.name == "output" ? "--output|-o" : "--" + f.name;
    out[pattern].insert(f.values.begin(), f.values.end());
  };
  for (const FlagSpec& f : globals) add(f);
  for (const Node& c : commands) {
    for (const FlagSpec& f : c.flags) add(f);
  }
  return out;
}

// The `case "$prev"` arms for the flags of FlagValues, each ending in `reply(words)`.
template <typename Reply>
std::string FlagValueCases(const std::vector<Node>& commands, const std::vector<FlagSpec>& globals,
                           Reply reply) {
  std::string out;
  for (const auto& [pattern, values] : FlagValues(commands, globals)) {
    absl::StrAppend(&out, "    ", pattern, ")\n      ",
                    reply(absl::StrJoin(values.begin(), values.end(), " ")), "\n      return ;;\n");
  }
  return out;
}

// The shell code common to bash and zsh: finds $cmd and $sub (the first two words that are
// neither flags nor flag values) in words 1 .. $cword - 1 of $cwords, then sets the candidates
// with `set_words("...")` for the word being completed. Both shells read this `case` alike.
template <typename SetWords>
std::string CaseBody(const std::vector<Node>& commands, const std::vector<FlagSpec>& globals,
                     SetWords set_words) {
  const std::string global_words = FlagWords(globals);
  std::vector<std::string> names;
  for (const Node& c : commands) names.push_back(c.name);
  const std::string command_words = absl::StrJoin(names, " ");
  std::string out = "  case \"$cmd\" in\n";
  absl::StrAppend(&out, "    \"\") ", set_words(Words(command_words, global_words)), " ;;\n");
  for (const Node& c : commands) {
    const std::string flags = Words(FlagWords(c.flags), global_words);
    if (c.name == "help") {
      absl::StrAppend(&out, "    help) ", set_words(command_words), " ;;\n");
      continue;
    }
    if (c.name == "completion") {
      absl::StrAppend(&out, "    completion) ", set_words("bash zsh"), " ;;\n");
      continue;
    }
    if (c.subcommands.empty()) {
      absl::StrAppend(&out, "    ", c.name, ") ",
                      set_words(Words(absl::StrJoin(c.positional_words, " "), flags)), " ;;\n");
      continue;
    }
    std::vector<std::string> subs;
    std::string sub_cases;
    for (const Node& s : c.subcommands) {
      const std::string& sub = s.name;
      subs.push_back(sub);
      absl::StrAppend(&sub_cases, "        ", sub, ") ",
                      set_words(Words(FlagWords(s.flags), global_words)), " ;;\n");
    }
    absl::StrAppend(&out, "    ", c.name, ")\n      case \"$sub\" in\n", "        \"\") ",
                    set_words(absl::StrJoin(subs, " ")), " ;;\n", sub_cases, "        *) ",
                    set_words(flags), " ;;\n      esac ;;\n");
  }
  absl::StrAppend(&out, "  esac\n");
  return out;
}

// The loop that finds $cmd and $sub; `first` is the index of the first word after `attend`.
std::string ScanLoop(const std::vector<Node>& commands, const std::vector<FlagSpec>& globals,
                     int first) {
  return absl::StrCat("  local cmd=\"\" sub=\"\" i w\n  for ((i = ", first,
                      "; i < cword; i++)); do\n    w=\"${cwords[i]}\"\n    case \"$w\" in\n      ",
                      ValueFlagPattern(commands, globals),
                      ") ((i++)) ;;\n      -*) ;;\n"
                      "      *) if [[ -z \"$cmd\" ]]; then cmd=\"$w\"; "
                      "elif [[ -z \"$sub\" ]]; then sub=\"$w\"; fi ;;\n    esac\n  done\n");
}

}  // namespace

std::string BashCompletion(const CLI::App& root, const PositionalWords& words) {
  const Node tree = NodeOf(root, words);
  const std::vector<Node>& commands = tree.subcommands;
  const std::vector<FlagSpec>& globals = tree.flags;
  std::string out =
      "# bash completion for attend, generated by 'attend completion bash'.\n"
      "# Use: source <(attend completion bash)\n"
      "_attend() {\n"
      "  local cword=$COMP_CWORD cur=\"${COMP_WORDS[COMP_CWORD]}\"\n"
      "  local prev=\"${COMP_WORDS[COMP_CWORD-1]}\"\n"
      "  local -a cwords=(\"${COMP_WORDS[@]}\")\n";
  absl::StrAppend(&out, "  case \"$prev\" in\n",
                  FlagValueCases(commands, globals,
                                 [](const std::string& list) {
                                   return absl::StrCat("COMPREPLY=($(compgen -W \"", list,
                                                       "\" -- \"$cur\"))");
                                 }),
                  "    ", ValueFlagPattern(commands, globals),
                  ")\n      COMPREPLY=($(compgen -f -- \"$cur\"))\n      return ;;\n  esac\n");
  absl::StrAppend(&out, ScanLoop(commands, globals, 1), "  local words=\"\"\n");
  absl::StrAppend(&out, CaseBody(commands, globals, [](const std::string& list) {
    return absl::StrCat("words=\"", list, "\"");
  }));
  absl::StrAppend(&out,
                  "  COMPREPLY=($(compgen -W \"$words\" -- \"$cur\"))\n"
                  "}\n"
                  "complete -o default -F _attend attend\n");
  return out;
}

std::string ZshCompletion(const CLI::App& root, const PositionalWords& words) {
  const Node tree = NodeOf(root, words);
  const std::vector<Node>& commands = tree.subcommands;
  const std::vector<FlagSpec>& globals = tree.flags;
  std::string out =
      "#compdef attend\n"
      "# zsh completion for attend, generated by 'attend completion zsh'.\n"
      "# Use: source <(attend completion zsh) after compinit, or save as _attend in $fpath.\n"
      "_attend() {\n"
      "  local cword=$CURRENT\n"
      "  local -a cwords=(\"${words[@]}\")\n";
  absl::StrAppend(
      &out, "  case \"${words[CURRENT-1]}\" in\n",
      FlagValueCases(commands, globals,
                     [](const std::string& list) { return absl::StrCat("compadd ", list); }),
      "    ", ValueFlagPattern(commands, globals), ")\n      _files\n      return ;;\n  esac\n");
  absl::StrAppend(&out, ScanLoop(commands, globals, 2), "  local -a cands\n");
  absl::StrAppend(&out, CaseBody(commands, globals, [](const std::string& list) {
    return absl::StrCat("cands=(", list, ")");
  }));
  absl::StrAppend(&out,
                  "  compadd -a cands\n"
                  "}\n"
                  "if [[ \"${funcstack[1]}\" == _attend ]]; then\n"
                  "  _attend \"$@\"\n"
                  "else\n"
                  "  compdef _attend attend\n"
                  "fi\n");
  return out;
}

}  // namespace attend::cli
