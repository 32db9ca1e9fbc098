#include "client/cli/format.h"

#include <cmath>
#include <cstdio>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

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
    if (!std::isfinite(values[i])) {
      out += "null";
    } else {
      out += absl::StrFormat("%.9g", static_cast<double>(values[i]));
    }
  }
  return out + "]";
}

}  // namespace

std::string Table::Render() const {
  std::vector<size_t> widths;
  for (const auto& row : rows_) {
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
  std::string out;
  for (const auto& row : rows_) {
    std::string line;
    for (size_t c = 0; c < row.size(); ++c) {
      const std::string& cell = row[c];
      const std::string pad(widths[c] - cell.size(), ' ');
      if (c) line += "  ";
      line += numeric[c] ? pad + cell : cell + pad;
    }
    while (!line.empty() && line.back() == ' ') line.pop_back();
    out += line + "\n";
  }
  return out;
}

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

std::string Duration(double seconds) {
  if (seconds < 1e-3) return absl::StrFormat("%.1f us", seconds * 1e6);
  if (seconds < 1.0) return absl::StrFormat("%.2f ms", seconds * 1e3);
  return absl::StrFormat("%.2f s", seconds);
}

std::string ShapeString(absl::Span<const int64_t> shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
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

}  // namespace attend::cli
