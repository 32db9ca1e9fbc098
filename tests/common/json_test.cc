// The shared JSON parser: every kind of value, the strict grammar (what RFC 8259 refuses, hostile
// bytes), errors that say where, the limits, dense arrays of numbers and AsInt64's exactness.
// Its caller's own tests: tests/planner/import/hf_config_test.cc (config.json).
#include "common/json.h"

#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "tests/test_util.h"

namespace attend::json {
namespace {

using ::attend::testing::StatusIs;

constexpr auto kInvalid = absl::StatusCode::kInvalidArgument;

std::string Nested(int depth) {
  return std::string(static_cast<size_t>(depth), '[') +
         std::string(static_cast<size_t>(depth), ']');
}

TEST(JsonParse, ReadsEveryKindOfValue) {
  absl::StatusOr<Value> v = Parse(R"( {"a": [1, -2.5e3, true, false, null],
      "s": "x\"\\\/\b\f\n\r\t\u00e9\ud83d\ude00", "o": {}, "e": [], "n": [1, -2.5, 3e2, 0],
      "f": [1, "two", [3]]} )");
  ASSERT_OK(v);
  ASSERT_TRUE(v->is_object());
  EXPECT_EQ(v->members().size(), 6u);
  EXPECT_EQ(v->members()[0].first, "a");  // document order

  const Value* a = v->Find("a");
  ASSERT_NE(a, nullptr);
  ASSERT_TRUE(a->is_array());
  ASSERT_FALSE(a->all_numbers());
  ASSERT_EQ(a->size(), 5u);
  ASSERT_EQ(a->items().size(), 5u);
  EXPECT_EQ(a->items()[0].number_value(), 1.0);
  EXPECT_EQ(a->items()[1].number_value(), -2500.0);
  // The numbers before the first non-number keep their text too.
  EXPECT_EQ(a->items()[0].number_text(), "1");
  EXPECT_EQ(a->items()[1].number_text(), "-2.5e3");
  EXPECT_TRUE(a->items()[2].bool_value());
  EXPECT_FALSE(a->items()[3].bool_value());
  EXPECT_TRUE(a->items()[4].is_null());

  EXPECT_EQ(v->Find("s")->string_value(), "x\"\\/\b\f\n\r\t\xC3\xA9\xF0\x9F\x98\x80");
  EXPECT_TRUE(v->Find("o")->is_object());
  EXPECT_TRUE(v->Find("o")->members().empty());
  EXPECT_TRUE(v->Find("e")->is_array());
  EXPECT_TRUE(v->Find("e")->all_numbers());  // the empty array is dense
  EXPECT_EQ(v->Find("e")->size(), 0u);

  const Value* n = v->Find("n");
  ASSERT_TRUE(n->all_numbers());
  EXPECT_EQ(n->numbers(), (std::vector<double>{1, -2.5, 300, 0}));
  EXPECT_EQ(n->size(), 4u);

  const Value* f = v->Find("f");
  ASSERT_FALSE(f->all_numbers());
  ASSERT_EQ(f->items().size(), 3u);
  EXPECT_EQ(f->items()[0].number_value(), 1);  // the number before the string kept its place
  EXPECT_EQ(f->items()[1].string_value(), "two");
  EXPECT_TRUE(f->items()[2].all_numbers());

  EXPECT_EQ(v->Find("missing"), nullptr);
  EXPECT_EQ(v->Find("a")->Find("x"), nullptr);  // not an object
  EXPECT_FALSE(v->Find("s")->all_numbers());    // not an array
}

TEST(JsonParse, TypeNamesReadInMessages) {
  absl::StatusOr<Value> v = Parse(R"([null, true, 1, "s", [], {}])");
  ASSERT_OK(v);
  std::vector<std::string> names;
  for (const Value& item : v->items()) names.emplace_back(item.type_name());
  EXPECT_EQ(names, (std::vector<std::string>{"null", "a boolean", "a number", "a string",
                                             "an array", "an object"}));
  EXPECT_EQ(Value().type(), Value::Type::kNull);
}

TEST(JsonParse, KeepsRawUtf8AndSkipsAByteOrderMark) {
  absl::StatusOr<Value> v = Parse("\xEF\xBB\xBF{\"k\": \"caf\xC3\xA9 \xE2\x82\xAC\"}");
  ASSERT_OK(v);
  EXPECT_EQ(v->Find("k")->string_value(), "caf\xC3\xA9 \xE2\x82\xAC");
}

TEST(JsonParse, NumbersAreExactDoubles) {
  absl::StatusOr<Value> v = Parse("[0.1, 1e-400, -0, 123456789012345678, 1.5E+3]");
  ASSERT_OK(v);
  ASSERT_TRUE(v->all_numbers());
  EXPECT_EQ(v->numbers()[0], 0.1);
  EXPECT_EQ(v->numbers()[1], 0.0);  // underflow rounds to zero
  EXPECT_TRUE(std::signbit(v->numbers()[2]));
  EXPECT_EQ(v->numbers()[3], 123456789012345678.0);
  EXPECT_EQ(v->numbers()[4], 1500.0);
}

TEST(JsonParse, UnderflowRoundsToZeroAndOverflowIsAnError) {
  // Out of range is told apart by the literal's magnitude, not by its exponent's sign.
  const std::string tiny = "0." + std::string(400, '0') + "1";
  const std::string huge_with_negative_exponent = "1" + std::string(400, '0') + "e-5";
  absl::StatusOr<Value> v = Parse(absl::StrCat("[1e-400, -1e-400, ", tiny, "]"));
  ASSERT_OK(v);
  EXPECT_EQ(v->numbers(), (std::vector<double>{0.0, 0.0, 0.0}));
  EXPECT_TRUE(std::signbit(v->numbers()[1]));
  EXPECT_THAT(Parse(huge_with_negative_exponent), StatusIs(kInvalid, {"too large for a double"}));
  EXPECT_THAT(Parse("1e99999999999999999999"), StatusIs(kInvalid, {"too large for a double"}));
  EXPECT_OK(Parse("1e-99999999999999999999"));
  EXPECT_THAT(Parse("[1, 2, 1e400]"),
              StatusIs(kInvalid, {"line 1, column 8: number '1e400' is too large for a double"}));
}

TEST(JsonParse, RejectsWhatRfc8259Refuses) {
  const std::pair<const char*, const char*> cases[] = {
      {"", "unexpected end of input, expected a value"},
      {"   ", "expected a value"},
      {"[1,]", "a trailing ',' before ']'"},
      {"[1, 2,]", "trailing ','"},
      {"{\"a\":1,}", "a trailing ',' before '}'"},
      {"{\"a\" 1}", "expected ':' after an object key"},
      {"{a:1}", "expected an object key in double quotes"},
      {"{", "unexpected end of input, expected an object key"},
      {"['a']", "unexpected character '\\'', expected a value"},
      {"[1 2]", "expected ',' or ']' after an array element"},
      {"[1, 2", "unexpected end of input, expected ',' or ']'"},
      {"{\"a\": 1", "unexpected end of input, expected ',' or '}'"},
      {"{} x", "unexpected content after the JSON document"},
      {"[1] [2]", "after the JSON document"},
      {"01", "leading zero in a number"},
      {"[01]", "leading zero"},
      {"[+1]", "unexpected character '+'"},
      {"[.5]", "unexpected character '.'"},
      {"-", "expected a digit in a number"},
      {"1.", "expected a digit after the decimal point"},
      {"[1.]", "after the decimal point"},
      {"1e", "expected a digit in the exponent"},
      {"[1e]", "in the exponent"},
      {"NaN", "NaN and Infinity are not JSON numbers"},
      {"[NaN]", "NaN and Infinity"},
      {"Infinity", "NaN and Infinity"},
      {"-Infinity", "NaN and Infinity"},
      {"tru", "invalid literal, expected 'true'"},
      {"nul", "expected 'null'"},
      {"// c\n{}", "unexpected character '/'"},
      {"\"abc", "unterminated string"},
      {"\"abc\\", "unterminated string"},
      {"\"a\x01\"", "unescaped control character in a string"},
      {"[\"a\tb\"]", "control character"},
      {"\"\\x\"", "invalid escape '\\x'"},
      {"\"\\u12zz\"", "invalid hex digit in a \\u escape"},
      {"\"\\u12\"", "truncated \\u escape"},
      {"\"\\ud800\"", "lone high surrogate"},
      {"\"\\udc00\"", "lone low surrogate"},
      {"\"\\ud800\\u0041\"", "high surrogate not followed by a low surrogate"},
      {"\"\xFF\"", "invalid UTF-8 in a string"},
      {"\"\xC0\xAF\"", "invalid UTF-8"},          // overlong '/'
      {"\"\xED\xA0\x80\"", "invalid UTF-8"},      // encoded surrogate
      {"\"\xF4\x90\x80\x80\"", "invalid UTF-8"},  // above U+10FFFF
      {"\"\xE2\x82\"", "invalid UTF-8"},          // truncated sequence
      {"{\"a\":1,\"a\":2}", "duplicate key 'a'"},
      {"1e400", "too large for a double"},
      {"-1e400", "too large for a double"},
      // Hostile bytes are escaped in messages.
      {"\xFF", "unexpected character '\\xff'"},
      {"[\x01]", "unexpected character '\\x01'"},
      {"{\"a\x7F\": 1, \"a\x7F\": 2}", "duplicate key 'a\\x7f'"},
  };
  for (const auto& [text, message] : cases) {
    EXPECT_THAT(Parse(text), StatusIs(kInvalid, {"line 1, column ", message})) << text;
  }
}

TEST(JsonParse, ErrorsSayWhere) {
  EXPECT_THAT(Parse("{\n  \"a\": 1,\n  \"b\" 2\n}"),
              StatusIs(kInvalid, {"line 3, column 7: expected ':' after an object key"}));
  EXPECT_THAT(
      Parse("{\n  \"q\": {\n    \"shape\": [1, 1] \"values\": []\n  }\n}"),
      StatusIs(kInvalid, {"line 3, column 21: expected ',' or '}' after an object member"}));
  // A duplicate key is reported where it starts; a bad number where the number starts.
  EXPECT_THAT(Parse("{\"a\": 1,\n \"a\": 2}"), StatusIs(kInvalid, {"line 2, column 2: duplicate"}));
  EXPECT_THAT(Parse("[1,\n  012]"), StatusIs(kInvalid, {"line 2, column 3: leading zero"}));
  // In a mixed array (read twice, see ArraysOfNumbersAreDense) errors still say where.
  EXPECT_THAT(Parse("[1, 2,\n \"x\", 0x]"),
              StatusIs(kInvalid, {"line 2, column 8: expected ',' or ']'"}));
}

TEST(JsonParse, ArraysOfNumbersAreDense) {
  // A million numbers: one double each, no Value each.
  std::string big = "[";
  for (int i = 0; i < 1000000; ++i) absl::StrAppend(&big, i == 0 ? "" : ",", i % 1000, ".5");
  big += "]";
  absl::StatusOr<Value> v = Parse(big);
  ASSERT_OK(v);
  ASSERT_TRUE(v->all_numbers());
  EXPECT_EQ(v->size(), 1000000u);
  EXPECT_TRUE(v->items().empty());
  EXPECT_EQ(v->numbers()[999999], 999.5);

  // Arrays nested in arrays: the inner ones are dense, the outer one is not.
  v = Parse("[[1, 2], [3], []]");
  ASSERT_OK(v);
  ASSERT_FALSE(v->all_numbers());
  ASSERT_EQ(v->size(), 3u);
  EXPECT_EQ(v->items()[0].numbers(), (std::vector<double>{1, 2}));
  EXPECT_TRUE(v->items()[2].all_numbers());

  // A non-number after many numbers turns the array into Values, in order, with their text.
  std::string mixed = "[";
  for (int i = 0; i < 1000; ++i) absl::StrAppend(&mixed, i, ", ");
  mixed += "\"end\", 7]";
  v = Parse(mixed);
  ASSERT_OK(v);
  ASSERT_FALSE(v->all_numbers());
  ASSERT_EQ(v->size(), 1002u);
  EXPECT_TRUE(v->numbers().empty());
  EXPECT_EQ(v->items()[999].number_text(), "999");
  EXPECT_EQ(v->items()[1000].string_value(), "end");
  EXPECT_EQ(v->items()[1001].number_value(), 7);
  // The numbers read twice are counted once against max_values.
  Limits limits;
  limits.max_values = 1003;  // the array and its elements
  EXPECT_OK(Parse(mixed, limits));
  limits.max_values = 1002;
  EXPECT_THAT(Parse(mixed, limits), StatusIs(kInvalid, {"more than 1002 values"}));
}

TEST(JsonParse, BoundsNestingDepth) {
  Limits limits;
  limits.max_depth = 3;
  EXPECT_OK(Parse("[[[1]]]", limits));
  EXPECT_THAT(Parse("[[[[1]]]]", limits), StatusIs(kInvalid, {"nesting deeper than 3 levels"}));
  limits.max_depth = 64;
  EXPECT_OK(Parse(Nested(64), limits));
  EXPECT_THAT(Parse(Nested(65), limits), StatusIs(kInvalid, {"nesting deeper than 64"}));
  // Far deeper input fails at the limit rather than exhausting the stack.
  EXPECT_THAT(Parse(std::string(500000, '['), limits),
              StatusIs(kInvalid, {"nesting deeper than 64"}));
  std::string objects;
  for (int i = 0; i < 100; ++i) objects += "{\"a\":";
  EXPECT_THAT(Parse(objects, limits), StatusIs(kInvalid, {"nesting deeper than 64"}));
  // The default.
  EXPECT_OK(Parse(Nested(32)));
  EXPECT_THAT(Parse(std::string(100000, '[')), StatusIs(kInvalid, {"nesting deeper than 32"}));
}

TEST(JsonParse, BoundsSizes) {
  Limits limits;
  limits.max_input_bytes = 64;
  EXPECT_THAT(Parse(std::string(65, ' '), limits),
              StatusIs(kInvalid, {"the input is 65 bytes; the limit is 64"}));
  EXPECT_THAT(Parse(std::string(64, ' '), limits), StatusIs(kInvalid, {"expected a value"}));

  limits = Limits();
  limits.max_string_bytes = 4;
  EXPECT_OK(Parse("\"abcd\"", limits));
  EXPECT_OK(Parse("\"\\u00e9\\u00e9\"", limits));  // 4 bytes once unescaped
  EXPECT_THAT(Parse("\"abcde\"", limits), StatusIs(kInvalid, {"string longer than 4 bytes"}));
  EXPECT_THAT(Parse("[\"abcdefgh\"]", limits), StatusIs(kInvalid, {"longer than 4 bytes"}));
  EXPECT_THAT(Parse("{\"abcdefgh\": 1}", limits), StatusIs(kInvalid, {"string longer than 4"}));

  limits = Limits();
  limits.max_number_chars = 4;
  EXPECT_OK(Parse("[-1.5]", limits));
  EXPECT_THAT(Parse("[1.125]", limits), StatusIs(kInvalid, {"number longer than 4 characters"}));
  EXPECT_THAT(Parse("[\"x\", 1.125]", limits), StatusIs(kInvalid, {"longer than 4 characters"}));

  limits = Limits();
  limits.max_array_elements = 3;
  EXPECT_OK(Parse("[1,2,3]", limits));
  EXPECT_OK(Parse("[\"a\",\"b\",\"c\"]", limits));
  EXPECT_THAT(Parse("[1,2,3,4]", limits), StatusIs(kInvalid, {"array longer than 3 elements"}));
  EXPECT_THAT(Parse("[1,2,3,\"x\"]", limits), StatusIs(kInvalid, {"array longer than 3"}));
  EXPECT_THAT(Parse("[null,2,3,4]", limits), StatusIs(kInvalid, {"array longer than 3"}));

  limits = Limits();
  limits.max_object_members = 2;
  EXPECT_OK(Parse("{\"a\":1,\"b\":2}", limits));
  EXPECT_THAT(Parse("{\"a\":1,\"b\":2,\"c\":3}", limits),
              StatusIs(kInvalid, {"object with more than 2 members"}));

  limits = Limits();
  limits.max_values = 5;
  EXPECT_OK(Parse("[[1],[2]]", limits));
  EXPECT_THAT(Parse("[[1],[2],3]", limits),
              StatusIs(kInvalid, {"more than 5 values in the document"}));
  limits.max_values = 4;
  EXPECT_OK(Parse("[1, 2, 3]", limits));  // the array and its three numbers
  EXPECT_THAT(Parse("[1, 2, 3, 4]", limits), StatusIs(kInvalid, {"more than 4 values"}));

  // The defaults hold a long number that the planner's config.json limits refuse (see
  // tests/planner/import/hf_config_test.cc).
  EXPECT_OK(Parse(std::string(300, '1')));
  EXPECT_THAT(Parse(std::string(1025, '1')), StatusIs(kInvalid, {"longer than 1024 characters"}));
}

TEST(JsonParse, DuplicateKeysInLargeObjects) {
  // Beyond a few members duplicates are found by hashing: a large object stays linear and a
  // duplicate far from its first occurrence is still found.
  std::string object = "{";
  for (int i = 0; i < 100000; ++i) absl::StrAppend(&object, i == 0 ? "" : ",", "\"k", i, "\":", i);
  absl::StatusOr<Value> v = Parse(object + "}");
  ASSERT_OK(v);
  EXPECT_EQ(v->members().size(), 100000u);
  EXPECT_EQ(v->Find("k99999")->number_value(), 99999);
  EXPECT_THAT(Parse(object + ",\"k3\":0}"), StatusIs(kInvalid, {"duplicate key 'k3'"}));
  EXPECT_THAT(Parse(object + ",\"k99999\":0}"), StatusIs(kInvalid, {"duplicate key 'k99999'"}));
  // Keys compare after unescaping.
  EXPECT_THAT(Parse("{\"a\": 1, \"\\u0061\": 2}"), StatusIs(kInvalid, {"duplicate key 'a'"}));
}

TEST(AsInt64, ExactIntegersOnly) {
  const auto parse_int = [](const std::string& text) {
    absl::StatusOr<Value> v = Parse(text);
    EXPECT_OK(v);
    return AsInt64(*v, "field");
  };
  EXPECT_EQ(*parse_int("4096"), 4096);
  EXPECT_EQ(*parse_int("-7"), -7);
  EXPECT_EQ(*parse_int("0"), 0);
  EXPECT_EQ(*parse_int("4096.0"), 4096);
  EXPECT_EQ(*parse_int("4.096e3"), 4096);
  EXPECT_EQ(*parse_int("9007199254740992.0"), int64_t{1} << 53);
  EXPECT_EQ(*parse_int("9223372036854775807"), std::numeric_limits<int64_t>::max());
  EXPECT_EQ(*parse_int("-9223372036854775808"), std::numeric_limits<int64_t>::min());
  EXPECT_THAT(parse_int("9223372036854775808"),
              StatusIs(kInvalid, {"field: '9223372036854775808' does not fit in 64 bits"}));
  EXPECT_THAT(parse_int("-9223372036854775809"), StatusIs(kInvalid, {"does not fit in 64 bits"}));
  // 2^70.
  EXPECT_THAT(parse_int("1180591620717411303424"),
              StatusIs(kInvalid, {"'1180591620717411303424' does not fit in 64 bits"}));
  EXPECT_THAT(parse_int("1e300"), StatusIs(kInvalid, {"too large to be read as an exact"}));
  EXPECT_THAT(parse_int("9007199254740994.0"), StatusIs(kInvalid, {"too large to be read"}));
  EXPECT_THAT(parse_int("32.5"), StatusIs(kInvalid, {"field: '32.5' is not an integer"}));
  EXPECT_THAT(parse_int("\"32\""),
              StatusIs(kInvalid, {"field: expected an integer, got a string"}));
  EXPECT_THAT(parse_int("null"), StatusIs(kInvalid, {"got null"}));
  EXPECT_THAT(parse_int("[1]"), StatusIs(kInvalid, {"got an array"}));
}

TEST(AsInt64, ReadsNumbersOfMixedArraysExactly) {
  // Numbers that precede a non-number in an array are Values with their text, so AsInt64 is
  // exact for them too (a dense array keeps doubles only).
  absl::StatusOr<Value> v = Parse("[9223372036854775807, 1180591620717411303424, \"x\"]");
  ASSERT_OK(v);
  ASSERT_FALSE(v->all_numbers());
  EXPECT_EQ(*AsInt64(v->items()[0], "a[0]"), std::numeric_limits<int64_t>::max());
  EXPECT_THAT(AsInt64(v->items()[1], "a[1]"),
              StatusIs(kInvalid, {"a[1]: '1180591620717411303424' does not fit in 64 bits"}));
}

// Every strict prefix of a valid document is an error, never a crash.
TEST(JsonParse, EveryTruncationFails) {
  const std::string doc =
      R"({"a": [1, 2.5, "x\u00e9y", {"b": null, "c": true}], "d": -0.5e-3, "e": "\ud83d\ude00",
          "f": [1, 2, 3]})";
  ASSERT_OK(Parse(doc));
  for (size_t n = 0; n < doc.size(); ++n) {
    EXPECT_THAT(Parse(doc.substr(0, n)), StatusIs(kInvalid)) << n;
  }
}

// Random byte mutations of a valid document either parse or fail with INVALID_ARGUMENT, under
// the default limits and under tight ones.
TEST(JsonParse, SurvivesMutations) {
  const std::string doc =
      R"({"num_hidden_layers": 32, "layer_types": ["sliding_attention", "full_attention"],
          "rope_scaling": {"factor": 8.0, "type": "llama3"}, "eos": [1, 2, 3], "n": null,
          "q": {"shape": [1, 2], "values": [0.5, -1e-3]}})";
  Limits tight;
  tight.max_depth = 3;
  tight.max_string_bytes = 16;
  tight.max_number_chars = 8;
  tight.max_array_elements = 3;
  tight.max_object_members = 6;
  tight.max_values = 30;
  std::mt19937_64 rng(7);
  const std::string alphabet = "{}[]\",:0123456789eE+-.\\u tfn\x01\xC3\xFF";
  int ok = 0;
  for (int i = 0; i < 20000; ++i) {
    std::string mutated = doc;
    const int edits = 1 + static_cast<int>(rng() % 4);
    for (int e = 0; e < edits; ++e) {
      const size_t at = rng() % mutated.size();
      switch (rng() % 3) {
        case 0:
          mutated[at] = alphabet[rng() % alphabet.size()];
          break;
        case 1:
          mutated.erase(at, 1);
          break;
        default:
          mutated.insert(at, 1, alphabet[rng() % alphabet.size()]);
      }
    }
    for (const Limits& limits : {Limits(), tight}) {
      absl::StatusOr<Value> v = Parse(mutated, limits);
      if (v.ok()) {
        ++ok;
      } else {
        ASSERT_EQ(v.status().code(), kInvalid) << v.status();
      }
    }
  }
  EXPECT_GT(ok, 0);  // some mutations (e.g. digit changes) stay valid
}

}  // namespace

// Python's json module writes NaN and Infinity; a caller that reads its files may accept them,
// in arrays of numbers too, and keeps their text.
TEST(JsonParse, PythonNonFiniteNumbersOnlyWhenAllowed) {
  Limits python;
  python.allow_python_non_finite = true;
  absl::StatusOr<Value> v =
      Parse(R"({"limit": [0.0, Infinity], "x": -Infinity, "y": NaN})", python);
  ASSERT_TRUE(v.ok()) << v.status();
  const Value* limit = v->Find("limit");
  ASSERT_NE(limit, nullptr);
  ASSERT_TRUE(limit->all_numbers());
  ASSERT_EQ(limit->numbers().size(), 2u);
  EXPECT_TRUE(std::isinf(limit->numbers()[1]) && limit->numbers()[1] > 0);
  EXPECT_EQ(v->Find("x")->number_text(), "-Infinity");
  EXPECT_TRUE(std::isnan(v->Find("y")->number_value()));
  EXPECT_FALSE(Parse(R"([0.0, Infinity])", Limits()).ok());
  EXPECT_FALSE(Parse(R"([Infinite])", python).ok());
}

}  // namespace attend::json
