// The command groups of the services (client/cli/commands/), as RunCli (client/cli/cli.h) puts
// them in the CLI's command table.
//
// Thread-safety: as for every command (client/cli/framework/command.h), a call uses its Context
// alone; the functions here only build table entries.
#ifndef ATTEND_CLIENT_CLI_COMMANDS_COMMANDS_H_
#define ATTEND_CLIENT_CLI_COMMANDS_COMMANDS_H_

#include <vector>

#include "client/cli/framework/command.h"

namespace attend::cli {

// `health`: grpc.health.v1 of the server and its services.
std::vector<Command> HealthCommands();
// Commands of the Attention service.
std::vector<Command> AttentionCommands();
// Commands of the Planner service: models, model, plan, cost.
std::vector<Command> PlannerCommands();
// The `seq` command group of the KvCache service, whose subcommands (create, append, decode,
// fork, truncate, release, get, list, stats, save, load, export, import, hand-off) are CLI11
// subcommands.
std::vector<Command> SeqCommands();
// The subcommands of `seq`, named "seq <subcommand>", each with its own flags: what
// `attend seq <subcommand> --help` prints.
std::vector<Command> SeqSubcommands();

}  // namespace attend::cli

#endif  // ATTEND_CLIENT_CLI_COMMANDS_COMMANDS_H_
