// What the CLI's SVG writers (svg_chart.h: line charts, svg_heatmap.h: heatmaps) share: text
// escaped for XML, the start of a document, coordinates, "nice" axis ticks and their labels, and
// the length of labels in characters.
//
// The documents are self-contained (no scripts, fonts or external references) and well-formed
// XML: every piece of text goes through XmlEscape, which replaces bytes that are not valid
// UTF-8 or not allowed in XML 1.0.
//
// Thread-safety: pure functions.
#ifndef ATTEND_CLIENT_CLI_RENDER_SVG_H_
#define ATTEND_CLIENT_CLI_RENDER_SVG_H_

#include <cstddef>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"

namespace attend::cli {

// About `target` (>= 1) evenly spaced ticks, 1, 2 or 5 x 10^k apart, from the last tick at or
// below `lo` to the first at or above `hi`. hi <= lo is treated as [lo, lo + 1].
// REQUIRES: lo and hi finite.
std::vector<double> NiceTicks(double lo, double hi, int target);

// A tick value with as many decimals as `step` needs and thousands separators: "32,768", "0.25".
std::string TickLabel(double value, double step);

// `text` escaped for XML character data and attribute values.
std::string XmlEscape(absl::string_view text);

// A coordinate or length in pixels as the documents write them, with two decimals: "12.50".
std::string SvgNumber(double value);

// The XML declaration, the <svg> element's start tag (size, viewBox, a sans-serif font of
// `font_size` px) and the document's <title> (escaped): what every document starts with.
// `width` and `height` are written as given.
std::string SvgStart(absl::string_view width, absl::string_view height, int font_size,
                     absl::string_view title);

// A white rectangle over the whole picture, drawn first so that viewers with a dark background
// show the document as it is meant to look.
inline constexpr char kSvgWhiteBackground[] =
    "<rect x=\"0\" y=\"0\" width=\"100%\" height=\"100%\" fill=\"#ffffff\"/>\n";

// The number of characters of a label (UTF-8 sequences; a stray byte counts as one).
size_t LabelChars(const std::string& label);

// At most `max_chars` characters of a label (whole UTF-8 sequences), with "..." when cut.
std::string ShortLabel(const std::string& label, size_t max_chars);

}  // namespace attend::cli

#endif  // ATTEND_CLIENT_CLI_RENDER_SVG_H_
