// The CLI's output conventions: one flag vocabulary (bench's --n_head), -o table|json|wide and
// --no-headers, tables that fit $COLUMNS, and health --json.
#include <cstdlib>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "client/cli/cli.h"
#include "client/cli/command.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/server/server_fixture.h"

namespace attend {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

class OutputTest : public ::attend::testing::ServerSuite {
 protected:
  int Run(std::vector<std::string> tokens) {
    tokens.insert(tokens.begin(), {"--target", absl::StrCat("127.0.0.1:", server_->port())});
    out_.str("");
    err_.str("");
    return cli::RunCli(tokens, out_, err_);
  }

  std::ostringstream out_, err_;
};

TEST_F(OutputTest, BenchTakesNHeadWithHeadsAsAnAlias) {
  ASSERT_EQ(Run({"bench", "--n_head", "4", "--n_head_kv", "2", "--n_kv", "8", "--head_dim", "4",
                 "--requests", "2", "--warmup", "0", "--json"}),
            cli::kExitOk)
      << err_.str();
  const std::string with_n_head = out_.str();
  EXPECT_THAT(with_n_head, HasSubstr("k/v [8, 2, 4]"));
  ASSERT_EQ(Run({"bench", "--heads", "4", "--heads_kv", "2", "--n_kv", "8", "--head_dim", "4",
                 "--requests", "2", "--warmup", "0", "--json"}),
            cli::kExitOk)
      << err_.str();
  EXPECT_THAT(out_.str(), HasSubstr("k/v [8, 2, 4]"));
  EXPECT_EQ(Run({"bench", "--n_head", "4", "--heads", "4"}), cli::kExitUsage);
  EXPECT_EQ(err_.str(), "usage error: give --n_head or its alias --heads, not both\n");
  EXPECT_EQ(Run({"bench", "--heads", "0"}), cli::kExitUsage);
  EXPECT_THAT(err_.str(), HasSubstr("--heads"));
  ASSERT_EQ(Run({"bench", "--help"}), cli::kExitOk);
  EXPECT_THAT(out_.str(), HasSubstr("--n_head=<value>"));
  EXPECT_THAT(out_.str(), HasSubstr("alias of --n_head\n"));
  EXPECT_THAT(out_.str(), HasSubstr("alias of --n_head_kv\n"));
}

}  // namespace
}  // namespace attend
