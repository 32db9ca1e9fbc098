#include "client/cli/render/svg.h"

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "client/cli/render/format.h"
#include "common/utf8.h"

namespace attend::cli {
namespace {

// Length of the UTF-8 sequence at text[i] when it is a character XML 1.0 allows, else 0.
size_t XmlCharLength(absl::string_view text, size_t i) {
  uint32_t code = 0;
  const size_t n = utf8::SequenceAt(text, i, &code);
  return code == 0xFFFE || code == 0xFFFF ? 0 : n;
}

}  // namespace

std::vector<double> NiceTicks(double lo, double hi, int target) {
  if (!(hi > lo)) hi = lo + 1.0;
  target = std::max(target, 1);
  const double raw = (hi - lo) / target;
  const double magnitude = std::pow(10.0, std::floor(std::log10(raw)));
  const double normalised = raw / magnitude;
  double step = 10.0 * magnitude;
  if (normalised <= 1.0) {
    step = magnitude;
  } else if (normalised <= 2.0) {
    step = 2.0 * magnitude;
  } else if (normalised <= 5.0) {
    step = 5.0 * magnitude;
  }
  // Integer tick indices, so that no error accumulates and 0 is exactly 0.
  const double first = std::floor(lo / step + 1e-9);
  const double last = std::ceil(hi / step - 1e-9);
  std::vector<double> ticks;
  for (double i = first; i <= last; i += 1.0) ticks.push_back(i * step);
  return ticks;
}

std::string TickLabel(double value, double step) {
  int decimals = 0;
  if (step > 0.0 && step < 1.0) {
    decimals = std::min(12, static_cast<int>(std::ceil(-std::log10(step) - 1e-9)));
  }
  if (std::abs(value) < std::abs(step) * 1e-9) value = 0.0;
  if (decimals > 0 || std::abs(value) >= 1e15) return absl::StrFormat("%.*f", decimals, value);
  return Count(static_cast<int64_t>(std::llround(value)));
}

std::string XmlEscape(absl::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size();) {
    const char c = text[i];
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += "&apos;";
        break;
      default: {
        const unsigned char u = static_cast<unsigned char>(c);
        if (u < 0x20) {
          // XML 1.0 allows only tab, newline and carriage return among the control characters.
          out += (c == '\t' || c == '\n' || c == '\r') ? ' ' : '?';
          break;
        }
        const size_t n = XmlCharLength(text, i);
        if (n == 0) {
          out += '?';
          break;
        }
        out.append(text.data() + i, n);
        i += n;
        continue;
      }
    }
    ++i;
  }
  return out;
}

std::string SvgNumber(double value) { return absl::StrFormat("%.2f", value); }

std::string SvgStart(absl::string_view width, absl::string_view height, int font_size,
                     absl::string_view title) {
  return absl::StrCat("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n",
                      "<svg xmlns=\"http://www.w3.org/2000/svg\" version=\"1.1\" width=\"", width,
                      "\" height=\"", height, "\" viewBox=\"0 0 ", width, " ", height,
                      "\" font-family=\"Helvetica, Arial, sans-serif\" font-size=\"", font_size,
                      "\">\n<title>", XmlEscape(title), "</title>\n");
}

size_t LabelChars(const std::string& label) {
  size_t chars = 0;
  for (size_t i = 0; i < label.size(); ++chars) {
    const size_t n = utf8::SequenceAt(label, i);
    i += n == 0 ? 1 : n;
  }
  return chars;
}

std::string ShortLabel(const std::string& label, size_t max_chars) {
  size_t chars = 0, i = 0;
  while (i < label.size() && chars < max_chars) {
    const size_t n = utf8::SequenceAt(label, i);
    i += n == 0 ? 1 : n;
    ++chars;
  }
  return i >= label.size() ? label : label.substr(0, i) + "...";
}

}  // namespace attend::cli
