// The CLI's SVG line-chart writer: ticks, labels, escaping, and documents that are well-formed
// XML (checked by a small checker here and by python3's xml.etree) holding the expected series.
#include "client/cli/svg.h"

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
#include "gtest/gtest.h"

namespace attend::cli {
namespace {

// "" when `doc` is well-formed XML of the kind an SVG writer produces (an XML declaration,
// comments, elements with quoted, unique attributes, text, the five predefined entities and
// character references, one root element), otherwise what is wrong and where.
std::string XmlProblem(const std::string& doc) {
  const size_t n = doc.size();
  size_t i = 0;
  std::vector<std::string> open;
  bool root_seen = false;
  const auto at = [&](const std::string& what) { return absl::StrCat(what, " at offset ", i); };
  const auto name_start = [](char c) {
    return std::isalpha(static_cast<unsigned char>(c)) || c == '_' || c == ':';
  };
  const auto name_char = [&](char c) {
    return name_start(c) || std::isdigit(static_cast<unsigned char>(c)) || c == '-' || c == '.';
  };
  const auto read_name = [&] {
    const size_t start = i;
    if (i < n && name_start(doc[i])) {
      while (i < n && name_char(doc[i])) ++i;
    }
    return doc.substr(start, i - start);
  };
  const auto skip_space = [&] {
    const size_t start = i;
    while (i < n && std::isspace(static_cast<unsigned char>(doc[i]))) ++i;
    return i > start;
  };
  // At '&': a predefined entity or a character reference.
  const auto reference = [&]() -> bool {
    const size_t semi = doc.find(';', i);
    if (semi == std::string::npos) return false;
    const std::string ref = doc.substr(i + 1, semi - i - 1);
    static const std::set<std::string> kNamed = {"amp", "lt", "gt", "quot", "apos"};
    bool ok = kNamed.count(ref) > 0;
    if (!ok && ref.size() > 1 && ref[0] == '#') {
      const bool hex = ref[1] == 'x';
      const std::string digits = ref.substr(hex ? 2 : 1);
      ok = !digits.empty();
      for (char c : digits) {
        ok = ok && (hex ? std::isxdigit(static_cast<unsigned char>(c))
                        : std::isdigit(static_cast<unsigned char>(c)));
      }
    }
    i = semi + 1;
    return ok;
  };

  if (doc.compare(0, 5, "<?xml") == 0) {
    const size_t end = doc.find("?>");
    if (end == std::string::npos) return at("unterminated XML declaration");
    i = end + 2;
  }
  while (i < n) {
    const char c = doc[i];
    if (c == '<') {
      if (doc.compare(i, 4, "<!--") == 0) {
        const size_t end = doc.find("-->", i + 4);
        if (end == std::string::npos) return at("unterminated comment");
        i = end + 3;
        continue;
      }
      if (doc.compare(i, 2, "<!") == 0 || doc.compare(i, 2, "<?") == 0) {
        return at("unexpected markup declaration");
      }
      if (doc.compare(i, 2, "</") == 0) {
        i += 2;
        const std::string name = read_name();
        skip_space();
        if (i >= n || doc[i] != '>') return at("malformed end tag");
        ++i;
        if (open.empty() || open.back() != name) {
          return at(
              absl::StrCat("</", name, "> does not close <", open.empty() ? "" : open.back(), ">"));
        }
        open.pop_back();
        continue;
      }
      ++i;
      if (root_seen && open.empty()) return at("a second root element");
      const std::string name = read_name();
      if (name.empty()) return at("an element without a name");
      std::set<std::string> attributes;
      bool self_closing = false;
      while (true) {
        const bool space = skip_space();
        if (i >= n) return at("unterminated start tag");
        if (doc[i] == '>') {
          ++i;
          break;
        }
        if (doc.compare(i, 2, "/>") == 0) {
          i += 2;
          self_closing = true;
          break;
        }
        if (!space) return at("attributes must be separated by white space");
        const std::string attribute = read_name();
        if (attribute.empty()) return at("malformed attribute");
        if (!attributes.insert(attribute).second) return at("duplicate attribute " + attribute);
        skip_space();
        if (i >= n || doc[i] != '=') return at("attribute without '='");
        ++i;
        skip_space();
        if (i >= n || (doc[i] != '"' && doc[i] != '\'')) return at("unquoted attribute value");
        const char quote = doc[i++];
        while (i < n && doc[i] != quote) {
          if (doc[i] == '<') return at("'<' in an attribute value");
          if (doc[i] == '&') {
            if (!reference()) return at("bad reference in an attribute value");
          } else {
            ++i;
          }
        }
        if (i >= n) return at("unterminated attribute value");
        ++i;
      }
      root_seen = true;
      if (!self_closing) open.push_back(name);
    } else if (c == '&') {
      if (open.empty()) return at("a reference outside the root element");
      if (!reference()) return at("bad reference");
    } else {
      if (open.empty() && !std::isspace(static_cast<unsigned char>(c))) {
        return at("text outside the root element");
      }
      if (static_cast<unsigned char>(c) < 0x20 && c != '\t' && c != '\n' && c != '\r') {
        return at("a control character");
      }
      ++i;
    }
  }
  if (!open.empty()) return absl::StrCat("<", open.back(), "> is never closed");
  if (!root_seen) return "no root element";
  return "";
}

// Runs python3's xml.etree over `svg` and returns the data-series of its polylines, one per line
// (or the parser's error).
std::string PythonSeries(const std::string& svg) {
  const std::string dir = ::testing::TempDir();
  const std::string path = dir + "/svg_test_chart.svg", script = dir + "/svg_test_parse.py";
  std::ofstream(path, std::ios::binary) << svg;
  std::ofstream(script) << "import sys, xml.etree.ElementTree as ET\n"
                           "root = ET.parse(sys.argv[1]).getroot()\n"
                           "assert root.tag == '{http://www.w3.org/2000/svg}svg', root.tag\n"
                           "for p in root.iter('{http://www.w3.org/2000/svg}polyline'):\n"
                           "    print(p.get('data-series'))\n";
  FILE* pipe = popen(absl::StrCat("/usr/bin/python3 ", script, " ", path, " 2>&1").c_str(), "r");
  if (pipe == nullptr) return "popen failed";
  std::string out;
  char buffer[4096];
  size_t got;
  while ((got = fread(buffer, 1, sizeof(buffer), pipe)) > 0) out.append(buffer, got);
  const int status = pclose(pipe);
  return status == 0 ? out : absl::StrCat("python3 failed (", status, "): ", out);
}

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

}  // namespace
}  // namespace attend::cli
