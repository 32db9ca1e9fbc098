// Shell completion scripts for the attend CLI, generated from the same command and flag tables
// that RunCli parses with, so that they cannot drift from it. They complete command names, a
// command group's subcommands (`attend seq cr<TAB>`), each command's flags and the global
// ones, a command's positional words (Command::positional_words: example names), the values of
// flags that take a fixed few (FlagSpec::values: -o table|json|wide), and file names after
// any other flag that takes a value.
//
// Thread-safety: pure functions.
#ifndef ATTEND_CLIENT_CLI_COMPLETION_H_
#define ATTEND_CLIENT_CLI_COMPLETION_H_

#include <string>
#include <vector>

#include "client/cli/args.h"
#include "client/cli/command.h"

namespace attend::cli {

// `source <(attend completion bash)`, or save it under bash-completion's completions directory.
std::string BashCompletion(const std::vector<Command>& commands,
                           const std::vector<FlagSpec>& globals);

// `source <(attend completion zsh)` after compinit, or save it as _attend in a directory of
// $fpath.
std::string ZshCompletion(const std::vector<Command>& commands,
                          const std::vector<FlagSpec>& globals);

}  // namespace attend::cli

#endif  // ATTEND_CLIENT_CLI_COMPLETION_H_
