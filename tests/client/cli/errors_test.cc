// The CLI's error messages and warnings against a real server: `attend cost` when the model does
// not fit the hardware's memory, hints for messages over a size limit and for a server that is
// not there, and why a file cannot be opened.
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "attend/v1/planner.pb.h"
#include "client/cli/cli.h"
#include "client/cli/framework/command.h"
#include "client/npy.h"
#include "google/protobuf/util/json_util.h"
#include "tests/server/server_fixture.h"
#include "tests/test_util.h"

namespace attend {
namespace {

// A loopback port with nothing listening on it: bound, then closed.
int FreePort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof(addr);
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    close(fd);
    return 0;
  }
  close(fd);
  return ntohs(addr.sin_port);
}

class ErrorsTest : public ::attend::testing::ServerSuite {
 protected:
  std::string Target() const { return absl::StrCat("127.0.0.1:", server_->port()); }
  int Run(std::vector<std::string> tokens) {
    if (std::find(tokens.begin(), tokens.end(), "--target") == tokens.end()) {
      tokens.insert(tokens.begin(), {"--target", Target()});
    }
    out_.str("");
    err_.str("");
    return cli::RunCli(tokens, out_, err_);
  }
  // The line of stderr that starts with `prefix`, or "" when there is none.
  std::string ErrLine(const std::string& prefix) const {
    std::istringstream lines(err_.str());
    for (std::string line; std::getline(lines, line);) {
      if (line.rfind(prefix, 0) == 0) return line;
    }
    return "";
  }
  std::ostringstream out_, err_;
};

// --- attend cost: does the model fit? ------------------------------------------------------------

// Llama 3 70B in bfloat16 is 141.1 GB of weights, more than an H100's 80 GiB.
TEST_F(ErrorsTest, CostWarnsWhenWeightsAndCacheExceedTheMemory) {
  ASSERT_EQ(Run({"cost", "llama-3-70b", "--context", "4096", "--hardware", "h100"}), cli::kExitOk)
      << err_.str();
  EXPECT_EQ(err_.str(),
            "warning: does not fit: weights 141.1 GB (bfloat16) + KV cache 1.34 GB (1 x 4,096 "
            "tokens) = 142.4 GB > h100 memory 85.9 GB (80.00 GiB)\n");

  ASSERT_EQ(Run({"--json", "cost", "llama-3-70b", "--context", "4096", "--hardware", "h100"}),
            cli::kExitOk);
  v1::EstimateCostResponse r;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(out_.str(), &r).ok()) << out_.str();
  ASSERT_TRUE(r.has_fits());
  EXPECT_FALSE(r.fits());
  EXPECT_DOUBLE_EQ(r.weights_bytes(), 2.0 * 70553706496);
  EXPECT_DOUBLE_EQ(r.kv_cache_bytes(), 4096 * 327680.0);
  EXPECT_NE(out_.str().find("\"fits\": false"), std::string::npos) << out_.str();
  EXPECT_NE(err_.str().find("warning: does not fit"), std::string::npos);
}

TEST_F(ErrorsTest, CostSaysNothingWhenItFitsOrTheMemoryIsUnknown) {
  ASSERT_EQ(Run({"--json", "cost", "llama-3-8b", "--context", "4096", "--hardware", "h100"}),
            cli::kExitOk);
  EXPECT_EQ(err_.str(), "");
  EXPECT_NE(out_.str().find("\"fits\": true"), std::string::npos) << out_.str();
  // A custom profile without --memory: whether it fits is unknown, and "fits" is absent.
  ASSERT_EQ(Run({"--json", "cost", "llama-3-70b", "--context", "4096", "--peak_flops", "1e15",
                 "--bandwidth", "1TB"}),
            cli::kExitOk);
  EXPECT_EQ(err_.str(), "");
  EXPECT_EQ(out_.str().find("\"fits\""), std::string::npos) << out_.str();
  // With --memory it is known.
  ASSERT_EQ(Run({"cost", "llama-3-70b", "--context", "4096", "--peak_flops", "1e15", "--bandwidth",
                 "1TB", "--hardware", "box", "--memory", "100GB"}),
            cli::kExitOk);
  EXPECT_EQ(ErrLine("warning:"),
            "warning: does not fit: weights 141.1 GB (bfloat16) + KV cache 1.34 GB (1 x 4,096 "
            "tokens) = 142.4 GB > box memory 100.0 GB (93.13 GiB)");
}

// --- messages over a size limit ------------------------------------------------------------------

// 1,024 keys of 1 x 64 float32 values are 256 KiB each of k and v: over a 100,000-byte limit of
// the client's own.
TEST_F(ErrorsTest, RequestOverTheClientsLimitSuggestsBf16AndALimit) {
  EXPECT_EQ(Run({"--max_message_bytes", "100000", "attend", "--n_q", "1", "--n_kv", "1024",
                 "--n_head", "1", "--head_dim", "64"}),
            cli::kExitServerError);
  EXPECT_EQ(ErrLine("error:"),
            "error: RESOURCE_EXHAUSTED: Sent message larger than max (524593 vs. 100000)");
  EXPECT_EQ(ErrLine("hint:"),
            "hint: the request is 524593 bytes, over this client's limit of 100000: send the "
            "tensors as bf16 with --wire bf16 (half the bytes of f32), or raise the limit: "
            "--max_message_bytes 1048576 (1 MiB); the server must take as much (attend-server "
            "--max_message_bytes)");
}

// The test server takes at most 1 MiB: 2,048 keys of 1 x 128 float32 are 1 MiB each of k and v.
TEST_F(ErrorsTest, RequestOverTheServersLimitSuggestsRaisingBoth) {
  EXPECT_EQ(Run({"attend", "--n_q", "1", "--n_kv", "2048", "--n_head", "1", "--head_dim", "128"}),
            cli::kExitServerError);
  EXPECT_EQ(ErrLine("error:"),
            "error: RESOURCE_EXHAUSTED: Received message larger than max (2097716 vs. 1048576)");
  EXPECT_EQ(ErrLine("hint:"),
            "hint: a message of 2097716 bytes is over a limit of 1048576 (this client's or the "
            "server's): send the tensors as bf16 with --wire bf16 (half the bytes of f32), or "
            "raise both to 3145728 (3 MiB): --max_message_bytes here and attend-server "
            "--max_message_bytes");
  // Already bf16: the hint does not suggest it again.
  EXPECT_EQ(Run({"attend", "--n_q", "1", "--n_kv", "4096", "--n_head", "1", "--head_dim", "128",
                 "--wire", "bf16"}),
            cli::kExitServerError);
  EXPECT_EQ(ErrLine("hint:"),
            "hint: a message of 2097460 bytes is over a limit of 1048576 (this client's or the "
            "server's): raise both to 3145728 (3 MiB): --max_message_bytes here and "
            "attend-server --max_message_bytes");
}

// Weights of 600 x 600 queries and keys are 1.44 MB: the server refuses to answer with them.
TEST_F(ErrorsTest, AnswerOverTheServersLimitNamesTheSizeNeeded) {
  EXPECT_EQ(Run({"attend", "--n_q", "600", "--n_kv", "600", "--n_head", "1", "--head_dim", "1",
                 "--weights"}),
            cli::kExitServerError);
  EXPECT_NE(ErrLine("error: RESOURCE_EXHAUSTED: the response would hold 1442400 bytes"), "")
      << err_.str();
  EXPECT_EQ(ErrLine("hint:"),
            "hint: the answer is over the server's message limit: ask for less, or raise the "
            "limit to 2097152 (2 MiB): attend-server --max_message_bytes, and --max_message_bytes "
            "here");
}

// --- no server
// -------------------------------------------------------------------------------------

TEST_F(ErrorsTest, NoServerListeningSaysWhereAndHowToStartOne) {
  const int port = FreePort();
  ASSERT_NE(port, 0);
  const std::string target = absl::StrCat("127.0.0.1:", port);
  EXPECT_EQ(Run({"--target", target, "models"}), cli::kExitConnection);
  EXPECT_EQ(ErrLine("hint:"),
            absl::StrCat("hint: no server is listening at ", target,
                         ": start one with `bash scripts/serve.sh` or `attend-server --address ",
                         target, "`, or point --target (or ATTEND_TARGET) at a running server"));
  EXPECT_NE(ErrLine("error: UNAVAILABLE:").find(absl::StrCat("(server ", target, ")")),
            std::string::npos)
      << err_.str();
}

TEST_F(ErrorsTest, UnresolvableHostSaysSo) {
  EXPECT_EQ(Run({"--target", "no-such-host.invalid:50051", "models"}), cli::kExitConnection);
  EXPECT_EQ(ErrLine("hint:"),
            "hint: the host of no-such-host.invalid:50051 does not resolve: check --target (or "
            "ATTEND_TARGET); for a server on this machine, start one with `bash "
            "scripts/serve.sh` and give --target localhost:50051");
  EXPECT_NE(ErrLine("error: UNAVAILABLE:").find("(server no-such-host.invalid:50051)"),
            std::string::npos)
      << err_.str();
}

// --- a deadline that passed ----------------------------------------------------------------------

// The server was there; the call ran out of time: a server error (exit 4), not "unreachable" (3).
TEST_F(ErrorsTest, DeadlineExceededIsAServerErrorWithAHint) {
  EXPECT_EQ(Run({"--deadline", "1e-9", "models"}), cli::kExitServerError) << err_.str();
  EXPECT_EQ(ErrLine("error:"),
            absl::StrCat("error: DEADLINE_EXCEEDED: Deadline Exceeded (server ", Target(), ")"));
  EXPECT_EQ(ErrLine("hint:"),
            "hint: the call did not finish within --deadline 1e-09 s: give it longer with "
            "--deadline SECONDS (or ATTEND_DEADLINE), or ask for less");
}

// --- files that cannot be opened -----------------------------------------------------------------

TEST_F(ErrorsTest, MissingFileSaysSo) {
  const std::string path = ::testing::TempDir() + "/errors_test_missing.json";
  std::filesystem::remove(path);
  for (const std::vector<std::string>& command :
       {std::vector<std::string>{"attend", "--input", path}, {"plan", "--config", path}}) {
    EXPECT_EQ(Run(command), cli::kExitLocalError) << command[0];
    EXPECT_EQ(err_.str(), absl::StrCat("error: cannot open '", path, "': no such file\n"));
  }
}

TEST_F(ErrorsTest, DirectorySaysSo) {
  const std::string path = ::testing::TempDir() + "/errors_test_dir";
  std::filesystem::create_directories(path);
  for (const std::vector<std::string>& command :
       {std::vector<std::string>{"attend", "--input", path}, {"plan", "--config", path}}) {
    EXPECT_EQ(Run(command), cli::kExitLocalError) << command[0];
    EXPECT_EQ(err_.str(), absl::StrCat("error: cannot open '", path,
                                       "': it is a directory; give the path of a file in it\n"));
  }
}

TEST_F(ErrorsTest, UnreadableFileSaysPermissionDenied) {
  if (geteuid() == 0) GTEST_SKIP() << "root reads a file of mode 000";
  const std::string path = ::testing::TempDir() + "/errors_test_unreadable.json";
  std::ofstream(path) << "{}";
  ASSERT_EQ(chmod(path.c_str(), 0), 0);
  EXPECT_EQ(Run({"attend", "--input", path}), cli::kExitLocalError);
  EXPECT_EQ(err_.str(), absl::StrCat("error: cannot open '", path,
                                     "': permission denied (this user may not read it)\n"));
  chmod(path.c_str(), 0600);
}

// --- usage errors name the flag or argument and the value ---------------------------------------

TEST_F(ErrorsTest, UsageErrorsNameTheFlagAndTheValue) {
  const struct {
    std::vector<std::string> args;
    std::string error;
  } cases[] = {
      {{"attend", "--n_q", "-1"},
       "--n_q must be between 1 and 2^24 (16777216) for random inputs, got -1"},
      {{"attend", "--n_q", "4", "--n_kv", "0"},
       "--n_kv must be between 1 and 2^24 (16777216) for random inputs, got 0"},
      {{"attend", "--head_dim", "16777217"},
       "--head_dim must be between 1 and 2^24 (16777216) for random inputs, got 16777217"},
      {{"mha", "--n", "-1"}, "--n must be between 1 and 2^20 (1048576) for random inputs, got -1"},
      {{"mha", "--n_head", "2", "--n_head_kv", "0"},
       "--n_head_kv must be between 1 and 2^20 (1048576) for random inputs, got 0"},
      {{"--deadline", "inf", "health"}, "--deadline must be finite: at most 1e9 seconds, got inf"},
      {{"--deadline", "2e9", "health"},
       "--deadline must be finite: at most 1e9 seconds, got 2e+09"},
      {{"--keepalive_seconds", "inf", "health"},
       "--keepalive_seconds must be finite: at most 1e9 seconds, got inf"},
      {{"softmax", "1e400", "1"},
       "logit 1, '1e400', is beyond the range of a double; scores are finite, or -inf to mask"},
      {{"softmax", "1", "-1e400"},
       "logit 2, '-1e400', is beyond the range of a double; scores are finite, or -inf to mask"},
      {{"softmax", "inf", "1"}, "logit 1, 'inf': scores are finite, or -inf to mask"},
      {{"softmax", "1", "nan"}, "logit 2, 'nan': scores are finite, or -inf to mask"},
      // The server's rule (core/lessons/softmax.cc), checked before anything is sent.
      {{"softmax", "1", "2", "--temperature", "inf"},
       "--temperature must be positive and finite: greater than 0 and at most 1.8e308 (a "
       "double's largest), got inf"},
      {{"softmax", "1", "2", "--temperature", "nan"},
       "--temperature must be positive and finite: greater than 0 and at most 1.8e308 (a "
       "double's largest), got nan"},
      {{"softmax", "1", "2", "--temperature", "0"},
       "--temperature must be positive and finite: greater than 0 and at most 1.8e308 (a "
       "double's largest), got 0"},
      {{"softmax", "1", "2", "--temperature=-0.5"},
       "--temperature must be positive and finite: greater than 0 and at most 1.8e308 (a "
       "double's largest), got -0.5"},
      {{"scaling", "--head_dims", "4,,64"},
       "--head_dims needs comma-separated integers, got '4,,64' (item 2 is empty)"},
      {{"scaling", "--head_dims", "4,64,"},
       "--head_dims needs comma-separated integers, got '4,64,' (item 3 is empty)"},
      {{"scaling", "--head_dims", ""},
       "--head_dims needs comma-separated integers, got '' (item 1 is empty)"},
      {{"seq", "save", "--id", "a", "--name", "../x"},
       "--name '../x': a saved sequence's file name has 1 to 128 characters of A-Z a-z 0-9 . _ : "
       "- and /, and no part between '/'s that is empty, '.' or '..'"},
      {{"seq", "load", "--name", "a b"},
       "--name 'a b': a saved sequence's file name has 1 to 128 characters of A-Z a-z 0-9 . _ : "
       "- and /, and no part between '/'s that is empty, '.' or '..'"},
  };
  for (const auto& [args, error] : cases) {
    EXPECT_EQ(Run(args), cli::kExitUsage) << absl::StrJoin(args, " ") << "\n" << err_.str();
    EXPECT_EQ(err_.str(), absl::StrCat("usage error: ", error, "\n")) << absl::StrJoin(args, " ");
  }
  // -inf masks, as it always did.
  EXPECT_EQ(Run({"softmax", "1", "-inf"}), cli::kExitOk) << err_.str();
  // Any positive, finite temperature goes to the server.
  EXPECT_EQ(Run({"softmax", "1", "2", "--temperature", "1e-3"}), cli::kExitOk) << err_.str();
}

// --- files that cannot be written ----------------------------------------------------------------

// Every file a command writes fails with the system's reason and exit 1: /dev/full takes the
// open and refuses the bytes (ENOSPC), which a buffered stream only reports when it flushes.
TEST_F(ErrorsTest, WriteErrorsSayWhyAndExitOne) {
  const std::string q = ::testing::TempDir() + "/errors_test_q.npy";
  ASSERT_TRUE(client::WriteNpyFile(q, {{1, 1, 4}, {1, 2, 3, 4}}).ok());
  const std::string dir = ::testing::TempDir() + "/errors_test_out_dir";
  std::filesystem::create_directories(dir);
  const struct {
    std::vector<std::string> args;
    std::string error;
  } cases[] = {
      {{"attend", "--q", q, "--k", q, "--v", q, "--out", "/dev/full"},
       "error: cannot write '/dev/full': No space left on device\n"},
      {{"attend", "--n_q", "2", "--weights_out", "/dev/full"},
       "error: cannot write '/dev/full': No space left on device\n"},
      {{"mha", "--n", "2", "--d_model", "4", "--n_head", "2", "--out", "/dev/full"},
       "error: cannot write '/dev/full': No space left on device\n"},
      {{"mha", "--n", "2", "--d_model", "4", "--n_head", "2", "--weights_out", "/dev/full"},
       "error: cannot write '/dev/full': No space left on device\n"},
      {{"attend", "--n_q", "2", "--out", dir},
       absl::StrCat("error: cannot write '", dir, "': Is a directory\n")},
      {{"attend", "--n_q", "2", "--heatmap", "/nonexistent/dir/x.svg"},
       "error: cannot write '/nonexistent/dir/x.svg': No such file or directory\n"},
      {{"attend", "--n_q", "2", "--heatmap", "/dev/full"},
       "error: cannot write '/dev/full': No space left on device\n"},
      {{"plan", "tiny", "--plot", "/dev/full"},
       "error: cannot write '/dev/full': No space left on device\n"},
      {{"cost", "tiny", "--context", "100", "--plot", "/dev/full"},
       "error: cannot write '/dev/full': No space left on device\n"},
  };
  for (const auto& [args, error] : cases) {
    EXPECT_EQ(Run(args), cli::kExitLocalError) << absl::StrJoin(args, " ") << "\n" << err_.str();
    EXPECT_EQ(err_.str(), error) << absl::StrJoin(args, " ");
  }
}

}  // namespace
}  // namespace attend
