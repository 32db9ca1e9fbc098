// attend: the command-line client of attend-server. See client/cli/cli.h.
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <iostream>
#include <ostream>
#include <string>
#include <vector>

#include "client/cli/cli.h"
#include "client/cli/framework/command.h"
#include "client/output_file.h"
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
  // stdout through a buffer that keeps a failed write and its reason (a full disk, a closed
  // pipe): std::cout would lose both, and the command would exit 0 with its output gone.
  attend::client::CheckedStreamBuffer stdout_buffer(STDOUT_FILENO, isatty(STDOUT_FILENO) == 1);
  std::ostream out(&stdout_buffer);
  int code =
      attend::cli::RunCli(std::vector<std::string>(argv + 1, argv + argc), out, std::cerr, options);
  out.flush();
  if (stdout_buffer.failed()) {
    const int error = stdout_buffer.error();
    std::cerr << "error: cannot write to stdout: "
              << (error != 0 ? std::strerror(error) : "a write failed") << "\n";
    // A command that failed already keeps its own code; one that succeeded lost its output.
    if (code == attend::cli::kExitOk) code = attend::cli::kExitLocalError;
  }
  return code;
}
