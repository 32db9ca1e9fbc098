// The attend binary with its stdout on /dev/full: what it prints is lost, so it must not exit 0.
// The check is main's (the in-process RunCli writes to a stream the caller owns), so the binary
// runs in a child process (child_run.h) with stdout redirected by a shell.
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/client/child_run.h"

namespace attend {
namespace {

using ::attend::testing::ChildRun;

// `attend <args> >/dev/full` against an address nothing listens on; stderr comes back.
ChildRun AttendToDevFull(const std::string& args) {
  return ::attend::testing::RunProgram(
      {"/bin/sh", "-c",
       std::string("exec ") + ATTEND_CLI_BINARY + " --target 127.0.0.1:1 " + args + " >/dev/full"},
      30, int64_t{2} << 30);
}

TEST(StdoutCli, AFullStdoutIsAnErrorWithTheSystemsReason) {
  for (const std::string args : {"example list", "help", "--version", "completion bash"}) {
    const ChildRun run = AttendToDevFull(args);
    ASSERT_TRUE(run.finished) << args;
    EXPECT_EQ(run.exit_code, 1) << args << ": " << run.output;
    EXPECT_EQ(run.output, "error: cannot write to stdout: No space left on device\n") << args;
  }
}

// A run that failed keeps its own exit code (no command: the overview, exit 2); stdout's failure
// is reported beside it.
TEST(StdoutCli, AFailedRunKeepsItsCode) {
  const ChildRun run = AttendToDevFull("");
  EXPECT_EQ(run.exit_code, 2) << run.output;
  EXPECT_EQ(run.output, "error: cannot write to stdout: No space left on device\n");
}

}  // namespace
}  // namespace attend
