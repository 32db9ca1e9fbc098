#include "core/planner/json.h"

#include <cmath>
#include <system_error>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/charconv.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "core/planner/model.h"
#include "core/status_macros.h"

namespace attend::planner::json {

const Value* Value::Find(absl::string_view key) const {
  if (type_ != Type::kObject) return nullptr;
  for (const Member& m : object_) {
    if (m.first == key) return &m.second;
  }
  return nullptr;
}

absl::string_view Value::TypeName(Type type) {
  switch (type) {
    case Type::kNull:
      return "null";
    case Type::kBool:
      return "boolean";
    case Type::kNumber:
      return "number";
    case Type::kString:
      return "string";
    case Type::kArray:
      return "array";
    case Type::kObject:
      return "object";
  }
  return "unknown";
}

namespace {

// Numbers longer than this are not plausible in a config and would only cost time.
constexpr size_t kMaxNumberChars = 256;

bool IsDigit(char c) { return c >= '0' && c <= '9'; }

int HexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

void AppendUtf8(uint32_t cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

// Length of the valid UTF-8 sequence starting at s[0] (a byte >= 0x80), or 0 when it is invalid
// (bad lead byte, missing continuation, overlong form, surrogate or above U+10FFFF).
size_t Utf8SequenceLength(absl::string_view s) {
  const auto b = [&](size_t i) { return static_cast<unsigned char>(s[i]); };
  const unsigned char lead = b(0);
  size_t length = 0;
  unsigned char lo = 0x80, hi = 0xBF;  // range of the first continuation byte
  if (lead >= 0xC2 && lead <= 0xDF) {
    length = 2;
  } else if (lead >= 0xE0 && lead <= 0xEF) {
    length = 3;
    if (lead == 0xE0) lo = 0xA0;
    if (lead == 0xED) hi = 0x9F;
  } else if (lead >= 0xF0 && lead <= 0xF4) {
    length = 4;
    if (lead == 0xF0) lo = 0x90;
    if (lead == 0xF4) hi = 0x8F;
  } else {
    return 0;
  }
  if (s.size() < length) return 0;
  if (b(1) < lo || b(1) > hi) return 0;
  for (size_t i = 2; i < length; ++i) {
    if (b(i) < 0x80 || b(i) > 0xBF) return 0;
  }
  return length;
}

}  // namespace

class Parser {
 public:
  Parser(absl::string_view text, const Limits& limits) : text_(text), limits_(limits) {}

  absl::StatusOr<Value> ParseDocument() {
    if (text_.size() > limits_.max_input_bytes) {
      return absl::InvalidArgumentError(absl::StrCat("json: the input is ", text_.size(),
                                                     " bytes; at most ", limits_.max_input_bytes));
    }
    if (text_.substr(0, 3) == "\xEF\xBB\xBF") pos_ = 3;
    Value root;
    SkipWhitespace();
    ATTEND_RETURN_IF_ERROR(ParseValue(&root, 0));
    SkipWhitespace();
    if (pos_ != text_.size()) return Error("unexpected content after the JSON value");
    return root;
  }

 private:
  absl::Status Error(absl::string_view what) const { return ErrorAt(pos_, what); }

  absl::Status ErrorAt(size_t pos, absl::string_view what) const {
    int64_t line = 1, column = 1;
    for (size_t i = 0; i < pos && i < text_.size(); ++i) {
      if (text_[i] == '\n') {
        ++line;
        column = 1;
      } else {
        ++column;
      }
    }
    return absl::InvalidArgumentError(
        absl::StrCat("json: line ", line, ", column ", column, ": ", what));
  }

  bool AtEnd() const { return pos_ >= text_.size(); }
  char Peek() const { return text_[pos_]; }

  void SkipWhitespace() {
    while (!AtEnd()) {
      const char c = Peek();
      if (c != ' ' && c != '\t' && c != '\n' && c != '\r') break;
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
    if (AtEnd()) return Error("unexpected end of input, expected a value");
    ATTEND_RETURN_IF_ERROR(CountValue());
    switch (Peek()) {
      case '{':
        return ParseObject(out, depth + 1);
      case '[':
        return ParseArray(out, depth + 1);
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
        if (Peek() == '-' || IsDigit(Peek())) return ParseNumber(out);
        return Error(absl::StrCat("unexpected character ", QuoteForError(text_.substr(pos_, 1)),
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

  absl::Status EnterContainer(int depth) {
    if (depth > limits_.max_depth) {
      return Error(absl::StrCat("nesting deeper than ", limits_.max_depth, " levels"));
    }
    return absl::OkStatus();
  }

  absl::Status ParseArray(Value* out, int depth) {
    ATTEND_RETURN_IF_ERROR(EnterContainer(depth));
    out->type_ = Value::Type::kArray;
    ++pos_;  // '['
    SkipWhitespace();
    if (!AtEnd() && Peek() == ']') {
      ++pos_;
      return absl::OkStatus();
    }
    while (true) {
      if (out->array_.size() >= limits_.max_array_elements) {
        return Error(absl::StrCat("array longer than ", limits_.max_array_elements, " elements"));
      }
      out->array_.emplace_back();
      SkipWhitespace();
      ATTEND_RETURN_IF_ERROR(ParseValue(&out->array_.back(), depth));
      SkipWhitespace();
      if (AtEnd()) return Error("unexpected end of input inside an array");
      if (Peek() == ',') {
        ++pos_;
        continue;
      }
      if (Peek() == ']') {
        ++pos_;
        return absl::OkStatus();
      }
      return Error("expected ',' or ']' in an array");
    }
  }

  absl::Status ParseObject(Value* out, int depth) {
    ATTEND_RETURN_IF_ERROR(EnterContainer(depth));
    out->type_ = Value::Type::kObject;
    ++pos_;  // '{'
    SkipWhitespace();
    if (!AtEnd() && Peek() == '}') {
      ++pos_;
      return absl::OkStatus();
    }
    absl::flat_hash_set<std::string> keys;
    while (true) {
      if (out->object_.size() >= limits_.max_object_members) {
        return Error(
            absl::StrCat("object with more than ", limits_.max_object_members, " members"));
      }
      SkipWhitespace();
      if (AtEnd() || Peek() != '"') return Error("expected a string key in an object");
      const size_t key_pos = pos_;
      std::string key;
      ATTEND_RETURN_IF_ERROR(ParseString(&key));
      if (!keys.insert(key).second) {
        return ErrorAt(key_pos, absl::StrCat("duplicate key ", QuoteForError(key)));
      }
      SkipWhitespace();
      if (AtEnd() || Peek() != ':') return Error("expected ':' after an object key");
      ++pos_;
      SkipWhitespace();
      out->object_.emplace_back(std::move(key), Value());
      ATTEND_RETURN_IF_ERROR(ParseValue(&out->object_.back().second, depth));
      SkipWhitespace();
      if (AtEnd()) return Error("unexpected end of input inside an object");
      if (Peek() == ',') {
        ++pos_;
        continue;
      }
      if (Peek() == '}') {
        ++pos_;
        return absl::OkStatus();
      }
      return Error("expected ',' or '}' in an object");
    }
  }

  absl::StatusOr<uint32_t> ParseHex4() {
    if (text_.size() - pos_ < 4) return Error("truncated \\u escape");
    uint32_t value = 0;
    for (int i = 0; i < 4; ++i) {
      const int h = HexValue(text_[pos_ + static_cast<size_t>(i)]);
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
      if (AtEnd()) return ErrorAt(start, "unterminated string");
      if (out->size() > limits_.max_string_bytes) {
        return ErrorAt(start,
                       absl::StrCat("string longer than ", limits_.max_string_bytes, " bytes"));
      }
      const unsigned char c = static_cast<unsigned char>(Peek());
      if (c == '"') {
        ++pos_;
        if (out->size() > limits_.max_string_bytes) {
          return ErrorAt(start,
                         absl::StrCat("string longer than ", limits_.max_string_bytes, " bytes"));
        }
        return absl::OkStatus();
      }
      if (c < 0x20) return Error("unescaped control character in a string");
      if (c >= 0x80) {
        const size_t length = Utf8SequenceLength(text_.substr(pos_));
        if (length == 0) return Error("invalid UTF-8 in a string");
        out->append(text_.data() + pos_, length);
        pos_ += length;
        continue;
      }
      if (c != '\\') {
        out->push_back(static_cast<char>(c));
        ++pos_;
        continue;
      }
      ++pos_;
      if (AtEnd()) return ErrorAt(start, "unterminated string");
      const char e = Peek();
      ++pos_;
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
          ATTEND_ASSIGN_OR_RETURN(uint32_t cp, ParseHex4());
          if (cp >= 0xDC00 && cp <= 0xDFFF) return Error("lone low surrogate in a \\u escape");
          if (cp >= 0xD800 && cp <= 0xDBFF) {
            if (text_.substr(pos_, 2) != "\\u") return Error("lone high surrogate in a \\u escape");
            pos_ += 2;
            ATTEND_ASSIGN_OR_RETURN(const uint32_t low, ParseHex4());
            if (low < 0xDC00 || low > 0xDFFF) {
              return Error("high surrogate not followed by a low surrogate");
            }
            cp = 0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00);
          }
          AppendUtf8(cp, out);
          break;
        }
        default:
          return Error(absl::StrCat("invalid escape ",
                                    QuoteForError(absl::StrCat("\\", std::string(1, e)))));
      }
    }
  }

  absl::Status ParseNumber(Value* out) {
    const size_t start = pos_;
    const auto digits = [&] {
      const size_t before = pos_;
      while (!AtEnd() && IsDigit(Peek())) ++pos_;
      return pos_ - before;
    };
    if (Peek() == '-') ++pos_;
    if (AtEnd() || !IsDigit(Peek())) return Error("expected a digit in a number");
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
    const absl::string_view lexeme = text_.substr(start, pos_ - start);
    if (lexeme.size() > kMaxNumberChars) {
      return ErrorAt(start, absl::StrCat("number longer than ", kMaxNumberChars, " characters"));
    }
    double value = 0.0;
    const absl::from_chars_result r =
        absl::from_chars(lexeme.data(), lexeme.data() + lexeme.size(), value);
    if (r.ec == std::errc::invalid_argument || r.ptr != lexeme.data() + lexeme.size()) {
      return ErrorAt(start, absl::StrCat("invalid number ", QuoteForError(lexeme)));
    }
    if (r.ec == std::errc::result_out_of_range && std::fabs(value) >= 1.0) {
      return ErrorAt(start,
                     absl::StrCat("number ", QuoteForError(lexeme), " is too large for a double"));
    }
    if (!std::isfinite(value)) {
      return ErrorAt(start,
                     absl::StrCat("number ", QuoteForError(lexeme), " is too large for a double"));
    }
    // Underflow (1e-400) rounds to zero or a subnormal, which is harmless for a config.
    out->type_ = Value::Type::kNumber;
    out->number_ = value;
    out->text_ = std::string(lexeme);
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
        absl::StrCat(field, ": expected an integer, got ", Value::TypeName(value.type())));
  }
  const std::string& text = value.number_text();
  if (text.find_first_of(".eE") == std::string::npos) {
    int64_t result = 0;
    if (!absl::SimpleAtoi(text, &result)) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, ": ", QuoteForError(text), " does not fit in 64 bits"));
    }
    return result;
  }
  const double d = value.number();
  constexpr double kMaxExact = 9007199254740992.0;  // 2^53
  if (std::fabs(d) > kMaxExact) {
    return absl::InvalidArgumentError(absl::StrCat(field, ": ", QuoteForError(text),
                                                   " is too large to be read as an exact integer"));
  }
  if (d != std::floor(d)) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": ", QuoteForError(text), " is not an integer"));
  }
  return static_cast<int64_t>(d);
}

}  // namespace attend::planner::json
