// Small, dependency-free SVG writers for the CLI's pictures:
//
// - line charts (--plot): one polyline per series, axes with "nice" ticks (1, 2 or 5 x 10^k
//   apart) and labels, a legend, a title, and labelled vertical markers (e.g. a crossover);
// - heatmaps (--heatmap): one panel of cells per attention head, a colour scale with its legend,
//   masked cells hatched grey, and each cell's value in a <title> tooltip.
//
// Documents are self-contained (no scripts, fonts or external references) and well-formed XML:
// every piece of text is escaped, and bytes that are not valid UTF-8 or not allowed in XML 1.0
// are replaced. Each series' polyline carries data-series="<name>", each marker's line
// data-marker="<label>", and each heatmap cell data-head/-row/-col/-value (and
// data-masked="true"), so that tools and tests can find them.
//
// Thread-safety: pure functions.
#ifndef ATTEND_CLIENT_CLI_SVG_H_
#define ATTEND_CLIENT_CLI_SVG_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

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

struct LineChart {
  std::string title;
  std::string subtitle;  // a second, smaller title line; empty: none
  std::string x_label;   // with units, e.g. "context (tokens)"
  std::string y_label;   // e.g. "KV cache (GiB)"
  std::vector<ChartSeries> series;
  std::vector<ChartMarker> markers;
  // Pixels. The width grows to fit the legend (series names of up to 80 characters) beside a
  // plot of at least 400 px; both are clamped to 4096.
  int width = 860;
  int height = 500;
};

// Heads of attention weights (or any [heads, rows, cols] values >= 0) as a grid of panels.
struct Heatmap {
  std::string title;
  std::string subtitle;  // empty: none
  std::string row_axis = "query";
  std::string column_axis = "key";
  int64_t heads = 0;
  int64_t rows = 0;
  int64_t cols = 0;
  std::vector<float> values;  // [heads, rows, cols], row-major
  // [heads, rows, cols]: cells the mask hid, drawn hatched grey rather than in the colour of 0
  // (a visible weight can be 0 too). Empty: none is masked.
  std::vector<bool> masked;
  // Names of the rows, columns and panels (e.g. tokens, "head 3"); empty: their indices and
  // "head <h>". Labels longer than 16 characters are shortened in the picture, not in tooltips.
  std::vector<std::string> row_labels;
  std::vector<std::string> column_labels;
  std::vector<std::string> panel_titles;
  // The top of the colour scale; 0 = the first "nice" tick at or above the largest value drawn.
  double value_max = 0.0;
  // The most panels, rows and columns drawn: the first ones are; the picture says what was left
  // out. Each at least 1.
  int64_t max_panels = 8;
  int64_t max_rows = 48;
  int64_t max_cols = 48;
};

// The heatmap as an SVG document with one <rect class="cell"> per drawn cell. INVALID_ARGUMENT
// when the sizes are not positive or disagree with `values`, `masked` or the label lists.
absl::StatusOr<std::string> RenderHeatmapSvg(const Heatmap& heatmap);

// True when the heatmap drawn would leave out heads, rows or columns.
bool HeatmapTruncated(const Heatmap& heatmap);

// The chart as an SVG document. Both axes start at 0 or below the smallest value (charts of
// sizes and counts start at 0) and end at the first tick at or above the largest value or
// marker; an empty chart gets the range [0, 1].
std::string RenderSvg(const LineChart& chart);

// About `target` (>= 1) evenly spaced ticks, 1, 2 or 5 x 10^k apart, from the last tick at or
// below `lo` to the first at or above `hi`. hi <= lo is treated as [lo, lo + 1].
// REQUIRES: lo and hi finite.
std::vector<double> NiceTicks(double lo, double hi, int target);

// A tick value with as many decimals as `step` needs and thousands separators: "32,768", "0.25".
std::string TickLabel(double value, double step);

// `text` escaped for XML character data and attribute values.
std::string XmlEscape(absl::string_view text);

}  // namespace attend::cli

#endif  // ATTEND_CLIENT_CLI_SVG_H_
