// The attend command line against a real server: outputs, --json, files and exit codes; the
// lessons' examples and their heatmaps, JSON requests, and `attend bench`.
#include "client/cli/cli.h"

#include <cmath>
#include <cstdio>
#include <fstream>
#include <regex>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "client/cli/framework/command.h"
#include "client/json_input.h"
#include "client/kv_cache_client.h"
#include "client/npy.h"
#include "core/kernels/simd.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"
#include "tests/client/xml_check.h"
#include "tests/server/server_fixture.h"
#include "tests/test_util.h"

namespace attend {
namespace {

using ::attend::testing::ReadFile;
using ::testing::HasSubstr;

// One heatmap cell as python3's xml.etree read it (see PythonHeatmapCells).
struct Cell {
  int head, row, col;
  double value;
  bool masked;
  std::string tooltip;
};

std::vector<Cell> ParseCells(const std::string& listing) {
  std::vector<Cell> cells;
  for (absl::string_view line : absl::StrSplit(listing, '\n', absl::SkipEmpty())) {
    const std::vector<std::string> parts = absl::StrSplit(line, absl::MaxSplits('|', 1));
    std::istringstream fields(parts.at(0));
    Cell c;
    std::string state;
    fields >> c.head >> c.row >> c.col >> c.value >> state;
    EXPECT_TRUE(fields) << "unreadable cell: " << line;
    c.masked = state == "masked";
    c.tooltip = parts.size() > 1 ? parts[1] : "";
    cells.push_back(c);
  }
  return cells;
}

google::protobuf::Struct ParseJsonObject(const std::string& json) {
  google::protobuf::Struct s;
  const auto status = google::protobuf::util::JsonStringToMessage(json, &s);
  EXPECT_TRUE(status.ok()) << status << "\n" << json;
  return s;
}

double Number(const google::protobuf::Struct& s, const std::string& path) {
  const google::protobuf::Struct* at = &s;
  std::vector<std::string> keys = absl::StrSplit(path, '.');
  for (size_t i = 0; i + 1 < keys.size(); ++i) {
    const auto it = at->fields().find(keys[i]);
    if (it == at->fields().end()) {
      ADD_FAILURE() << "no " << path;
      return NAN;
    }
    at = &it->second.struct_value();
  }
  const auto it = at->fields().find(keys.back());
  if (it == at->fields().end()) {
    ADD_FAILURE() << "no " << path;
    return NAN;
  }
  return it->second.number_value();
}

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
  // Three query rows: the vector kernels ran, and the engine names their set.
  EXPECT_NE(out.find(absl::StrCat("engine onednn/f32+", simd::KernelName({DType::kFloat32}),
                                  ": 6 attended pairs")),
            std::string::npos)
      << out;
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
  EXPECT_NE(out_.str().find("\"attended_pairs\": 4"), std::string::npos) << out_.str();
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

// The layer's output [n, d_out] has no head dimension, so its table has no head column; the
// projections [n, heads, head_dim] keep theirs.
TEST_F(CliTest, MhaOutputTableHasNoHeadColumn) {
  ASSERT_EQ(Run({"mha", "--n", "2", "--d_model", "4", "--n_head", "2", "--projections"}),
            cli::kExitOk)
      << err_.str();
  EXPECT_THAT(out_.str(), HasSubstr("output [2, 4]:\ntoken     [0]      [1]      [2]     [3]\n"))
      << out_.str();
  EXPECT_THAT(out_.str(), HasSubstr("q [2, 2, 2]:\ntoken  head      [0]      [1]\n"));
  // `attend attend`'s output [n_q, heads, head_dim] keeps it too.
  ASSERT_EQ(Run({"attend", "--n_q", "1", "--n_head", "1", "--head_dim", "2"}), cli::kExitOk);
  EXPECT_THAT(out_.str(), HasSubstr("token  head"));
}

// d_model / n_head would round down (8 / 3 = 2) and compute a layer nobody asked for.
TEST_F(CliTest, MhaRefusesHeadsThatDoNotDivideTheModelUnlessHeadDimIsGiven) {
  EXPECT_EQ(Run({"mha", "--d_model", "8", "--n_head", "3"}), cli::kExitUsage);
  EXPECT_NE(err_.str().find("d_model 8 is not a multiple of n_head 3"), std::string::npos)
      << err_.str();
  EXPECT_NE(err_.str().find("--head_dim"), std::string::npos) << err_.str();
  EXPECT_EQ(Run({"mha", "--d_model", "8", "--n_head", "16"}), cli::kExitUsage);
  EXPECT_NE(err_.str().find("d_model 8 is not a multiple of n_head 16"), std::string::npos)
      << err_.str();
  ASSERT_EQ(Run({"mha", "--d_model", "8", "--n_head", "3", "--head_dim", "2"}), cli::kExitOk)
      << err_.str();
}

// absl::SimpleAtod, like strtod, reads "0x10" as 16; nobody types a logit in hexadecimal, so a
// 0x is a typo to report rather than a number.
TEST_F(CliTest, NumbersAreDecimalNotHexadecimal) {
  EXPECT_EQ(Run({"softmax", "0x10", "1"}), cli::kExitUsage);
  EXPECT_NE(err_.str().find("'0x10' is not a decimal number"), std::string::npos) << err_.str();
  EXPECT_EQ(Run({"softmax", "1", "-0X1p3"}), cli::kExitUsage);
  EXPECT_EQ(Run({"attend", "--scale", "0x1"}), cli::kExitUsage);
  EXPECT_NE(err_.str().find("--scale needs a decimal number, got '0x1'"), std::string::npos)
      << err_.str();
  ASSERT_EQ(Run({"softmax", "2", "1e0", "-inf"}), cli::kExitOk) << err_.str();
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

// The lesson's shares for the "it" example: softmax(2, 1, 0.5) (scores 4, 2, 1 at scale 1/2).
TEST_F(CliTest, ItExampleHeatmapHoldsTheLessonShares) {
  const std::string path = ::testing::TempDir() + "/cli_it.svg";
  ASSERT_EQ(Run({"attend", "--example", "it", "--heatmap", path}), cli::kExitOk) << err_.str();
  EXPECT_THAT(out_.str(), HasSubstr("wrote " + path + ": 1 head of 1 x 3 weights"));
  EXPECT_THAT(out_.str(), HasSubstr("0.629  0.231  0.140"));  // the weight table
  const std::string svg = ReadFile(path);
  EXPECT_EQ(::attend::testing::XmlProblem(svg), "");
  const std::vector<Cell> cells = ParseCells(::attend::testing::PythonHeatmapCells(svg));
  ASSERT_EQ(cells.size(), 3u);
  const double e[] = {std::exp(2.0), std::exp(1.0), std::exp(0.5)};
  const char* keys[] = {"animal", "tired", "street"};
  for (int j = 0; j < 3; ++j) {
    EXPECT_FALSE(cells[j].masked);
    EXPECT_EQ(cells[j].col, j);
    EXPECT_NEAR(cells[j].value, e[j] / (e[0] + e[1] + e[2]), 1e-6);
    EXPECT_THAT(cells[j].tooltip,
                HasSubstr(absl::StrCat("query 0 (it), key ", j, " (", keys[j], ")")));
  }
  EXPECT_THAT(cells[0].tooltip, HasSubstr(": 0.6285"));
}

// The lesson's causal weight table for "The cat sat down".
TEST_F(CliTest, CausalExampleHeatmapHoldsTheLessonTable) {
  const std::string path = ::testing::TempDir() + "/cli_causal.svg";
  ASSERT_EQ(Run({"attend", "--example", "causal", "--heatmap", path}), cli::kExitOk) << err_.str();
  const double golden[4][4] = {{1.000, 0, 0, 0},
                               {0.818, 0.182, 0, 0},
                               {0.331, 0.547, 0.122, 0},
                               {0.167, 0.276, 0.455, 0.102}};
  const std::vector<Cell> cells = ParseCells(::attend::testing::PythonHeatmapCells(ReadFile(path)));
  ASSERT_EQ(cells.size(), 16u);
  const char* tokens[] = {"The", "cat", "sat", "down"};
  for (const Cell& c : cells) {
    EXPECT_EQ(c.head, 0);
    EXPECT_EQ(c.masked, c.col > c.row) << c.row << ", " << c.col;
    EXPECT_NEAR(c.value, golden[c.row][c.col], 5e-4) << c.row << ", " << c.col;
    EXPECT_THAT(c.tooltip, HasSubstr(absl::StrCat("query ", c.row, " (", tokens[c.row], "), key ",
                                                  c.col, " (", tokens[c.col], ")")));
  }
  // --labels renames the tokens (queries take their positions' names).
  ASSERT_EQ(Run({"attend", "--example", "causal", "--heatmap", path, "--labels", "A,B,C,D"}),
            cli::kExitOk)
      << err_.str();
  EXPECT_THAT(ReadFile(path), HasSubstr("query 2 (C), key 1 (B): 0.5465"));
  EXPECT_EQ(Run({"attend", "--example", "causal", "--heatmap", path, "--labels", "A,B"}),
            cli::kExitUsage);
  EXPECT_THAT(err_.str(), HasSubstr("--labels names 2 tokens but there are 4 keys"));
  EXPECT_EQ(Run({"attend", "--example", "causal", "--n_q", "3"}), cli::kExitUsage);
  EXPECT_EQ(Run({"attend", "--example", "nope"}), cli::kExitUsage);
}

TEST_F(CliTest, MhaHeatmapHasAPanelPerHeadWithRowsSummingToOne) {
  const std::string path = ::testing::TempDir() + "/cli_mha.svg";
  ASSERT_EQ(Run({"mha", "--n", "3", "--d_model", "8", "--n_head", "2", "--causal", "--window", "2",
                 "--heatmap", path}),
            cli::kExitOk)
      << err_.str();
  const std::vector<Cell> cells = ParseCells(::attend::testing::PythonHeatmapCells(ReadFile(path)));
  ASSERT_EQ(cells.size(), 2u * 3u * 3u);
  double sums[2][3] = {};
  for (const Cell& c : cells) {
    // Causal with a window of 2: key j is visible from query i when i - 2 < j <= i.
    EXPECT_EQ(c.masked, !(c.col <= c.row && c.row - c.col < 2)) << c.row << ", " << c.col;
    if (c.masked) {
      EXPECT_EQ(c.value, 0.0);
    }
    sums[c.head][c.row] += c.value;
  }
  for (auto& head : sums) {
    for (double sum : head) EXPECT_NEAR(sum, 1.0, 1e-5);
  }
}

TEST_F(CliTest, LargeHeatmapsAreCappedAndSaySo) {
  const std::string path = ::testing::TempDir() + "/cli_big.svg";
  ASSERT_EQ(Run({"attend", "--n_q", "50", "--n_kv", "60", "--n_head", "18", "--n_head_kv", "3",
                 "--head_dim", "2", "--heatmap", path}),
            cli::kExitOk)
      << err_.str();
  // 16 heads of 6,144 cells: 384 each, the longer side cut first.
  EXPECT_THAT(out_.str(), HasSubstr("18 heads of 50 x 60 weights (drawn: the first 16 heads, 20 "
                                    "queries and 19 keys)"));
  const std::string svg = ReadFile(path);
  EXPECT_EQ(::attend::testing::XmlProblem(svg), "");
  // The queries are positions 10-59: the drawn ones are numbered so.
  EXPECT_THAT(svg, HasSubstr("truncated: showing heads 0-15 of 18, queries 10-29 (20 of 50), "
                             "keys 0-18 of 60"));
  EXPECT_EQ(ParseCells(::attend::testing::PythonHeatmapCells(svg)).size(), 16u * 20u * 19u);
  EXPECT_NE(svg.find(">head 15 (KV head 2)<"), std::string::npos);  // 6 query heads per KV head
}

TEST_F(CliTest, HeatmapScaleFixedOrAuto) {
  const std::string path = ::testing::TempDir() + "/cli_scale.svg";
  ASSERT_EQ(Run({"attend", "--example", "it", "--heatmap", path, "--heatmap_scale", "fixed"}),
            cli::kExitOk)
      << err_.str();
  EXPECT_THAT(ReadFile(path), HasSubstr(">fixed scale</text>"));
  ASSERT_EQ(Run({"mha", "--n", "3", "--heatmap", path}), cli::kExitOk) << err_.str();
  EXPECT_THAT(ReadFile(path), HasSubstr(">this picture's scale</text>"));
  EXPECT_EQ(Run({"attend", "--heatmap", path, "--heatmap_scale", "log"}), cli::kExitUsage);
  EXPECT_THAT(err_.str(), HasSubstr("--heatmap_scale: 'log'; use auto (default) or fixed"));
  EXPECT_EQ(Run({"attend", "--heatmap_scale", "fixed"}), cli::kExitUsage);
  EXPECT_THAT(err_.str(), HasSubstr("--heatmap_scale goes with --heatmap"));
}

TEST_F(CliTest, AttendReadsAJsonRequest) {
  const std::string path = ::testing::TempDir() + "/cli_request.json";
  std::ofstream(path) << R"({"q": {"shape": [1, 1, 4], "values": [1, 1, 1, 1]},
    "k": {"shape": [3, 1, 4], "values": [1, 1, 1, 1, 1, 1, 0, 0, 1, 0, 0, 0]},
    "v": {"shape": [3, 1, 2], "values": [1, 0, 0, 1, 1, 1]}})";
  ASSERT_EQ(Run({"attend", "--input", path}), cli::kExitOk) << err_.str();
  EXPECT_THAT(out_.str(), HasSubstr("0  0.7688  0.3715"));  // 0.63 [1, 0] + 0.23 [0, 1] + ...
  // The file's mask and scale apply, and the command line overrides them.
  std::ofstream(path) << R"({"q": {"shape": [2, 1, 1], "values": [1, 1]},
    "k": {"shape": [2, 1, 1], "values": [0, 0]}, "v": {"shape": [2, 1, 1], "values": [2, 4]},
    "mask": {"causal": true}, "scale": 1})";
  ASSERT_EQ(Run({"attend", "--input", path}), cli::kExitOk) << err_.str();
  EXPECT_THAT(out_.str(), HasSubstr("0     0  2.0000\n    1     0  3.0000"));
  ASSERT_EQ(Run({"attend", "--input", path, "--causal=false"}), cli::kExitOk) << err_.str();
  EXPECT_THAT(out_.str(), HasSubstr("0     0  3.0000\n    1     0  3.0000"));
  // The tensors --json prints read back as inputs.
  ASSERT_EQ(Run({"attend", "--n_q", "2", "--n_head", "1", "--head_dim", "2", "--json"}),
            cli::kExitOk);
  // --json prints each tensor on one line, {"shape": [...], "values": [...]}, without braces
  // inside.
  const std::string printed = out_.str();
  const size_t start = printed.find("\"output\": {");
  ASSERT_NE(start, std::string::npos) << printed;
  const size_t end = printed.find('}', start);
  absl::StatusOr<client::FloatTensor> output =
      client::TensorFromJson(printed.substr(start + 10, end + 1 - (start + 10)), "output");
  ASSERT_OK(output);
  EXPECT_EQ(output->shape, (std::vector<int64_t>{2, 1, 2}));
}

TEST_F(CliTest, MalformedJsonRequestsAreLocalErrorsNamingTheField) {
  const std::string path = ::testing::TempDir() + "/cli_bad.json";
  std::ofstream(path) << R"({"q": {"shape": [1, 1, 2], "values": [1, "one"]},
    "k": {"shape": [1, 1, 2], "values": [1, 1]}, "v": {"shape": [1, 1, 2], "values": [1, 1]}})";
  EXPECT_EQ(Run({"attend", "--input", path}), cli::kExitLocalError);
  EXPECT_THAT(err_.str(),
              HasSubstr(path + ": q.values[1]: expected a number (float32), got \"one\""));
  std::ofstream(path) << "{\"q\": {\"shape\": [1]\n\"values\": [1]}}";
  EXPECT_EQ(Run({"attend", "--input", path}), cli::kExitLocalError);
  EXPECT_THAT(err_.str(), HasSubstr("line 2, column 1"));
  EXPECT_EQ(Run({"attend", "--input", path + ".missing"}), cli::kExitLocalError);
  EXPECT_EQ(Run({"attend", "--input", path, "--n_q", "2"}), cli::kExitUsage);
  EXPECT_EQ(Run({"mha", "--input", path, "--n", "2"}), cli::kExitUsage);
}

TEST_F(CliTest, MhaReadsAJsonRequest) {
  const std::string path = ::testing::TempDir() + "/cli_mha.json";
  // Identity projections and two tokens: the layer's output is attention over x itself.
  std::ofstream(path) << R"({"x": {"shape": [2, 2], "values": [1, 0, 0, 1]},
    "wq": {"shape": [2, 2], "values": [1, 0, 0, 1]}, "wk": {"shape": [2, 2], "values": [1, 0, 0, 1]},
    "wv": {"shape": [2, 2], "values": [1, 0, 0, 1]}, "n_head": 1, "scale": 0,
    "mask": {"causal": true}})";
  ASSERT_EQ(Run({"mha", "--input", path, "--json"}), cli::kExitOk) << err_.str();
  // Causal, uniform weights (scale 0): token 0 sees itself, token 1 the mean of both.
  EXPECT_THAT(out_.str(),
              HasSubstr("\"output\": {\"shape\": [2, 2], \"values\": [1, 0, 0.5, 0.5]}"));
}

TEST_F(CliTest, BenchReportsOrderedPercentilesAndServerTimes) {
  ASSERT_EQ(Run({"bench", "--n_q", "2", "--n_kv", "16", "--heads", "2", "--head_dim", "8",
                 "--requests", "20", "--concurrency", "2", "--warmup", "2", "--json"}),
            cli::kExitOk)
      << err_.str();
  const google::protobuf::Struct r = ParseJsonObject(out_.str());
  EXPECT_EQ(Number(r, "requests"), 20);
  EXPECT_EQ(Number(r, "concurrency"), 2);
  EXPECT_GT(Number(r, "requests_per_second"), 0);
  for (const char* what : {"latency_seconds", "server_compute_seconds", "server_queue_seconds"}) {
    const std::string w = what;
    EXPECT_GE(Number(r, w + ".p50"), 0) << w;
    EXPECT_LE(Number(r, w + ".p50"), Number(r, w + ".p90")) << w;
    EXPECT_LE(Number(r, w + ".p90"), Number(r, w + ".p99")) << w;
    EXPECT_LE(Number(r, w + ".p99"), Number(r, w + ".max")) << w;
    EXPECT_LE(Number(r, w + ".mean"), Number(r, w + ".max")) << w;
  }
  // The server's part of a request is inside the client's wall time.
  EXPECT_GT(Number(r, "latency_seconds.p50"), 0);
  EXPECT_LT(Number(r, "server_compute_seconds.mean"), Number(r, "latency_seconds.mean"));
  EXPECT_GE(Number(r, "overhead_seconds.max"), 0);
  // 20 requests of 2 heads x 2 queries x 16 keys x 4 x head_dim 8 FLOP each.
  EXPECT_EQ(Number(r, "attention_flops"), 20.0 * 2 * 2 * 16 * 4 * 8);

  ASSERT_EQ(Run({"bench", "--requests", "5", "--n_kv", "4", "--heads", "1", "--head_dim", "4"}),
            cli::kExitOk)
      << err_.str();
  for (const char* text : {"bench Attend", "5 requests", "p50", "p99", "latency (client)",
                           "server compute", "overhead", "requests/s"}) {
    EXPECT_THAT(out_.str(), HasSubstr(text));
  }
}

TEST_F(CliTest, BenchDecodesOverTheKvCacheAndReleasesItsSequences) {
  ASSERT_EQ(
      Run({"bench", "--rpc", "decode", "--n_kv", "8", "--heads", "2", "--heads_kv", "1",
           "--head_dim", "8", "--batch", "2", "--requests", "12", "--concurrency", "3", "--json"}),
      cli::kExitOk)
      << err_.str();
  const google::protobuf::Struct r = ParseJsonObject(out_.str());
  EXPECT_EQ(Number(r, "requests"), 12);
  EXPECT_LE(Number(r, "latency_seconds.p50"), Number(r, "latency_seconds.p99"));
  EXPECT_GT(Number(r, "server_compute_seconds.max"), 0);
  // Every request decodes 2 sequences; each step attends over its whole cache, which grows.
  EXPECT_GT(Number(r, "attention_flops"), 12.0 * 2 * 2 * 9 * 4 * 8 - 1);
  client::ConnectionOptions options;
  options.target = absl::StrCat("127.0.0.1:", server_->port());
  auto all = client::KvCacheClient(client::Connect(options), options).ListAllSequences();
  ASSERT_OK(all);
  EXPECT_TRUE(all->empty()) << all->size() << " sequences left";
}

TEST_F(CliTest, BenchSoftmaxHasNoServerTimesAndErrorsStopTheRun) {
  ASSERT_EQ(Run({"bench", "--rpc", "softmax", "--n_kv", "8", "--requests", "10", "--json"}),
            cli::kExitOk)
      << err_.str();
  EXPECT_THAT(out_.str(), HasSubstr("\"server_compute_seconds\": null"));
  EXPECT_EQ(Number(ParseJsonObject(out_.str()), "requests"), 10);
  EXPECT_EQ(Run({"bench", "--rpc", "nope"}), cli::kExitUsage);
  EXPECT_EQ(Run({"bench", "--requests", "0"}), cli::kExitUsage);
  EXPECT_EQ(Run({"bench", "--rpc", "softmax", "--batch", "2"}), cli::kExitUsage);
  // A request the server refuses (3 heads do not share 2 key/value heads) ends the run.
  EXPECT_EQ(Run({"bench", "--heads", "3", "--heads_kv", "2", "--n_kv", "4", "--head_dim", "4"}),
            cli::kExitServerError);
  EXPECT_THAT(err_.str(), HasSubstr("INVALID_ARGUMENT"));
  std::ostringstream out, err;
  EXPECT_EQ(cli::RunCli({"--target", "127.0.0.1:1", "--deadline", "2", "bench", "--rpc", "softmax",
                         "--requests", "3"},
                        out, err),
            cli::kExitConnection);
}

}  // namespace
}  // namespace attend
