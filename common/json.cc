#include "common/json.h"

#include <algorithm>
#include <cmath>
#include <system_error>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/charconv.h"
#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/utf8.h"

// The core's status_macros.h is out of reach (this library must not depend on the core).
#define ATTEND_JSON_RETURN_IF_ERROR(expr)        \
  do {                                           \
    ::absl::Status json_status_ = (expr);        \
    if (!json_status_.ok()) return json_status_; \
  } while (false)

namespace attend::json {

absl::string_view Value::TypeName(Type type) {
  switch (type) {
    case Type::kNull:
      return "null";
    case Type::kBool:
      return "a boolean";
    case Type::kNumber:
      return "a number";
    case Type::kString:
      return "a string";
    case Type::kArray:
      return "an array";
    case Type::kObject:
      return "an object";
  }
  return "a value";
}

const Value* Value::Find(absl::string_view key) const {
  if (type_ != Type::kObject) return nullptr;
  for (const Member& member : members_) {
    if (member.first == key) return &member.second;
  }
  return nullptr;
}

namespace {

// Objects up to this many members find duplicate keys by a linear scan, which allocates nothing;
// larger ones switch to a hash set so that a hostile object cannot cost quadratic time.
constexpr size_t kLinearKeyScanMembers = 16;

bool IsDigit(char c) { return c >= '0' && c <= '9'; }

int HexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// Untrusted text in a message: C-escaped (no control bytes or invalid UTF-8 reach a log) and cut
// at 64 bytes.
std::string Quote(absl::string_view text) {
  constexpr size_t kMaxBytes = 64;
  const bool cut = text.size() > kMaxBytes;
  return absl::StrCat("'", absl::CHexEscape(text.substr(0, kMaxBytes)), cut ? "...'" : "'");
}

void AppendUtf8(uint32_t cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
    return;
  }
  const int tail = cp < 0x800 ? 1 : (cp < 0x10000 ? 2 : 3);
  const unsigned char lead_bits[] = {0, 0xC0, 0xE0, 0xF0};
  out->push_back(static_cast<char>(lead_bits[tail] | (cp >> (6 * tail))));
  for (int k = tail - 1; k >= 0; --k) {
    out->push_back(static_cast<char>(0x80 | ((cp >> (6 * k)) & 0x3F)));
  }
}

// Whether a well-formed number literal that from_chars found out of range is below 1 in
// magnitude (an underflow, which rounds to zero) rather than above (an overflow, an error).
// from_chars' `value` is not relied on for this: Abseil documents it as unspecified then.
bool MagnitudeBelowOne(absl::string_view literal) {
  size_t i = literal[0] == '-' ? 1 : 0;
  // The decimal exponent of the leading non-zero digit, before the literal's own exponent.
  int64_t lead = 0;
  bool found = false;
  int64_t integer_digits = 0;
  for (; i < literal.size() && IsDigit(literal[i]); ++i) {
    if (!found && literal[i] != '0') found = true;
    if (found) ++integer_digits;
  }
  if (found) {
    lead = integer_digits - 1;
  } else if (i < literal.size() && literal[i] == '.') {
    int64_t zeros = 0;
    for (++i; i < literal.size() && IsDigit(literal[i]); ++i) {
      if (literal[i] != '0') {
        found = true;
        break;
      }
      ++zeros;
    }
    lead = -zeros - 1;
  }
  if (!found) return true;  // zero (cannot be out of range; kept total)
  while (i < literal.size() && literal[i] != 'e' && literal[i] != 'E') ++i;
  int64_t exponent = 0;
  if (i < literal.size()) {
    ++i;
    const bool negative = literal[i] == '-';
    if (literal[i] == '+' || literal[i] == '-') ++i;
    for (; i < literal.size(); ++i) {
      // Saturate: any exponent beyond 10^9 is as out of range as 10^9.
      exponent = std::min<int64_t>(exponent * 10 + (literal[i] - '0'), int64_t{1000000000});
    }
    if (negative) exponent = -exponent;
  }
  return lead + exponent < 0;
}

}  // namespace

// Recursive descent over the text; `depth` (the number of enclosing containers) bounds the
// recursion by Limits::max_depth.
class Parser {
 public:
  Parser(absl::string_view text, const Limits& limits) : text_(text), limits_(limits) {}

  absl::StatusOr<Value> ParseDocument() {
    if (text_.size() > limits_.max_input_bytes) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the input is ", text_.size(), " bytes; the limit is ", limits_.max_input_bytes));
    }
    if (text_.substr(0, 3) == "\xEF\xBB\xBF") pos_ = 3;
    Value root;
    ATTEND_JSON_RETURN_IF_ERROR(ParseValue(&root, 0));
    SkipWhitespace();
    if (!AtEnd()) return Error("unexpected content after the JSON document");
    return root;
  }

 private:
  absl::Status Error(absl::string_view what) const { return ErrorAt(pos_, what); }

  // "line L, column C: <what>", counting columns in bytes from 1. Only an error pays for the
  // count.
  absl::Status ErrorAt(size_t pos, absl::string_view what) const {
    size_t line = 1, line_start = 0;
    for (size_t k = 0; k < pos && k < text_.size(); ++k) {
      if (text_[k] == '\n') {
        ++line;
        line_start = k + 1;
      }
    }
    return absl::InvalidArgumentError(
        absl::StrCat("line ", line, ", column ", pos - line_start + 1, ": ", what));
  }

  bool AtEnd() const { return pos_ >= text_.size(); }
  char Peek() const { return text_[pos_]; }  // REQUIRES: !AtEnd()
  bool AtNumber() const {
    return !AtEnd() && (Peek() == '-' || IsDigit(Peek()) ||
                        (limits_.allow_python_non_finite && (Peek() == 'N' || Peek() == 'I')));
  }

  // Python's non-finite literals, when the limits allow them: sets *value and advances.
  bool ParseNonFinite(double* value, std::string* text) {
    if (!limits_.allow_python_non_finite) return false;
    for (const auto& [word, v] : {std::pair<absl::string_view, double>{"NaN", std::nan("")},
                                  {"Infinity", HUGE_VAL},
                                  {"-Infinity", -HUGE_VAL}}) {
      if (text_.substr(pos_, word.size()) == word) {
        pos_ += word.size();
        *value = v;
        if (text != nullptr) text->assign(word.data(), word.size());
        return true;
      }
    }
    return false;
  }

  void SkipWhitespace() {
    while (!AtEnd()) {
      const char c = Peek();
      if (c != ' ' && c != '\t' && c != '\n' && c != '\r') return;
      ++pos_;
    }
  }

  absl::Status CountValue() {
    if (++values_ > limits_.max_values) {
      return Error(absl::StrCat("more than ", limits_.max_values, " values in the document"));
    }
    return absl::OkStatus();
  }

  absl::Status ParseValue(Value* out, int depth) {
    SkipWhitespace();
    if (AtEnd()) return Error("unexpected end of input, expected a value");
    ATTEND_JSON_RETURN_IF_ERROR(CountValue());
    const char c = Peek();
    switch (c) {
      case '{':
      case '[':
        if (depth >= limits_.max_depth) {
          return Error(absl::StrCat("nesting deeper than ", limits_.max_depth, " levels"));
        }
        return c == '{' ? ParseObject(out, depth + 1) : ParseArray(out, depth + 1);
      case '"':
        out->type_ = Value::Type::kString;
        return ParseString(&out->text_);
      case 't':
        out->type_ = Value::Type::kBool;
        out->bool_ = true;
        return ParseLiteral("true");
      case 'f':
        out->type_ = Value::Type::kBool;
        out->bool_ = false;
        return ParseLiteral("false");
      case 'n':
        out->type_ = Value::Type::kNull;
        return ParseLiteral("null");
      default:
        if (AtNumber()) {
          out->type_ = Value::Type::kNumber;
          return ParseNumber(&out->number_, &out->text_);
        }
        if (text_.substr(pos_, 3) == "NaN" || text_.substr(pos_, 8) == "Infinity") {
          return Error("NaN and Infinity are not JSON numbers");
        }
        return Error(absl::StrCat("unexpected character ", Quote(text_.substr(pos_, 1)),
                                  ", expected a value"));
    }
  }

  absl::Status ParseLiteral(absl::string_view word) {
    if (text_.substr(pos_, word.size()) != word) {
      return Error(absl::StrCat("invalid literal, expected '", word, "'"));
    }
    pos_ += word.size();
    return absl::OkStatus();
  }

  absl::Status ParseArray(Value* out, int depth) {
    out->type_ = Value::Type::kArray;
    ++pos_;  // '['
    SkipWhitespace();
    if (!AtEnd() && Peek() == ']') {
      ++pos_;
      return absl::OkStatus();
    }
    const size_t first_element = pos_;
    const size_t values_before = values_;
    while (true) {
      if (out->size() >= limits_.max_array_elements) {
        return Error(absl::StrCat("array longer than ", limits_.max_array_elements, " elements"));
      }
      SkipWhitespace();
      if (out->all_numbers_ && AtNumber()) {
        // The dense path: a number of an all-number array needs no Value of its own.
        ATTEND_JSON_RETURN_IF_ERROR(CountValue());
        double number = 0.0;
        ATTEND_JSON_RETURN_IF_ERROR(ParseNumber(&number, nullptr));
        out->numbers_.push_back(number);
      } else {
        if (out->all_numbers_) {
          out->all_numbers_ = false;
          if (!out->numbers_.empty()) {
            // The first element that is not a number: read the array again from its start, its
            // numbers now as Values that keep their text (AsInt64 needs it). Only numbers precede
            // this point, so the second pass is linear and happens at most once per array.
            out->numbers_ = std::vector<double>();
            pos_ = first_element;
            values_ = values_before;
            continue;
          }
        }
        out->items_.emplace_back();
        ATTEND_JSON_RETURN_IF_ERROR(ParseValue(&out->items_.back(), depth));
      }
      SkipWhitespace();
      if (AtEnd()) {
        return Error("unexpected end of input, expected ',' or ']' after an array element");
      }
      if (Peek() == ']') {
        ++pos_;
        return absl::OkStatus();
      }
      if (Peek() != ',') return Error("expected ',' or ']' after an array element");
      ++pos_;
      SkipWhitespace();
      if (!AtEnd() && Peek() == ']') return Error("a trailing ',' before ']'");
    }
  }

  absl::Status ParseObject(Value* out, int depth) {
    out->type_ = Value::Type::kObject;
    ++pos_;  // '{'
    SkipWhitespace();
    if (!AtEnd() && Peek() == '}') {
      ++pos_;
      return absl::OkStatus();
    }
    absl::flat_hash_set<std::string> keys;  // filled once the linear scan is too slow
    while (true) {
      if (out->members_.size() >= limits_.max_object_members) {
        return Error(
            absl::StrCat("object with more than ", limits_.max_object_members, " members"));
      }
      SkipWhitespace();
      if (AtEnd()) return Error("unexpected end of input, expected an object key");
      if (Peek() != '"') return Error("expected an object key in double quotes");
      const size_t key_pos = pos_;
      std::string key;
      ATTEND_JSON_RETURN_IF_ERROR(ParseString(&key));
      if (IsDuplicateKey(*out, key, &keys)) {
        return ErrorAt(key_pos, absl::StrCat("duplicate key ", Quote(key)));
      }
      SkipWhitespace();
      if (AtEnd() || Peek() != ':') return Error("expected ':' after an object key");
      ++pos_;
      out->members_.emplace_back(std::move(key), Value());
      ATTEND_JSON_RETURN_IF_ERROR(ParseValue(&out->members_.back().second, depth));
      SkipWhitespace();
      if (AtEnd()) {
        return Error("unexpected end of input, expected ',' or '}' after an object member");
      }
      if (Peek() == '}') {
        ++pos_;
        return absl::OkStatus();
      }
      if (Peek() != ',') return Error("expected ',' or '}' after an object member");
      ++pos_;
      SkipWhitespace();
      if (!AtEnd() && Peek() == '}') return Error("a trailing ',' before '}'");
    }
  }

  // Whether `key` is already a member of `object`; `keys` mirrors the members' keys once the
  // object has kLinearKeyScanMembers of them. Records `key` when it is new.
  static bool IsDuplicateKey(const Value& object, const std::string& key,
                             absl::flat_hash_set<std::string>* keys) {
    const std::vector<Value::Member>& members = object.members_;
    if (members.size() < kLinearKeyScanMembers) {
      return std::any_of(members.begin(), members.end(),
                         [&](const Value::Member& m) { return m.first == key; });
    }
    if (keys->empty()) {
      for (const Value::Member& m : members) keys->insert(m.first);
    }
    return !keys->insert(key).second;
  }

  absl::StatusOr<uint32_t> ParseHex4() {
    if (text_.size() - pos_ < 4) return Error("truncated \\u escape");
    uint32_t value = 0;
    for (size_t k = 0; k < 4; ++k) {
      const int h = HexValue(text_[pos_ + k]);
      if (h < 0) return Error("invalid hex digit in a \\u escape");
      value = value * 16 + static_cast<uint32_t>(h);
    }
    pos_ += 4;
    return value;
  }

  absl::Status ParseString(std::string* out) {
    const size_t start = pos_;
    ++pos_;  // '"'
    while (true) {
      // Checked before each character, so at most one character (4 bytes) past the limit is
      // ever held.
      if (out->size() > limits_.max_string_bytes) {
        return ErrorAt(start,
                       absl::StrCat("string longer than ", limits_.max_string_bytes, " bytes"));
      }
      if (AtEnd()) return ErrorAt(start, "unterminated string");
      const unsigned char c = static_cast<unsigned char>(Peek());
      if (c == '"') {
        ++pos_;
        return absl::OkStatus();
      }
      if (c < 0x20) return Error("unescaped control character in a string");
      if (c != '\\') {
        const size_t n = utf8::SequenceAt(text_, pos_);
        if (n == 0) return Error("invalid UTF-8 in a string");
        out->append(text_.data() + pos_, n);
        pos_ += n;
        continue;
      }
      ++pos_;
      if (AtEnd()) return ErrorAt(start, "unterminated string");
      const char e = Peek();
      switch (e) {
        case '"':
        case '\\':
        case '/':
          out->push_back(e);
          break;
        case 'b':
          out->push_back('\b');
          break;
        case 'f':
          out->push_back('\f');
          break;
        case 'n':
          out->push_back('\n');
          break;
        case 'r':
          out->push_back('\r');
          break;
        case 't':
          out->push_back('\t');
          break;
        case 'u': {
          ++pos_;
          absl::StatusOr<uint32_t> cp = ParseHex4();
          if (!cp.ok()) return cp.status();
          if (*cp >= 0xDC00 && *cp <= 0xDFFF) return Error("lone low surrogate in a \\u escape");
          if (*cp >= 0xD800 && *cp <= 0xDBFF) {
            if (text_.substr(pos_, 2) != "\\u") return Error("lone high surrogate in a \\u escape");
            pos_ += 2;
            absl::StatusOr<uint32_t> low = ParseHex4();
            if (!low.ok()) return low.status();
            if (*low < 0xDC00 || *low > 0xDFFF) {
              return Error("high surrogate not followed by a low surrogate");
            }
            *cp = 0x10000 + ((*cp - 0xD800) << 10) + (*low - 0xDC00);
          }
          AppendUtf8(*cp, out);
          continue;  // pos_ is past the escape already
        }
        default:
          return Error(
              absl::StrCat("invalid escape '\\", absl::CHexEscape(text_.substr(pos_, 1)), "'"));
      }
      ++pos_;
    }
  }

  // RFC 8259: -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?. `text` (optional) receives the
  // literal.
  absl::Status ParseNumber(double* value, std::string* text) {
    if (ParseNonFinite(value, text)) return absl::OkStatus();
    const size_t start = pos_;
    const auto digits = [&] {
      const size_t from = pos_;
      while (!AtEnd() && IsDigit(Peek())) ++pos_;
      return pos_ - from;
    };
    if (Peek() == '-') ++pos_;
    if (AtEnd() || !IsDigit(Peek())) {
      return Error(text_.substr(pos_, 8) == "Infinity" ? "NaN and Infinity are not JSON numbers"
                                                       : "expected a digit in a number");
    }
    if (Peek() == '0') {
      ++pos_;
      if (!AtEnd() && IsDigit(Peek())) return ErrorAt(start, "leading zero in a number");
    } else {
      digits();
    }
    if (!AtEnd() && Peek() == '.') {
      ++pos_;
      if (digits() == 0) return Error("expected a digit after the decimal point");
    }
    if (!AtEnd() && (Peek() == 'e' || Peek() == 'E')) {
      ++pos_;
      if (!AtEnd() && (Peek() == '+' || Peek() == '-')) ++pos_;
      if (digits() == 0) return Error("expected a digit in the exponent");
    }
    const absl::string_view literal = text_.substr(start, pos_ - start);
    if (literal.size() > limits_.max_number_chars) {
      return ErrorAt(start,
                     absl::StrCat("number longer than ", limits_.max_number_chars, " characters"));
    }
    double parsed = 0.0;
    const absl::from_chars_result r =
        absl::from_chars(literal.data(), literal.data() + literal.size(), parsed);
    if (r.ptr != literal.data() + literal.size() ||
        (r.ec != std::errc() && r.ec != std::errc::result_out_of_range)) {
      return ErrorAt(start, absl::StrCat("invalid number ", Quote(literal)));
    }
    if (r.ec == std::errc::result_out_of_range) {
      if (!MagnitudeBelowOne(literal)) {
        return ErrorAt(start,
                       absl::StrCat("number ", Quote(literal), " is too large for a double"));
      }
      parsed = 0.0;  // an underflow rounds to zero
    }
    if (!std::isfinite(parsed)) {
      return ErrorAt(start, absl::StrCat("number ", Quote(literal), " is too large for a double"));
    }
    *value = literal[0] == '-' && parsed == 0.0 ? -0.0 : parsed;
    if (text != nullptr) text->assign(literal.data(), literal.size());
    return absl::OkStatus();
  }

  absl::string_view text_;
  const Limits& limits_;
  size_t pos_ = 0;
  size_t values_ = 0;
};

absl::StatusOr<Value> Parse(absl::string_view text, const Limits& limits) {
  return Parser(text, limits).ParseDocument();
}

absl::StatusOr<int64_t> AsInt64(const Value& value, absl::string_view field) {
  if (!value.is_number()) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": expected an integer, got ", value.type_name()));
  }
  const std::string& text = value.number_text();
  if (text.find_first_of(".eE") == std::string::npos) {
    int64_t result = 0;
    if (!absl::SimpleAtoi(text, &result)) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, ": ", Quote(text), " does not fit in 64 bits"));
    }
    return result;
  }
  // A fraction or exponent: the double is exact for integers up to 2^53 only.
  const double d = value.number_value();
  constexpr double kMaxExact = 9007199254740992.0;  // 2^53
  if (std::fabs(d) > kMaxExact) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": ", Quote(text), " is too large to be read as an exact integer"));
  }
  if (d != std::floor(d)) {
    return absl::InvalidArgumentError(absl::StrCat(field, ": ", Quote(text), " is not an integer"));
  }
  return static_cast<int64_t>(d);
}

}  // namespace attend::json

#undef ATTEND_JSON_RETURN_IF_ERROR
