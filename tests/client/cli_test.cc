// The attend command line against a real server: outputs, --json, files and exit codes.
#include "client/cli/cli.h"

#include <cstdio>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "client/cli/command.h"
#include "client/npy.h"
#include "tests/server/server_fixture.h"
#include "tests/test_util.h"

namespace attend {
namespace {

class CliTest : public ::attend::testing::ServerSuite {
 protected:
  int Run(std::vector<std::string> tokens) {
    tokens.insert(tokens.begin(), {"--target", absl::StrCat("127.0.0.1:", server_->port())});
    out_.str("");
    err_.str("");
    return cli::RunCli(tokens, out_, err_);
  }

  std::ostringstream out_, err_;
};

TEST_F(CliTest, HealthReportsServing) {
  EXPECT_EQ(Run({"health"}), cli::kExitOk) << err_.str();
  EXPECT_NE(out_.str().find("attend.v1.Attention  SERVING"), std::string::npos) << out_.str();
  EXPECT_EQ(Run({"health", "--service", "no.such.Service"}), cli::kExitNotServing);
  EXPECT_NE(out_.str().find("SERVICE_UNKNOWN"), std::string::npos) << out_.str();
}

TEST_F(CliTest, SoftmaxPrintsTheLessonShares) {
  ASSERT_EQ(Run({"softmax", "2", "1", "0.5"}), cli::kExitOk) << err_.str();
  const std::string out = out_.str();
  for (const char* expected : {"0.628532", "0.231224", "0.140244", "62.9%", "7.389", "11.7561"}) {
    EXPECT_NE(out.find(expected), std::string::npos) << expected << " in\n" << out;
  }
}

TEST_F(CliTest, SoftmaxJacobianAndMaskedScores) {
  ASSERT_EQ(Run({"softmax", "3", "-inf", "1", "--jacobian"}), cli::kExitOk) << err_.str();
  EXPECT_NE(out_.str().find("jacobian"), std::string::npos);
  EXPECT_NE(out_.str().find("0.000000"), std::string::npos);
}

TEST_F(CliTest, SoftmaxJson) {
  ASSERT_EQ(Run({"--json", "softmax", "0", "0"}), cli::kExitOk) << err_.str();
  EXPECT_NE(out_.str().find("\"probabilities\": [\n  0.5,\n  0.5\n ]"), std::string::npos)
      << out_.str();
}

TEST_F(CliTest, AttendPrintsOutputWeightsAndStats) {
  ASSERT_EQ(
      Run({"attend", "--n_q", "3", "--n_head", "1", "--head_dim", "4", "--causal", "--weights"}),
      cli::kExitOk)
      << err_.str();
  const std::string out = out_.str();
  EXPECT_NE(out.find("output [3, 1, 4]"), std::string::npos) << out;
  EXPECT_NE(out.find("weights, head 0"), std::string::npos) << out;
  EXPECT_NE(out.find("1.000  0.000  0.000"), std::string::npos) << out;  // first causal row
  EXPECT_NE(out.find("engine onednn/f32: 6 attended pairs"), std::string::npos) << out;
}

TEST_F(CliTest, AttendReadsAndWritesNpyFiles) {
  const std::string dir = ::testing::TempDir();
  const std::string q = dir + "/cli_q.npy", k = dir + "/cli_k.npy", v = dir + "/cli_v.npy",
                    o = dir + "/cli_o.npy";
  ASSERT_TRUE(client::WriteNpyFile(q, {{1, 1, 4}, {1, 1, 1, 1}}).ok());
  ASSERT_TRUE(client::WriteNpyFile(k, {{3, 1, 4}, {1, 1, 1, 1, 1, 1, 0, 0, 1, 0, 0, 0}}).ok());
  ASSERT_TRUE(client::WriteNpyFile(v, {{3, 1, 2}, {1, 0, 0, 1, 1, 1}}).ok());
  ASSERT_EQ(Run({"attend", "--q", q, "--k", k, "--v", v, "--out", o}), cli::kExitOk) << err_.str();
  auto output = client::ReadNpyFile(o);
  ASSERT_TRUE(output.ok()) << output.status();
  EXPECT_EQ(output->shape, (std::vector<int64_t>{1, 1, 2}));
  EXPECT_NEAR(output->values[0], 0.77, 0.005);
  EXPECT_NEAR(output->values[1], 0.37, 0.005);
}

TEST_F(CliTest, AttendJsonHasTensorsAndStats) {
  ASSERT_EQ(
      Run({"attend", "--n_q", "2", "--n_head", "1", "--head_dim", "2", "--json", "--weights"}),
      cli::kExitOk);
  EXPECT_NE(out_.str().find("\"output\": {\"shape\": [2, 1, 2], \"values\": ["), std::string::npos)
      << out_.str();
  EXPECT_NE(out_.str().find("\"weights\": {\"shape\": [1, 2, 2]"), std::string::npos) << out_.str();
  EXPECT_NE(out_.str().find("\"attended_pairs\": \"4\""), std::string::npos) << out_.str();
}

TEST_F(CliTest, MhaAndScaling) {
  ASSERT_EQ(
      Run({"mha", "--n", "3", "--d_model", "8", "--n_head", "4", "--n_head_kv", "2", "--causal"}),
      cli::kExitOk)
      << err_.str();
  EXPECT_NE(out_.str().find("Wq 64, Wk 32, Wv 32, Wo 64, total 192 (key/value 64)"),
            std::string::npos)
      << out_.str();
  ASSERT_EQ(Run({"scaling", "--head_dims", "4"}), cli::kExitOk) << err_.str();
  EXPECT_NE(out_.str().find("0.576"), std::string::npos) << out_.str();
}

TEST_F(CliTest, ExitCodesTellFailuresApart) {
  EXPECT_EQ(Run({"softmax"}), cli::kExitUsage);
  EXPECT_EQ(Run({"softmax", "two"}), cli::kExitUsage);
  EXPECT_EQ(Run({"attend", "--bogus"}), cli::kExitUsage);
  EXPECT_EQ(Run({"nonsense"}), cli::kExitUsage);
  EXPECT_EQ(Run({"attend", "--n_head", "3", "--n_head_kv", "2"}), cli::kExitServerError);
  EXPECT_NE(err_.str().find("error: INVALID_ARGUMENT: n_head 3"), std::string::npos) << err_.str();
  EXPECT_EQ(Run({"attend", "--q", "/nonexistent.npy", "--k", "x", "--v", "y"}),
            cli::kExitLocalError);
  std::ostringstream out, err;
  EXPECT_EQ(cli::RunCli({"--target", "127.0.0.1:1", "--deadline", "2", "health"}, out, err),
            cli::kExitConnection);
  EXPECT_NE(err.str().find("UNAVAILABLE"), std::string::npos) << err.str();
}

TEST_F(CliTest, HelpListsCommandsAndExamples) {
  EXPECT_EQ(Run({"--help"}), cli::kExitOk);
  EXPECT_NE(out_.str().find("softmax"), std::string::npos);
  EXPECT_EQ(Run({"attend", "--help"}), cli::kExitOk);
  EXPECT_NE(out_.str().find("Examples:"), std::string::npos);
  EXPECT_NE(out_.str().find("--n_head_kv"), std::string::npos);
}

}  // namespace
}  // namespace attend
