#include "common/byte_size.h"

#include <cmath>
#include <map>
#include <string>

#include "absl/algorithm/container.h"
#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace attend {
namespace {

// absl::SimpleAtod also takes hex ("0x10"); a size written in hex is more likely a typo.
bool ParseDecimalNumber(absl::string_view text, double* value) {
  absl::string_view digits = text;
  if (!digits.empty() && (digits[0] == '-' || digits[0] == '+')) digits.remove_prefix(1);
  if (digits.size() >= 2 && digits[0] == '0' && (digits[1] == 'x' || digits[1] == 'X')) {
    return false;
  }
  return absl::SimpleAtod(text, value);
}

}  // namespace

absl::StatusOr<int64_t> ParseByteSize(absl::string_view text, absl::string_view what) {
  absl::string_view t = absl::StripAsciiWhitespace(text);
  size_t split = 0;
  // The number: digits, sign, point and exponent ("1e9", "1.5E+3"); the unit is the rest.
  while (split < t.size() &&
         (absl::ascii_isdigit(t[split]) || t[split] == '.' || t[split] == '+' || t[split] == '-' ||
          ((t[split] == 'e' || t[split] == 'E') && split > 0 && split + 1 < t.size() &&
           (absl::ascii_isdigit(t[split + 1]) || t[split + 1] == '+' || t[split + 1] == '-')))) {
    ++split;
  }
  const std::string number(t.substr(0, split));
  const std::string unit = absl::AsciiStrToLower(absl::StripAsciiWhitespace(t.substr(split)));
  const auto bad = [&](absl::string_view why) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, what.empty() ? "'" : ": '", text, "' ", why,
                     "; write a byte count such as 80GiB (2^30), 80GB (10^9), 512MiB or 1e9"));
  };
  double value;
  if (number.empty() || !ParseDecimalNumber(number, &value) || !std::isfinite(value)) {
    return bad("is not a size");
  }
  if (value < 0) return bad("is negative");
  static const auto* const kUnits = new std::map<std::string, double>{
      {"", 1.0},       {"b", 1.0},      {"kib", 0x1p10}, {"mib", 0x1p20},
      {"gib", 0x1p30}, {"tib", 0x1p40}, {"pib", 0x1p50}, {"kb", 1e3},
      {"mb", 1e6},     {"gb", 1e9},     {"tb", 1e12},    {"pb", 1e15},
  };
  const auto it = kUnits->find(unit);
  if (it == kUnits->end()) {
    const bool ambiguous = unit == "k" || unit == "m" || unit == "g" || unit == "t" || unit == "p";
    return bad(ambiguous ? "has an ambiguous unit (binary GiB or decimal GB?)"
                         : "has an unknown unit");
  }
  // Whole numbers are taken exactly (a double would round 2^63 - 1 up to 2^63).
  if (int64_t whole;
      absl::c_all_of(number, absl::ascii_isdigit) && absl::SimpleAtoi(number, &whole)) {
    const int64_t unit_bytes = static_cast<int64_t>(it->second);
    if (whole > INT64_MAX / unit_bytes) return bad("is over 2^63 - 1 bytes");
    return whole * unit_bytes;
  }
  const long double bytes = static_cast<long double>(value) * it->second;
  // 2^63 is the first value that does not fit.
  if (bytes >= 0x1p63L) return bad("is over 2^63 - 1 bytes");
  return static_cast<int64_t>(std::llroundl(bytes));
}

std::string FormatByteSize(int64_t bytes) {
  static constexpr const char* kUnits[] = {"PiB", "TiB", "GiB", "MiB", "KiB"};
  if (bytes > 0) {
    for (int i = 0; i < 5; ++i) {
      const int64_t unit = int64_t{1} << (10 * (5 - i));
      if (bytes % unit == 0) return absl::StrCat(bytes / unit, kUnits[i]);
    }
  }
  return absl::StrCat(bytes);
}

bool AbslParseFlag(absl::string_view text, ByteSize* size, std::string* error) {
  absl::StatusOr<int64_t> bytes = ParseByteSize(text, "");
  if (!bytes.ok()) {
    *error = std::string(bytes.status().message());
    return false;
  }
  size->bytes = *bytes;
  return true;
}

std::string AbslUnparseFlag(ByteSize size) { return FormatByteSize(size.bytes); }

}  // namespace attend
