// attend: the command-line client of attend-server. See client/cli/cli.h.
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <ostream>
#include <streambuf>
#include <string>
#include <vector>

#include "client/cli/cli.h"
#include "client/cli/framework/command.h"
#include "grpc/support/log.h"

namespace {

// gRPC core logs failed TLS handshakes and the like on stderr; the CLI reports each failure
// itself, with a hint, so the core's copy is noise. GRPC_VERBOSITY (e.g. debug) brings it back.
void DropGrpcLog(gpr_log_func_args* /*args*/) {}

// stdout as a stream buffer over file descriptor 1 that remembers the first failed write(2) and
// its errno. Output to a full disk or a closed pipe fails only when a buffer is written out, and
// std::cout (through C stdio) reports that neither in its state reliably nor with the reason, so
// a command would exit 0 with its output lost. Buffered as stdio buffers stdout, so that it
// interleaves with stderr as before: by line on a terminal, else in blocks of BUFSIZ.
class StdoutBuffer : public std::streambuf {
 public:
  StdoutBuffer() : line_buffered_(isatty(STDOUT_FILENO) == 1) {}
  // The errno of the first write that failed; 0 while none has (or it gave none).
  int error() const { return error_; }
  // Whether a write has failed.
  bool failed() const { return failed_; }

 protected:
  // No put area: every character comes here or to xsputn, which decide when to write.
  int_type overflow(int_type c) override {
    if (traits_type::eq_int_type(c, traits_type::eof())) {
      return Drain() ? traits_type::not_eof(c) : traits_type::eof();
    }
    const char ch = traits_type::to_char_type(c);
    return Put(&ch, 1) ? c : traits_type::eof();
  }
  std::streamsize xsputn(const char* s, std::streamsize n) override {
    return Put(s, static_cast<size_t>(n)) ? n : 0;
  }
  int sync() override { return Drain() ? 0 : -1; }

 private:
  bool Put(const char* s, size_t n) {
    pending_.append(s, n);
    const bool line_done = line_buffered_ && std::memchr(s, '\n', n) != nullptr;
    return line_done || pending_.size() >= BUFSIZ ? Drain() : !failed_;
  }

  // Writes out what is pending; false (remembering why) when the system refuses it.
  bool Drain() {
    size_t done = 0;
    while (done < pending_.size() && !failed_) {
      const ssize_t n = write(STDOUT_FILENO, pending_.data() + done, pending_.size() - done);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        error_ = n < 0 ? errno : 0;
        failed_ = true;
        break;
      }
      done += static_cast<size_t>(n);
    }
    pending_.clear();  // what failed is dropped, as stdio drops it
    return !failed_;
  }

  const bool line_buffered_;
  std::string pending_;
  int error_ = 0;
  bool failed_ = false;
};

}  // namespace

int main(int argc, char** argv) {
  if (std::getenv("GRPC_VERBOSITY") == nullptr) gpr_set_log_function(DropGrpcLog);
  attend::cli::CliOptions options;
  options.err_is_terminal = isatty(STDERR_FILENO) == 1;
  StdoutBuffer stdout_buffer;
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
