// A small, strict, bounded JSON (RFC 8259) parser for reading Hugging Face config.json texts.
//
// Strict: no comments, trailing commas, NaN/Infinity, leading zeros, unescaped control
// characters, invalid UTF-8, lone surrogates, duplicate object keys or trailing content. Numbers
// must be finite doubles (1e400 is rejected); integer literals keep their text so that
// AsInt64() is exact and detects values that do not fit in 64 bits (2^70).
//
// Bounded: the input size, nesting depth, string length, array and object sizes and the total
// number of values are capped (Limits), and checked before the memory for them is used, so a
// hostile text costs at most O(input) time and a bounded amount of memory.
//
// Thread-safety: Parse() is a pure function; a Value is immutable after parsing.
#ifndef ATTEND_CORE_PLANNER_JSON_H_
#define ATTEND_CORE_PLANNER_JSON_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace attend::planner::json {

struct Limits {
  size_t max_input_bytes = size_t{1} << 20;  // config.json files are a few KiB
  int max_depth = 64;                        // nested arrays/objects
  size_t max_string_bytes = size_t{1} << 16;
  size_t max_array_elements = size_t{1} << 16;
  size_t max_object_members = size_t{1} << 14;
  size_t max_values = size_t{1} << 16;  // every value in the document
};

class Value {
 public:
  enum class Type { kNull, kBool, kNumber, kString, kArray, kObject };
  using Member = std::pair<std::string, Value>;

  Value() = default;

  Type type() const { return type_; }
  bool is_null() const { return type_ == Type::kNull; }
  bool is_bool() const { return type_ == Type::kBool; }
  bool is_number() const { return type_ == Type::kNumber; }
  bool is_string() const { return type_ == Type::kString; }
  bool is_array() const { return type_ == Type::kArray; }
  bool is_object() const { return type_ == Type::kObject; }

  // REQUIRES: the matching type.
  bool bool_value() const { return bool_; }
  double number() const { return number_; }
  // The number as written, e.g. "4096" or "1e-05".
  const std::string& number_text() const { return text_; }
  const std::string& string_value() const { return text_; }
  const std::vector<Value>& array() const { return array_; }
  const std::vector<Member>& object() const { return object_; }

  // The member called `key` of an object, or nullptr (also for non-objects).
  const Value* Find(absl::string_view key) const;

  // "null", "boolean", "number", "string", "array", "object".
  static absl::string_view TypeName(Type type);

 private:
  friend class Parser;
  Type type_ = Type::kNull;
  bool bool_ = false;
  double number_ = 0.0;
  std::string text_;  // string value, or the number's text
  std::vector<Value> array_;
  std::vector<Member> object_;
};

// Parses one JSON document (a UTF-8 byte order mark is skipped). INVALID_ARGUMENT says what is
// wrong and where: "json: line 3, column 17: expected ':' after an object key".
absl::StatusOr<Value> Parse(absl::string_view text, const Limits& limits = Limits());

// The exact integer value of a number: integer literals must fit in int64; a literal with a
// fraction or exponent must be integral and at most 2^53 in magnitude (4096.0 and 4.096e3 are
// accepted, 32.5 is not). INVALID_ARGUMENT naming `field` otherwise, also for non-numbers.
absl::StatusOr<int64_t> AsInt64(const Value& value, absl::string_view field);

}  // namespace attend::planner::json

#endif  // ATTEND_CORE_PLANNER_JSON_H_
