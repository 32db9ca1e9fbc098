// A strict, bounded JSON (RFC 8259) parser for untrusted text: the planner's import of Hugging
// Face config.json files (planner/import). The client's request files are proto3 JSON and go
// through protobuf's parser (client/json_input.h); this one stays for documents that are not a
// proto message. It depends on Abseil only.
//
// Strict: no comments, trailing commas, NaN/Infinity (unless Limits allow Python's), leading
// zeros or '+', unescaped control
// characters, invalid UTF-8, lone surrogates, duplicate object keys or trailing content. Numbers
// must be finite doubles: 1e400 is an error, 1e-400 underflows to 0 as in any parser.
//
// Bounded: the input size, nesting depth, string and number lengths, array and object sizes and
// the total number of values are capped (Limits) and checked before memory is spent on them, so
// that a hostile text costs O(input) time and memory. Each caller passes the limits its inputs
// need: the planner small ones for config.json (HfConfigJsonLimits).
//
// Two representations of numbers:
//   - an array whose elements are all numbers (the empty array included) is stored densely, as
//     doubles (numbers()), so that an array of millions of values (what the client's request
//     files held when they were read with this parser) costs 8 bytes per value and no Value
//     each; its elements do not keep their text;
//   - every other number is a Value that keeps its literal text (number_text()), so that
//     AsInt64() is exact and detects integers that do not fit in 64 bits (2^70).
// Callers that want the elements of an array must handle both: numbers() when all_numbers(),
// items() otherwise.
//
// Errors are INVALID_ARGUMENT "line L, column C: <what>" (lines and columns counted from 1,
// columns in bytes), except for an oversized input, which has no position. Offending text in a
// message is quoted and C-escaped, so messages are safe to log.
//
// Thread-safety: Parse() and AsInt64() are pure functions; a Value is
// immutable after parsing, so concurrent reads of one Value are safe.
#ifndef ATTEND_COMMON_JSON_H_
#define ATTEND_COMMON_JSON_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace attend::json {

// Caps on what one document may hold. The defaults suit large machine-written inputs (arrays of
// millions of numbers); callers reading small hand-written files pass tighter ones.
struct Limits {
  size_t max_input_bytes = size_t{1} << 30;
  int max_depth = 32;                         // nested arrays and objects
  size_t max_string_bytes = size_t{1} << 20;  // after unescaping; object keys included
  size_t max_number_chars = size_t{1} << 10;  // a literal's length, sign and exponent included
  size_t max_array_elements = size_t{1} << 28;
  size_t max_object_members = size_t{1} << 28;
  size_t max_values = size_t{1} << 28;  // every value of the document, array elements included
  // Accept Python's NaN, Infinity and -Infinity as numbers (their text kept as written). Python's
  // json module writes them, so config.json files saved by transformers carry them (Mamba-2's
  // "time_step_limit": [0.0, Infinity]); they are not JSON, so this is off by default.
  bool allow_python_non_finite = false;
};

class Value {
 public:
  enum class Type { kNull, kBool, kNumber, kString, kArray, kObject };
  using Member = std::pair<std::string, Value>;

  Value() = default;  // null

  Type type() const { return type_; }
  bool is_null() const { return type_ == Type::kNull; }
  bool is_bool() const { return type_ == Type::kBool; }
  bool is_number() const { return type_ == Type::kNumber; }
  bool is_string() const { return type_ == Type::kString; }
  bool is_array() const { return type_ == Type::kArray; }
  bool is_object() const { return type_ == Type::kObject; }

  // "null", "a boolean", "a number", "a string", "an array", "an object": for messages such as
  // "expected a string, got a number".
  static absl::string_view TypeName(Type type);
  absl::string_view type_name() const { return TypeName(type_); }

  // Scalars. REQUIRES: the matching type.
  bool bool_value() const { return bool_; }
  double number_value() const { return number_; }
  // The number as written, e.g. "4096" or "1e-05".
  const std::string& number_text() const { return text_; }
  const std::string& string_value() const { return text_; }

  // Objects: the members in document order (their keys are unique). Find() is a linear search,
  // meant for reading a few known keys; it returns nullptr when the key is absent or this is not
  // an object.
  const std::vector<Member>& members() const { return members_; }
  const Value* Find(absl::string_view key) const;

  // Arrays: an array whose elements are all numbers keeps them in numbers(), any other array
  // keeps its elements in items(). size() counts the elements either way.
  size_t size() const { return all_numbers_ ? numbers_.size() : items_.size(); }  // REQUIRES: array
  bool all_numbers() const { return type_ == Type::kArray && all_numbers_; }
  const std::vector<double>& numbers() const { return numbers_; }  // REQUIRES: all_numbers()
  const std::vector<Value>& items() const { return items_; }       // REQUIRES: !all_numbers()

 private:
  friend class Parser;
  Type type_ = Type::kNull;
  bool bool_ = false;
  bool all_numbers_ = true;  // arrays: until an element that is not a number
  double number_ = 0.0;
  std::string text_;  // the string, or the number's literal
  std::vector<double> numbers_;
  std::vector<Value> items_;
  std::vector<Member> members_;
};

// Parses one document (a leading UTF-8 byte order mark is skipped). INVALID_ARGUMENT says what is
// wrong and where: "line 3, column 17: expected ':' after an object key".
absl::StatusOr<Value> Parse(absl::string_view text, const Limits& limits = Limits());

// The exact integer value of a number Value: an integer literal must fit in int64; a literal with
// a fraction or exponent must be integral and at most 2^53 in magnitude (4096.0 and 4.096e3 are
// accepted, 32.5 is not). INVALID_ARGUMENT naming `field` otherwise, also for non-numbers:
// "num_hidden_layers: expected an integer, got a string".
absl::StatusOr<int64_t> AsInt64(const Value& value, absl::string_view field);

}  // namespace attend::json

#endif  // ATTEND_COMMON_JSON_H_
