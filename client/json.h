// A strict, bounded JSON (RFC 8259) reader for the client's inputs: request files of tensors,
// whose bulk is long arrays of numbers.
//
// Why the client has its own: the CLI must not link the core, whose planner parser is built
// for config.json files (at most 2^16 values, a node per number). Here an array whose elements
// are all numbers is stored densely (8 bytes per element, no node each), so a request of
// millions of values costs what its numbers do.
//
// Strict: no comments, trailing commas, NaN/Infinity, leading zeros or '+', unescaped control
// characters, invalid UTF-8, lone surrogates, duplicate object keys or trailing content; numbers
// must be finite doubles (1e400 is an error; 1e-400 underflows to 0 as in any parser).
// Bounded: input size, nesting depth, string length and the total number of values are capped
// (Limits) and checked before memory is spent on them, so a hostile text costs O(input) time.
//
// Thread-safety: Parse() is a pure function; a Value is immutable after parsing.
#ifndef ATTEND_CLIENT_JSON_H_
#define ATTEND_CLIENT_JSON_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace attend::client::json {

struct Limits {
  size_t max_input_bytes = size_t{1} << 30;
  int max_depth = 32;
  size_t max_string_bytes = size_t{1} << 20;
  size_t max_values = size_t{1} << 28;  // every value of the document, array elements included
};

class Value {
 public:
  enum class Kind { kNull, kBool, kNumber, kString, kArray, kObject };
  using Member = std::pair<std::string, Value>;

  Value() = default;

  Kind kind() const { return kind_; }
  bool is_array() const { return kind_ == Kind::kArray; }
  bool is_object() const { return kind_ == Kind::kObject; }
  // "null", "a boolean", "a number", "a string", "an array", "an object": for messages such as
  // "expected a number, got a string".
  static absl::string_view KindName(Kind kind);

  // REQUIRES: the matching kind.
  bool boolean() const { return boolean_; }
  double number() const { return number_; }
  const std::string& string() const { return string_; }
  const std::vector<Member>& members() const { return members_; }
  // The member called `key` of an object, or nullptr.
  const Value* Find(absl::string_view key) const;

  // Arrays: an array whose elements are all numbers (the empty array included) keeps them in
  // numbers(); any other array keeps its elements in items().
  size_t size() const { return all_numbers_ ? numbers_.size() : items_.size(); }
  bool all_numbers() const { return kind_ == Kind::kArray && all_numbers_; }
  const std::vector<double>& numbers() const { return numbers_; }  // REQUIRES: all_numbers()
  const std::vector<Value>& items() const { return items_; }       // REQUIRES: !all_numbers()

 private:
  friend class Reader;
  Kind kind_ = Kind::kNull;
  bool boolean_ = false;
  bool all_numbers_ = true;
  double number_ = 0.0;
  std::string string_;
  std::vector<double> numbers_;
  std::vector<Value> items_;
  std::vector<Member> members_;
};

// Parses one document (a UTF-8 byte order mark is skipped). INVALID_ARGUMENT says what is wrong
// and where: "line 3, column 17: expected ',' or '}' after an object member".
absl::StatusOr<Value> Parse(absl::string_view text, const Limits& limits = Limits());

// Length of the well-formed UTF-8 sequence that starts at text[i] (1 for ASCII), or 0 when the
// bytes there are not one (bad lead or continuation byte, overlong form, surrogate, above
// U+10FFFF, cut short); *code_point (optional) receives the character.
// REQUIRES: i < text.size().
size_t Utf8SequenceAt(absl::string_view text, size_t i, uint32_t* code_point = nullptr);

}  // namespace attend::client::json

#endif  // ATTEND_CLIENT_JSON_H_
