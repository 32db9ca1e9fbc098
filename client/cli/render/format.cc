#include "client/cli/render/format.h"

#include <sys/ioctl.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "google/protobuf/util/json_util.h"

namespace attend::cli {
namespace {

bool LooksNumeric(const std::string& s) {
  if (s.empty()) return false;
  const char c = s[0];
  if (s == "-inf" || s == "inf" || s == "nan") return true;
  return (c >= '0' && c <= '9') || ((c == '-' || c == '+' || c == '.') && s.size() > 1);
}

template <typename T>
std::string Numbers(absl::Span<const T> values) {
  std::string out = "[";
  for (size_t i = 0; i < values.size(); ++i) {
    if (i) out += ", ";
    out += JsonNumber(static_cast<double>(values[i]));
  }
  return out + "]";
}

}  // namespace

TableStyle TableStyleFromFlags(bool no_headers, bool wide) {
  TableStyle style;
  style.headers = !no_headers;
  if (wide) return style;
  int64_t columns = 0;
  if (const char* env = std::getenv("COLUMNS");
      env != nullptr && absl::SimpleAtoi(env, &columns) && columns > 0) {
    style.max_width = static_cast<size_t>(columns);
  } else if (isatty(STDOUT_FILENO)) {
    winsize size{};
    const bool told = ioctl(STDOUT_FILENO, TIOCGWINSZ, &size) == 0 && size.ws_col > 0;
    style.max_width = told ? size.ws_col : 80;
  }
  return style;
}

std::string Table::Render(const TableStyle& style, std::vector<std::string>* hidden) const {
  const size_t first = style.headers ? 0 : 1;
  std::vector<size_t> widths;
  for (size_t r = first; r < rows_.size(); ++r) {
    const auto& row = rows_[r];
    if (widths.size() < row.size()) widths.resize(row.size(), 0);
    for (size_t c = 0; c < row.size(); ++c) widths[c] = std::max(widths[c], row[c].size());
  }
  // A column whose body is all numbers is right-aligned, header included.
  std::vector<bool> numeric(widths.size(), rows_.size() > 1);
  for (size_t r = 1; r < rows_.size(); ++r) {
    for (size_t c = 0; c < rows_[r].size(); ++c) {
      if (!LooksNumeric(rows_[r][c]) && rows_[r][c] != "...") numeric[c] = false;
    }
  }
  // Hide columns in the drop order while the widest line is wider than allowed.
  std::vector<bool> shown(widths.size(), true);
  size_t total = 0;
  for (size_t c = 0; c < widths.size(); ++c) total += widths[c] + (c ? 2 : 0);
  for (const std::string& name : drop_order_) {
    if (style.max_width == 0 || total <= style.max_width) break;
    const auto it = std::find(rows_[0].begin(), rows_[0].end(), name);
    const size_t c = static_cast<size_t>(it - rows_[0].begin());
    if (it == rows_[0].end() || c >= widths.size() || !shown[c]) continue;
    shown[c] = false;
    total -= widths[c] + 2;
    if (hidden != nullptr) hidden->push_back(name);
  }
  std::string out;
  for (size_t r = first; r < rows_.size(); ++r) {
    std::string line;
    for (size_t c = 0; c < rows_[r].size(); ++c) {
      if (!shown[c]) continue;
      const std::string& cell = rows_[r][c];
      const std::string pad(widths[c] - cell.size(), ' ');
      if (!line.empty()) line += "  ";
      line += numeric[c] ? pad + cell : cell + pad;
    }
    while (!line.empty() && line.back() == ' ') line.pop_back();
    out += line + "\n";
  }
  return out;
}

std::string HiddenColumnsNote(const std::vector<std::string>& hidden, size_t max_width) {
  if (hidden.empty()) return "";
  return absl::StrCat("(", absl::StrJoin(hidden, ", "), " hidden to fit ", max_width,
                      " columns; -o wide shows ", hidden.size() == 1 ? "it" : "them", ")\n");
}

void PrintTable(const Table& table, const TableStyle& style, std::ostream& out, std::ostream& err) {
  std::vector<std::string> hidden;
  out << table.Render(style, &hidden);
  (style.headers ? out : err) << HiddenColumnsNote(hidden, style.max_width);
}

std::string Fields::Render(const std::string& indent, size_t max_width) const {
  size_t width = 0;
  for (const auto& [label, value] : rows_) width = std::max(width, label.size());
  const std::string value_indent(indent.size() + width + 2, ' ');
  std::string out;
  for (const auto& [label, value] : rows_) {
    const std::string start =
        absl::StrCat(indent, label, std::string(width - label.size() + 2, ' '));
    if (max_width == 0 || start.size() + value.size() <= max_width ||
        max_width <= value_indent.size()) {
      absl::StrAppend(&out, start, value, "\n");
      continue;
    }
    // Wrap puts the indent before the first line too: the label takes its place there.
    const std::string wrapped = Wrap(value, max_width - value_indent.size(), value_indent);
    absl::StrAppend(&out, start, absl::string_view(wrapped).substr(value_indent.size()));
  }
  return out;
}

std::string PadRight(std::string text, size_t width) {
  if (text.size() < width) text.resize(width, ' ');
  return text;
}

std::string Wrap(const std::string& text, size_t width, const std::string& indent) {
  std::string out, line;
  for (absl::string_view word : absl::StrSplit(text, ' ', absl::SkipEmpty())) {
    if (!line.empty() && indent.size() + line.size() + 1 + word.size() > width) {
      absl::StrAppend(&out, indent, line, "\n");
      line.clear();
    }
    absl::StrAppend(&line, line.empty() ? "" : " ", word);
  }
  if (!line.empty()) absl::StrAppend(&out, indent, line, "\n");
  return out;
}

std::string Shorten(const std::string& text, size_t max_chars) {
  if (text.size() <= max_chars) return text;
  return text.substr(0, max_chars - 3) + "...";
}

std::string Quoted(const std::string& text) { return absl::StrCat("'", text, "'"); }

std::string Fixed(double value, int decimals) { return absl::StrFormat("%.*f", decimals, value); }

std::string Si(double value, const std::string& unit) {
  const char* prefixes[] = {"", "k", "M", "G", "T", "P", "E"};
  int i = 0;
  double v = value;
  while (std::abs(v) >= 1000.0 && i < 6) {
    v /= 1000.0;
    ++i;
  }
  return absl::StrFormat("%.3g %s%s", v, prefixes[i], unit);
}

std::string SiFine(double value, const std::string& unit) {
  const char* prefixes[] = {"", "k", "M", "G", "T", "P", "E", "Z"};
  int i = 0;
  double v = value;
  while (std::abs(v) >= 1000.0 && i < 7) {
    v /= 1000.0;
    ++i;
  }
  return absl::StrFormat("%.*f %s%s", std::abs(v) >= 10.0 ? 1 : 2, v, prefixes[i], unit);
}

std::string Rate(double value) {
  if (!std::isfinite(value)) return "-";
  if (value >= 1000.0) return Count(static_cast<int64_t>(std::llround(value)));
  return absl::StrFormat("%.3g", value);
}

std::string Duration(double seconds) {
  if (seconds < 1e-3) return absl::StrFormat("%.1f us", seconds * 1e6);
  if (seconds < 1.0) return absl::StrFormat("%.2f ms", seconds * 1e3);
  return absl::StrFormat("%.2f s", seconds);
}

std::string Ago(int64_t unix_ms) {
  const double s =
      std::max(0.0, absl::ToDoubleSeconds(absl::Now() - absl::FromUnixMillis(unix_ms)));
  if (s < 60) return absl::StrFormat("%.0f s", s);
  if (s < 3600) return absl::StrFormat("%.0f min", s / 60);
  if (s < 86400) return absl::StrFormat("%.0f h", s / 3600);
  return absl::StrFormat("%.0f d", s / 86400);
}

std::string UtcTime(int64_t unix_ms) {
  return absl::FormatTime("%Y-%m-%d %H:%M:%S UTC", absl::FromUnixMillis(unix_ms),
                          absl::UTCTimeZone());
}

std::string ShapeString(absl::Span<const int64_t> shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

std::string Count(int64_t value) {
  // Through uint64 so that INT64_MIN has a magnitude.
  const uint64_t magnitude =
      value < 0 ? uint64_t{0} - static_cast<uint64_t>(value) : static_cast<uint64_t>(value);
  const std::string digits = absl::StrCat(magnitude);
  std::string out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return value < 0 ? "-" + out : out;
}

std::string Plural(int64_t n, const std::string& one, const std::string& many) {
  return absl::StrCat(Count(n), " ", n == 1 ? one : many);
}

std::string BinaryBytes(int64_t bytes) {
  const char* units[] = {"KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  if (std::abs(static_cast<double>(bytes)) < 1024.0) return absl::StrCat(bytes, " bytes");
  double v = static_cast<double>(bytes) / 1024.0;
  int i = 0;
  while (std::abs(v) >= 1024.0 && i < 5) {
    v /= 1024.0;
    ++i;
  }
  return absl::StrFormat("%.2f %s", v, units[i]);
}

std::string BytesWithCount(int64_t bytes) {
  if (std::abs(static_cast<double>(bytes)) < 1024.0) return BinaryBytes(bytes);
  return absl::StrCat(BinaryBytes(bytes), " (", Count(bytes), " bytes)");
}

std::string AttentionVariantName(int64_t n_head, int64_t n_head_kv) {
  if (n_head_kv == n_head) return "multi-head";
  if (n_head_kv == 1) return "multi-query";
  return "grouped-query";
}

std::string JsonNumber(double value) {
  if (!std::isfinite(value)) return "null";
  return absl::StrFormat("%.9g", value);
}

std::string JsonNumbers(absl::Span<const float> values) { return Numbers(values); }
std::string JsonNumbers(absl::Span<const double> values) { return Numbers(values); }

std::string JsonString(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          out += absl::StrFormat("\\u%04x", c);
        } else {
          out += c;
        }
    }
  }
  return out + "\"";
}

std::string JsonTensor(const client::FloatTensor& tensor) {
  return absl::StrCat("{\"shape\": [", absl::StrJoin(tensor.shape, ", "),
                      "], \"values\": ", JsonNumbers(absl::MakeConstSpan(tensor.values)), "}");
}

namespace {

using google::protobuf::Descriptor;
using google::protobuf::FieldDescriptor;

// `value` (a member's or element's JSON text) without its quotes when `field` is a 64-bit
// integer and `value` a quoted integer of magnitude at most 2^53.
std::optional<absl::string_view> ExactInt64(absl::string_view value, const FieldDescriptor* field) {
  if (field == nullptr || !absl::ConsumePrefix(&value, "\"") ||
      !absl::ConsumeSuffix(&value, "\"")) {
    return std::nullopt;
  }
  constexpr uint64_t kExact = uint64_t{1} << 53;
  int64_t i = 0;
  uint64_t u = 0;
  switch (field->cpp_type()) {
    case FieldDescriptor::CPPTYPE_INT64:
      if (absl::SimpleAtoi(value, &i) && i >= -static_cast<int64_t>(kExact) &&
          i <= static_cast<int64_t>(kExact)) {
        return value;
      }
      return std::nullopt;
    case FieldDescriptor::CPPTYPE_UINT64:
      if (absl::SimpleAtoi(value, &u) && u <= kExact) return value;
      return std::nullopt;
    default:
      return std::nullopt;
  }
}

}  // namespace

std::string UnquoteExactInt64s(absl::string_view json, const Descriptor& type) {
  // The printer's indented layout has one member, element, opening or closing on each line:
  // `"key": value`, `value`, `"key": {`, `"key": [`, `{`, `}` and `]`, each but the openings
  // with an optional trailing comma, and `[]` or `{}` for empty ones. An open object or array is
  // a frame: an object of message `type` (nullptr: one copied as it is, such as a well-known
  // type's), a map's object, whose members' values are `field`, or an array of `field`.
  struct Frame {
    enum Kind { kMessage, kMap, kArray } kind;
    const Descriptor* type;
    const FieldDescriptor* field;
  };
  std::vector<Frame> open;
  bool seen_root = false;
  std::string out;
  out.reserve(json.size());
  const std::vector<absl::string_view> lines = absl::StrSplit(json, '\n');
  for (size_t n = 0; n < lines.size(); ++n) {
    const absl::string_view line = lines[n];
    if (n > 0) out += '\n';
    absl::string_view value = absl::StripLeadingAsciiWhitespace(line);
    const bool comma = absl::ConsumeSuffix(&value, ",");
    if (value.empty() || value == "}" || value == "]") {
      if (!value.empty()) {
        if (open.empty()) return std::string(json);
        open.pop_back();
      }
      absl::StrAppend(&out, line);
      continue;
    }
    // The field whose value this line holds (nullptr where there is none).
    const FieldDescriptor* field = nullptr;
    if (open.empty()) {
      if (value != "{" || seen_root) return std::string(json);  // one object, the message
      seen_root = true;
    } else if (open.back().kind == Frame::kArray) {
      field = open.back().field;
    } else {
      // A key: a JSON string, then ": ".
      size_t end = 1;
      while (end < value.size() && value[end] != '"') end += value[end] == '\\' ? 2 : 1;
      if (value[0] != '"' || !absl::StartsWith(value.substr(std::min(end, value.size())), "\": ")) {
        return std::string(json);
      }
      const absl::string_view key = value.substr(1, end - 1);
      value.remove_prefix(end + 3);
      const Frame& frame = open.back();
      field = frame.kind == Frame::kMap ? frame.field
              : frame.type != nullptr   ? frame.type->FindFieldByName(std::string(key))
                                        : nullptr;
    }
    if (value == "{") {
      if (field != nullptr && field->is_map() && open.back().kind != Frame::kArray) {
        open.push_back({Frame::kMap, nullptr, field->message_type()->map_value()});
      } else {
        const Descriptor* message = open.empty()       ? &type
                                    : field != nullptr ? field->message_type()
                                                       : nullptr;
        if (message != nullptr && absl::StartsWith(message->full_name(), "google.protobuf.")) {
          message = nullptr;
        }
        open.push_back({Frame::kMessage, message, nullptr});
      }
    } else if (value == "[") {
      open.push_back({Frame::kArray, nullptr, field});
    } else if (const std::optional<absl::string_view> digits = ExactInt64(value, field)) {
      absl::StrAppend(&out, line.substr(0, line.size() - value.size() - (comma ? 1 : 0)), *digits,
                      comma ? "," : "");
      continue;
    }
    absl::StrAppend(&out, line);
  }
  return open.empty() ? out : std::string(json);
}

std::string ToJson(const google::protobuf::Message& message) {
  std::string json;
  google::protobuf::util::JsonPrintOptions options;
  options.add_whitespace = true;
  options.always_print_primitive_fields = true;
  options.preserve_proto_field_names = true;
  // Printing a message the client holds cannot fail: it has no Any fields.
  (void)google::protobuf::util::MessageToJsonString(message, &json, options);
  return UnquoteExactInt64s(json, *message.GetDescriptor());
}

void PrintHeadRows(std::ostream& out, const client::FloatTensor& t, const std::string& row_name,
                   int64_t first_row, int64_t max_rows, int64_t max_cols) {
  if (t.shape.empty()) return;
  const int64_t n = t.shape[0], heads = t.shape.size() > 2 ? t.shape[1] : 1;
  const int64_t dim = t.shape.size() > 1 ? t.shape.back() : 1;
  // A tensor without a head dimension (an MHA layer's [n, d_out] output) gets no head column: it
  // would read 0 on every row.
  const bool head_column = t.shape.size() > 2;
  std::vector<std::string> header = {row_name};
  if (head_column) header.push_back("head");
  for (int64_t c = 0; c < std::min(dim, max_cols); ++c) header.push_back(absl::StrCat("[", c, "]"));
  if (dim > max_cols) header.push_back("...");
  Table table(header);
  int64_t rows = 0;
  for (int64_t i = 0; i < n && rows < max_rows; ++i) {
    for (int64_t h = 0; h < heads && rows < max_rows; ++h, ++rows) {
      std::vector<std::string> row = {absl::StrCat(first_row + i)};
      if (head_column) row.push_back(absl::StrCat(h));
      for (int64_t c = 0; c < std::min(dim, max_cols); ++c) {
        row.push_back(Fixed(t.values[static_cast<size_t>((i * heads + h) * dim + c)], 4));
      }
      if (dim > max_cols) row.push_back("...");
      table.AddRow(row);
    }
  }
  out << table.Render();
  if (n * heads > max_rows) out << "(" << n * heads - max_rows << " more rows)\n";
}

void PrintWeights(std::ostream& out, const client::FloatTensor& weights, const std::string& rows,
                  const std::string& columns, int64_t first_row) {
  if (weights.shape.size() != 3) return;
  const int64_t heads = weights.shape[0], n_q = weights.shape[1], n_kv = weights.shape[2];
  const int64_t max = 16;
  for (int64_t h = 0; h < heads; ++h) {
    out << "weights, head " << h << " (row = " << rows << ", column = " << columns << "):\n";
    std::vector<std::string> header = {"q\\k"};
    for (int64_t j = 0; j < std::min(n_kv, max); ++j) header.push_back(absl::StrCat(j));
    if (n_kv > max) header.push_back("...");
    Table table(header);
    for (int64_t i = 0; i < std::min(n_q, max); ++i) {
      std::vector<std::string> row = {absl::StrCat(first_row + i)};
      for (int64_t j = 0; j < std::min(n_kv, max); ++j) {
        row.push_back(Fixed(weights.values[static_cast<size_t>((h * n_q + i) * n_kv + j)], 3));
      }
      if (n_kv > max) row.push_back("...");
      table.AddRow(row);
    }
    out << table.Render();
    if (n_q > max) out << "(" << n_q - max << " more queries)\n";
  }
}

void PrintStats(std::ostream& out, const v1::ComputeStats& stats) {
  out << "engine " << stats.engine() << ": " << stats.attended_pairs() << " attended pairs, "
      << Si(static_cast<double>(stats.attention_flops()), "FLOP") << " in "
      << Duration(stats.compute_seconds());
  if (stats.compute_seconds() > 0) {
    out << " (" << Si(stats.attention_flops() / stats.compute_seconds(), "FLOP/s") << ")";
  }
  out << "; queued " << Duration(stats.queue_seconds()) << "\n";
}

}  // namespace attend::cli
