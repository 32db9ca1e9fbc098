// The pictures of `attend plan --plot` and `attend cost --plot` against a real server, read back
// with python3's xml.etree: a log y axis, the points where lines meet the budget, the note when
// the axis runs past the model's maximum context, and cost's panel of roofline time. Expected
// values come from the same server's --json answers.
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "attend/v1/planner.pb.h"
#include "client/cli/framework/command.h"
#include "client/cli/render/format.h"
#include "gmock/gmock.h"
#include "google/protobuf/util/json_util.h"
#include "tests/client/cli/cli_fixture.h"
#include "tests/client/xml_check.h"

namespace attend {
namespace {

using ::attend::testing::PythonSelect;
using ::attend::testing::ReadFile;
using ::testing::HasSubstr;

std::vector<std::string> Select(const std::string& svg, const std::string& tag,
                                const std::string& cls, const std::string& what) {
  std::vector<std::string> lines = absl::StrSplit(PythonSelect(svg, tag, cls, what), '\n');
  if (!lines.empty() && lines.back().empty()) lines.pop_back();
  return lines;
}

class PlannerPlotTest : public ::attend::testing::CliServerSuite {
 protected:
  template <typename Message>
  Message Json() {
    Message m;
    const auto status = google::protobuf::util::JsonStringToMessage(out_.str(), &m);
    EXPECT_TRUE(status.ok()) << status << "\n" << out_.str();
    return m;
  }
  // One file per test: ctest runs the tests of this fixture as separate processes, in parallel
  // under -j, and a shared name let one test read another's picture.
  const std::string path_ = ::testing::TempDir() + "/planner_plot_" +
                            ::testing::UnitTest::GetInstance()->current_test_info()->name() +
                            ".svg";
};

TEST_F(PlannerPlotTest, PlanLogYHasATickPerPowerOfTen) {
  ASSERT_EQ(Run({"plan", "llama-3-8b", "--context", "8192", "--plot", path_}), cli::kExitOk);
  const std::string linear = ReadFile(path_);
  EXPECT_THAT(Select(linear, "text", "y-tick", "text").front(), "0");
  ASSERT_EQ(Run({"plan", "llama-3-8b", "--context", "8192", "--plot", path_, "--log_y"}),
            cli::kExitOk)
      << err_.str();
  const std::string svg = ReadFile(path_);
  EXPECT_EQ(::attend::testing::XmlProblem(svg), "");
  EXPECT_THAT(Select(svg, "text", "y-label", "text").at(0), HasSubstr("log scale"));
  const std::vector<std::string> ticks = Select(svg, "text", "y-tick", "text");
  ASSERT_GE(ticks.size(), 4u);
  EXPECT_THAT(ticks, ::testing::Contains("1"));
  EXPECT_THAT(ticks, ::testing::Contains("10"));
  EXPECT_THAT(ticks, ::testing::Not(::testing::Contains("0")));
  EXPECT_EQ(Run({"plan", "llama-3-8b", "--log_y"}), cli::kExitUsage);
  EXPECT_THAT(err_.str(), HasSubstr("--log_y goes with --plot"));
}

TEST_F(PlannerPlotTest, PlanMarksWhereEachLineMeetsTheBudget) {
  ASSERT_EQ(Run({"--json", "plan", "llama-3-8b", "--context", "32768", "--budget", "2GiB", "--plot",
                 path_}),
            cli::kExitOk)
      << err_.str();
  const v1::PlanKvCacheResponse plan = Json<v1::PlanKvCacheResponse>();
  const std::string svg = ReadFile(path_);
  // A line meets the budget where its bytes per token times the context reach it; the lines
  // that stay below it within the axis get no point.
  std::vector<std::string> labels, series;
  for (const v1::VariantRow& v : plan.variants()) {
    const int64_t fit = plan.budget().available_bytes() / v.bytes_per_token();
    if (fit >= plan.context_tokens()) continue;
    labels.push_back(absl::StrCat("fits to ", cli::Count(fit), " tokens"));
    if (v.is_model()) {
      EXPECT_EQ(fit, plan.budget().max_context_tokens());
    }
  }
  ASSERT_GE(labels.size(), 2u);  // MHA and the model's GQA; not MQA
  EXPECT_EQ(Select(svg, "circle", "point", "data-point"), labels);
  // Each ring sits on the dashed budget line.
  const std::vector<std::string> cy = Select(svg, "circle", "point", "cy");
  const std::vector<std::string> names = Select(svg, "polyline", "", "data-series");
  const std::vector<std::string> points = Select(svg, "polyline", "", "points");
  ASSERT_EQ(names.back(), "budget: 2.00 GiB for the cache");
  const std::string budget_y = points.back().substr(points.back().find(',') + 1, 6);
  for (const std::string& y : cy) EXPECT_NEAR(std::stod(y), std::stod(budget_y), 0.02);
}

TEST_F(PlannerPlotTest, PlanNotesWhenTheAxisRunsPastTheModelsContext) {
  ASSERT_EQ(Run({"--json", "plan", "llama-3-8b", "--context", "4096", "--plot", path_}),
            cli::kExitOk);
  EXPECT_EQ(Select(ReadFile(path_), "text", "note", "text").size(), 0u);
  ASSERT_EQ(Run({"--json", "plan", "llama-3-8b", "--context", "32768", "--plot", path_}),
            cli::kExitOk);
  const int64_t max_context = Json<v1::PlanKvCacheResponse>().model().max_context_tokens();
  ASSERT_GT(max_context, 0);
  ASSERT_LT(max_context, 32768);
  const std::string svg = ReadFile(path_);
  EXPECT_EQ(Select(svg, "text", "note", "text"),
            (std::vector<std::string>{
                absl::StrCat("note: the axis runs past Llama 3 8B's maximum context of ",
                             cli::Count(max_context), " tokens, to 32,768")}));
  EXPECT_THAT(Select(svg, "line", "", "data-marker"),
              ::testing::Contains(absl::StrCat("max context ", cli::Count(max_context))));
}

TEST_F(PlannerPlotTest, CostHasAPanelOfRooflineTime) {
  ASSERT_EQ(Run({"--json", "cost", "llama-3-8b", "--prompt", "2048", "--hardware", "a100", "--plot",
                 path_}),
            cli::kExitOk)
      << err_.str();
  const v1::EstimateCostResponse cost = Json<v1::EstimateCostResponse>();
  const std::string svg = ReadFile(path_);
  EXPECT_EQ(::attend::testing::XmlProblem(svg), "");
  EXPECT_EQ(Select(svg, "g", "chart-panel", "class").size(), 2u);
  EXPECT_EQ(Select(svg, "text", "title", "text").at(1), "Llama 3 8B on a100: roofline time");
  EXPECT_THAT(
      Select(svg, "text", "subtitle", "text").at(1),
      HasSubstr(absl::StrCat("prefill takes ", cli::Duration(cost.prefill().roofline_seconds()),
                             " (", cost.prefill().bound(), "-bound), a decode step ",
                             cli::Duration(cost.decode().roofline_seconds()))));
  const std::vector<std::string> labels = Select(svg, "text", "y-label", "text");
  ASSERT_EQ(labels.size(), 2u);
  EXPECT_THAT(labels[0], ::testing::Not(HasSubstr("log scale")));
  EXPECT_THAT(labels[1], HasSubstr("log scale"));
  // The whole prefill of a long prompt takes longer than one decode step at that context.
  const std::vector<std::string> names = Select(svg, "polyline", "", "data-series");
  const std::vector<std::string> points = Select(svg, "polyline", "", "points");
  ASSERT_EQ(names.size(), 4u);
  EXPECT_EQ(names[2], "prefill (the whole prompt)");
  EXPECT_EQ(names[3], "decode step (one token per sequence)");
  const auto last_y = [](const std::string& p) { return std::stod(p.substr(p.rfind(',') + 1)); };
  EXPECT_LT(last_y(points[2]), last_y(points[3]));  // pixels: higher is smaller y
  ASSERT_EQ(Run({"cost", "llama-3-8b", "--prompt", "2048", "--plot", path_, "--log_y"}),
            cli::kExitOk);
  for (const std::string& label : Select(ReadFile(path_), "text", "y-label", "text")) {
    EXPECT_THAT(label, HasSubstr("log scale"));
  }
  EXPECT_EQ(Run({"cost", "llama-3-8b", "--prompt", "2048", "--log_y"}), cli::kExitUsage);
}

}  // namespace
}  // namespace attend
