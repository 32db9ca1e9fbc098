// attend: the command-line client of attend-server. See client/cli/cli.h.
#include <unistd.h>

#include <cstdlib>
#include <iostream>
#include <string>
#include <vector>

#include "client/cli/cli.h"
#include "grpc/support/log.h"

namespace {

// gRPC core logs failed TLS handshakes and the like on stderr; the CLI reports each failure
// itself, with a hint, so the core's copy is noise. GRPC_VERBOSITY (e.g. debug) brings it back.
void DropGrpcLog(gpr_log_func_args* /*args*/) {}

}  // namespace

int main(int argc, char** argv) {
  if (std::getenv("GRPC_VERBOSITY") == nullptr) gpr_set_log_function(DropGrpcLog);
  attend::cli::CliOptions options;
  options.err_is_terminal = isatty(STDERR_FILENO) == 1;
  return attend::cli::RunCli(std::vector<std::string>(argv + 1, argv + argc), std::cout, std::cerr,
                             options);
}
