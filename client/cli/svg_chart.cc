#include "client/cli/svg_chart.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "client/cli/svg.h"

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

// The smallest and largest coordinates of the points (pairs with a non-finite coordinate aside)
// and of the markers' x; all 0 when there are none. A marker only widens x.
struct DataRange {
  double x_lo = 0, x_hi = 0, y_lo = 0, y_hi = 0;
};

DataRange RangeOf(const LineChart& chart) {
  DataRange d;
  bool any = false;
  const auto extend = [&](double x, double y, bool has_y) {
    if (!any) {
      d.x_lo = d.x_hi = x;
      if (has_y) d.y_lo = d.y_hi = y;
      any = true;
      return;
    }
    d.x_lo = std::min(d.x_lo, x);
    d.x_hi = std::max(d.x_hi, x);
    if (has_y) {
      d.y_lo = std::min(d.y_lo, y);
      d.y_hi = std::max(d.y_hi, y);
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
  return d;
}

// The picture's size, the plot area in it (pixels) and the ticks of its axes (data units).
struct ChartFrame {
  int width = 0, height = 0;
  double left = 0, right = 0, top = 0, bottom = 0;
  std::vector<double> x_ticks, y_ticks;

  // The pixel column of data x and the pixel row of data y; the axes run from the first tick to
  // the last.
  double X(double x) const {
    const double x0 = x_ticks.front(), x1 = x_ticks.back();
    return left + (x - x0) / (x1 - x0) * (right - left);
  }
  double Y(double y) const {
    const double y0 = y_ticks.front(), y1 = y_ticks.back();
    return bottom - (y - y0) / (y1 - y0) * (bottom - top);
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
  f.bottom = f.height - 60.0;
  const DataRange d = RangeOf(chart);
  f.x_ticks = AxisTicks(d.x_lo, d.x_hi, 8);
  // A little headroom, so that a series at the maximum does not run along the frame.
  f.y_ticks = AxisTicks(d.y_lo, d.y_hi + 0.02 * (d.y_hi - std::min(d.y_lo, 0.0)), 6);
  return f;
}

// The document's start with the title lines.
void AppendHeader(const LineChart& chart, const ChartFrame& f, std::string* svg) {
  absl::StrAppend(svg, SvgStart(absl::StrCat(f.width), absl::StrCat(f.height), 12, chart.title),
                  kSvgWhiteBackground, "<text class=\"title\" x=\"", SvgNumber(f.width / 2.0),
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
                    XmlEscape(TickLabel(t, y_step)), "</text>\n");
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

// One polyline per series, clipped to the plot area.
void AppendSeries(const LineChart& chart, const ChartFrame& f, std::string* svg) {
  absl::StrAppend(svg, "<clipPath id=\"plot-area\"><rect x=\"", SvgNumber(f.left), "\" y=\"",
                  SvgNumber(f.top), "\" width=\"", SvgNumber(f.right - f.left), "\" height=\"",
                  SvgNumber(f.bottom - f.top),
                  "\"/></clipPath>\n<g class=\"series\" clip-path=\"url(#plot-area)\">\n");
  for (size_t s = 0; s < chart.series.size(); ++s) {
    const ChartSeries& series = chart.series[s];
    std::string points;
    for (size_t i = 0; i < std::min(series.x.size(), series.y.size()); ++i) {
      if (!std::isfinite(series.x[i]) || !std::isfinite(series.y[i])) continue;
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
  for (const ChartMarker& m : chart.markers) {
    if (!std::isfinite(m.x)) continue;
    const double x = f.X(m.x);
    absl::StrAppend(svg, "<line data-marker=\"", XmlEscape(m.label), "\" x1=\"", SvgNumber(x),
                    "\" y1=\"", SvgNumber(f.top), "\" x2=\"", SvgNumber(x), "\" y2=\"",
                    SvgNumber(f.bottom),
                    "\" stroke=\"#555555\" stroke-width=\"1.5\" stroke-dasharray=\"3 3\"/>\n",
                    "<text class=\"marker-label\" x=\"", SvgNumber(x + 4), "\" y=\"",
                    SvgNumber(f.top + 14), "\" fill=\"#333333\">", XmlEscape(m.label), "</text>\n");
  }
  absl::StrAppend(svg, "</g>\n");
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

std::string RenderSvg(const LineChart& chart) {
  const ChartFrame frame = LayOutChart(chart);
  std::string svg;
  AppendHeader(chart, frame, &svg);
  AppendAxes(chart, frame, &svg);
  AppendSeries(chart, frame, &svg);
  AppendMarkers(chart, frame, &svg);
  AppendLegend(chart, frame, &svg);
  svg += "</svg>\n";
  return svg;
}

}  // namespace attend::cli
