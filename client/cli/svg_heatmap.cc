#include "client/cli/svg_heatmap.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "client/cli/svg.h"

namespace attend::cli {
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
      "<svg xmlns=\"http://www.w3.org/2000/svg\" version=\"1.1\" width=\"", SvgNumber(width),
      "\" height=\"", SvgNumber(height), "\" viewBox=\"0 0 ", SvgNumber(width), " ",
      SvgNumber(height), "\" font-family=\"Helvetica, Arial, sans-serif\" font-size=\"11\">\n",
      "<title>", XmlEscape(h.title), "</title>\n",
      "<defs>\n"
      "<pattern id=\"masked\" width=\"6\" height=\"6\" patternUnits=\"userSpaceOnUse\" "
      "patternTransform=\"rotate(45)\"><rect width=\"6\" height=\"6\" fill=\"#e6e6e6\"/>"
      "<line x1=\"0\" y1=\"0\" x2=\"0\" y2=\"6\" stroke=\"#a0a0a0\" stroke-width=\"2.5\"/>"
      "</pattern>\n<linearGradient id=\"scale\" x1=\"0\" y1=\"1\" x2=\"0\" y2=\"0\">\n");
  for (int i = 0; i <= 8; ++i) {
    absl::StrAppend(&svg, "<stop offset=\"", SvgNumber(i / 8.0), "\" stop-color=\"",
                    Viridis(i / 8.0), "\"/>\n");
  }
  absl::StrAppend(&svg, "</linearGradient>\n</defs>\n",
                  "<rect x=\"0\" y=\"0\" width=\"100%\" height=\"100%\" fill=\"#ffffff\"/>\n",
                  "<text class=\"title\" x=\"", SvgNumber(margin), "\" y=\"26\" font-size=\"16\" ",
                  "font-weight=\"bold\">", XmlEscape(h.title), "</text>\n");
  double line_y = 26;
  if (!h.subtitle.empty()) {
    line_y += 20;
    absl::StrAppend(&svg, "<text class=\"subtitle\" x=\"", SvgNumber(margin), "\" y=\"",
                    SvgNumber(line_y), "\" font-size=\"12\" fill=\"#444444\">",
                    XmlEscape(h.subtitle), "</text>\n");
  }
  if (truncated) {
    line_y += 20;
    std::vector<std::string> parts;
    if (panels < h.heads) parts.push_back(Range("head", panels, h.heads));
    if (rows < h.rows) parts.push_back(Range(h.row_axis, rows, h.rows));
    if (cols < h.cols) parts.push_back(Range(h.column_axis, cols, h.cols));
    absl::StrAppend(&svg, "<text class=\"note\" x=\"", SvgNumber(margin), "\" y=\"",
                    SvgNumber(line_y), "\" font-size=\"12\" fill=\"#b00000\">truncated: showing ",
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
        SvgNumber(grid_x + grid_w / 2), "\" y=\"", SvgNumber(y0 + 14),
        "\" text-anchor=\"middle\" font-size=\"13\" font-weight=\"bold\">", XmlEscape(panel_title),
        "</text>\n", "<text class=\"column-axis\" x=\"", SvgNumber(grid_x + grid_w / 2), "\" y=\"",
        SvgNumber(y0 + 32), "\" text-anchor=\"middle\" fill=\"#444444\">", XmlEscape(h.column_axis),
        " &#8594;</text>\n");
    const double axis_y = grid_y + grid_h / 2;
    absl::StrAppend(
        &svg, "<text class=\"row-axis\" x=\"", SvgNumber(x0 + 10), "\" y=\"", SvgNumber(axis_y),
        "\" text-anchor=\"middle\" fill=\"#444444\" transform=\"rotate(-90 ", SvgNumber(x0 + 10),
        " ", SvgNumber(axis_y), ")\">", XmlEscape(h.row_axis), " &#8594;</text>\n");
    for (int64_t c = 0; c < cols; c += stride) {
      const double x = grid_x + (static_cast<double>(c) + 0.5) * cell;
      const std::string text = XmlEscape(ShortLabel(column_label(c), 16));
      if (upright) {
        absl::StrAppend(&svg, "<text class=\"column-label\" x=\"", SvgNumber(x + 4), "\" y=\"",
                        SvgNumber(grid_y - 6), "\" transform=\"rotate(-90 ", SvgNumber(x + 4), " ",
                        SvgNumber(grid_y - 6), ")\">", text, "</text>\n");
      } else {
        absl::StrAppend(&svg, "<text class=\"column-label\" x=\"", SvgNumber(x), "\" y=\"",
                        SvgNumber(grid_y - 6), "\" text-anchor=\"middle\">", text, "</text>\n");
      }
    }
    for (int64_t r = 0; r < rows; r += stride) {
      absl::StrAppend(&svg, "<text class=\"row-label\" x=\"", SvgNumber(grid_x - 6), "\" y=\"",
                      SvgNumber(grid_y + (static_cast<double>(r) + 0.5) * cell + 4),
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
        absl::StrAppend(
            &svg, "<rect class=\"cell\" data-head=\"", p, "\" data-row=\"", r, "\" data-col=\"", c,
            "\" data-value=\"", absl::StrFormat("%.9g", v), "\"",
            hidden ? " data-masked=\"true\"" : "", " x=\"", SvgNumber(x), "\" y=\"", SvgNumber(y),
            "\" width=\"", SvgNumber(cell), "\" height=\"", SvgNumber(cell), "\" fill=\"",
            hidden ? "url(#masked)" : Viridis(t), "\"><title>",
            XmlEscape(absl::StrCat(panel_title, ", ", h.row_axis, " ", r, " (", row_label(r), "), ",
                                   h.column_axis, " ", c, " (", column_label(c), "): ",
                                   hidden ? "masked (not attended)" : absl::StrFormat("%.4f", v))),
            "</title></rect>\n");
        if (cell >= 30 && !hidden) {
          absl::StrAppend(&svg, "<text class=\"cell-value\" x=\"", SvgNumber(x + cell / 2),
                          "\" y=\"", SvgNumber(y + cell / 2 + 4),
                          "\" text-anchor=\"middle\" fill=\"", t < 0.6 ? "#ffffff" : "#000000",
                          "\">", absl::StrFormat("%.2f", v), "</text>\n");
        }
      }
    }
    absl::StrAppend(&svg, "<rect x=\"", SvgNumber(grid_x), "\" y=\"", SvgNumber(grid_y),
                    "\" width=\"", SvgNumber(grid_w), "\" height=\"", SvgNumber(grid_h),
                    "\" fill=\"none\" stroke=\"#333333\" stroke-width=\"1\"/>\n</g>\n");
  }

  // Legend: the colour bar with its ticks, and the masked swatch below it.
  const double bar_x = margin + static_cast<double>(per_line) * panel_w + 10;
  const double bar_y = header + 20, bar_h = 200;
  absl::StrAppend(&svg, "<g class=\"legend\">\n<text x=\"", SvgNumber(bar_x), "\" y=\"",
                  SvgNumber(bar_y - 8), "\" font-weight=\"bold\">weight</text>\n", "<rect x=\"",
                  SvgNumber(bar_x), "\" y=\"", SvgNumber(bar_y), "\" width=\"16\" height=\"",
                  SvgNumber(bar_h),
                  "\" fill=\"url(#scale)\" stroke=\"#333333\" stroke-width=\"1\"/>\n");
  for (double tick : scale_ticks) {
    if (tick > top_value * (1 + 1e-9)) continue;
    const double y = bar_y + bar_h - tick / top_value * bar_h;
    absl::StrAppend(&svg, "<line x1=\"", SvgNumber(bar_x + 16), "\" y1=\"", SvgNumber(y),
                    "\" x2=\"", SvgNumber(bar_x + 21), "\" y2=\"", SvgNumber(y),
                    "\" stroke=\"#333333\"/>\n", "<text class=\"scale-tick\" x=\"",
                    SvgNumber(bar_x + 25), "\" y=\"", SvgNumber(y + 4), "\">",
                    XmlEscape(TickLabel(tick, scale_step)), "</text>\n");
  }
  const double swatch_y = bar_y + bar_h + 24;
  absl::StrAppend(&svg, "<rect class=\"masked-swatch\" x=\"", SvgNumber(bar_x), "\" y=\"",
                  SvgNumber(swatch_y), "\" width=\"16\" height=\"16\" fill=\"url(#masked)\" ",
                  "stroke=\"#333333\" stroke-width=\"1\"/>\n", "<text x=\"", SvgNumber(bar_x + 22),
                  "\" y=\"", SvgNumber(swatch_y + 12), "\">masked</text>\n", "<text x=\"",
                  SvgNumber(bar_x + 22), "\" y=\"", SvgNumber(swatch_y + 26),
                  "\" fill=\"#444444\">(not attended)</text>\n</g>\n</svg>\n");
  return svg;
}

}  // namespace attend::cli
