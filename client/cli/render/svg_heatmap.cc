#include "client/cli/render/svg_heatmap.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <tuple>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "client/cli/render/format.h"
#include "client/cli/render/svg.h"

namespace attend::cli {
namespace {

// Viridis (perceptually uniform, colour-blind friendly, readable in grey), sampled at nine
// points and interpolated linearly between them.
constexpr unsigned char kViridis[9][3] = {{68, 1, 84},    {71, 44, 122},  {59, 81, 139},
                                          {44, 113, 142}, {33, 144, 141}, {39, 173, 129},
                                          {92, 200, 99},  {170, 220, 50}, {253, 231, 37}};

// The panels of a heatmap fit in about this many pixels each way; single panels are smaller
// still (480 x 640 at most), so that one head does not fill a screen with a few huge cells.
constexpr double kGridMaxWidth = 1400, kGridMaxHeight = 1400;
// A value is printed inside its cell ("0.25", four characters of the 11 px font, about 25 px)
// only from this cell size on; smaller cells keep it in the tooltip alone.
constexpr double kValueMinCell = 30;

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

// "query" -> "queries", "key" -> "keys".
std::string PluralNoun(const std::string& noun) {
  const bool consonant_y = noun.size() >= 2 && noun.back() == 'y' &&
                           std::string("aeiou").find(noun[noun.size() - 2]) == std::string::npos;
  return consonant_y ? noun.substr(0, noun.size() - 1) + "ies" : noun + "s";
}

// "queries 0-47 of 100", or with numbers that do not start at 0 "queries 10-33 (24 of 50)".
std::string Range(const std::string& what, int64_t first, int64_t shown, int64_t total) {
  if (first == 0) return absl::StrCat(PluralNoun(what), " 0-", shown - 1, " of ", total);
  return absl::StrCat(PluralNoun(what), " ", first, "-", first + shown - 1, " (", shown, " of ",
                      total, ")");
}

absl::Status ValidateHeatmap(const Heatmap& h) {
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
  return absl::OkStatus();
}

// Where cell (head, r, c) is in `values` and `masked`.
size_t CellIndex(const Heatmap& h, int64_t head, int64_t r, int64_t c) {
  return static_cast<size_t>((head * h.rows + r) * h.cols + c);
}

bool CellMasked(const Heatmap& h, size_t k) { return !h.masked.empty() && h.masked[k]; }

// What the picture calls row r and column c: the label, else the number.
std::string RowLabel(const Heatmap& h, int64_t r) {
  return h.row_labels.empty() ? absl::StrCat(h.row_offset + r)
                              : h.row_labels[static_cast<size_t>(r)];
}

std::string ColumnLabel(const Heatmap& h, int64_t c) {
  return h.column_labels.empty() ? absl::StrCat(c) : h.column_labels[static_cast<size_t>(c)];
}

std::string PanelTitle(const Heatmap& h, int64_t p) {
  return h.panel_titles.empty() ? absl::StrCat("head ", p) : h.panel_titles[static_cast<size_t>(p)];
}

// "query 12 (sat)", or "query 12" without labels.
std::string CellName(const std::string& axis, int64_t number, const std::vector<std::string>& names,
                     int64_t index) {
  if (names.empty()) return absl::StrCat(axis, " ", number);
  return absl::StrCat(axis, " ", number, " (", names[static_cast<size_t>(index)], ")");
}

// The sizes of the picture, in whole pixels (so that cells are written as integers) unless
// named otherwise.
struct HeatmapLayout {
  HeatmapDrawn drawn;
  bool any_masked = false;                    // among the cells drawn
  double cell = 0;                            // side of a cell
  int64_t stride = 1;                         // every stride-th row and column is labelled
  bool upright = false;                       // column labels turned to run upwards
  double row_labels_w = 0, col_labels_h = 0;  // room for the labels left of and above a grid
  double grid_w = 0, grid_h = 0;              // the cells of one panel
  double panel_w = 0, panel_h = 0;            // one panel with its titles and labels
  double legend_w = 150, margin = 20;
  int64_t per_line = 1, lines = 1;  // panels side by side, and lines of them
  double header = 0;                // the title lines above the panels
  double width = 0, height = 0;
};

bool AnyMaskedDrawn(const Heatmap& h, const HeatmapDrawn& d) {
  if (h.masked.empty()) return false;
  for (int64_t p = 0; p < d.panels; ++p) {
    for (int64_t r = 0; r < d.rows; ++r) {
      for (int64_t c = 0; c < d.cols; ++c) {
        if (h.masked[CellIndex(h, p, r, c)]) return true;
      }
    }
  }
  return false;
}

// The panels in a grid of about sqrt(panels) a line; cells as large as let the grid fit
// kGridMaxWidth x kGridMaxHeight and a panel 480 x 640 (4 to 56 px); row labels on the left,
// column labels above (turned upright when they do not fit across a cell), every k-th label
// when cells are smaller than the 11 px font; the legend right of the grid.
HeatmapLayout LayOutHeatmap(const Heatmap& h) {
  HeatmapLayout l;
  l.drawn = DrawnPart(h);
  l.any_masked = AnyMaskedDrawn(h, l.drawn);
  const double rows = static_cast<double>(l.drawn.rows), cols = static_cast<double>(l.drawn.cols);
  l.per_line = static_cast<int64_t>(std::ceil(std::sqrt(static_cast<double>(l.drawn.panels))));
  l.lines = (l.drawn.panels + l.per_line - 1) / l.per_line;
  size_t longest_row = 1, longest_col = 1, longest_title = 1;
  for (int64_t r = 0; r < l.drawn.rows; ++r) {
    longest_row = std::max(longest_row, LabelChars(RowLabel(h, r)));
  }
  for (int64_t c = 0; c < l.drawn.cols; ++c) {
    longest_col = std::max(longest_col, LabelChars(ColumnLabel(h, c)));
  }
  for (int64_t p = 0; p < l.drawn.panels; ++p) {
    longest_title = std::max(longest_title, LabelChars(PanelTitle(h, p)));
  }
  longest_row = std::min<size_t>(longest_row, 19);
  longest_col = std::min<size_t>(longest_col, 19);
  l.row_labels_w = std::ceil(6.5 * static_cast<double>(longest_row) + 10);
  const double upright_h = std::ceil(6.5 * static_cast<double>(longest_col) + 10);
  const double fit_w = kGridMaxWidth / static_cast<double>(l.per_line) - 50 - l.row_labels_w;
  const double fit_h = kGridMaxHeight / static_cast<double>(l.lines) - 62 - upright_h;
  l.cell = std::clamp(
      std::floor(std::min({480.0 / rows, 640.0 / cols, fit_w / cols, fit_h / rows})), 4.0, 56.0);
  l.stride = static_cast<int64_t>(std::ceil(13.0 / l.cell));
  l.upright = 6.5 * static_cast<double>(longest_col) > l.cell * static_cast<double>(l.stride) - 4;
  l.col_labels_h = l.upright ? upright_h : 18;
  l.grid_w = l.cell * cols;
  l.grid_h = l.cell * rows;
  // A panel is at least as wide as its title (13 px bold, about 8 px a character).
  l.panel_w = std::max(20 + l.row_labels_w + l.grid_w + 30,
                       std::ceil(8.0 * static_cast<double>(longest_title)) + 30);
  l.panel_h = 22 + 16 + l.col_labels_h + l.grid_h + 24;
  l.header = 36 + (h.subtitle.empty() ? 0 : 20) + (l.drawn.truncated ? 20 : 0) + 10;
  // Wide enough for the panels and the legend, and for the title lines (about 9.5 px per
  // character of the 16 px title, 7 px of the 12 px lines).
  const double text_w = std::max(9.5 * static_cast<double>(LabelChars(h.title)),
                                 7.0 * static_cast<double>(LabelChars(h.subtitle)));
  l.width = std::ceil(std::min(
      4096.0, std::max(2 * l.margin + static_cast<double>(l.per_line) * l.panel_w + l.legend_w,
                       2 * l.margin + text_w)));
  l.height =
      std::max(l.header + static_cast<double>(l.lines) * l.panel_h + l.margin, l.header + 320.0);
  return l;
}

// The colour scale: [0, top], by default up to a nice tick at or above the largest value
// drawn (masked cells and non-finite values aside).
struct ColourScale {
  std::vector<double> ticks;
  double top = 1;
  double step = 1;  // between ticks
};

ColourScale ScaleOf(const Heatmap& h, const HeatmapLayout& l) {
  double largest = 0;
  for (int64_t p = 0; p < l.drawn.panels; ++p) {
    for (int64_t r = 0; r < l.drawn.rows; ++r) {
      for (int64_t c = 0; c < l.drawn.cols; ++c) {
        const size_t k = CellIndex(h, p, r, c);
        if (!CellMasked(h, k) && std::isfinite(h.values[k])) {
          largest = std::max<double>(largest, h.values[k]);
        }
      }
    }
  }
  ColourScale scale;
  scale.ticks =
      h.value_max > 0 ? NiceTicks(0, h.value_max, 5) : NiceTicks(0, largest > 0 ? largest : 1, 5);
  scale.top = h.value_max > 0 ? h.value_max : scale.ticks.back();
  scale.step = scale.ticks.size() > 1 ? scale.ticks[1] - scale.ticks[0] : 1.0;
  return scale;
}

// "truncated: showing heads 0-7 of 9, queries 10-33 (24 of 50) (at most ...)".
std::string TruncationNote(const Heatmap& h, const HeatmapDrawn& d) {
  std::vector<std::string> parts;
  if (d.panels < h.heads) parts.push_back(Range("head", 0, d.panels, h.heads));
  if (d.rows < h.rows) parts.push_back(Range(h.row_axis, h.row_offset, d.rows, h.rows));
  if (d.cols < h.cols) parts.push_back(Range(h.column_axis, 0, d.cols, h.cols));
  return absl::StrCat("truncated: showing ", absl::StrJoin(parts, ", "), " (at most ", h.max_panels,
                      " heads of ", h.max_rows, " x ", h.max_cols, " cells, ", Count(h.max_cells),
                      " cells in all, are drawn)");
}

// The document's start: the masked-cell hatching (when needed) and the colour gradient, the
// title, the subtitle and what truncation left out.
void AppendHeader(const Heatmap& h, const HeatmapLayout& l, std::string* svg) {
  absl::StrAppend(svg, SvgStart(SvgNumber(l.width), SvgNumber(l.height), 11, h.title), "<defs>\n");
  if (l.any_masked) {
    absl::StrAppend(
        svg,
        "<pattern id=\"masked\" width=\"6\" height=\"6\" patternUnits=\"userSpaceOnUse\" "
        "patternTransform=\"rotate(45)\"><rect width=\"6\" height=\"6\" fill=\"#e6e6e6\"/>"
        "<line x1=\"0\" y1=\"0\" x2=\"0\" y2=\"6\" stroke=\"#a0a0a0\" stroke-width=\"2.5\"/>"
        "</pattern>\n");
  }
  absl::StrAppend(svg, "<linearGradient id=\"scale\" x1=\"0\" y1=\"1\" x2=\"0\" y2=\"0\">\n");
  for (int i = 0; i <= 8; ++i) {
    absl::StrAppend(svg, "<stop offset=\"", SvgNumber(i / 8.0), "\" stop-color=\"",
                    Viridis(i / 8.0), "\"/>\n");
  }
  absl::StrAppend(svg, "</linearGradient>\n</defs>\n", kSvgWhiteBackground,
                  "<text class=\"title\" x=\"", SvgNumber(l.margin),
                  "\" y=\"26\" font-size=\"16\" ", "font-weight=\"bold\">", XmlEscape(h.title),
                  "</text>\n");
  double line_y = 26;
  if (!h.subtitle.empty()) {
    line_y += 20;
    absl::StrAppend(svg, "<text class=\"subtitle\" x=\"", SvgNumber(l.margin), "\" y=\"",
                    SvgNumber(line_y), "\" font-size=\"12\" fill=\"#444444\">",
                    XmlEscape(h.subtitle), "</text>\n");
  }
  if (l.drawn.truncated) {
    line_y += 20;
    absl::StrAppend(svg, "<text class=\"note\" x=\"", SvgNumber(l.margin), "\" y=\"",
                    SvgNumber(line_y), "\" font-size=\"12\" fill=\"#b00000\">",
                    XmlEscape(TruncationNote(h, l.drawn)), "</text>\n");
  }
}

// Where one panel is: its top left corner, and the top left corner of its grid of cells.
struct PanelOrigin {
  double x0 = 0, y0 = 0;
  int64_t grid_x = 0, grid_y = 0;
};

PanelOrigin OriginOf(const HeatmapLayout& l, int64_t p) {
  PanelOrigin o;
  o.x0 = l.margin + static_cast<double>(p % l.per_line) * l.panel_w;
  o.y0 = l.header + static_cast<double>(p / l.per_line) * l.panel_h;
  o.grid_x = std::llround(o.x0 + 20 + l.row_labels_w);
  o.grid_y = std::llround(o.y0 + 22 + 16 + l.col_labels_h);
  return o;
}

// A panel's title, its axis names, and the labels of its columns and rows.
void AppendPanelLabels(const Heatmap& h, const HeatmapLayout& l, const PanelOrigin& o,
                       const std::string& panel_title, std::string* svg) {
  const double grid_x = static_cast<double>(o.grid_x), grid_y = static_cast<double>(o.grid_y);
  absl::StrAppend(
      svg, "<text class=\"panel-title\" x=\"", SvgNumber(grid_x + l.grid_w / 2), "\" y=\"",
      SvgNumber(o.y0 + 14), "\" text-anchor=\"middle\" font-size=\"13\" font-weight=\"bold\">",
      XmlEscape(panel_title), "</text>\n", "<text class=\"column-axis\" x=\"",
      SvgNumber(grid_x + l.grid_w / 2), "\" y=\"", SvgNumber(o.y0 + 32),
      "\" text-anchor=\"middle\" fill=\"#444444\">", XmlEscape(h.column_axis), " &#8594;</text>\n");
  const double axis_y = grid_y + l.grid_h / 2;
  absl::StrAppend(
      svg, "<text class=\"row-axis\" x=\"", SvgNumber(o.x0 + 10), "\" y=\"", SvgNumber(axis_y),
      "\" text-anchor=\"middle\" fill=\"#444444\" transform=\"rotate(-90 ", SvgNumber(o.x0 + 10),
      " ", SvgNumber(axis_y), ")\">", XmlEscape(h.row_axis), " &#8594;</text>\n");
  for (int64_t c = 0; c < l.drawn.cols; c += l.stride) {
    const double x = grid_x + (static_cast<double>(c) + 0.5) * l.cell;
    const std::string text = XmlEscape(ShortLabel(ColumnLabel(h, c), 16));
    if (l.upright) {
      absl::StrAppend(svg, "<text class=\"column-label\" x=\"", SvgNumber(x + 4), "\" y=\"",
                      SvgNumber(grid_y - 6), "\" transform=\"rotate(-90 ", SvgNumber(x + 4), " ",
                      SvgNumber(grid_y - 6), ")\">", text, "</text>\n");
    } else {
      absl::StrAppend(svg, "<text class=\"column-label\" x=\"", SvgNumber(x), "\" y=\"",
                      SvgNumber(grid_y - 6), "\" text-anchor=\"middle\">", text, "</text>\n");
    }
  }
  for (int64_t r = 0; r < l.drawn.rows; r += l.stride) {
    absl::StrAppend(svg, "<text class=\"row-label\" x=\"", SvgNumber(grid_x - 6), "\" y=\"",
                    SvgNumber(grid_y + (static_cast<double>(r) + 0.5) * l.cell + 4),
                    "\" text-anchor=\"end\">", XmlEscape(ShortLabel(RowLabel(h, r), 16)),
                    "</text>\n");
  }
}

// The cells of panel `p`, each with its value as a tooltip; values printed inside when cells
// are large enough. Coordinates are whole pixels, written without decimals: a picture holds
// thousands of cells.
void AppendPanelCells(const Heatmap& h, const HeatmapLayout& l, const ColourScale& scale, int64_t p,
                      const PanelOrigin& o, const std::string& panel_title, std::string* svg) {
  const int64_t cell = static_cast<int64_t>(l.cell);
  for (int64_t r = 0; r < l.drawn.rows; ++r) {
    const std::string row_name = CellName(h.row_axis, h.row_offset + r, h.row_labels, r);
    for (int64_t c = 0; c < l.drawn.cols; ++c) {
      const size_t k = CellIndex(h, p, r, c);
      const float v = h.values[k];
      const bool hidden = CellMasked(h, k);
      const int64_t x = o.grid_x + c * cell, y = o.grid_y + r * cell;
      const double t = v / scale.top;
      absl::StrAppend(
          svg, "<rect class=\"cell\" data-head=\"", p, "\" data-row=\"", r, "\" data-col=\"", c,
          "\" data-value=\"", absl::StrFormat("%.9g", v), "\"",
          hidden ? " data-masked=\"true\"" : "", " x=\"", x, "\" y=\"", y, "\" width=\"", cell,
          "\" height=\"", cell, "\" fill=\"", hidden ? "url(#masked)" : Viridis(t), "\"><title>",
          XmlEscape(absl::StrCat(panel_title, ", ", row_name, ", ",
                                 CellName(h.column_axis, c, h.column_labels, c), ": ",
                                 hidden ? "masked (not attended)" : absl::StrFormat("%.4f", v))),
          "</title></rect>\n");
      if (l.cell >= kValueMinCell && !hidden) {
        absl::StrAppend(svg, "<text class=\"cell-value\" x=\"", x + cell / 2, "\" y=\"",
                        y + cell / 2 + 4, "\" text-anchor=\"middle\" fill=\"",
                        t < 0.6 ? "#ffffff" : "#000000", "\">", absl::StrFormat("%.2f", v),
                        "</text>\n");
      }
    }
  }
}

// Panel `p` as a group: labels, cells and a frame around the cells.
void AppendPanel(const Heatmap& h, const HeatmapLayout& l, const ColourScale& scale, int64_t p,
                 std::string* svg) {
  const PanelOrigin o = OriginOf(l, p);
  const std::string panel_title = PanelTitle(h, p);
  absl::StrAppend(svg, "<g class=\"panel\" data-head=\"", p, "\">\n");
  AppendPanelLabels(h, l, o, panel_title, svg);
  AppendPanelCells(h, l, scale, p, o, panel_title, svg);
  absl::StrAppend(svg, "<rect class=\"frame\" x=\"", o.grid_x, "\" y=\"", o.grid_y, "\" width=\"",
                  SvgNumber(l.grid_w), "\" height=\"", SvgNumber(l.grid_h),
                  "\" fill=\"none\" stroke=\"#333333\" stroke-width=\"1\"/>\n</g>\n");
}

// The colour bar with its ticks and what the scale is, and the masked swatch below it when
// some cell drawn is masked, right of the panels.
void AppendLegend(const Heatmap& h, const HeatmapLayout& l, const ColourScale& scale,
                  std::string* svg) {
  const double bar_x = l.margin + static_cast<double>(l.per_line) * l.panel_w + 10;
  const double bar_y = l.header + 20, bar_h = 200;
  absl::StrAppend(svg, "<g class=\"legend\">\n<text x=\"", SvgNumber(bar_x), "\" y=\"",
                  SvgNumber(bar_y - 8), "\" font-weight=\"bold\">weight</text>\n", "<rect x=\"",
                  SvgNumber(bar_x), "\" y=\"", SvgNumber(bar_y), "\" width=\"16\" height=\"",
                  SvgNumber(bar_h),
                  "\" fill=\"url(#scale)\" stroke=\"#333333\" stroke-width=\"1\"/>\n");
  for (double tick : scale.ticks) {
    if (tick > scale.top * (1 + 1e-9)) continue;
    const double y = bar_y + bar_h - tick / scale.top * bar_h;
    absl::StrAppend(svg, "<line x1=\"", SvgNumber(bar_x + 16), "\" y1=\"", SvgNumber(y), "\" x2=\"",
                    SvgNumber(bar_x + 21), "\" y2=\"", SvgNumber(y), "\" stroke=\"#333333\"/>\n",
                    "<text class=\"scale-tick\" x=\"", SvgNumber(bar_x + 25), "\" y=\"",
                    SvgNumber(y + 4), "\">", XmlEscape(TickLabel(tick, scale.step)), "</text>\n");
  }
  absl::StrAppend(svg, "<text class=\"scale-kind\" x=\"", SvgNumber(bar_x), "\" y=\"",
                  SvgNumber(bar_y + bar_h + 18), "\" fill=\"#444444\">",
                  h.value_max > 0 ? "fixed scale" : "this picture's scale", "</text>\n");
  if (l.any_masked) {
    const double swatch_y = bar_y + bar_h + 34;
    absl::StrAppend(svg, "<rect class=\"masked-swatch\" x=\"", SvgNumber(bar_x), "\" y=\"",
                    SvgNumber(swatch_y), "\" width=\"16\" height=\"16\" fill=\"url(#masked)\" ",
                    "stroke=\"#333333\" stroke-width=\"1\"/>\n", "<text x=\"",
                    SvgNumber(bar_x + 22), "\" y=\"", SvgNumber(swatch_y + 12),
                    "\">masked</text>\n", "<text x=\"", SvgNumber(bar_x + 22), "\" y=\"",
                    SvgNumber(swatch_y + 26), "\" fill=\"#444444\">(not attended)</text>\n");
  }
  absl::StrAppend(svg, "</g>\n");
}

}  // namespace

HeatmapDrawn DrawnPart(const Heatmap& h) {
  HeatmapDrawn d;
  d.panels = std::min(h.heads, std::max<int64_t>(1, h.max_panels));
  d.rows = std::min(h.rows, std::max<int64_t>(1, h.max_rows));
  d.cols = std::min(h.cols, std::max<int64_t>(1, h.max_cols));
  const int64_t budget = std::max<int64_t>(1, h.max_cells);
  // Rows and columns at most max_rows + max_cols steps; panels go only when one cell each is
  // still too many.
  while (d.panels * d.rows * d.cols > budget && (d.rows > 1 || d.cols > 1)) {
    if (d.cols >= d.rows && d.cols > 1) {
      --d.cols;
    } else {
      --d.rows;
    }
  }
  d.panels = std::min(d.panels, std::max<int64_t>(1, budget / (d.rows * d.cols)));
  d.truncated = d.panels < h.heads || d.rows < h.rows || d.cols < h.cols;
  return d;
}

absl::StatusOr<std::string> RenderHeatmapSvg(const Heatmap& h) {
  if (absl::Status s = ValidateHeatmap(h); !s.ok()) return s;
  const HeatmapLayout layout = LayOutHeatmap(h);
  const ColourScale scale = ScaleOf(h, layout);
  std::string svg;
  AppendHeader(h, layout, &svg);
  for (int64_t p = 0; p < layout.drawn.panels; ++p) AppendPanel(h, layout, scale, p, &svg);
  AppendLegend(h, layout, scale, &svg);
  svg += "</svg>\n";
  return svg;
}

}  // namespace attend::cli
