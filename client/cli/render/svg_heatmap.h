// Heatmaps as SVG documents, for the attention weights of `attend attend --heatmap`,
// `attend mha --heatmap` and `attend example --heatmap`: one panel of cells per attention head,
// the panels in a grid about as wide as it is tall, a colour scale with its legend, masked cells
// hatched grey (and a "masked" legend entry when some are), and each cell's value in a <title>
// tooltip and, where a cell is large enough to hold it legibly, printed inside.
//
// Each cell carries data-head/-row/-col/-value (and data-masked="true"), so that tools and
// tests can find them; data-row and data-col are indices from 0 whatever the labels say.
// Documents are self-contained and well-formed XML (see svg.h), and their size is bounded:
// at most max_cells cells are drawn, each in about 220 bytes (about 1.4 MB at most).
//
// Thread-safety: pure functions and value types.
#ifndef ATTEND_CLIENT_CLI_RENDER_SVG_HEATMAP_H_
#define ATTEND_CLIENT_CLI_RENDER_SVG_HEATMAP_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace attend::cli {

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
  // Names of the rows, columns and panels (e.g. tokens, "head 3"); empty: their numbers and
  // "head <h>". Labels longer than 16 characters are shortened in the picture, not in tooltips.
  std::vector<std::string> row_labels;
  std::vector<std::string> column_labels;
  std::vector<std::string> panel_titles;
  // Row r is numbered row_offset + r in labels, tooltips and the truncation note: a query's
  // position when the queries are the last of the keys' positions.
  int64_t row_offset = 0;
  // The top of the colour scale; 0 = the first "nice" tick at or above the largest value drawn
  // (each picture its own scale). 1 makes weights comparable across pictures.
  double value_max = 0.0;
  // The most panels, rows and columns drawn: the first ones are; the picture says what was left
  // out. Each at least 1. When panels x rows x cols would exceed max_cells, the longer of rows
  // and columns is cut first, so that every head drawn keeps a panel.
  int64_t max_panels = 16;
  int64_t max_rows = 48;
  int64_t max_cols = 48;
  int64_t max_cells = 6144;
};

// What of a heatmap is drawn: the first `panels` heads, `rows` rows and `cols` columns.
struct HeatmapDrawn {
  int64_t panels = 0, rows = 0, cols = 0;
  bool truncated = false;  // some head, row or column is left out
};
HeatmapDrawn DrawnPart(const Heatmap& heatmap);

// The heatmap as an SVG document with one <rect class="cell"> per drawn cell. INVALID_ARGUMENT
// when the sizes are not positive or disagree with `values`, `masked` or the label lists.
absl::StatusOr<std::string> RenderHeatmapSvg(const Heatmap& heatmap);

// True when the heatmap drawn would leave out heads, rows or columns.
inline bool HeatmapTruncated(const Heatmap& heatmap) { return DrawnPart(heatmap).truncated; }

}  // namespace attend::cli

#endif  // ATTEND_CLIENT_CLI_RENDER_SVG_HEATMAP_H_
