// Line charts as SVG documents, for the planner's --plot (KV-cache size against context, FLOPs
// against prompt length): one polyline per series, axes with "nice" ticks (1, 2 or 5 x 10^k
// apart) and labels, a legend, a title, and labelled vertical markers (e.g. a crossover).
//
// Each series' polyline carries data-series="<name>", each marker's line data-marker="<label>"
// and each point's ring data-point="<label>", so that tools and tests can find them. Documents are
// self-contained and well-formed XML (see svg.h).
//
// Thread-safety: pure functions and value types.
#ifndef ATTEND_CLIENT_CLI_RENDER_SVG_CHART_H_
#define ATTEND_CLIENT_CLI_RENDER_SVG_CHART_H_

#include <string>
#include <vector>

namespace attend::cli {

struct ChartSeries {
  std::string name;  // legend text and data-series attribute
  // Points in data units, x[i] with y[i]; pairs with a non-finite coordinate are skipped. The
  // polyline joins them in the order given.
  std::vector<double> x;
  std::vector<double> y;
  bool dashed = false;
};

// A vertical line across the plot at `x`, with `label` beside it.
struct ChartMarker {
  double x = 0.0;
  std::string label;
};

// A point drawn as a ring with `label` beside it (e.g. where a line meets a budget), in data
// units; points outside the axes are not drawn.
struct ChartPoint {
  double x = 0.0;
  double y = 0.0;
  std::string label;
  std::string series;  // the data-series it belongs to, for tools; may be empty
};

struct LineChart {
  std::string title;
  std::string subtitle;  // a second, smaller title line; empty: none
  std::string x_label;   // with units, e.g. "context (tokens)"
  std::string y_label;   // e.g. "KV cache (GiB)"
  std::vector<ChartSeries> series;
  std::vector<ChartMarker> markers;
  std::vector<ChartPoint> points;
  // Lines of text under the plot (e.g. that an axis runs past a limit), each in its own
  // <text class="note">.
  std::vector<std::string> notes;
  // A log10 y axis with a tick at each power of ten, for curves that span decades. Points with
  // y <= 0 cannot be drawn on it and are skipped.
  bool log_y = false;
  // Pixels. The width grows to fit the legend (series names of up to 80 characters) beside a
  // plot of at least 400 px; both are clamped to 4096.
  int width = 860;
  int height = 500;
};

// The chart as an SVG document. Both axes start at 0 or below the smallest value (charts of
// sizes and counts start at 0) and end at the first tick at or above the largest value or
// marker; an empty chart gets the range [0, 1]. A log y axis runs from the power of ten at or
// below the smallest positive value to the one at or above the largest.
std::string RenderSvg(const LineChart& chart);

// Charts stacked top to bottom in one document, each in a <g class="chart-panel">, as wide as
// the widest; the document's <title> is the first chart's. Empty: an empty chart.
std::string RenderSvg(const std::vector<LineChart>& charts);

}  // namespace attend::cli

#endif  // ATTEND_CLIENT_CLI_RENDER_SVG_CHART_H_
