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

}  // namespace

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
      "<text class=\"title\" x=\"", SvgNumber(width / 2.0), "\" y=\"24\" text-anchor=\"middle\" ",
      "font-size=\"16\" font-weight=\"bold\">", XmlEscape(chart.title), "</text>\n");
  if (!chart.subtitle.empty()) {
    absl::StrAppend(&svg, "<text class=\"subtitle\" x=\"", SvgNumber(width / 2.0),
                    "\" y=\"44\" text-anchor=\"middle\" fill=\"#444444\">",
                    XmlEscape(chart.subtitle), "</text>\n");
  }

  // Grid, ticks and tick labels.
  absl::StrAppend(&svg, "<g class=\"grid\" stroke=\"#e0e0e0\" stroke-width=\"1\">\n");
  for (double t : x_ticks) {
    absl::StrAppend(&svg, "<line x1=\"", SvgNumber(px(t)), "\" y1=\"", SvgNumber(top), "\" x2=\"",
                    SvgNumber(px(t)), "\" y2=\"", SvgNumber(bottom), "\"/>\n");
  }
  for (double t : y_ticks) {
    absl::StrAppend(&svg, "<line x1=\"", SvgNumber(left), "\" y1=\"", SvgNumber(py(t)), "\" x2=\"",
                    SvgNumber(right), "\" y2=\"", SvgNumber(py(t)), "\"/>\n");
  }
  absl::StrAppend(&svg, "</g>\n<g class=\"axes\" stroke=\"#000000\" stroke-width=\"1\">\n",
                  "<line x1=\"", SvgNumber(left), "\" y1=\"", SvgNumber(bottom), "\" x2=\"",
                  SvgNumber(right), "\" y2=\"", SvgNumber(bottom), "\"/>\n", "<line x1=\"",
                  SvgNumber(left), "\" y1=\"", SvgNumber(top), "\" x2=\"", SvgNumber(left),
                  "\" y2=\"", SvgNumber(bottom), "\"/>\n");
  for (double t : x_ticks) {
    absl::StrAppend(&svg, "<line x1=\"", SvgNumber(px(t)), "\" y1=\"", SvgNumber(bottom),
                    "\" x2=\"", SvgNumber(px(t)), "\" y2=\"", SvgNumber(bottom + 5), "\"/>\n");
  }
  for (double t : y_ticks) {
    absl::StrAppend(&svg, "<line x1=\"", SvgNumber(left - 5), "\" y1=\"", SvgNumber(py(t)),
                    "\" x2=\"", SvgNumber(left), "\" y2=\"", SvgNumber(py(t)), "\"/>\n");
  }
  absl::StrAppend(&svg, "</g>\n<g class=\"tick-labels\" fill=\"#000000\">\n");
  for (double t : x_ticks) {
    absl::StrAppend(&svg, "<text class=\"x-tick\" x=\"", SvgNumber(px(t)), "\" y=\"",
                    SvgNumber(bottom + 19), "\" text-anchor=\"middle\">",
                    XmlEscape(TickLabel(t, x_step)), "</text>\n");
  }
  for (double t : y_ticks) {
    absl::StrAppend(&svg, "<text class=\"y-tick\" x=\"", SvgNumber(left - 8), "\" y=\"",
                    SvgNumber(py(t) + 4), "\" text-anchor=\"end\">",
                    XmlEscape(TickLabel(t, y_step)), "</text>\n");
  }
  const double mid_y = (top + bottom) / 2;
  absl::StrAppend(&svg, "</g>\n<text class=\"x-label\" x=\"", SvgNumber((left + right) / 2),
                  "\" y=\"", SvgNumber(bottom + 42), "\" text-anchor=\"middle\">",
                  XmlEscape(chart.x_label), "</text>\n", "<text class=\"y-label\" x=\"24\" y=\"",
                  SvgNumber(mid_y), "\" text-anchor=\"middle\" transform=\"rotate(-90 24 ",
                  SvgNumber(mid_y), ")\">", XmlEscape(chart.y_label), "</text>\n");

  // Series, clipped to the plot area.
  absl::StrAppend(&svg, "<clipPath id=\"plot-area\"><rect x=\"", SvgNumber(left), "\" y=\"",
                  SvgNumber(top), "\" width=\"", SvgNumber(right - left), "\" height=\"",
                  SvgNumber(bottom - top),
                  "\"/></clipPath>\n<g class=\"series\" clip-path=\"url(#plot-area)\">\n");
  for (size_t s = 0; s < chart.series.size(); ++s) {
    const ChartSeries& series = chart.series[s];
    std::string points;
    for (size_t i = 0; i < std::min(series.x.size(), series.y.size()); ++i) {
      if (!std::isfinite(series.x[i]) || !std::isfinite(series.y[i])) continue;
      absl::StrAppend(&points, points.empty() ? "" : " ", SvgNumber(px(series.x[i])), ",",
                      SvgNumber(py(series.y[i])));
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
      absl::StrAppend(&svg, "<line data-marker=\"", XmlEscape(m.label), "\" x1=\"", SvgNumber(x),
                      "\" y1=\"", SvgNumber(top), "\" x2=\"", SvgNumber(x), "\" y2=\"",
                      SvgNumber(bottom),
                      "\" stroke=\"#555555\" stroke-width=\"1.5\" stroke-dasharray=\"3 3\"/>\n",
                      "<text class=\"marker-label\" x=\"", SvgNumber(x + 4), "\" y=\"",
                      SvgNumber(top + 14), "\" fill=\"#333333\">", XmlEscape(m.label), "</text>\n");
    }
    absl::StrAppend(&svg, "</g>\n");
  }

  // Legend, right of the plot.
  absl::StrAppend(&svg, "<g class=\"legend\">\n");
  for (size_t s = 0; s < chart.series.size(); ++s) {
    const double y = top + 10 + 22.0 * static_cast<double>(s);
    const bool dashed = chart.series[s].dashed || s >= static_cast<size_t>(kPaletteSize);
    absl::StrAppend(&svg, "<line x1=\"", SvgNumber(right + 16), "\" y1=\"", SvgNumber(y),
                    "\" x2=\"", SvgNumber(right + 44), "\" y2=\"", SvgNumber(y), "\" stroke=\"",
                    kPalette[s % kPaletteSize], "\" stroke-width=\"2\"",
                    dashed ? " stroke-dasharray=\"6 4\"" : "", "/>\n",
                    "<text class=\"legend-label\" x=\"", SvgNumber(right + 50), "\" y=\"",
                    SvgNumber(y + 4), "\">", XmlEscape(chart.series[s].name), "</text>\n");
  }
  absl::StrAppend(&svg, "</g>\n</svg>\n");
  return svg;
}

}  // namespace attend::cli
