// The CLI's SVG writers: line charts (ticks, labels, escaping, the expected series) and
// heatmaps (one cell per weight, masked cells apart, tooltips, truncation), in documents that
// are well-formed XML (checked by a small checker and by python3's xml.etree).
#include "client/cli/render/svg.h"

#include <cctype>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <limits>
#include <regex>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "client/cli/render/svg_chart.h"
#include "client/cli/render/svg_heatmap.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/client/xml_check.h"

namespace attend::cli {
namespace {

using ::attend::testing::PythonHeatmapCells;
using ::attend::testing::PythonSeries;
using ::attend::testing::XmlProblem;

// The attribute `name` of every `tag` element, in order.
std::vector<std::string> Attributes(const std::string& svg, const std::string& tag,
                                    const std::string& name) {
  std::vector<std::string> out;
  const std::regex re("<" + tag + "\\b[^>]*\\b" + name + "=\"([^\"]*)\"");
  for (std::sregex_iterator it(svg.begin(), svg.end(), re), end; it != end; ++it) {
    out.push_back((*it)[1]);
  }
  return out;
}

std::vector<std::pair<double, double>> Points(const std::string& points) {
  std::vector<std::pair<double, double>> out;
  for (absl::string_view p : absl::StrSplit(points, ' ', absl::SkipEmpty())) {
    const std::vector<std::string> xy = absl::StrSplit(p, ',');
    out.emplace_back(std::stod(xy.at(0)), std::stod(xy.at(1)));
  }
  return out;
}

LineChart ThreeLines() {
  LineChart chart;
  chart.title = "Llama 3 8B: KV cache against context";
  chart.subtitle = "float16 cache";
  chart.x_label = "context (tokens)";
  chart.y_label = "KV cache (GiB)";
  chart.series = {{"MHA", {0, 16384, 32768}, {0, 8, 16}},
                  {"GQA", {0, 16384, 32768}, {0, 2, 4}},
                  {"MQA", {0, 16384, 32768}, {0, 0.25, 0.5}, true}};
  chart.markers = {{4096, "window 4,096"}};
  return chart;
}

TEST(XmlChecker, CatchesMalformedDocuments) {
  EXPECT_EQ(XmlProblem("<?xml version=\"1.0\"?>\n<a x='1'><b/>t &amp; &#x41;</a>\n"), "");
  for (const char* bad :
       {"<a><b></a></b>", "<a x='1' x='2'/>", "<a>&nope;</a>", "<a>1 < 2</a>", "<a b=1/>",
        "<a/><b/>", "<a>", "text<a/>", "<a x=\"<\"/>", "<a>&amp</a>", "<a x='1'y='2'/>", ""}) {
    EXPECT_NE(XmlProblem(bad), "") << bad;
  }
}

TEST(NiceTicks, StepsOfOneTwoOrFive) {
  EXPECT_EQ(NiceTicks(0, 32768, 8),
            (std::vector<double>{0, 5000, 10000, 15000, 20000, 25000, 30000, 35000}));
  EXPECT_EQ(NiceTicks(-3, 97, 5), (std::vector<double>{-20, 0, 20, 40, 60, 80, 100}));
  const std::vector<double> unit = NiceTicks(0, 1, 6);
  ASSERT_EQ(unit.size(), 6u);
  for (size_t i = 0; i < unit.size(); ++i) EXPECT_NEAR(unit[i], 0.2 * i, 1e-12);
  // An empty range becomes [lo, lo + 1].
  EXPECT_EQ(NiceTicks(5, 5, 2), (std::vector<double>{5, 5.5, 6}));
  const std::vector<double> big = NiceTicks(0, 4.5e15, 6);
  EXPECT_EQ(big.front(), 0);
  EXPECT_GE(big.back(), 4.5e15);
  EXPECT_DOUBLE_EQ(big[1] - big[0], 1e15);
}

TEST(TickLabel, SeparatorsAndDecimalsAsTheStepNeeds) {
  EXPECT_EQ(TickLabel(32768, 1), "32,768");
  EXPECT_EQ(TickLabel(1e6, 2e5), "1,000,000");
  EXPECT_EQ(TickLabel(-1500, 500), "-1,500");
  EXPECT_EQ(TickLabel(0, 5000), "0");
  EXPECT_EQ(TickLabel(0.6000000000000001, 0.2), "0.6");
  EXPECT_EQ(TickLabel(0.25, 0.05), "0.25");
  EXPECT_EQ(TickLabel(5.5e-17, 0.2), "0.0");
}

TEST(XmlEscape, EscapesMarkupAndReplacesBadBytes) {
  EXPECT_EQ(XmlEscape("<a & 'b' \"c\">"), "&lt;a &amp; &apos;b&apos; &quot;c&quot;&gt;");
  EXPECT_EQ(XmlEscape("caf\xC3\xA9 \xE2\x80\x94 ok"), "caf\xC3\xA9 \xE2\x80\x94 ok");
  EXPECT_EQ(XmlEscape("bad \xFF byte"), "bad ? byte");
  EXPECT_EQ(XmlEscape("cut \xE2\x80"), "cut ??");
  EXPECT_EQ(XmlEscape("overlong \xC0\xAF"), "overlong ??");
  EXPECT_EQ(XmlEscape(std::string("nul \0 bell \a tab\t", 17)), "nul ? bell ? tab ");
}

TEST(RenderSvg, IsWellFormedWithOnePolylinePerSeries) {
  const std::string svg = RenderSvg(ThreeLines());
  EXPECT_EQ(XmlProblem(svg), "") << svg;
  EXPECT_EQ(Attributes(svg, "polyline", "data-series"),
            (std::vector<std::string>{"MHA", "GQA", "MQA"}));
  EXPECT_EQ(Attributes(svg, "line", "data-marker"), (std::vector<std::string>{"window 4,096"}));
  for (const char* text :
       {"<title>Llama 3 8B: KV cache against context</title>", ">float16 cache</text>",
        ">context (tokens)</text>", ">KV cache (GiB)</text>", ">MHA</text>", ">MQA</text>",
        ">35,000</text>", ">20</text>", "stroke-dasharray=\"6 4\""}) {
    EXPECT_NE(svg.find(text), std::string::npos) << text;
  }
  EXPECT_EQ(svg.find("<script"), std::string::npos);
  EXPECT_EQ(svg.find("href"), std::string::npos);  // self-contained
}

TEST(RenderSvg, MapsDataIntoThePlotArea) {
  LineChart chart = ThreeLines();
  chart.markers.clear();
  const std::string svg = RenderSvg(chart);
  const std::vector<std::string> points = Attributes(svg, "polyline", "points");
  ASSERT_EQ(points.size(), 3u);
  const std::vector<std::pair<double, double>> mha = Points(points[0]);
  ASSERT_EQ(mha.size(), 3u);
  // (0, 0) is the origin of the axes: 90 px from the left, 60 px above the bottom of 500.
  EXPECT_DOUBLE_EQ(mha[0].first, 90.0);
  EXPECT_DOUBLE_EQ(mha[0].second, 440.0);
  // x and y grow right and up, linearly: the middle point is halfway.
  EXPECT_GT(mha[2].first, mha[1].first);
  EXPECT_LT(mha[2].second, mha[1].second);
  EXPECT_NEAR(mha[1].first - mha[0].first, mha[2].first - mha[1].first, 0.02);
  EXPECT_NEAR(mha[0].second - mha[1].second, mha[1].second - mha[2].second, 0.02);
  // GQA is a quarter of MHA at every x.
  const std::vector<std::pair<double, double>> gqa = Points(points[1]);
  EXPECT_NEAR(440.0 - gqa[2].second, (440.0 - mha[2].second) / 4, 0.02);
  const std::vector<std::string> widths = Attributes(svg, "svg", "width");
  ASSERT_EQ(widths.size(), 1u);
  for (const std::string& p : points) {
    for (const auto& [x, y] : Points(p)) {
      EXPECT_GE(x, 90.0);
      EXPECT_LE(x, std::stod(widths[0]));
      EXPECT_GE(y, 0.0);
      EXPECT_LE(y, 440.0);
    }
  }
}

TEST(RenderSvg, SkipsNonFinitePointsAndEscapesHostileNames) {
  LineChart chart;
  chart.title = "</title><script>alert(1)</script> & \xFF";
  chart.series = {{"a\"b<c>&d'e", {0, 1, std::nan(""), 3}, {0, 1, 2, 3}},
                  {"inf", {0, 1}, {std::numeric_limits<double>::infinity(), 1}}};
  chart.markers = {{std::nan(""), "nan"}, {2, "two & <three>"}};
  const std::string svg = RenderSvg(chart);
  EXPECT_EQ(XmlProblem(svg), "") << svg;
  EXPECT_EQ(svg.find("<script>"), std::string::npos);
  const std::vector<std::string> names = Attributes(svg, "polyline", "data-series");
  EXPECT_EQ(names, (std::vector<std::string>{"a&quot;b&lt;c&gt;&amp;d&apos;e", "inf"}));
  const std::vector<std::string> points = Attributes(svg, "polyline", "points");
  ASSERT_EQ(points.size(), 2u);
  EXPECT_EQ(Points(points[0]).size(), 3u);
  EXPECT_EQ(Points(points[1]).size(), 1u);
  EXPECT_EQ(Attributes(svg, "line", "data-marker"),
            (std::vector<std::string>{"two &amp; &lt;three&gt;"}));
}

TEST(RenderSvg, EmptyChartIsStillADocument) {
  const std::string svg = RenderSvg(LineChart());
  EXPECT_EQ(XmlProblem(svg), "") << svg;
  EXPECT_EQ(Attributes(svg, "polyline", "data-series").size(), 0u);
  EXPECT_NE(svg.find(">1.0</text>"), std::string::npos);  // the axes span [0, 1]
}

TEST(RenderSvg, LegendWidensTheChart) {
  LineChart chart = ThreeLines();
  const std::string narrow = RenderSvg(chart);
  chart.series[0].name = std::string(70, 'w');
  const std::string wide = RenderSvg(chart);
  EXPECT_LT(std::stod(Attributes(narrow, "svg", "width")[0]),
            std::stod(Attributes(wide, "svg", "width")[0]));
}

TEST(RenderSvg, ParsesWithPythonXmlEtree) {
  EXPECT_EQ(PythonSeries(RenderSvg(ThreeLines())), "MHA\nGQA\nMQA\n");
  LineChart hostile;
  hostile.title = "bad \xC3 utf-8 <&>";
  hostile.series = {{"x&y \xFF", {0, 1}, {0, 1}}};
  EXPECT_EQ(PythonSeries(RenderSvg(hostile)), "x&y ?\n");
}

// Two heads of 2 queries x 3 keys; the second query of each head sees every key, the first
// only the first two (as a causal mask with queries aligned to the end would have it).
Heatmap SmallHeatmap() {
  Heatmap h;
  h.title = "weights <&>";
  h.heads = 2;
  h.rows = 2;
  h.cols = 3;
  h.values = {0.7f, 0.3f, 0.0f, 0.2f, 0.3f, 0.5f, 1.0f, 0.0f, 0.0f, 0.0f, 0.25f, 0.75f};
  h.masked = {false, false, true, false, false, false, false, false, true, false, false, false};
  h.row_labels = {"cat", "sat"};
  h.column_labels = {"The", "cat", "sat"};
  return h;
}

TEST(RenderHeatmapSvg, OneCellPerWeightWithTooltipsAndMaskedCellsApart) {
  absl::StatusOr<std::string> svg = RenderHeatmapSvg(SmallHeatmap());
  ASSERT_TRUE(svg.ok()) << svg.status();
  EXPECT_EQ(XmlProblem(*svg), "") << *svg;
  EXPECT_EQ(Attributes(*svg, "rect", "data-value").size(), 12u);
  // A masked cell and a visible weight of exactly 0 look different: hatched grey against the
  // colour of 0.
  std::vector<std::string> fills;
  const std::regex cell_fill("<rect class=\"cell\"[^>]*\\bfill=\"([^\"]*)\"");
  for (std::sregex_iterator it(svg->begin(), svg->end(), cell_fill), end; it != end; ++it) {
    fills.push_back((*it)[1]);
  }
  ASSERT_EQ(fills.size(), 12u);
  EXPECT_EQ(fills[2], "url(#masked)");
  EXPECT_EQ(fills[8], "url(#masked)");
  EXPECT_NE(fills[7], "url(#masked)");  // head 1, query 0, key 1: visible, weight 0
  EXPECT_EQ(fills[7], fills[9]);        // both 0, both the bottom of the scale
  EXPECT_NE(fills[6], fills[7]);        // 1 and 0 differ
  EXPECT_EQ(Attributes(*svg, "rect", "data-masked").size(), 2u);
  for (const char* text :
       {"<title>weights &lt;&amp;&gt;</title>",
        "head 0, query 1 (sat), key 2 "
        "(sat): 0.5000</title>",
        "head 0, query 0 (cat), key 2 (sat): masked "
        "(not attended)</title>",
        ">head 1</text>", ">The</text>", "id=\"masked\"", "id=\"scale\"", ">masked</text>"}) {
    EXPECT_NE(svg->find(text), std::string::npos) << text;
  }
  EXPECT_EQ(svg->find("truncated"), std::string::npos);
  EXPECT_EQ(svg->find("<script"), std::string::npos);
  EXPECT_EQ(svg->find("href"), std::string::npos);  // self-contained
}

TEST(RenderHeatmapSvg, ParsesWithPythonXmlEtree) {
  absl::StatusOr<std::string> svg = RenderHeatmapSvg(SmallHeatmap());
  ASSERT_TRUE(svg.ok()) << svg.status();
  const std::string cells = PythonHeatmapCells(*svg);
  const std::vector<std::string> lines = absl::StrSplit(cells, '\n', absl::SkipEmpty());
  ASSERT_EQ(lines.size(), 12u) << cells;
  EXPECT_EQ(lines[0], "0 0 0 0.699999988 visible|head 0, query 0 (cat), key 0 (The): 0.7000");
  EXPECT_EQ(lines[2], "0 0 2 0 masked|head 0, query 0 (cat), key 2 (sat): masked (not attended)");
  EXPECT_EQ(lines[11], "1 1 2 0.75 visible|head 1, query 1 (sat), key 2 (sat): 0.7500");
}

TEST(RenderHeatmapSvg, ColourScaleEndsAtANiceTickOrTheGivenMaximum) {
  Heatmap h = SmallHeatmap();
  h.values[6] = 0.6f;  // the largest visible value is now 0.75
  absl::StatusOr<std::string> svg = RenderHeatmapSvg(h);
  ASSERT_TRUE(svg.ok());
  EXPECT_NE(svg->find(">0.8</text>"), std::string::npos);
  EXPECT_EQ(svg->find(">1.0</text>"), std::string::npos);
  h.value_max = 1.0;
  svg = RenderHeatmapSvg(h);
  ASSERT_TRUE(svg.ok());
  EXPECT_NE(svg->find(">1.0</text>"), std::string::npos);
}

TEST(RenderHeatmapSvg, CapsTheDrawnSizeAndSaysSo) {
  Heatmap h;
  h.title = "big";
  h.heads = 3;
  h.rows = 5;
  h.cols = 70;
  h.values.assign(3 * 5 * 70, 0.01f);
  h.max_panels = 2;
  h.max_rows = 4;
  h.max_cols = 60;
  EXPECT_TRUE(HeatmapTruncated(h));
  absl::StatusOr<std::string> svg = RenderHeatmapSvg(h);
  ASSERT_TRUE(svg.ok()) << svg.status();
  EXPECT_EQ(XmlProblem(*svg), "");
  EXPECT_EQ(Attributes(*svg, "rect", "data-value").size(), 2u * 4u * 60u);
  EXPECT_NE(svg->find("truncated: showing heads 0-1 of 3, queries 0-3 of 5, keys 0-59 of 70"),
            std::string::npos)
      << svg->substr(0, 2000);
  h.max_panels = 3;
  h.max_rows = 5;
  h.max_cols = 70;
  EXPECT_FALSE(HeatmapTruncated(h));
}

TEST(RenderHeatmapSvg, RefusesSizesThatDisagree) {
  Heatmap h = SmallHeatmap();
  h.values.pop_back();
  EXPECT_EQ(RenderHeatmapSvg(h).status().code(), absl::StatusCode::kInvalidArgument);
  h = SmallHeatmap();
  h.masked.pop_back();
  EXPECT_EQ(RenderHeatmapSvg(h).status().code(), absl::StatusCode::kInvalidArgument);
  h = SmallHeatmap();
  h.column_labels.pop_back();
  EXPECT_THAT(std::string(RenderHeatmapSvg(h).status().message()),
              ::testing::HasSubstr("2 column labels for 3 columns"));
  h = SmallHeatmap();
  h.rows = 0;
  EXPECT_EQ(RenderHeatmapSvg(h).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(RenderHeatmapSvg, EscapesHostileLabels) {
  Heatmap h = SmallHeatmap();
  h.row_labels = {"</text><script>", "\xFF&"};
  h.panel_titles = {"a\"b", "c'd"};
  absl::StatusOr<std::string> svg = RenderHeatmapSvg(h);
  ASSERT_TRUE(svg.ok());
  EXPECT_EQ(XmlProblem(*svg), "") << *svg;
  EXPECT_EQ(svg->find("<script>"), std::string::npos);
  const std::string cells = PythonHeatmapCells(*svg);
  EXPECT_NE(cells.find("a\"b, query 0 (</text><script>), key 0 (The): 0.7000"), std::string::npos)
      << cells;
  EXPECT_NE(cells.find("(?&)"), std::string::npos) << cells;
}

}  // namespace
}  // namespace attend::cli
