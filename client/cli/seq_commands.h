// The parts of the `attend seq <subcommand>` group (sequences of the server's KV cache: create,
// append, decode, fork, truncate, release, get, list, stats, save, load, export, import,
// hand-off) that its files share.
// seq_commands.cc holds the group and every subcommand but decode, which is in
// seq_decode_command.cc.
//
// `seq` is a group: each subcommand is a CLI11 subcommand with its own options struct, and a
// flag meant for another subcommand is a usage error rather than silently ignored (RunCli).
//
// Thread-safety: as for every command (command.h), a call uses its Context alone.
#ifndef ATTEND_CLIENT_CLI_SEQ_COMMANDS_H_
#define ATTEND_CLIENT_CLI_SEQ_COMMANDS_H_

#include "client/cli/args.h"
#include "client/cli/command.h"

namespace attend::cli {

// `decode`'s table entry, named without the group ("decode").
Command SeqDecodeSubcommand();

// --seed of the subcommands that make random tokens (append, decode). The group's help lists a
// flag once when every subcommand taking it means the same by it.
void DeclareRandomTokensSeed(Flags& f, Given<int64_t>* seed);

}  // namespace attend::cli

#endif  // ATTEND_CLIENT_CLI_SEQ_COMMANDS_H_
