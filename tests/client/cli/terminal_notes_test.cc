// Progress lines and "working..." notes: the formatter, drawing and clearing, nothing when not a
// terminal, and the attend binary with its stderr on a pseudo-terminal (isatty true) and on a
// pipe (false).
#include "client/cli/render/terminal_notes.h"

#include <fcntl.h>
#include <pty.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/cli/cli.h"
#include "client/cli/framework/command.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/client/cli/cli_fixture.h"

namespace attend {
namespace {

using ::testing::HasSubstr;
using ::testing::MatchesRegex;

TEST(FormatProgressTest, CountsOfTotalAndTheRateOnceKnown) {
  EXPECT_EQ(cli::FormatProgress("bench Attend", 0, 5000, -1), "bench Attend: 0/5,000 requests");
  EXPECT_EQ(cli::FormatProgress("bench Attend", 1234, 5000, 812.4),
            "bench Attend: 1,234/5,000 requests, 812 requests/s");
  EXPECT_EQ(cli::FormatProgress("bench Softmax", 1, 1, 12345.6),
            "bench Softmax: 1/1 request, 12,346 requests/s");
}

TEST(ProgressLineTest, DrawnAtOnceRedrawnInPlaceAndClearedAtTheEnd) {
  std::ostringstream err;
  std::atomic<int64_t> done{0};
  {
    cli::ProgressLine line(&err, true, "bench X", 100, &done, absl::Milliseconds(5));
    EXPECT_EQ(err.str(), "\rbench X: 0/100 requests");
    done = 42;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    line.Stop();
    line.Stop();  // idempotent
  }
  const std::string e = err.str();
  EXPECT_THAT(e, HasSubstr("\rbench X: 42/100 requests, "));
  EXPECT_THAT(e, MatchesRegex("(\r[^\r\n]*)+\r +\r"));
  // The clearing spaces cover the longest line drawn last.
  const size_t clear = e.rfind('\r', e.size() - 2);
  const size_t last = e.rfind('\r', clear - 1);
  EXPECT_GE(clear - last - 1, e.size() - clear - 2);
}

TEST(ProgressLineTest, NothingWhenNotATerminal) {
  std::ostringstream err;
  std::atomic<int64_t> done{0};
  {
    cli::ProgressLine line(&err, false, "bench X", 100, &done, absl::Milliseconds(1));
    done = 50;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_EQ(err.str(), "");
}

TEST(WorkingNoteTest, PrintedOnlyWhenTheWaitOutlastsItsDelayOnATerminal) {
  std::ostringstream err;
  { const cli::WorkingNote note(&err, true, absl::Seconds(30), "working..."); }
  EXPECT_EQ(err.str(), "");  // the reply came first
  { const cli::WorkingNote note(&err, false, absl::ZeroDuration(), "working..."); }
  EXPECT_EQ(err.str(), "");  // not a terminal
  { const cli::WorkingNote note(&err, true, absl::ZeroDuration(), "working..."); }
  EXPECT_EQ(err.str(), "working...\n");
  err.str("");
  {
    const cli::WorkingNote note(&err, true, absl::Milliseconds(10), "working...");
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
  }
  EXPECT_EQ(err.str(), "working...\n");
  EXPECT_EQ(cli::WorkingText("Append of 65,536 tokens", "localhost:50051"),
            "working... (Append of 65,536 tokens sent to localhost:50051; no reply yet)");
}

class TerminalCliTest : public ::attend::testing::CliServerSuite {
 protected:
  std::string Target() const { return absl::StrCat("127.0.0.1:", server_->port()); }

  // `tokens` under a "terminal" stderr with the working note due at once.
  int RunOnTerminal(std::vector<std::string> tokens) {
    tokens.insert(tokens.begin(), {"--target", Target()});
    out_.str("");
    err_.str("");
    cli::CliOptions terminal;
    terminal.err_is_terminal = true;
    terminal.working_note_after = absl::ZeroDuration();
    return cli::RunCli(tokens, out_, err_, terminal);
  }
};

TEST_F(TerminalCliTest, SeqAppendAndAttendSayTheyAreWorkingOnATerminalOnly) {
  ASSERT_EQ(Run({"seq", "create", "--id", "note-1"}), cli::kExitOk) << err_.str();
  ASSERT_EQ(Run({"seq", "append", "--id", "note-1", "--n", "4"}), cli::kExitOk);
  EXPECT_EQ(err_.str(), "");
  const std::string piped = out_.str();
  ASSERT_EQ(RunOnTerminal({"seq", "append", "--id", "note-1", "--n", "4"}), cli::kExitOk);
  EXPECT_EQ(err_.str(),
            absl::StrCat("working... (Append of 4 tokens sent to ", Target(), "; no reply yet)\n"));
  ASSERT_EQ(RunOnTerminal({"attend", "--n_q", "2", "--n_kv", "3", "--head_dim", "4"}), cli::kExitOk)
      << err_.str();
  EXPECT_THAT(err_.str(), HasSubstr("working... (Attend sent to "));
  ASSERT_EQ(Run({"attend", "--n_q", "2", "--n_kv", "3", "--head_dim", "4"}), cli::kExitOk);
  EXPECT_EQ(err_.str(), "");
  ASSERT_EQ(RunOnTerminal({"mha", "--n", "3"}), cli::kExitOk) << err_.str();
  EXPECT_THAT(err_.str(), HasSubstr("working... (MultiHeadAttend sent to "));
}

// What the attend binary writes to its stderr when that is a pseudo-terminal (`pty`) or a pipe;
// stdout goes to /dev/null. Empty on failure (with a test failure).
std::string StderrOfAttend(const std::vector<std::string>& args, bool pty) {
  int read_fd = -1, write_fd = -1;
  if (pty) {
    if (openpty(&read_fd, &write_fd, nullptr, nullptr, nullptr) != 0) {
      ADD_FAILURE() << "openpty: " << errno;
      return "";
    }
  } else {
    int fds[2];
    if (pipe(fds) != 0) return "";
    read_fd = fds[0];
    write_fd = fds[1];
  }
  const pid_t child = fork();
  if (child == 0) {
    const int null = open("/dev/null", O_WRONLY);
    dup2(null, STDOUT_FILENO);
    dup2(write_fd, STDERR_FILENO);
    close(read_fd);
    std::vector<char*> argv = {const_cast<char*>(ATTEND_CLI_BINARY)};
    for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    execv(argv[0], argv.data());
    _exit(127);
  }
  close(write_fd);
  std::string text;
  char buffer[4096];
  ssize_t n;
  // A pty's master reads EIO once the child (the last holder of its slave) has exited.
  while ((n = read(read_fd, buffer, sizeof(buffer))) > 0 || (n < 0 && errno == EINTR)) {
    if (n > 0) text.append(buffer, static_cast<size_t>(n));
  }
  close(read_fd);
  int status = 0;
  waitpid(child, &status, 0);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status << "\n" << text;
  return text;
}

TEST_F(TerminalCliTest, TheBinaryDrawsProgressOnAPseudoTerminalAndNothingOnAPipe) {
  const std::vector<std::string> bench = {"--target", Target(),   "bench", "--rpc",
                                          "softmax",  "--n_kv",   "4",     "--requests",
                                          "50",       "--warmup", "0"};
  const std::string terminal = StderrOfAttend(bench, true);
  // One line for the RPC's calls and the empty unary's, which alternate.
  EXPECT_THAT(terminal, HasSubstr("\rbench Softmax and Health/Check: 0/100 requests"));
  EXPECT_THAT(terminal, MatchesRegex("(\r[^\r\n]*)+\r +\r"));
  EXPECT_EQ(StderrOfAttend(bench, false), "");
}

}  // namespace
}  // namespace attend
