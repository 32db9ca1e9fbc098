#include "client/cli/svg.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "client/cli/format.h"
#include "common/utf8.h"

namespace attend::cli {
namespace {

// Colour-blind-friendly (Okabe-Ito), then repeated with dashes.
constexpr const char* kPalette[] = {"#0072B2", "#D55E00", "#009E73", "#CC79A7",
                                    "#E69F00", "#56B4E9", "#000000", "#F0E442"};
constexpr int kPaletteSize = sizeof(kPalette) / sizeof(kPalette[0]);

// Length of the UTF-8 sequence at text[i] when it is a character XML 1.0 allows, else 0.
size_t XmlCharLength(absl::string_view text, size_t i) {
  uint32_t code = 0;
  const size_t n = utf8::SequenceAt(text, i, &code);
  return code == 0xFFFE || code == 0xFFFF ? 0 : n;
}

std::string Num(double v) { return absl::StrFormat("%.2f", v); }

// Ticks of one axis over the data range [lo, hi] (and 0).
std::vector<double> AxisTicks(double lo, double hi, int target) {
  lo = std::min(lo, 0.0);
  if (!(hi > lo)) hi = lo + 1.0;
  return NiceTicks(lo, hi, target);
}

}  // namespace

std::vector<double> NiceTicks(double lo, double hi, int target) {
  if (!(hi > lo)) hi = lo + 1.0;
  target = std::max(target, 1);
  const double raw = (hi - lo) / target;
  const double magnitude = std::pow(10.0, std::floor(std::log10(raw)));
  const double normalised = raw / magnitude;
  double step = 10.0 * magnitude;
  if (normalised <= 1.0) {
    step = magnitude;
  } else if (normalised <= 2.0) {
    step = 2.0 * magnitude;
  } else if (normalised <= 5.0) {
    step = 5.0 * magnitude;
  }
  // Integer tick indices, so that no error accumulates and 0 is exactly 0.
  const double first = std::floor(lo / step + 1e-9);
  const double last = std::ceil(hi / step - 1e-9);
  std::vector<double> ticks;
  for (double i = first; i <= last; i += 1.0) ticks.push_back(i * step);
  return ticks;
}

std::string TickLabel(double value, double step) {
  int decimals = 0;
  if (step > 0.0 && step < 1.0) {
    decimals = std::min(12, static_cast<int>(std::ceil(-std::log10(step) - 1e-9)));
  }
  if (std::abs(value) < std::abs(step) * 1e-9) value = 0.0;
  if (decimals > 0 || std::abs(value) >= 1e15) return absl::StrFormat("%.*f", decimals, value);
  return Count(static_cast<int64_t>(std::llround(value)));
}

std::string XmlEscape(absl::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size();) {
    const char c = text[i];
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += "&apos;";
        break;
      default: {
        const unsigned char u = static_cast<unsigned char>(c);
        if (u < 0x20) {
          // XML 1.0 allows only tab, newline and carriage return among the control characters.
          out += (c == '\t' || c == '\n' || c == '\r') ? ' ' : '?';
          break;
        }
        const size_t n = XmlCharLength(text, i);
        if (n == 0) {
          out += '?';
          break;
        }
        out.append(text.data() + i, n);
        i += n;
        continue;
      }
    }
    ++i;
  }
  return out;
}

std::string RenderSvg(const LineChart& chart) {
  // The legend sits right of the plot; at 12 px a character of a sans-serif font is at most
  // about 7 px wide. The chart grows rather than squeeze the plot below 400 px.
  size_t longest_name = 0;
  for (const ChartSeries& s : chart.series) {
    longest_name = std::max(longest_name, s.name.size());
  }
  const double legend_width = 70.0 + 7.0 * static_cast<double>(std::min<size_t>(longest_name, 80));
  const double left = 90;
  const int width = std::clamp(
      std::max(chart.width, static_cast<int>(std::ceil(left + 400.0 + legend_width))), 320, 4096);
  const int height = std::clamp(chart.height, 240, 4096);
  // Plot area: room on the left for y tick labels and the axis label, on the right for the
  // legend, on top for the title lines.
  const double right = width - legend_width, top = chart.subtitle.empty() ? 50 : 68;
  const double bottom = height - 60.0;

  double x_lo = 0, x_hi = 0, y_lo = 0, y_hi = 0;
  bool any = false;
  const auto extend = [&](double x, double y, bool has_y) {
    if (!any) {
      x_lo = x_hi = x;
      if (has_y) y_lo = y_hi = y;
      any = true;
      return;
    }
    x_lo = std::min(x_lo, x);
    x_hi = std::max(x_hi, x);
    if (has_y) {
      y_lo = std::min(y_lo, y);
      y_hi = std::max(y_hi, y);
    }
  };
  for (const ChartSeries& s : chart.series) {
    for (size_t i = 0; i < std::min(s.x.size(), s.y.size()); ++i) {
      if (std::isfinite(s.x[i]) && std::isfinite(s.y[i])) extend(s.x[i], s.y[i], true);
    }
  }
  for (const ChartMarker& m : chart.markers) {
    if (std::isfinite(m.x)) extend(m.x, 0.0, false);
  }
  const std::vector<double> x_ticks = AxisTicks(x_lo, x_hi, 8);
  // A little headroom, so that a series at the maximum does not run along the frame.
  const std::vector<double> y_ticks =
      AxisTicks(y_lo, y_hi + 0.02 * (y_hi - std::min(y_lo, 0.0)), 6);
  const double x0 = x_ticks.front(), x1 = x_ticks.back();
  const double y0 = y_ticks.front(), y1 = y_ticks.back();
  const double x_step = x_ticks.size() > 1 ? x_ticks[1] - x_ticks[0] : 1.0;
  const double y_step = y_ticks.size() > 1 ? y_ticks[1] - y_ticks[0] : 1.0;
  const auto px = [&](double x) { return left + (x - x0) / (x1 - x0) * (right - left); };
  const auto py = [&](double y) { return bottom - (y - y0) / (y1 - y0) * (bottom - top); };

  std::string svg = absl::StrCat(
      "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n",
      "<svg xmlns=\"http://www.w3.org/2000/svg\" version=\"1.1\" width=\"", width, "\" height=\"",
      height, "\" viewBox=\"0 0 ", width, " ", height,
      "\" font-family=\"Helvetica, Arial, sans-serif\" font-size=\"12\">\n", "<title>",
      XmlEscape(chart.title), "</title>\n",
      "<rect x=\"0\" y=\"0\" width=\"100%\" height=\"100%\" fill=\"#ffffff\"/>\n",
      "<text class=\"title\" x=\"", Num(width / 2.0), "\" y=\"24\" text-anchor=\"middle\" ",
      "font-size=\"16\" font-weight=\"bold\">", XmlEscape(chart.title), "</text>\n");
  if (!chart.subtitle.empty()) {
    absl::StrAppend(&svg, "<text class=\"subtitle\" x=\"", Num(width / 2.0),
                    "\" y=\"44\" text-anchor=\"middle\" fill=\"#444444\">",
                    XmlEscape(chart.subtitle), "</text>\n");
  }

  // Grid, ticks and tick labels.
  absl::StrAppend(&svg, "<g class=\"grid\" stroke=\"#e0e0e0\" stroke-width=\"1\">\n");
  for (double t : x_ticks) {
    absl::StrAppend(&svg, "<line x1=\"", Num(px(t)), "\" y1=\"", Num(top), "\" x2=\"", Num(px(t)),
                    "\" y2=\"", Num(bottom), "\"/>\n");
  }
  for (double t : y_ticks) {
    absl::StrAppend(&svg, "<line x1=\"", Num(left), "\" y1=\"", Num(py(t)), "\" x2=\"", Num(right),
                    "\" y2=\"", Num(py(t)), "\"/>\n");
  }
  absl::StrAppend(&svg, "</g>\n<g class=\"axes\" stroke=\"#000000\" stroke-width=\"1\">\n",
                  "<line x1=\"", Num(left), "\" y1=\"", Num(bottom), "\" x2=\"", Num(right),
                  "\" y2=\"", Num(bottom), "\"/>\n", "<line x1=\"", Num(left), "\" y1=\"", Num(top),
                  "\" x2=\"", Num(left), "\" y2=\"", Num(bottom), "\"/>\n");
  for (double t : x_ticks) {
    absl::StrAppend(&svg, "<line x1=\"", Num(px(t)), "\" y1=\"", Num(bottom), "\" x2=\"",
                    Num(px(t)), "\" y2=\"", Num(bottom + 5), "\"/>\n");
  }
  for (double t : y_ticks) {
    absl::StrAppend(&svg, "<line x1=\"", Num(left - 5), "\" y1=\"", Num(py(t)), "\" x2=\"",
                    Num(left), "\" y2=\"", Num(py(t)), "\"/>\n");
  }
  absl::StrAppend(&svg, "</g>\n<g class=\"tick-labels\" fill=\"#000000\">\n");
  for (double t : x_ticks) {
    absl::StrAppend(&svg, "<text class=\"x-tick\" x=\"", Num(px(t)), "\" y=\"", Num(bottom + 19),
                    "\" text-anchor=\"middle\">", XmlEscape(TickLabel(t, x_step)), "</text>\n");
  }
  for (double t : y_ticks) {
    absl::StrAppend(&svg, "<text class=\"y-tick\" x=\"", Num(left - 8), "\" y=\"", Num(py(t) + 4),
                    "\" text-anchor=\"end\">", XmlEscape(TickLabel(t, y_step)), "</text>\n");
  }
  const double mid_y = (top + bottom) / 2;
  absl::StrAppend(&svg, "</g>\n<text class=\"x-label\" x=\"", Num((left + right) / 2), "\" y=\"",
                  Num(bottom + 42), "\" text-anchor=\"middle\">", XmlEscape(chart.x_label),
                  "</text>\n", "<text class=\"y-label\" x=\"24\" y=\"", Num(mid_y),
                  "\" text-anchor=\"middle\" transform=\"rotate(-90 24 ", Num(mid_y), ")\">",
                  XmlEscape(chart.y_label), "</text>\n");

  // Series, clipped to the plot area.
  absl::StrAppend(&svg, "<clipPath id=\"plot-area\"><rect x=\"", Num(left), "\" y=\"", Num(top),
                  "\" width=\"", Num(right - left), "\" height=\"", Num(bottom - top),
                  "\"/></clipPath>\n<g class=\"series\" clip-path=\"url(#plot-area)\">\n");
  for (size_t s = 0; s < chart.series.size(); ++s) {
    const ChartSeries& series = chart.series[s];
    std::string points;
    for (size_t i = 0; i < std::min(series.x.size(), series.y.size()); ++i) {
      if (!std::isfinite(series.x[i]) || !std::isfinite(series.y[i])) continue;
      absl::StrAppend(&points, points.empty() ? "" : " ", Num(px(series.x[i])), ",",
                      Num(py(series.y[i])));
    }
    const bool dashed = series.dashed || s >= static_cast<size_t>(kPaletteSize);
    absl::StrAppend(&svg, "<polyline data-series=\"", XmlEscape(series.name),
                    "\" fill=\"none\" stroke=\"", kPalette[s % kPaletteSize],
                    "\" stroke-width=\"2\" stroke-linejoin=\"round\"",
                    dashed ? " stroke-dasharray=\"6 4\"" : "", " points=\"", points, "\"/>\n");
  }
  absl::StrAppend(&svg, "</g>\n");

  // Markers: a dashed vertical line with its label at the top.
  if (!chart.markers.empty()) {
    absl::StrAppend(&svg, "<g class=\"markers\">\n");
    for (const ChartMarker& m : chart.markers) {
      if (!std::isfinite(m.x)) continue;
      const double x = px(m.x);
      absl::StrAppend(&svg, "<line data-marker=\"", XmlEscape(m.label), "\" x1=\"", Num(x),
                      "\" y1=\"", Num(top), "\" x2=\"", Num(x), "\" y2=\"", Num(bottom),
                      "\" stroke=\"#555555\" stroke-width=\"1.5\" stroke-dasharray=\"3 3\"/>\n",
                      "<text class=\"marker-label\" x=\"", Num(x + 4), "\" y=\"", Num(top + 14),
                      "\" fill=\"#333333\">", XmlEscape(m.label), "</text>\n");
    }
    absl::StrAppend(&svg, "</g>\n");
  }

  // Legend, right of the plot.
  absl::StrAppend(&svg, "<g class=\"legend\">\n");
  for (size_t s = 0; s < chart.series.size(); ++s) {
    const double y = top + 10 + 22.0 * static_cast<double>(s);
    const bool dashed = chart.series[s].dashed || s >= static_cast<size_t>(kPaletteSize);
    absl::StrAppend(&svg, "<line x1=\"", Num(right + 16), "\" y1=\"", Num(y), "\" x2=\"",
                    Num(right + 44), "\" y2=\"", Num(y), "\" stroke=\"", kPalette[s % kPaletteSize],
                    "\" stroke-width=\"2\"", dashed ? " stroke-dasharray=\"6 4\"" : "", "/>\n",
                    "<text class=\"legend-label\" x=\"", Num(right + 50), "\" y=\"", Num(y + 4),
                    "\">", XmlEscape(chart.series[s].name), "</text>\n");
  }
  absl::StrAppend(&svg, "</g>\n</svg>\n");
  return svg;
}

// --- heatmaps ------------------------------------------------------------------------------------

namespace {

// Viridis (perceptually uniform, colour-blind friendly, readable in grey), sampled at nine
// points and interpolated linearly between them.
constexpr unsigned char kViridis[9][3] = {{68, 1, 84},    {71, 44, 122},  {59, 81, 139},
                                          {44, 113, 142}, {33, 144, 141}, {39, 173, 129},
                                          {92, 200, 99},  {170, 220, 50}, {253, 231, 37}};

// The colour of t in [0, 1] (clamped; NaN as 0).
std::string Viridis(double t) {
  if (!(t > 0)) t = 0;
  if (t > 1) t = 1;
  const double x = t * 8;
  const int i = std::min(7, static_cast<int>(x));
  const double f = x - i;
  int rgb[3];
  for (int c = 0; c < 3; ++c) {
    rgb[c] =
        static_cast<int>(std::lround(kViridis[i][c] + f * (kViridis[i + 1][c] - kViridis[i][c])));
  }
  return absl::StrFormat("#%02x%02x%02x", rgb[0], rgb[1], rgb[2]);
}

// At most `max_chars` characters of a label (whole UTF-8 sequences), with "..." when cut.
std::string ShortLabel(const std::string& label, size_t max_chars) {
  size_t chars = 0, i = 0;
  while (i < label.size() && chars < max_chars) {
    const size_t n = utf8::SequenceAt(label, i);
    i += n == 0 ? 1 : n;
    ++chars;
  }
  return i >= label.size() ? label : label.substr(0, i) + "...";
}

size_t LabelChars(const std::string& label) {
  size_t chars = 0;
  for (size_t i = 0; i < label.size(); ++chars) {
    const size_t n = utf8::SequenceAt(label, i);
    i += n == 0 ? 1 : n;
  }
  return chars;
}

// "query" -> "queries", "key" -> "keys".
std::string PluralNoun(const std::string& noun) {
  const bool consonant_y = noun.size() >= 2 && noun.back() == 'y' &&
                           std::string("aeiou").find(noun[noun.size() - 2]) == std::string::npos;
  return consonant_y ? noun.substr(0, noun.size() - 1) + "ies" : noun + "s";
}

// "queries 0-47 of 100".
std::string Range(const std::string& what, int64_t shown, int64_t total) {
  return absl::StrCat(PluralNoun(what), " 0-", shown - 1, " of ", total);
}

}  // namespace

bool HeatmapTruncated(const Heatmap& h) {
  return h.heads > std::max<int64_t>(1, h.max_panels) ||
         h.rows > std::max<int64_t>(1, h.max_rows) || h.cols > std::max<int64_t>(1, h.max_cols);
}

absl::StatusOr<std::string> RenderHeatmapSvg(const Heatmap& h) {
  if (h.heads < 1 || h.rows < 1 || h.cols < 1) {
    return absl::InvalidArgumentError(absl::StrCat("heatmap: sizes must be positive, got ", h.heads,
                                                   " x ", h.rows, " x ", h.cols));
  }
  if (static_cast<double>(h.heads) * static_cast<double>(h.rows) * static_cast<double>(h.cols) !=
      static_cast<double>(h.values.size())) {
    return absl::InvalidArgumentError(absl::StrCat("heatmap: ", h.heads, " x ", h.rows, " x ",
                                                   h.cols, " cells but ", h.values.size(),
                                                   " values"));
  }
  if (!h.masked.empty() && h.masked.size() != h.values.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "heatmap: ", h.masked.size(), " mask entries for ", h.values.size(), " values"));
  }
  for (const auto& [labels, n, what] :
       {std::tuple{&h.row_labels, h.rows, "row"}, std::tuple{&h.column_labels, h.cols, "column"},
        std::tuple{&h.panel_titles, h.heads, "panel"}}) {
    if (!labels->empty() && static_cast<int64_t>(labels->size()) != n) {
      return absl::InvalidArgumentError(
          absl::StrCat("heatmap: ", labels->size(), " ", what, " labels for ", n, " ", what, "s"));
    }
  }
  const int64_t panels = std::min(h.heads, std::max<int64_t>(1, h.max_panels));
  const int64_t rows = std::min(h.rows, std::max<int64_t>(1, h.max_rows));
  const int64_t cols = std::min(h.cols, std::max<int64_t>(1, h.max_cols));
  const auto index = [&](int64_t head, int64_t r, int64_t c) {
    return static_cast<size_t>((head * h.rows + r) * h.cols + c);
  };
  const auto row_label = [&](int64_t r) {
    return h.row_labels.empty() ? absl::StrCat(r) : h.row_labels[static_cast<size_t>(r)];
  };
  const auto column_label = [&](int64_t c) {
    return h.column_labels.empty() ? absl::StrCat(c) : h.column_labels[static_cast<size_t>(c)];
  };

  // The colour scale: [0, value_max], by default up to a nice tick at or above what is drawn.
  double largest = 0;
  for (int64_t p = 0; p < panels; ++p) {
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t c = 0; c < cols; ++c) {
        const size_t k = index(p, r, c);
        const bool hidden = !h.masked.empty() && h.masked[k];
        if (!hidden && std::isfinite(h.values[k])) largest = std::max<double>(largest, h.values[k]);
      }
    }
  }
  const std::vector<double> scale_ticks =
      h.value_max > 0 ? NiceTicks(0, h.value_max, 5) : NiceTicks(0, largest > 0 ? largest : 1, 5);
  const double top_value = h.value_max > 0 ? h.value_max : scale_ticks.back();
  const double scale_step = scale_ticks.size() > 1 ? scale_ticks[1] - scale_ticks[0] : 1.0;

  // Geometry of one panel: cells as large as fit 480 x 640 px (4 to 56 px), row labels on the
  // left, column labels above (turned upright when they do not fit across a cell), every k-th
  // label when cells are smaller than the 11 px font.
  const double cell = std::clamp(
      std::floor(std::min(480.0 / static_cast<double>(rows), 640.0 / static_cast<double>(cols))),
      4.0, 56.0);
  const int64_t stride = static_cast<int64_t>(std::ceil(13.0 / cell));
  size_t longest_row = 1, longest_col = 1;
  for (int64_t r = 0; r < rows; ++r) longest_row = std::max(longest_row, LabelChars(row_label(r)));
  for (int64_t c = 0; c < cols; ++c)
    longest_col = std::max(longest_col, LabelChars(column_label(c)));
  longest_row = std::min<size_t>(longest_row, 19);
  longest_col = std::min<size_t>(longest_col, 19);
  const bool upright =
      6.5 * static_cast<double>(longest_col) > cell * static_cast<double>(stride) - 4;
  const double row_labels_w = 6.5 * static_cast<double>(longest_row) + 10;
  const double col_labels_h = upright ? 6.5 * static_cast<double>(longest_col) + 10 : 18;
  const double grid_w = cell * static_cast<double>(cols), grid_h = cell * static_cast<double>(rows);
  const double panel_w = 20 + row_labels_w + grid_w + 30;
  const double panel_h = 22 + 16 + col_labels_h + grid_h + 24;
  const double legend_w = 150, margin = 20;
  const int64_t per_line = std::max<int64_t>(
      1, std::min<int64_t>(
             {panels, 4, static_cast<int64_t>((4096 - legend_w - 2 * margin) / panel_w)}));
  const int64_t lines = (panels + per_line - 1) / per_line;
  const bool truncated = HeatmapTruncated(h);
  const double header = 36 + (h.subtitle.empty() ? 0 : 20) + (truncated ? 20 : 0) + 10;
  // Wide enough for the panels and the legend, and for the title lines (about 9.5 px per
  // character of the 16 px title, 7 px of the 12 px lines).
  const double text_w = std::max(9.5 * static_cast<double>(LabelChars(h.title)),
                                 7.0 * static_cast<double>(LabelChars(h.subtitle)));
  const double width =
      std::min(4096.0, std::max(2 * margin + static_cast<double>(per_line) * panel_w + legend_w,
                                2 * margin + text_w));
  const double height =
      std::max(header + static_cast<double>(lines) * panel_h + margin, header + 320.0);

  std::string svg = absl::StrCat(
      "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n",
      "<svg xmlns=\"http://www.w3.org/2000/svg\" version=\"1.1\" width=\"", Num(width),
      "\" height=\"", Num(height), "\" viewBox=\"0 0 ", Num(width), " ", Num(height),
      "\" font-family=\"Helvetica, Arial, sans-serif\" font-size=\"11\">\n", "<title>",
      XmlEscape(h.title), "</title>\n",
      "<defs>\n"
      "<pattern id=\"masked\" width=\"6\" height=\"6\" patternUnits=\"userSpaceOnUse\" "
      "patternTransform=\"rotate(45)\"><rect width=\"6\" height=\"6\" fill=\"#e6e6e6\"/>"
      "<line x1=\"0\" y1=\"0\" x2=\"0\" y2=\"6\" stroke=\"#a0a0a0\" stroke-width=\"2.5\"/>"
      "</pattern>\n<linearGradient id=\"scale\" x1=\"0\" y1=\"1\" x2=\"0\" y2=\"0\">\n");
  for (int i = 0; i <= 8; ++i) {
    absl::StrAppend(&svg, "<stop offset=\"", Num(i / 8.0), "\" stop-color=\"", Viridis(i / 8.0),
                    "\"/>\n");
  }
  absl::StrAppend(&svg, "</linearGradient>\n</defs>\n",
                  "<rect x=\"0\" y=\"0\" width=\"100%\" height=\"100%\" fill=\"#ffffff\"/>\n",
                  "<text class=\"title\" x=\"", Num(margin), "\" y=\"26\" font-size=\"16\" ",
                  "font-weight=\"bold\">", XmlEscape(h.title), "</text>\n");
  double line_y = 26;
  if (!h.subtitle.empty()) {
    line_y += 20;
    absl::StrAppend(&svg, "<text class=\"subtitle\" x=\"", Num(margin), "\" y=\"", Num(line_y),
                    "\" font-size=\"12\" fill=\"#444444\">", XmlEscape(h.subtitle), "</text>\n");
  }
  if (truncated) {
    line_y += 20;
    std::vector<std::string> parts;
    if (panels < h.heads) parts.push_back(Range("head", panels, h.heads));
    if (rows < h.rows) parts.push_back(Range(h.row_axis, rows, h.rows));
    if (cols < h.cols) parts.push_back(Range(h.column_axis, cols, h.cols));
    absl::StrAppend(&svg, "<text class=\"note\" x=\"", Num(margin), "\" y=\"", Num(line_y),
                    "\" font-size=\"12\" fill=\"#b00000\">truncated: showing ",
                    XmlEscape(absl::StrJoin(parts, ", ")), " (at most ", h.max_panels, " heads of ",
                    h.max_rows, " x ", h.max_cols, " cells are drawn)</text>\n");
  }

  for (int64_t p = 0; p < panels; ++p) {
    const double x0 = margin + static_cast<double>(p % per_line) * panel_w;
    const double y0 = header + static_cast<double>(p / per_line) * panel_h;
    const double grid_x = x0 + 20 + row_labels_w, grid_y = y0 + 22 + 16 + col_labels_h;
    const std::string panel_title =
        h.panel_titles.empty() ? absl::StrCat("head ", p) : h.panel_titles[static_cast<size_t>(p)];
    absl::StrAppend(
        &svg, "<g class=\"panel\" data-head=\"", p, "\">\n", "<text class=\"panel-title\" x=\"",
        Num(grid_x + grid_w / 2), "\" y=\"", Num(y0 + 14),
        "\" text-anchor=\"middle\" font-size=\"13\" font-weight=\"bold\">", XmlEscape(panel_title),
        "</text>\n", "<text class=\"column-axis\" x=\"", Num(grid_x + grid_w / 2), "\" y=\"",
        Num(y0 + 32), "\" text-anchor=\"middle\" fill=\"#444444\">", XmlEscape(h.column_axis),
        " &#8594;</text>\n");
    const double axis_y = grid_y + grid_h / 2;
    absl::StrAppend(&svg, "<text class=\"row-axis\" x=\"", Num(x0 + 10), "\" y=\"", Num(axis_y),
                    "\" text-anchor=\"middle\" fill=\"#444444\" transform=\"rotate(-90 ",
                    Num(x0 + 10), " ", Num(axis_y), ")\">", XmlEscape(h.row_axis),
                    " &#8594;</text>\n");
    for (int64_t c = 0; c < cols; c += stride) {
      const double x = grid_x + (static_cast<double>(c) + 0.5) * cell;
      const std::string text = XmlEscape(ShortLabel(column_label(c), 16));
      if (upright) {
        absl::StrAppend(&svg, "<text class=\"column-label\" x=\"", Num(x + 4), "\" y=\"",
                        Num(grid_y - 6), "\" transform=\"rotate(-90 ", Num(x + 4), " ",
                        Num(grid_y - 6), ")\">", text, "</text>\n");
      } else {
        absl::StrAppend(&svg, "<text class=\"column-label\" x=\"", Num(x), "\" y=\"",
                        Num(grid_y - 6), "\" text-anchor=\"middle\">", text, "</text>\n");
      }
    }
    for (int64_t r = 0; r < rows; r += stride) {
      absl::StrAppend(&svg, "<text class=\"row-label\" x=\"", Num(grid_x - 6), "\" y=\"",
                      Num(grid_y + (static_cast<double>(r) + 0.5) * cell + 4),
                      "\" text-anchor=\"end\">", XmlEscape(ShortLabel(row_label(r), 16)),
                      "</text>\n");
    }
    // Cells, each with its value as a tooltip; values printed inside when cells are large.
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t c = 0; c < cols; ++c) {
        const size_t k = index(p, r, c);
        const float v = h.values[k];
        const bool hidden = !h.masked.empty() && h.masked[k];
        const double x = grid_x + static_cast<double>(c) * cell;
        const double y = grid_y + static_cast<double>(r) * cell;
        const double t = v / top_value;
        absl::StrAppend(&svg, "<rect class=\"cell\" data-head=\"", p, "\" data-row=\"", r,
                        "\" data-col=\"", c, "\" data-value=\"", absl::StrFormat("%.9g", v), "\"",
                        hidden ? " data-masked=\"true\"" : "", " x=\"", Num(x), "\" y=\"", Num(y),
                        "\" width=\"", Num(cell), "\" height=\"", Num(cell), "\" fill=\"",
                        hidden ? "url(#masked)" : Viridis(t), "\"><title>",
                        XmlEscape(absl::StrCat(
                            panel_title, ", ", h.row_axis, " ", r, " (", row_label(r), "), ",
                            h.column_axis, " ", c, " (", column_label(c),
                            "): ", hidden ? "masked (not attended)" : absl::StrFormat("%.4f", v))),
                        "</title></rect>\n");
        if (cell >= 30 && !hidden) {
          absl::StrAppend(&svg, "<text class=\"cell-value\" x=\"", Num(x + cell / 2), "\" y=\"",
                          Num(y + cell / 2 + 4), "\" text-anchor=\"middle\" fill=\"",
                          t < 0.6 ? "#ffffff" : "#000000", "\">", absl::StrFormat("%.2f", v),
                          "</text>\n");
        }
      }
    }
    absl::StrAppend(&svg, "<rect x=\"", Num(grid_x), "\" y=\"", Num(grid_y), "\" width=\"",
                    Num(grid_w), "\" height=\"", Num(grid_h),
                    "\" fill=\"none\" stroke=\"#333333\" stroke-width=\"1\"/>\n</g>\n");
  }

  // Legend: the colour bar with its ticks, and the masked swatch below it.
  const double bar_x = margin + static_cast<double>(per_line) * panel_w + 10;
  const double bar_y = header + 20, bar_h = 200;
  absl::StrAppend(&svg, "<g class=\"legend\">\n<text x=\"", Num(bar_x), "\" y=\"", Num(bar_y - 8),
                  "\" font-weight=\"bold\">weight</text>\n", "<rect x=\"", Num(bar_x), "\" y=\"",
                  Num(bar_y), "\" width=\"16\" height=\"", Num(bar_h),
                  "\" fill=\"url(#scale)\" stroke=\"#333333\" stroke-width=\"1\"/>\n");
  for (double tick : scale_ticks) {
    if (tick > top_value * (1 + 1e-9)) continue;
    const double y = bar_y + bar_h - tick / top_value * bar_h;
    absl::StrAppend(&svg, "<line x1=\"", Num(bar_x + 16), "\" y1=\"", Num(y), "\" x2=\"",
                    Num(bar_x + 21), "\" y2=\"", Num(y), "\" stroke=\"#333333\"/>\n",
                    "<text class=\"scale-tick\" x=\"", Num(bar_x + 25), "\" y=\"", Num(y + 4),
                    "\">", XmlEscape(TickLabel(tick, scale_step)), "</text>\n");
  }
  const double swatch_y = bar_y + bar_h + 24;
  absl::StrAppend(&svg, "<rect class=\"masked-swatch\" x=\"", Num(bar_x), "\" y=\"", Num(swatch_y),
                  "\" width=\"16\" height=\"16\" fill=\"url(#masked)\" ",
                  "stroke=\"#333333\" stroke-width=\"1\"/>\n", "<text x=\"", Num(bar_x + 22),
                  "\" y=\"", Num(swatch_y + 12), "\">masked</text>\n", "<text x=\"",
                  Num(bar_x + 22), "\" y=\"", Num(swatch_y + 26),
                  "\" fill=\"#444444\">(not attended)</text>\n</g>\n</svg>\n");
  return svg;
}

}  // namespace attend::cli
