#include "client/json.h"

#include <cmath>
#include <system_error>

#include "absl/strings/charconv.h"
#include "absl/strings/str_cat.h"

namespace attend::client::json {

absl::string_view Value::KindName(Kind kind) {
  switch (kind) {
    case Kind::kNull:
      return "null";
    case Kind::kBool:
      return "a boolean";
    case Kind::kNumber:
      return "a number";
    case Kind::kString:
      return "a string";
    case Kind::kArray:
      return "an array";
    case Kind::kObject:
      return "an object";
  }
  return "a value";
}

const Value* Value::Find(absl::string_view key) const {
  for (const Member& member : members_) {
    if (member.first == key) return &member.second;
  }
  return nullptr;
}

size_t Utf8SequenceAt(absl::string_view text, size_t i, uint32_t* code_point) {
  const auto at = [&](size_t k) { return static_cast<unsigned char>(text[k]); };
  const unsigned char lead = at(i);
  if (lead < 0x80) {
    if (code_point) *code_point = lead;
    return 1;
  }
  size_t length;
  uint32_t cp;
  if (lead >= 0xC2 && lead <= 0xDF) {
    length = 2;
    cp = lead & 0x1Fu;
  } else if (lead >= 0xE0 && lead <= 0xEF) {
    length = 3;
    cp = lead & 0x0Fu;
  } else if (lead >= 0xF0 && lead <= 0xF4) {
    length = 4;
    cp = lead & 0x07u;
  } else {
    return 0;  // a continuation byte, or a lead that can only start an overlong or huge form
  }
  if (text.size() - i < length) return 0;
  for (size_t k = 1; k < length; ++k) {
    if ((at(i + k) & 0xC0u) != 0x80u) return 0;
    cp = (cp << 6) | (at(i + k) & 0x3Fu);
  }
  const uint32_t smallest[] = {0, 0, 0x80, 0x800, 0x10000};
  if (cp < smallest[length] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;
  if (code_point) *code_point = cp;
  return length;
}

// Recursive descent over the text; `depth` bounds the recursion.
class Reader {
 public:
  Reader(absl::string_view text, const Limits& limits) : text_(text), limits_(limits) {}

  absl::StatusOr<Value> Document() {
    if (text_.size() > limits_.max_input_bytes) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the JSON text is ", text_.size(), " bytes; the limit is ", limits_.max_input_bytes));
    }
    if (text_.substr(0, 3) == "\xEF\xBB\xBF") pos_ = 3;
    Value root;
    if (absl::Status s = ReadValue(root, 0); !s.ok()) return s;
    SkipSpace();
    if (pos_ < text_.size()) return Fail("unexpected text after the JSON document");
    return root;
  }

 private:
  // "line L, column C: <what>", counting columns in bytes from 1.
  absl::Status Fail(absl::string_view what) const {
    size_t line = 1, line_start = 0;
    for (size_t k = 0; k < pos_ && k < text_.size(); ++k) {
      if (text_[k] == '\n') {
        ++line;
        line_start = k + 1;
      }
    }
    return absl::InvalidArgumentError(
        absl::StrCat("line ", line, ", column ", pos_ - line_start + 1, ": ", what));
  }

  void SkipSpace() {
    while (pos_ < text_.size()) {
      const char c = text_[pos_];
      if (c != ' ' && c != '\t' && c != '\n' && c != '\r') return;
      ++pos_;
    }
  }

  bool Consume(absl::string_view word) {
    if (text_.substr(pos_, word.size()) != word) return false;
    pos_ += word.size();
    return true;
  }

  absl::Status Count() {
    if (++values_ > limits_.max_values) {
      return Fail(absl::StrCat("more than ", limits_.max_values, " values"));
    }
    return absl::OkStatus();
  }

  absl::Status ReadValue(Value& out, int depth) {
    SkipSpace();
    if (pos_ >= text_.size()) return Fail("unexpected end of the text, expected a value");
    if (absl::Status s = Count(); !s.ok()) return s;
    const char c = text_[pos_];
    if (c == '{' || c == '[') {
      if (depth >= limits_.max_depth) {
        return Fail(absl::StrCat("nested deeper than ", limits_.max_depth, " levels"));
      }
      return c == '{' ? ReadObject(out, depth + 1) : ReadArray(out, depth + 1);
    }
    if (c == '"') {
      out.kind_ = Value::Kind::kString;
      return ReadString(out.string_);
    }
    if (c == '-' || (c >= '0' && c <= '9')) {
      out.kind_ = Value::Kind::kNumber;
      return ReadNumber(out.number_);
    }
    if (Consume("true") || Consume("false")) {
      out.kind_ = Value::Kind::kBool;
      out.boolean_ = c == 't';
      return absl::OkStatus();
    }
    if (Consume("null")) return absl::OkStatus();
    if (text_.substr(pos_, 3) == "NaN" || text_.substr(pos_, 8) == "Infinity") {
      return Fail("NaN and Infinity are not JSON numbers");
    }
    return Fail(
        absl::StrCat("unexpected character '", text_.substr(pos_, 1), "', expected a value"));
  }

  absl::Status ReadObject(Value& out, int depth) {
    out.kind_ = Value::Kind::kObject;
    ++pos_;  // '{'
    SkipSpace();
    if (Consume("}")) return absl::OkStatus();
    while (true) {
      SkipSpace();
      if (pos_ >= text_.size() || text_[pos_] != '"') {
        return Fail("expected a member name in double quotes");
      }
      const size_t key_at = pos_;
      std::string key;
      if (absl::Status s = ReadString(key); !s.ok()) return s;
      if (out.Find(key) != nullptr) {
        pos_ = key_at;
        return Fail(absl::StrCat("member '", key, "' appears twice"));
      }
      SkipSpace();
      if (!Consume(":")) return Fail("expected ':' after a member name");
      out.members_.emplace_back(std::move(key), Value());
      if (absl::Status s = ReadValue(out.members_.back().second, depth); !s.ok()) return s;
      SkipSpace();
      if (Consume("}")) return absl::OkStatus();
      if (!Consume(",")) return Fail("expected ',' or '}' after an object member");
      SkipSpace();
      if (pos_ < text_.size() && text_[pos_] == '}') return Fail("a trailing ',' before '}'");
    }
  }

  absl::Status ReadArray(Value& out, int depth) {
    out.kind_ = Value::Kind::kArray;
    ++pos_;  // '['
    SkipSpace();
    if (Consume("]")) return absl::OkStatus();
    while (true) {
      SkipSpace();
      const char c = pos_ < text_.size() ? text_[pos_] : '\0';
      if (out.all_numbers_ && (c == '-' || (c >= '0' && c <= '9'))) {
        // The dense path: a number of an all-number array needs no Value of its own.
        if (absl::Status s = Count(); !s.ok()) return s;
        double number;
        if (absl::Status s = ReadNumber(number); !s.ok()) return s;
        out.numbers_.push_back(number);
      } else {
        if (out.all_numbers_) {
          // The first element that is not a number: the numbers so far become Values.
          out.all_numbers_ = false;
          out.items_.reserve(out.numbers_.size() + 1);
          for (double number : out.numbers_) {
            Value v;
            v.kind_ = Value::Kind::kNumber;
            v.number_ = number;
            out.items_.push_back(std::move(v));
          }
          out.numbers_ = std::vector<double>();
        }
        out.items_.emplace_back();
        if (absl::Status s = ReadValue(out.items_.back(), depth); !s.ok()) return s;
      }
      SkipSpace();
      if (Consume("]")) return absl::OkStatus();
      if (!Consume(",")) return Fail("expected ',' or ']' after an array element");
      SkipSpace();
      if (pos_ < text_.size() && text_[pos_] == ']') return Fail("a trailing ',' before ']'");
    }
  }

  // RFC 8259 number grammar: -?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)?
  absl::Status ReadNumber(double& out) {
    const size_t start = pos_;
    const auto digits = [&] {
      const size_t from = pos_;
      while (pos_ < text_.size() && text_[pos_] >= '0' && text_[pos_] <= '9') ++pos_;
      return pos_ - from;
    };
    if (pos_ < text_.size() && text_[pos_] == '-') ++pos_;
    if (pos_ < text_.size() && text_[pos_] == '0') {
      ++pos_;
      if (pos_ < text_.size() && text_[pos_] >= '0' && text_[pos_] <= '9') {
        return Fail("numbers do not start with 0 (no octal)");
      }
    } else if (digits() == 0) {
      return Fail(text_.substr(pos_, 8) == "Infinity" ? "NaN and Infinity are not JSON numbers"
                                                      : "expected a digit");
    }
    if (pos_ < text_.size() && text_[pos_] == '.') {
      ++pos_;
      if (digits() == 0) return Fail("expected a digit after '.'");
    }
    if (pos_ < text_.size() && (text_[pos_] == 'e' || text_[pos_] == 'E')) {
      ++pos_;
      if (pos_ < text_.size() && (text_[pos_] == '+' || text_[pos_] == '-')) ++pos_;
      if (digits() == 0) return Fail("expected a digit in the exponent");
    }
    const absl::string_view literal = text_.substr(start, pos_ - start);
    double value = 0.0;
    const absl::from_chars_result r =
        absl::from_chars(literal.data(), literal.data() + literal.size(), value);
    if (r.ec == std::errc::result_out_of_range) {
      // Underflow is a tiny number, which rounds to zero; overflow has no double.
      const size_t e = literal.find_first_of("eE");
      const bool tiny = e != absl::string_view::npos && literal.substr(e + 1, 1) == "-";
      if (!tiny) {
        pos_ = start;
        return Fail(absl::StrCat("the number ", literal, " is too large for a double"));
      }
      value = 0.0;
    } else if (r.ec != std::errc() || r.ptr != literal.data() + literal.size()) {
      pos_ = start;
      return Fail(absl::StrCat("cannot read the number ", literal));
    }
    if (!std::isfinite(value)) {
      pos_ = start;
      return Fail(absl::StrCat("the number ", literal, " is too large for a double"));
    }
    out = literal[0] == '-' && value == 0.0 ? -0.0 : value;
    return absl::OkStatus();
  }

  static int Hex(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  }

  // Four hex digits after "\u".
  absl::Status ReadHex4(uint32_t& out) {
    if (text_.size() - pos_ < 4) return Fail("expected four hex digits after \\u");
    out = 0;
    for (int k = 0; k < 4; ++k) {
      const int h = Hex(text_[pos_ + static_cast<size_t>(k)]);
      if (h < 0) return Fail("expected four hex digits after \\u");
      out = out * 16 + static_cast<uint32_t>(h);
    }
    pos_ += 4;
    return absl::OkStatus();
  }

  static void AppendUtf8(uint32_t cp, std::string& out) {
    if (cp < 0x80) {
      out += static_cast<char>(cp);
      return;
    }
    const int tail = cp < 0x800 ? 1 : (cp < 0x10000 ? 2 : 3);
    const unsigned char lead_bits[] = {0, 0xC0, 0xE0, 0xF0};
    out += static_cast<char>(lead_bits[tail] | (cp >> (6 * tail)));
    for (int k = tail - 1; k >= 0; --k) out += static_cast<char>(0x80 | ((cp >> (6 * k)) & 0x3F));
  }

  absl::Status ReadString(std::string& out) {
    ++pos_;  // '"'
    while (true) {
      if (pos_ >= text_.size()) return Fail("a string is not closed");
      if (out.size() > limits_.max_string_bytes) {
        return Fail(absl::StrCat("a string is longer than ", limits_.max_string_bytes, " bytes"));
      }
      const unsigned char c = static_cast<unsigned char>(text_[pos_]);
      if (c == '"') {
        ++pos_;
        return absl::OkStatus();
      }
      if (c < 0x20) return Fail("a control character in a string (escape it)");
      if (c != '\\') {
        const size_t n = Utf8SequenceAt(text_, pos_);
        if (n == 0) return Fail("invalid UTF-8 in a string");
        out.append(text_.data() + pos_, n);
        pos_ += n;
        continue;
      }
      ++pos_;
      if (pos_ >= text_.size()) return Fail("a string is not closed");
      const char e = text_[pos_++];
      switch (e) {
        case '"':
        case '\\':
        case '/':
          out += e;
          break;
        case 'b':
          out += '\b';
          break;
        case 'f':
          out += '\f';
          break;
        case 'n':
          out += '\n';
          break;
        case 'r':
          out += '\r';
          break;
        case 't':
          out += '\t';
          break;
        case 'u': {
          uint32_t cp = 0;
          if (absl::Status s = ReadHex4(cp); !s.ok()) return s;
          if (cp >= 0xDC00 && cp <= 0xDFFF) return Fail("a lone low surrogate in \\u escapes");
          if (cp >= 0xD800 && cp <= 0xDBFF) {
            uint32_t low = 0;
            if (!Consume("\\u")) return Fail("a high surrogate without its low half");
            if (absl::Status s = ReadHex4(low); !s.ok()) return s;
            if (low < 0xDC00 || low > 0xDFFF) return Fail("a high surrogate without its low half");
            cp = 0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00);
          }
          AppendUtf8(cp, out);
          break;
        }
        default:
          --pos_;
          return Fail(absl::StrCat("unknown escape '\\", text_.substr(pos_, 1), "'"));
      }
    }
  }

  absl::string_view text_;
  const Limits& limits_;
  size_t pos_ = 0;
  size_t values_ = 0;
};

absl::StatusOr<Value> Parse(absl::string_view text, const Limits& limits) {
  return Reader(text, limits).Document();
}

}  // namespace attend::client::json
