// `attend bench` (bench_command.cc): the server's latency and throughput as a client sees them,
// over the workloads of bench_workloads.h.
//
// Thread-safety: as for every command (client/cli/framework/command.h), a call uses its Context
// alone; BenchCommands only builds the table entry.
#ifndef ATTEND_CLIENT_CLI_BENCH_BENCH_COMMAND_H_
#define ATTEND_CLIENT_CLI_BENCH_BENCH_COMMAND_H_

#include <vector>

#include "client/cli/framework/command.h"

namespace attend::cli {

// `bench`: latency and throughput of the server as a client sees them.
std::vector<Command> BenchCommands();

}  // namespace attend::cli

#endif  // ATTEND_CLIENT_CLI_BENCH_BENCH_COMMAND_H_
