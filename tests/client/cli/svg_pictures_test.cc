// What the CLI's pictures show, read back from the SVG as python3's xml.etree parses it: heads
// in a grid within a bounded size, values printed only where legible, queries numbered by
// position, shared key/value heads named, the masked legend only when needed, a fixed colour
// scale; charts with a log y axis, marked points, notes and stacked panels. And that rsvg-convert
// (librsvg) renders them to PNG with the colours the cells claim.
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "client/cli/render/attention_heatmap.h"
#include "client/cli/render/svg_chart.h"
#include "client/cli/render/svg_heatmap.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/client/xml_check.h"

namespace attend::cli {
namespace {

using ::attend::testing::PythonSelect;
using ::attend::testing::RunPythonOn;
using ::attend::testing::XmlProblem;
using ::testing::HasSubstr;
using ::testing::Not;

// The lines of `text`, empty ones included (an absent attribute prints as one).
std::vector<std::string> Lines(const std::string& text) {
  std::vector<std::string> lines = absl::StrSplit(text, '\n');
  if (!lines.empty() && lines.back().empty()) lines.pop_back();
  return lines;
}

std::vector<std::string> Select(const std::string& svg, const std::string& tag,
                                const std::string& cls, const std::string& what) {
  return Lines(PythonSelect(svg, tag, cls, what));
}

// `heads` heads of rows x cols weights, each row's values 1/cols apart so that they differ.
Heatmap Uniform(int64_t heads, int64_t rows, int64_t cols) {
  Heatmap h;
  h.title = "weights";
  h.heads = heads;
  h.rows = rows;
  h.cols = cols;
  for (int64_t i = 0; i < heads * rows * cols; ++i) {
    h.values.push_back(static_cast<float>(i % cols + 1) / static_cast<float>(cols * cols));
  }
  return h;
}

std::string Render(const Heatmap& h) {
  absl::StatusOr<std::string> svg = RenderHeatmapSvg(h);
  EXPECT_TRUE(svg.ok()) << svg.status();
  EXPECT_EQ(XmlProblem(svg.value_or("")), "");
  return svg.value_or("");
}

// The distinct left and top edges of the panels' frames: the grid's columns and lines.
std::pair<size_t, size_t> GridShape(const std::string& svg) {
  const std::vector<std::string> xs = Select(svg, "rect", "frame", "x");
  const std::vector<std::string> ys = Select(svg, "rect", "frame", "y");
  return {std::set<std::string>(xs.begin(), xs.end()).size(),
          std::set<std::string>(ys.begin(), ys.end()).size()};
}

TEST(HeatmapGrid, ManyHeadsMakeAGridNotAStrip) {
  for (const auto& [heads, columns, lines] :
       {std::tuple{1, 1, 1}, {4, 2, 2}, {5, 3, 2}, {9, 3, 3}, {12, 4, 3}, {16, 4, 4}}) {
    const std::string svg = Render(Uniform(heads, 4, 6));
    EXPECT_EQ(GridShape(svg), std::make_pair(size_t(columns), size_t(lines))) << heads;
    EXPECT_EQ(Select(svg, "g", "panel", "data-head").size(), size_t(heads));
    const double width = std::stod(Select(svg, "svg", "", "width").at(0));
    const double height = std::stod(Select(svg, "svg", "", "height").at(0));
    EXPECT_LE(width, 1650) << heads;  // the grid's 1,400 px, margins and the legend
    EXPECT_LE(width, 3 * height) << heads;
  }
}

TEST(HeatmapGrid, FileSizeIsBoundedByTheCellBudget) {
  for (const auto& [heads, n] : {std::pair{12, 60}, {32, 128}}) {
    const Heatmap h = Uniform(heads, n, n);
    const std::string svg = Render(h);
    const HeatmapDrawn drawn = DrawnPart(h);
    EXPECT_TRUE(drawn.truncated);
    EXPECT_EQ(drawn.panels, std::min<int64_t>(heads, h.max_panels));
    EXPECT_LE(drawn.panels * drawn.rows * drawn.cols, h.max_cells);
    EXPECT_EQ(Select(svg, "rect", "cell", "data-value").size(),
              static_cast<size_t>(drawn.panels * drawn.rows * drawn.cols));
    EXPECT_LT(svg.size(), 1500u * 1000u) << heads << " heads of " << n << " x " << n;
    const std::vector<std::string> note = Select(svg, "text", "note", "text");
    ASSERT_EQ(note.size(), 1u);
    EXPECT_THAT(note[0], HasSubstr(absl::StrCat("queries 0-", drawn.rows - 1, " of ", n)));
  }
  // Twelve heads of 60 x 60 keep a panel each: rows and columns are cut, not heads.
  EXPECT_EQ(DrawnPart(Uniform(12, 60, 60)).panels, 12);
}

TEST(HeatmapValues, PrintedOnlyInCellsLargeEnoughToHoldThem) {
  Heatmap big = Uniform(1, 3, 3);
  big.masked = {false, true, true, false, false, true, false, false, false};
  const std::string svg = Render(big);
  const std::vector<std::string> widths = Select(svg, "rect", "cell", "width");
  ASSERT_EQ(widths.size(), 9u);
  EXPECT_GE(std::stod(widths[0]), 30);
  // One value per visible cell, none on a masked one.
  EXPECT_EQ(Select(svg, "text", "cell-value", "text"),
            (std::vector<std::string>{"0.11", "0.11", "0.22", "0.11", "0.22", "0.33"}));
  const std::string small = Render(Uniform(1, 40, 40));
  EXPECT_LT(std::stod(Select(small, "rect", "cell", "width").at(0)), 30);
  EXPECT_EQ(Select(small, "text", "cell-value", "text").size(), 0u);
}

TEST(HeatmapRows, NumberedFromTheRowOffset) {
  Heatmap h = Uniform(1, 2, 6);
  h.row_offset = 4;
  const std::string svg = Render(h);
  EXPECT_EQ(Select(svg, "text", "row-label", "text"), (std::vector<std::string>{"4", "5"}));
  EXPECT_EQ(Select(svg, "rect", "cell", "data-row").front(), "0");  // indices stay indices
  EXPECT_THAT(PythonSelect(svg, "title", "", "text"), HasSubstr("head 0, query 5, key 3: "));
}

// Weights [n_head, n_q, n_kv] with every value 1 / n_kv (only their shape matters here).
client::FloatTensor FlatWeights(int64_t n_head, int64_t n_q, int64_t n_kv) {
  return {{n_head, n_q, n_kv},
          std::vector<float>(static_cast<size_t>(n_head * n_q * n_kv), 1.0f / n_kv)};
}

TEST(AttentionHeatmap, QueriesAtTheirPositionsAndPanelsNameTheirKeyValueHead) {
  AttentionPicture picture;
  picture.title = "gqa";
  picture.mask.causal = true;
  picture.n_head_kv = 2;
  const Heatmap h = AttentionHeatmap(FlatWeights(4, 2, 6), picture);
  EXPECT_EQ(h.row_offset, 4);
  EXPECT_THAT(h.subtitle, HasSubstr("queries are positions 4-5 (the last 2)"));
  EXPECT_THAT(h.subtitle, HasSubstr("4 heads sharing 2 key/value heads"));
  EXPECT_THAT(h.subtitle, Not(HasSubstr("hover")));
  // One decode query: its position, not a range of one.
  EXPECT_THAT(AttentionHeatmap(FlatWeights(1, 1, 4096), picture).subtitle,
              HasSubstr("the query is position 4095 (the last)"));
  const std::string svg = Render(h);
  EXPECT_EQ(Select(svg, "text", "panel-title", "text"),
            (std::vector<std::string>{"head 0 (KV head 0)", "head 1 (KV head 0)",
                                      "head 2 (KV head 1)", "head 3 (KV head 1)"}));
  EXPECT_EQ(Select(svg, "text", "row-label", "text").front(), "4");
  // Query 4 (the first row) sees keys 0-4 under the causal mask; key 5 is hidden.
  const std::vector<std::string> masked = Select(svg, "rect", "cell", "data-masked");
  ASSERT_EQ(masked.size(), 4u * 2u * 6u);
  EXPECT_EQ(std::count(masked.begin(), masked.begin() + 6, "true"), 1);
  EXPECT_EQ(masked[5], "true");

  // Queries named on their own, without a mask, keep their numbers; heads that do not share
  // keep plain titles.
  AttentionPicture named;
  named.query_labels = {"it"};
  named.key_labels = {"animal", "tired", "street"};
  named.n_head_kv = 1;
  const Heatmap it = AttentionHeatmap(FlatWeights(1, 1, 3), named);
  EXPECT_EQ(it.row_offset, 0);
  EXPECT_TRUE(it.panel_titles.empty());
  EXPECT_THAT(PythonSelect(Render(it), "title", "", "text"), HasSubstr("query 0 (it), key 2"));
}

TEST(HeatmapLegend, MaskedEntryOnlyWhenSomethingIsMasked) {
  Heatmap h = Uniform(2, 3, 3);
  std::string svg = Render(h);
  EXPECT_EQ(Select(svg, "rect", "masked-swatch", "x").size(), 0u);
  EXPECT_EQ(Select(svg, "pattern", "", "id").size(), 0u);
  EXPECT_THAT(svg, Not(HasSubstr(">masked</text>")));
  h.masked.assign(h.values.size(), false);
  h.masked[4] = true;
  svg = Render(h);
  EXPECT_EQ(Select(svg, "rect", "masked-swatch", "x").size(), 1u);
  EXPECT_EQ(Select(svg, "pattern", "", "id"), (std::vector<std::string>{"masked"}));
}

TEST(HeatmapScale, FixedRunsFromZeroToOneInEveryPicture) {
  client::FloatTensor weights{{1, 1, 2}, {0.5f, 0.25f}};
  AttentionPicture picture;
  const std::string auto_svg = Render(AttentionHeatmap(weights, picture));
  picture.fixed_scale = true;
  const std::string fixed_svg = Render(AttentionHeatmap(weights, picture));
  // Own range: 0.5 is the top of the scale (yellow). Fixed: 0.5 is the middle of viridis.
  EXPECT_EQ(Select(auto_svg, "rect", "cell", "fill").at(0), "#fde725");
  EXPECT_EQ(Select(fixed_svg, "rect", "cell", "fill").at(0), "#21908d");
  EXPECT_EQ(Select(auto_svg, "text", "scale-tick", "text").back(), "0.5");
  EXPECT_EQ(Select(fixed_svg, "text", "scale-tick", "text").back(), "1.0");
  EXPECT_EQ(Select(auto_svg, "text", "scale-kind", "text"),
            (std::vector<std::string>{"this picture's scale"}));
  EXPECT_EQ(Select(fixed_svg, "text", "scale-kind", "text"),
            (std::vector<std::string>{"fixed scale"}));
}

// The y pixel of each point of the polyline of `series`.
std::vector<double> PolylineYs(const std::string& svg, const std::string& series) {
  const std::vector<std::string> names = Select(svg, "polyline", "", "data-series");
  const std::vector<std::string> points = Select(svg, "polyline", "", "points");
  std::vector<double> ys;
  for (size_t i = 0; i < names.size(); ++i) {
    if (names[i] != series) continue;
    for (absl::string_view p : absl::StrSplit(points[i], ' ', absl::SkipEmpty())) {
      ys.push_back(std::stod(std::string(p.substr(p.find(',') + 1))));
    }
  }
  return ys;
}

TEST(ChartLogY, TicksArePowersOfTenAndDecadesEvenlySpaced) {
  LineChart chart;
  chart.series = {{"growth", {0, 1, 2, 3, 4}, {0, 1, 10, 100, 1000}}};
  chart.log_y = true;
  const std::string svg = RenderSvg(chart);
  EXPECT_EQ(XmlProblem(svg), "");
  EXPECT_EQ(Select(svg, "text", "y-tick", "text"),
            (std::vector<std::string>{"1", "10", "100", "1,000"}));
  const std::vector<double> ys = PolylineYs(svg, "growth");
  ASSERT_EQ(ys.size(), 4u);  // y = 0 has no place on a log axis
  for (size_t i = 2; i < ys.size(); ++i) EXPECT_NEAR(ys[i - 1] - ys[i], ys[0] - ys[1], 0.02);
  chart.log_y = false;
  const std::vector<double> linear = PolylineYs(RenderSvg(chart), "growth");
  ASSERT_EQ(linear.size(), 5u);
  EXPECT_GT(linear[3] - linear[4], 5 * (linear[2] - linear[3]));
}

TEST(ChartPoints, MarkedOnTheirLineWithTheirLabel) {
  LineChart chart;
  chart.series = {{"kv", {0, 100}, {0, 50}}, {"budget", {0, 100}, {30, 30}, true}};
  chart.points = {{60, 30, "fits to 60 tokens", "kv"}};
  const std::string svg = RenderSvg(chart);
  EXPECT_EQ(Select(svg, "circle", "point", "data-point"),
            (std::vector<std::string>{"fits to 60 tokens"}));
  EXPECT_EQ(Select(svg, "circle", "point", "data-series"), (std::vector<std::string>{"kv"}));
  EXPECT_EQ(Select(svg, "text", "point-label", "text"),
            (std::vector<std::string>{"fits to 60 tokens"}));
  // The ring sits on the budget line, in the kv line's colour.
  EXPECT_NEAR(std::stod(Select(svg, "circle", "point", "cy").at(0)),
              PolylineYs(svg, "budget").at(0), 0.02);
  EXPECT_EQ(Select(svg, "circle", "point", "stroke").at(0), "#0072B2");
}

TEST(ChartNotesAndPanels, NotesUnderThePlotAndPanelsStacked) {
  LineChart flops, time;
  flops.title = "flops";
  flops.series = {{"a", {0, 1}, {0, 1}}};
  flops.notes = {"note: the x axis runs past the model's 8,192 tokens"};
  time.title = "time";
  time.series = {{"b", {0, 1}, {1, 100}}};
  time.log_y = true;
  const std::string svg = RenderSvg(std::vector<LineChart>{flops, time});
  EXPECT_EQ(XmlProblem(svg), "");
  EXPECT_EQ(Select(svg, "text", "note", "text"), flops.notes);
  EXPECT_EQ(Select(svg, "g", "chart-panel", "transform"),
            (std::vector<std::string>{"", "translate(0 500)"}));
  EXPECT_EQ(Select(svg, "svg", "", "height"), (std::vector<std::string>{"1000"}));
  EXPECT_EQ(Select(svg, "clipPath", "", "id"),
            (std::vector<std::string>{"plot-area", "plot-area-1"}));
  EXPECT_EQ(Select(svg, "text", "title", "text"), (std::vector<std::string>{"flops", "time"}));
  EXPECT_EQ(Select(svg, "title", "", "text"), (std::vector<std::string>{"flops"}));
}

// rsvg-convert's absence skips the test unless ATTEND_REQUIRE_RSVG=1 (scripts/test.sh, after
// scripts/setup.sh installed librsvg2-bin), where it fails.
bool ShouldRunRsvg() {
  if (std::system("command -v rsvg-convert >/dev/null 2>&1") == 0) return true;
  const char* require = std::getenv("ATTEND_REQUIRE_RSVG");
  return require != nullptr && std::string(require) == "1";
}

// Renders the SVG at sys.argv[1] with rsvg-convert and prints the PNG's width and height and the
// colour (#rrggbb) of the pixel at each "x,y" of the remaining arguments. PNGs of 8-bit RGB or
// RGBA, as rsvg-convert writes them, decoded here so that nothing outside the standard library
// is needed.
constexpr char kRenderScript[] = R"(import subprocess, sys, zlib, struct
png = subprocess.run(['rsvg-convert', sys.argv[1]], check=True, capture_output=True).stdout
assert png[:8] == b'\x89PNG\r\n\x1a\n', 'not a PNG'
pos, idat = 8, b''
while pos < len(png):
    n, kind = struct.unpack('>I4s', png[pos:pos + 8])
    body = png[pos + 8:pos + 8 + n]
    if kind == b'IHDR':
        w, h, depth, colour, _, _, interlace = struct.unpack('>IIBBBBB', body)
        assert depth == 8 and colour in (2, 6) and interlace == 0, (depth, colour, interlace)
    elif kind == b'IDAT':
        idat += body
    pos += 12 + n
bpp = 4 if colour == 6 else 3
raw, stride, rows, prev = zlib.decompress(idat), w * bpp, [], bytearray(w * bpp)
for y in range(h):
    f, line = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
    for i in range(stride):
        a = line[i - bpp] if i >= bpp else 0
        b, c = prev[i], prev[i - bpp] if i >= bpp else 0
        if f == 1: line[i] = (line[i] + a) & 255
        elif f == 2: line[i] = (line[i] + b) & 255
        elif f == 3: line[i] = (line[i] + (a + b) // 2) & 255
        elif f == 4:
            p = a + b - c
            pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
            line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
    rows.append(line)
    prev = line
print(w, h)
for xy in sys.argv[2:]:
    x, y = (int(v) for v in xy.split(','))
    print('#%02x%02x%02x' % tuple(rows[y][x * bpp:x * bpp + 3]))
)";

TEST(RsvgConvert, RendersAHeatmapWithTheColoursOfItsCells) {
  if (!ShouldRunRsvg()) GTEST_SKIP() << "rsvg-convert not installed (Debian: librsvg2-bin)";
  Heatmap h = Uniform(4, 3, 5);
  h.masked.assign(h.values.size(), false);
  h.masked[2] = true;
  const std::string svg = Render(h);
  // Near the top left corner of the first cell of each panel (its centre holds its value).
  const std::vector<std::string> xs = Select(svg, "rect", "cell", "x");
  const std::vector<std::string> ys = Select(svg, "rect", "cell", "y");
  const std::vector<std::string> fills = Select(svg, "rect", "cell", "fill");
  const double side = std::stod(Select(svg, "rect", "cell", "width").at(0));
  std::string script = kRenderScript;
  std::vector<std::string> probes;
  std::vector<std::string> expected;
  for (size_t i = 0; i < xs.size(); i += 15) {
    probes.push_back(absl::StrCat(static_cast<int>(std::stod(xs[i]) + side / 8), ",",
                                  static_cast<int>(std::stod(ys[i]) + side / 8)));
    expected.push_back(fills[i]);
  }
  ASSERT_EQ(probes.size(), 4u);
  // RunPythonOn passes only the SVG's path; the probes travel in the script.
  script =
      absl::StrCat("import sys\nsys.argv += ", "['", absl::StrJoin(probes, "', '"), "']\n", script);
  const std::vector<std::string> out = Lines(RunPythonOn(svg, script, "rsvg_heatmap"));
  ASSERT_EQ(out.size(), 5u) << absl::StrJoin(out, "\n");
  const double width = std::stod(Select(svg, "svg", "", "width").at(0));
  const double height = std::stod(Select(svg, "svg", "", "height").at(0));
  EXPECT_EQ(out[0], absl::StrCat(static_cast<int>(width), " ", static_cast<int>(height)));
  for (size_t i = 0; i < expected.size(); ++i) EXPECT_EQ(out[i + 1], expected[i]) << i;
}

TEST(RsvgConvert, RendersStackedCharts) {
  if (!ShouldRunRsvg()) GTEST_SKIP() << "rsvg-convert not installed (Debian: librsvg2-bin)";
  LineChart a, b;
  a.series = {{"a", {0, 1}, {0, 1}}};
  b.series = {{"b", {1, 2}, {1, 1000}}};
  b.log_y = true;
  const std::string svg = RenderSvg(std::vector<LineChart>{a, b});
  // A pixel of the white background, top left.
  const std::vector<std::string> out = Lines(RunPythonOn(
      svg, absl::StrCat("import sys\nsys.argv += ['2,2']\n", kRenderScript), "rsvg_chart"));
  EXPECT_EQ(out, (std::vector<std::string>{"860 1000", "#ffffff"}));
}

}  // namespace
}  // namespace attend::cli
