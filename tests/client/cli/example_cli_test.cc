// `attend example` against a real server: every worked example of lessons 000 and 003 prints the
// lesson's numbers, line for line where the lesson's program prints lines. The golden lines are
// typed from the lessons' printouts, not from this command's output. Also --json, --heatmap, the
// list, and the lesson flags of `attend mha` and `attend attend`.
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "client/cli/cli.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"
#include "tests/client/xml_check.h"
#include "tests/server/server_fixture.h"
#include "tests/test_util.h"

namespace attend {
namespace {

using ::testing::HasSubstr;

class ExampleCliTest : public ::attend::testing::ServerSuite {
 protected:
  int Run(std::vector<std::string> tokens) {
    tokens.insert(tokens.begin(), {"--target", absl::StrCat("127.0.0.1:", server_->port())});
    out_.str("");
    err_.str("");
    return cli::RunCli(tokens, out_, err_);
  }
  std::set<std::string> Lines() const {
    std::vector<std::string> lines = absl::StrSplit(out_.str(), '\n');
    return {lines.begin(), lines.end()};
  }
  std::ostringstream out_, err_;
};

// Whole lines of each lesson's printout (003), or the values after "# →" (000's Python).
const std::map<std::string, std::vector<std::string>>& GoldenLines() {
  static const auto* golden = new std::map<std::string, std::vector<std::string>>{
      {"context-mixing",
       {"bank in 'river bank' : [0.3, 0.3, 0.9]", "bank in 'money bank' : [0.3, 0.3, 0.9]",
        "after mixing with river: [0.6, 0.15, 0.6]", "after mixing with money: [0.15, 0.6, 0.5]",
        "cosine(river-bank, river) = 0.88, cosine(river-bank, money) = 0.25",
        "cosine(money-bank, river) = 0.38, cosine(money-bank, money) = 0.82"}},
      {"uniform-average",
       {"position 0: average of 1 vector(s) = [1.0, 0.0]",
        "position 1: average of 2 vector(s) = [0.5, 0.5]",
        "position 2: average of 3 vector(s) = [0.6666667, 0.6666667]",
        "position 3: average of 4 vector(s) = [1.0, 0.5]"}},
      {"weighted-average", {"scores  = [2.0, 0.0, 2.0, 4.0]", "weights = 0.105 0.014 0.105 0.776"}},
      {"qkv",
       {"q0 =   0.12  -0.46", "q1 =   0.43  -1.10", "q2 =  -0.16   0.59", "q3 =  -0.18   0.26",
        "k0 =   0.57   0.12", "k1 =   0.64   0.86", "k2 =  -0.10   0.34", "k3 =   0.12  -0.51",
        "v0 =   1.44   0.91", "v1 =   1.07  -0.33", "v2 =   0.05  -0.07", "v3 =  -0.68  -0.49",
        "score(2 asks 1) = q2.k1 = 0.407, score(1 asks 2) = q1.k2 = -0.417"}},
      {"scaling",
       {"d_head   std of q.k   sqrt(d_head)   largest weight, unscaled   largest weight, scaled",
        "     4         2.00           2.00                      0.576                    0.369",
        "    64         8.23           8.00                      0.875                    0.359",
        "  1024        31.67          32.00                      0.965                    0.358"}},
      {"causal",
       {"raw scores:", "    1.000    1.500    2.000    2.500",
        "    2.500    1.000    1.500    2.000", "    2.000    2.500    1.000    1.500",
        "    1.500    2.000    2.500    1.000", "after the mask:",
        "    1.000-Infinity-Infinity-Infinity", "    2.500    1.000-Infinity-Infinity",
        "    2.000    2.500    1.000-Infinity", "    1.500    2.000    2.500    1.000",
        "weights (softmax per row):", "    1.000    0.000    0.000    0.000",
        "    0.818    0.182    0.000    0.000", "    0.331    0.547    0.122    0.000",
        "    0.167    0.276    0.455    0.102"}},
      {"full-attention",
       {"attention weights (row = asking position, column = position looked at):",
        "   1.000   0.000   0.000   0.000", "   0.635   0.365   0.000   0.000",
        "   0.282   0.383   0.335   0.000", "   0.237   0.270   0.269   0.224",
        "outputs:", "position 0:   1.438   0.907", "position 1:   1.305   0.457",
        "position 2:   0.833   0.108", "position 3:   0.490   0.000"}},
      {"matrix-form",
       {"position 0:   1.438   0.907", "position 1:   1.305   0.457", "position 2:   0.833   0.108",
        "position 3:   0.490   0.000", "largest difference to the loop version below 1e-6: true"}},
      {"multi-head",
       {"head 0 weights of the last position: 0.322 0.268 0.056 0.355",
        "head 1 weights of the last position: 0.137 0.140 0.217 0.507",
        "concatenated: 4 x 8, after Wo: 4 x 8", "parameters in Wq, Wk, Wv, Wo: 256"}},
      {"gqa",
       {"query head 0 -> key/value head 0", "query head 1 -> key/value head 0",
        "query head 2 -> key/value head 0", "query head 3 -> key/value head 0",
        "query head 4 -> key/value head 1", "query head 5 -> key/value head 1",
        "query head 6 -> key/value head 1", "query head 7 -> key/value head 1",
        "tiny model, 4096 tokens: 4,194,304 bytes = 4.00 MiB of KV cache",
        "per layer: Wq 16,777,216  Wk 4,194,304  Wv 4,194,304  Wo 16,777,216 parameters",
        "32 key/value heads: 524,288 bytes of KV cache per token (512 KiB); 8192 tokens = 4.00 "
        "GiB",
        " 8 key/value heads: 131,072 bytes of KV cache per token (128 KiB); 8192 tokens = 1.00 "
        "GiB"}},
      {"variants",
       {"variant               kv heads  group  KiB/token  GiB at 32768 tokens",
        "multi-head (MHA)           32      1        512                16.00",
        "grouped-query (GQA)         8      4        128                 4.00",
        "multi-query (MQA)           1     32         16                 0.50"}},
      {"cost",
       {"      n   prefill attention   prefill weights   decode attention   decode weights",
        "   1024            0.3 TFLOP         16.4 TFLOP          0.5 GFLOP        16.0 GFLOP",
        "   8192           17.6 TFLOP        131.1 TFLOP          4.3 GFLOP        16.0 GFLOP",
        "  32768          281.5 TFLOP        524.3 TFLOP         17.2 GFLOP        16.0 GFLOP",
        " 131072         4503.6 TFLOP       2097.2 TFLOP         68.7 GFLOP        16.0 GFLOP"}},
      {"previous-token",
       {"attention weights:", "   1.000   0.000   0.000   0.000",
        "   0.993   0.007   0.000   0.000", "   0.007   0.987   0.007   0.000",
        "   0.007   0.007   0.980   0.007", "position 0: own content (1, 0) -> output (1.00, 0.00)",
        "position 1: own content (0, 1) -> output (0.99, 0.01)",
        "position 2: own content (1, 1) -> output (0.01, 0.99)",
        "position 3: own content (2, 0) -> output (1.00, 0.99)"}},
  };
  return *golden;
}

// Lesson 000 is Python: the values printed after "# →".
const std::map<std::string, std::vector<std::string>>& GoldenValues() {
  static const auto* golden = new std::map<std::string, std::vector<std::string>>{
      {"it",
       {"# → [2.0, 1.0, 0.5]", "# → [0.63, 0.23, 0.14]", "# → [0.77, 0.37]", "63%", "23%", "14%"}},
      {"softmax", {"# → [7.39, 2.72, 1.65]", "# → 11.76", "# → [0.63, 0.23, 0.14]"}},
      {"dot", {"# → 4.0"}},
      {"variance", {"# → 4\n", "# → 1.0\n", "# → 11.3\n"}},
  };
  return *golden;
}

TEST_F(ExampleCliTest, EveryExamplePrintsTheLessonsLines) {
  for (const auto& [name, lines] : GoldenLines()) {
    ASSERT_EQ(Run({"example", name}), 0) << name << ": " << err_.str();
    const std::set<std::string> got = Lines();
    for (const std::string& line : lines) {
      EXPECT_TRUE(got.count(line)) << name << ": the line \"" << line << "\" in\n" << out_.str();
    }
  }
  for (const auto& [name, values] : GoldenValues()) {
    ASSERT_EQ(Run({"example", name}), 0) << name << ": " << err_.str();
    for (const std::string& v : values) EXPECT_THAT(out_.str(), HasSubstr(v)) << name;
  }
}

// The server's float mix differs from the lesson's Java in the last digit (1.7615942 and
// 0.11920292 in the lesson), so the mixed vector is checked to seven significant digits.
TEST_F(ExampleCliTest, WeightedAverageMixIsTheLessonsToSevenDigits) {
  ASSERT_EQ(Run({"example", "weighted-average"}), 0) << err_.str();
  EXPECT_THAT(out_.str(), HasSubstr("mixed   = [1.761594"));
  EXPECT_THAT(out_.str(), HasSubstr(", 0.1192029"));
  EXPECT_THAT(out_.str(), HasSubstr("]   (uniform average was [1.0, 0.5])"));
}

TEST_F(ExampleCliTest, ListNamesEveryExampleWithAGoldenTest) {
  ASSERT_EQ(Run({"--json", "example", "list"}), 0) << err_.str();
  google::protobuf::Struct list;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(out_.str(), &list).ok()) << out_.str();
  const auto& examples = list.fields().at("examples").list_value().values();
  EXPECT_EQ(examples.size(), GoldenLines().size() + GoldenValues().size());
  for (const auto& e : examples) {
    const std::string name = e.struct_value().fields().at("name").string_value();
    EXPECT_TRUE(GoldenLines().count(name) || GoldenValues().count(name)) << name;
  }
  ASSERT_EQ(Run({"example", "list"}), 0);
  EXPECT_THAT(out_.str(), HasSubstr("003 Example 13"));
}

TEST_F(ExampleCliTest, JsonCarriesTheNumbers) {
  ASSERT_EQ(Run({"--json", "example", "qkv"}), 0) << err_.str();
  google::protobuf::Struct s;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(out_.str(), &s).ok()) << out_.str();
  EXPECT_EQ(s.fields().at("example").string_value(), "qkv");
  EXPECT_NEAR(s.fields().at("q2_k1").number_value(), 0.407, 5e-4);
  EXPECT_NEAR(s.fields().at("q1_k2").number_value(), -0.417, 5e-4);
  ASSERT_EQ(Run({"--json", "example", "cost"}), 0) << err_.str();
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(out_.str(), &s).ok()) << out_.str();
  const auto& row = s.fields().at("rows").list_value().values(0).struct_value().fields();
  EXPECT_DOUBLE_EQ(row.at("prefill_weight_flops").number_value(), 2 * 8e9 * 1024);
}

TEST_F(ExampleCliTest, HeatmapOnlyWhereThereAreWeights) {
  const std::string path = ::testing::TempDir() + "/example_full.svg";
  ASSERT_EQ(Run({"example", "full-attention", "--heatmap", path}), 0) << err_.str();
  const std::string svg = ::attend::testing::ReadFile(path);
  EXPECT_THAT(svg, HasSubstr("<svg"));
  EXPECT_THAT(svg, HasSubstr("data-masked=\"true\""));
  EXPECT_EQ(Run({"example", "cost", "--heatmap", path}), 2);
  EXPECT_THAT(err_.str(), HasSubstr("no attention weights"));
  EXPECT_EQ(Run({"example", "nope"}), 2);
  EXPECT_THAT(err_.str(), HasSubstr("previous-token"));
}

TEST_F(ExampleCliTest, MhaJavaSeedPrintsTheLessonsProjectionsAndScores) {
  ASSERT_EQ(
      Run({"mha", "--java_seed", "1", "--n", "4", "--d_model", "4", "--n_head", "1", "--head_dim",
           "2", "--d_out", "0", "--scale", "1", "--causal", "--projections", "--scores"}),
      0)
      << err_.str();
  // Example 4's q2 = (-0.16, 0.59) and the two scores, raw and masked.
  EXPECT_THAT(out_.str(), HasSubstr("-0.1641   0.5943"));
  EXPECT_THAT(out_.str(), HasSubstr("0.407"));
  EXPECT_THAT(out_.str(), HasSubstr("-0.417"));
  EXPECT_THAT(out_.str(), HasSubstr("-inf"));
  EXPECT_EQ(Run({"mha", "--java_seed", "1", "--seed", "2"}), 2);
  EXPECT_EQ(Run({"mha", "--std", "1"}), 2);
}

TEST_F(ExampleCliTest, AttendScoresPrintsTheTables) {
  ASSERT_EQ(Run({"attend", "--example", "causal", "--scores"}), 0) << err_.str();
  EXPECT_THAT(out_.str(), HasSubstr("masked scores, head 0:"));
  EXPECT_THAT(out_.str(), HasSubstr("2.500"));
  ASSERT_EQ(Run({"--json", "attend", "--example", "it", "--scores"}), 0) << err_.str();
  EXPECT_THAT(out_.str(), HasSubstr("\"masked_scores\""));
}

}  // namespace
}  // namespace attend
