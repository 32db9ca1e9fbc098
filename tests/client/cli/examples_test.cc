// The example inputs in examples/ (those the commands in docs/cli.md and docs/planner.md use)
// run through the CLI against a real server, so that they keep matching the formats it reads.
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/cli/cli.h"
#include "client/cli/framework/command.h"
#include "tests/client/cli/cli_fixture.h"
#include "tests/server/server_fixture.h"
#include "tests/test_util.h"

namespace attend {
namespace {

std::string Example(const std::string& name) {
  return absl::StrCat(ATTEND_SOURCE_DIR, "/examples/", name);
}

class ExamplesTest : public ::attend::testing::CliServerSuite {};

// Causal over three tokens: the first query sees only the first key, so its output is v[0].
TEST_F(ExamplesTest, RequestJsonAttends) {
  ASSERT_EQ(Run({"attend", "--input", Example("request.json"), "--weights"}), cli::kExitOk)
      << err_.str();
  EXPECT_EQ(err_.str(), "");
  ASSERT_EQ(Run({"--json", "attend", "--input", Example("request.json")}), cli::kExitOk)
      << err_.str();
  EXPECT_NE(out_.str().find("[1, 2, 3, 4"), std::string::npos) << out_.str();
}

// TinyLlama 1.1B: 22 layers x 4 KV heads x 64 x 2 (K and V) x 2 bytes = 22,528 bytes per token.
TEST_F(ExamplesTest, ConfigJsonPlans) {
  ASSERT_EQ(Run({"plan", "--config", Example("config.json"), "--context", "2048"}), cli::kExitOk)
      << err_.str();
  EXPECT_EQ(err_.str(), "");
  EXPECT_NE(out_.str().find("22,528"), std::string::npos) << out_.str();
}

}  // namespace
}  // namespace attend
