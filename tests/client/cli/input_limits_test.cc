// The attend binary with input files that never end (/dev/zero, a FIFO fed forever): each read
// is bounded, so the command fails at once with an error naming the flag, the file and the
// limit, and its peak memory stays small. The binary runs in a child process (child_run.h) with
// a deadline and an address-space cap, so that a regression fails instead of hanging.
#include <sys/stat.h>

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "client/npy.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/client/child_run.h"

namespace attend {
namespace {

using ::attend::testing::ChildRun;
using ::attend::testing::SanitizedRss;
using ::testing::HasSubstr;

constexpr int64_t kMiB = int64_t{1} << 20;
// The binary's own footprint (gRPC, abseil) plus the 1 MiB limit the tests set.
constexpr int64_t kSmallRss = 64 * kMiB;
constexpr int64_t kAddressSpace = int64_t{2} << 30;
constexpr double kTimeoutSeconds = 30;

// `attend <args>` against an address nothing listens on: the inputs fail before any call.
ChildRun Attend(std::vector<std::string> args) {
  args.insert(args.begin(), {ATTEND_CLI_BINARY, "--target", "127.0.0.1:1"});
  return ::attend::testing::RunProgram(args, kTimeoutSeconds, kAddressSpace);
}

TEST(InputLimitsCli, DevZeroAsNpyFailsOnItsFirstBytes) {
  const ChildRun run =
      Attend({"attend", "--q", "/dev/zero", "--k", "/dev/zero", "--v", "/dev/zero"});
  ASSERT_TRUE(run.finished) << "still running after " << run.seconds << " s";
  EXPECT_EQ(run.exit_code, 1) << run.output;
  EXPECT_THAT(run.output, HasSubstr("error: --q /dev/zero: not a .npy file: it starts with "
                                    "\"\\x00\\x00\\x00\\x00\\x00\\x00\""));
  EXPECT_LT(run.max_rss_bytes, SanitizedRss(kSmallRss));
}

TEST(InputLimitsCli, DevZeroAsJsonInputStopsAtTheMessageLimit) {
  const ChildRun run = Attend({"--max_message_bytes", "1048576", "attend", "--input", "/dev/zero"});
  ASSERT_TRUE(run.finished) << "still running after " << run.seconds << " s";
  EXPECT_EQ(run.exit_code, 1) << run.output;
  EXPECT_THAT(run.output,
              HasSubstr("error: --input /dev/zero: more than 1048576 bytes; a JSON request is "
                        "limited to 1.00 MiB"));
  EXPECT_THAT(run.output, HasSubstr("--max_message_bytes"));
  EXPECT_LT(run.max_rss_bytes, SanitizedRss(kSmallRss));
}

TEST(InputLimitsCli, EndlessFifoAsJsonInputOrNpyStops) {
  const std::string fifo = ::testing::TempDir() + "/input_limits_test.fifo";
  std::filesystem::remove(fifo);
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  const struct {
    std::vector<std::string> args;
    std::string error;
  } cases[] = {
      {{"--max_message_bytes", "1048576", "mha", "--input", fifo},
       "error: --input " + fifo + ": more than 1048576 bytes"},
      {{"seq", "append", "--id", "s", "--k", fifo, "--v", fifo},
       "error: --k " + fifo + ": not a .npy file: it starts with"},
  };
  for (const auto& [args, error] : cases) {
    const pid_t writer = ::attend::testing::StartEndlessWriter(fifo);
    const ChildRun run = Attend(args);
    ::attend::testing::StopWriter(writer);
    ASSERT_TRUE(run.finished) << error << ": still running after " << run.seconds << " s";
    EXPECT_EQ(run.exit_code, 1) << run.output;
    EXPECT_THAT(run.output, HasSubstr(error));
    EXPECT_LT(run.max_rss_bytes, SanitizedRss(kSmallRss));
  }
  std::filesystem::remove(fifo);
}

// The value limit follows --max_message_bytes: at 2 bytes a value, 12 bytes carry 6 values.
TEST(InputLimitsCli, NpyValueLimitFollowsMaxMessageBytes) {
  const std::string dir = ::testing::TempDir();
  const std::string six = dir + "/input_limits_six.npy", seven = dir + "/input_limits_seven.npy";
  ASSERT_TRUE(client::WriteNpyFile(six, {{6, 1, 1}, {1, 2, 3, 4, 5, 6}}).ok());
  ASSERT_TRUE(client::WriteNpyFile(seven, {{7, 1, 1}, {1, 2, 3, 4, 5, 6, 7}}).ok());
  // Six values pass the limit and the command goes on to call the (absent) server: exit 3.
  ChildRun run =
      Attend({"--max_message_bytes", "12", "attend", "--q", six, "--k", six, "--v", six});
  EXPECT_EQ(run.exit_code, 3) << run.output;
  run = Attend({"--max_message_bytes", "12", "attend", "--q", six, "--k", seven, "--v", six});
  EXPECT_EQ(run.exit_code, 1) << run.output;
  EXPECT_THAT(run.output,
              HasSubstr("error: --k " + seven +
                        ": the shape (7, 1, 1) holds 7 values; a .npy input is limited to 6 values "
                        "(a request of --max_message_bytes 12 carries no more, even as bf16 at 2 "
                        "bytes a value)\n"));
}

// Certificates were bounded already; this keeps them so.
TEST(InputLimitsCli, DevZeroAsCertificateStopsAtOneMebibyte) {
  const ChildRun run = Attend({"--tls", "--ca_cert", "/dev/zero", "health"});
  ASSERT_TRUE(run.finished) << "still running after " << run.seconds << " s";
  EXPECT_EQ(run.exit_code, 1) << run.output;
  EXPECT_THAT(run.output, HasSubstr("--ca_cert"));
  EXPECT_THAT(run.output, HasSubstr("1 MiB"));
  EXPECT_LT(run.max_rss_bytes, SanitizedRss(kSmallRss));
}

}  // namespace
}  // namespace attend
