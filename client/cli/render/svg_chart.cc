#include "client/cli/render/svg_chart.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "client/cli/render/svg.h"

namespace attend::cli {
namespace {

// Colour-blind-friendly (Okabe-Ito), then repeated with dashes.
constexpr const char* kPalette[] = {"#0072B2", "#D55E00", "#009E73", "#CC79A7",
                                    "#E69F00", "#56B4E9", "#000000", "#F0E442"};
constexpr int kPaletteSize = sizeof(kPalette) / sizeof(kPalette[0]);

// Ticks of one axis over the data range [lo, hi] (and 0).
std::vector<double> AxisTicks(double lo, double hi, int target) {
  lo = std::min(lo, 0.0);
  if (!(hi > lo)) hi = lo + 1.0;
  return NiceTicks(lo, hi, target);
}

// The smallest and largest coordinates of the series' points and the marked points (pairs
// with a non-finite coordinate aside, and on a log axis those with y <= 0) and of the
// markers' x; all 0 when there are none. A marker only widens x.
struct DataRange {
  double x_lo = 0, x_hi = 0, y_lo = 0, y_hi = 0;
};

DataRange RangeOf(const LineChart& chart) {
  DataRange d;
  bool any_x = false, any_y = false;
  const auto extend = [&](double x, double y, bool has_y) {
    if (!std::isfinite(x)) return;
    if (has_y && (!std::isfinite(y) || (chart.log_y && y <= 0))) return;
    d.x_lo = any_x ? std::min(d.x_lo, x) : x;
    d.x_hi = any_x ? std::max(d.x_hi, x) : x;
    any_x = true;
    if (!has_y) return;
    d.y_lo = any_y ? std::min(d.y_lo, y) : y;
    d.y_hi = any_y ? std::max(d.y_hi, y) : y;
    any_y = true;
  };
  for (const ChartSeries& s : chart.series) {
    for (size_t i = 0; i < std::min(s.x.size(), s.y.size()); ++i) extend(s.x[i], s.y[i], true);
  }
  for (const ChartPoint& p : chart.points) extend(p.x, p.y, true);
  for (const ChartMarker& m : chart.markers) extend(m.x, 0.0, false);
  return d;
}

// Powers of ten from the one at or below `lo` to the one at or above `hi` (at least two).
// REQUIRES: 0 < lo <= hi, both finite.
std::vector<double> LogTicks(double lo, double hi) {
  const int first = static_cast<int>(std::floor(std::log10(lo) + 1e-9));
  const int last = std::max(first + 1, static_cast<int>(std::ceil(std::log10(hi) - 1e-9)));
  std::vector<double> ticks;
  for (int k = first; k <= last; ++k) ticks.push_back(std::pow(10.0, k));
  return ticks;
}

// A power of ten as a tick label: "0.01", "1", "1,000", and from a million on "1e6".
std::string LogTickLabel(double value) {
  const int k = static_cast<int>(std::lround(std::log10(value)));
  if (k >= 6 || k < -4) return absl::StrCat("1e", k);
  if (k >= 0) return TickLabel(value, 1);
  return TickLabel(value, value);
}

// The picture's size, the plot area in it (pixels) and the ticks of its axes (data units).
struct ChartFrame {
  int width = 0, height = 0;
  double left = 0, right = 0, top = 0, bottom = 0;
  std::vector<double> x_ticks, y_ticks;
  bool log_y = false;

  // The pixel column of data x and the pixel row of data y; the axes run from the first tick to
  // the last (y in log10 on a log axis).
  double X(double x) const {
    const double x0 = x_ticks.front(), x1 = x_ticks.back();
    return left + (x - x0) / (x1 - x0) * (right - left);
  }
  double Y(double y) const {
    const auto at = [this](double v) { return log_y ? std::log10(v) : v; };
    const double y0 = at(y_ticks.front()), y1 = at(y_ticks.back());
    return bottom - (at(y) - y0) / (y1 - y0) * (bottom - top);
  }
  // Whether a point can be drawn: finite, and positive on a log axis.
  bool Drawable(double x, double y) const {
    return std::isfinite(x) && std::isfinite(y) && (!log_y || y > 0);
  }
};

ChartFrame LayOutChart(const LineChart& chart) {
  // The legend sits right of the plot; at 12 px a character of a sans-serif font is at most
  // about 7 px wide. The chart grows rather than squeeze the plot below 400 px.
  size_t longest_name = 0;
  for (const ChartSeries& s : chart.series) {
    longest_name = std::max(longest_name, s.name.size());
  }
  const double legend_width = 70.0 + 7.0 * static_cast<double>(std::min<size_t>(longest_name, 80));
  ChartFrame f;
  f.left = 90;
  f.width = std::clamp(
      std::max(chart.width, static_cast<int>(std::ceil(f.left + 400.0 + legend_width))), 320, 4096);
  f.height = std::clamp(chart.height, 240, 4096);
  // Plot area: room on the left for y tick labels and the axis label, on the right for the
  // legend, on top for the title lines.
  f.right = f.width - legend_width;
  f.top = chart.subtitle.empty() ? 50 : 68;
  f.bottom = f.height - 60.0 - 16.0 * static_cast<double>(chart.notes.size());
  const DataRange d = RangeOf(chart);
  f.x_ticks = AxisTicks(d.x_lo, d.x_hi, 8);
  f.log_y = chart.log_y;
  if (f.log_y) {
    f.y_ticks = d.y_hi > 0 ? LogTicks(d.y_lo, d.y_hi) : std::vector<double>{1, 10};
  } else {
    // A little headroom, so that a series at the maximum does not run along the frame.
    f.y_ticks = AxisTicks(d.y_lo, d.y_hi + 0.02 * (d.y_hi - std::min(d.y_lo, 0.0)), 6);
  }
  return f;
}

// The chart's title lines.
void AppendTitles(const LineChart& chart, const ChartFrame& f, std::string* svg) {
  absl::StrAppend(svg, "<text class=\"title\" x=\"", SvgNumber(f.width / 2.0),
                  "\" y=\"24\" text-anchor=\"middle\" ", "font-size=\"16\" font-weight=\"bold\">",
                  XmlEscape(chart.title), "</text>\n");
  if (!chart.subtitle.empty()) {
    absl::StrAppend(svg, "<text class=\"subtitle\" x=\"", SvgNumber(f.width / 2.0),
                    "\" y=\"44\" text-anchor=\"middle\" fill=\"#444444\">",
                    XmlEscape(chart.subtitle), "</text>\n");
  }
}

// Grid, axes, ticks, tick labels and the axis labels.
void AppendAxes(const LineChart& chart, const ChartFrame& f, std::string* svg) {
  const double x_step = f.x_ticks.size() > 1 ? f.x_ticks[1] - f.x_ticks[0] : 1.0;
  const double y_step = f.y_ticks.size() > 1 ? f.y_ticks[1] - f.y_ticks[0] : 1.0;
  absl::StrAppend(svg, "<g class=\"grid\" stroke=\"#e0e0e0\" stroke-width=\"1\">\n");
  for (double t : f.x_ticks) {
    absl::StrAppend(svg, "<line x1=\"", SvgNumber(f.X(t)), "\" y1=\"", SvgNumber(f.top), "\" x2=\"",
                    SvgNumber(f.X(t)), "\" y2=\"", SvgNumber(f.bottom), "\"/>\n");
  }
  for (double t : f.y_ticks) {
    absl::StrAppend(svg, "<line x1=\"", SvgNumber(f.left), "\" y1=\"", SvgNumber(f.Y(t)),
                    "\" x2=\"", SvgNumber(f.right), "\" y2=\"", SvgNumber(f.Y(t)), "\"/>\n");
  }
  absl::StrAppend(svg, "</g>\n<g class=\"axes\" stroke=\"#000000\" stroke-width=\"1\">\n",
                  "<line x1=\"", SvgNumber(f.left), "\" y1=\"", SvgNumber(f.bottom), "\" x2=\"",
                  SvgNumber(f.right), "\" y2=\"", SvgNumber(f.bottom), "\"/>\n", "<line x1=\"",
                  SvgNumber(f.left), "\" y1=\"", SvgNumber(f.top), "\" x2=\"", SvgNumber(f.left),
                  "\" y2=\"", SvgNumber(f.bottom), "\"/>\n");
  for (double t : f.x_ticks) {
    absl::StrAppend(svg, "<line x1=\"", SvgNumber(f.X(t)), "\" y1=\"", SvgNumber(f.bottom),
                    "\" x2=\"", SvgNumber(f.X(t)), "\" y2=\"", SvgNumber(f.bottom + 5), "\"/>\n");
  }
  for (double t : f.y_ticks) {
    absl::StrAppend(svg, "<line x1=\"", SvgNumber(f.left - 5), "\" y1=\"", SvgNumber(f.Y(t)),
                    "\" x2=\"", SvgNumber(f.left), "\" y2=\"", SvgNumber(f.Y(t)), "\"/>\n");
  }
  absl::StrAppend(svg, "</g>\n<g class=\"tick-labels\" fill=\"#000000\">\n");
  for (double t : f.x_ticks) {
    absl::StrAppend(svg, "<text class=\"x-tick\" x=\"", SvgNumber(f.X(t)), "\" y=\"",
                    SvgNumber(f.bottom + 19), "\" text-anchor=\"middle\">",
                    XmlEscape(TickLabel(t, x_step)), "</text>\n");
  }
  for (double t : f.y_ticks) {
    absl::StrAppend(svg, "<text class=\"y-tick\" x=\"", SvgNumber(f.left - 8), "\" y=\"",
                    SvgNumber(f.Y(t) + 4), "\" text-anchor=\"end\">",
                    XmlEscape(f.log_y ? LogTickLabel(t) : TickLabel(t, y_step)), "</text>\n");
  }
  const double mid_y = (f.top + f.bottom) / 2;
  absl::StrAppend(svg, "</g>\n<text class=\"x-label\" x=\"", SvgNumber((f.left + f.right) / 2),
                  "\" y=\"", SvgNumber(f.bottom + 42), "\" text-anchor=\"middle\">",
                  XmlEscape(chart.x_label), "</text>\n", "<text class=\"y-label\" x=\"24\" y=\"",
                  SvgNumber(mid_y), "\" text-anchor=\"middle\" transform=\"rotate(-90 24 ",
                  SvgNumber(mid_y), ")\">", XmlEscape(chart.y_label), "</text>\n");
}

// Series past the palette's colours repeat them dashed.
bool Dashed(const LineChart& chart, size_t s) {
  return chart.series[s].dashed || s >= static_cast<size_t>(kPaletteSize);
}

// One polyline per series, clipped to the plot area (`clip_id`: unique in the document).
void AppendSeries(const LineChart& chart, const ChartFrame& f, const std::string& clip_id,
                  std::string* svg) {
  absl::StrAppend(svg, "<clipPath id=\"", clip_id, "\"><rect x=\"", SvgNumber(f.left), "\" y=\"",
                  SvgNumber(f.top), "\" width=\"", SvgNumber(f.right - f.left), "\" height=\"",
                  SvgNumber(f.bottom - f.top),
                  "\"/></clipPath>\n<g class=\"series\" clip-path=\"url(#", clip_id, ")\">\n");
  for (size_t s = 0; s < chart.series.size(); ++s) {
    const ChartSeries& series = chart.series[s];
    std::string points;
    for (size_t i = 0; i < std::min(series.x.size(), series.y.size()); ++i) {
      if (!f.Drawable(series.x[i], series.y[i])) continue;
      absl::StrAppend(&points, points.empty() ? "" : " ", SvgNumber(f.X(series.x[i])), ",",
                      SvgNumber(f.Y(series.y[i])));
    }
    absl::StrAppend(
        svg, "<polyline data-series=\"", XmlEscape(series.name), "\" fill=\"none\" stroke=\"",
        kPalette[s % kPaletteSize], "\" stroke-width=\"2\" stroke-linejoin=\"round\"",
        Dashed(chart, s) ? " stroke-dasharray=\"6 4\"" : "", " points=\"", points, "\"/>\n");
  }
  absl::StrAppend(svg, "</g>\n");
}

// Markers: a dashed vertical line with its label at the top.
void AppendMarkers(const LineChart& chart, const ChartFrame& f, std::string* svg) {
  if (chart.markers.empty()) return;
  absl::StrAppend(svg, "<g class=\"markers\">\n");
  int drawn = 0;
  for (const ChartMarker& m : chart.markers) {
    if (!std::isfinite(m.x)) continue;
    const double x = f.X(m.x);
    // Each label a line lower than the one before, so that markers close together stay legible.
    const double label_y = f.top + 14 + 14.0 * (drawn++ % 3);
    absl::StrAppend(svg, "<line data-marker=\"", XmlEscape(m.label), "\" x1=\"", SvgNumber(x),
                    "\" y1=\"", SvgNumber(f.top), "\" x2=\"", SvgNumber(x), "\" y2=\"",
                    SvgNumber(f.bottom),
                    "\" stroke=\"#555555\" stroke-width=\"1.5\" stroke-dasharray=\"3 3\"/>\n",
                    "<text class=\"marker-label\" x=\"", SvgNumber(x + 4), "\" y=\"",
                    SvgNumber(label_y), "\" fill=\"#333333\">", XmlEscape(m.label), "</text>\n");
  }
  absl::StrAppend(svg, "</g>\n");
}

// Marked points: a ring in the colour of their series (black when it names none) with the
// label above it, right-aligned when the point is in the right half of the plot.
void AppendPoints(const LineChart& chart, const ChartFrame& f, std::string* svg) {
  if (chart.points.empty()) return;
  absl::StrAppend(svg, "<g class=\"points\">\n");
  for (const ChartPoint& p : chart.points) {
    if (!f.Drawable(p.x, p.y)) continue;
    std::string colour = "#000000";
    for (size_t s = 0; s < chart.series.size(); ++s) {
      if (chart.series[s].name == p.series) colour = kPalette[s % kPaletteSize];
    }
    const double x = f.X(p.x), y = f.Y(p.y);
    const bool right_half = x > (f.left + f.right) / 2;
    absl::StrAppend(svg, "<circle class=\"point\" data-point=\"", XmlEscape(p.label),
                    "\" data-series=\"", XmlEscape(p.series), "\" cx=\"", SvgNumber(x), "\" cy=\"",
                    SvgNumber(y), "\" r=\"5\" fill=\"#ffffff\" stroke=\"", colour,
                    "\" stroke-width=\"2\"/>\n", "<text class=\"point-label\" x=\"",
                    SvgNumber(right_half ? x - 8 : x + 8), "\" y=\"", SvgNumber(y - 8), "\"",
                    right_half ? " text-anchor=\"end\"" : "", " fill=\"", colour, "\">",
                    XmlEscape(p.label), "</text>\n");
  }
  absl::StrAppend(svg, "</g>\n");
}

// The notes, one line each below the x axis label.
void AppendNotes(const LineChart& chart, const ChartFrame& f, std::string* svg) {
  for (size_t i = 0; i < chart.notes.size(); ++i) {
    absl::StrAppend(svg, "<text class=\"note\" x=\"", SvgNumber(f.left), "\" y=\"",
                    SvgNumber(f.bottom + 60 + 16.0 * static_cast<double>(i)),
                    "\" fill=\"#b00000\">", XmlEscape(chart.notes[i]), "</text>\n");
  }
}

// The legend, right of the plot: each series' line style beside its name.
void AppendLegend(const LineChart& chart, const ChartFrame& f, std::string* svg) {
  absl::StrAppend(svg, "<g class=\"legend\">\n");
  for (size_t s = 0; s < chart.series.size(); ++s) {
    const double y = f.top + 10 + 22.0 * static_cast<double>(s);
    absl::StrAppend(svg, "<line x1=\"", SvgNumber(f.right + 16), "\" y1=\"", SvgNumber(y),
                    "\" x2=\"", SvgNumber(f.right + 44), "\" y2=\"", SvgNumber(y), "\" stroke=\"",
                    kPalette[s % kPaletteSize], "\" stroke-width=\"2\"",
                    Dashed(chart, s) ? " stroke-dasharray=\"6 4\"" : "", "/>\n",
                    "<text class=\"legend-label\" x=\"", SvgNumber(f.right + 50), "\" y=\"",
                    SvgNumber(y + 4), "\">", XmlEscape(chart.series[s].name), "</text>\n");
  }
  absl::StrAppend(svg, "</g>\n");
}

}  // namespace

std::string RenderSvg(const LineChart& chart) { return RenderSvg(std::vector<LineChart>{chart}); }

std::string RenderSvg(const std::vector<LineChart>& charts) {
  if (charts.empty()) return RenderSvg(LineChart());
  std::vector<ChartFrame> frames;
  int width = 0, height = 0;
  for (const LineChart& chart : charts) {
    frames.push_back(LayOutChart(chart));
    width = std::max(width, frames.back().width);
    height += frames.back().height;
  }
  std::string svg =
      absl::StrCat(SvgStart(absl::StrCat(width), absl::StrCat(height), 12, charts[0].title),
                   kSvgWhiteBackground);
  int top = 0;
  for (size_t i = 0; i < charts.size(); ++i) {
    const LineChart& chart = charts[i];
    const ChartFrame& frame = frames[i];
    absl::StrAppend(&svg, "<g class=\"chart-panel\"",
                    top > 0 ? absl::StrCat(" transform=\"translate(0 ", top, ")\"") : "", ">\n");
    AppendTitles(chart, frame, &svg);
    AppendAxes(chart, frame, &svg);
    AppendSeries(chart, frame, i == 0 ? "plot-area" : absl::StrCat("plot-area-", i), &svg);
    AppendMarkers(chart, frame, &svg);
    AppendPoints(chart, frame, &svg);
    AppendLegend(chart, frame, &svg);
    AppendNotes(chart, frame, &svg);
    svg += "</g>\n";
    top += frame.height;
  }
  svg += "</svg>\n";
  return svg;
}

}  // namespace attend::cli
