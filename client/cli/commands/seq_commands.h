// The parts of the `attend seq <subcommand>` group (sequences of the server's KV cache: create,
// append, decode, fork, truncate, release, get, list, stats, save, load, export, import,
// hand-off) that its files share: the group and its helpers are in seq_commands.cc; create,
// fork, truncate, release, get, list and stats in seq_lifecycle_commands.cc; append in
// seq_append_command.cc; decode in seq_decode_command.cc; save, load, export, import and
// hand-off in seq_persistence_commands.cc. SeqCommands itself is declared in commands.h.
//
// `seq` is a group: each subcommand is a CLI11 subcommand with its own options struct, and a
// flag meant for another subcommand is a usage error rather than silently ignored (RunCli).
//
// Thread-safety: as for every command (command.h), a call uses its Context alone.
#ifndef ATTEND_CLIENT_CLI_COMMANDS_SEQ_COMMANDS_H_
#define ATTEND_CLIENT_CLI_COMMANDS_SEQ_COMMANDS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "attend/v1/kv_cache.pb.h"
#include "client/cli/framework/args.h"
#include "client/cli/framework/command.h"

namespace attend::cli {

// The subcommands' table entries, named without the group ("create"), in the order help lists
// them.
Command SeqCreateSubcommand();                     // seq_lifecycle_commands.cc
Command SeqAppendSubcommand();                     // seq_append_command.cc
Command SeqDecodeSubcommand();                     // seq_decode_command.cc
std::vector<Command> SeqLifecycleSubcommands();    // fork, truncate, release, get, list, stats
std::vector<Command> SeqPersistenceSubcommands();  // save, load, export, import, hand-off

// --seed of the subcommands that make random tokens (append, decode). The group's help lists a
// flag once when every subcommand taking it means the same by it.
void DeclareRandomTokensSeed(Flags& f, Given<int64_t>* seed);

// The required --id of subcommand `sub`: "'attend seq <sub>' needs --id <sequence id>" when
// empty.
absl::StatusOr<std::string> RequiredId(const std::string& id, const std::string& sub);

// A required string flag: "'attend seq <sub>' needs --<flag> <what>" when absent or empty.
absl::StatusOr<std::string> RequiredFlag(const std::string& value, const std::string& sub,
                                         const std::string& flag, const std::string& what);

// --id of the subcommands about one existing sequence.
void DeclareSequenceId(Flags& f, std::string* id);

// `headline`, then the sequence's shape, storage, attention, tokens, blocks and bytes, and its
// tokens per layer.
void PrintSequence(Context& c, const v1::SequenceInfo& info, const std::string& headline);

}  // namespace attend::cli

#endif  // ATTEND_CLIENT_CLI_COMMANDS_SEQ_COMMANDS_H_
