#include "core/planner/json.h"

#include <limits>
#include <random>
#include <string>

#include "tests/test_util.h"

namespace attend::planner::json {
namespace {

using ::attend::testing::StatusIs;

constexpr auto kInvalid = absl::StatusCode::kInvalidArgument;

TEST(JsonParse, ReadsEveryKindOfValue) {
  absl::StatusOr<Value> v = Parse(R"( {"a": [1, -2.5e3, true, false, null],
      "s": "x\"\\\/\b\f\n\r\t\u00e9\ud83d\ude00", "o": {}, "e": []} )");
  ASSERT_OK(v);
  ASSERT_TRUE(v->is_object());
  const Value* a = v->Find("a");
  ASSERT_NE(a, nullptr);
  ASSERT_EQ(a->array().size(), 5u);
  EXPECT_EQ(a->array()[0].number(), 1.0);
  EXPECT_EQ(a->array()[1].number(), -2500.0);
  EXPECT_EQ(a->array()[1].number_text(), "-2.5e3");
  EXPECT_TRUE(a->array()[2].bool_value());
  EXPECT_FALSE(a->array()[3].bool_value());
  EXPECT_TRUE(a->array()[4].is_null());
  EXPECT_EQ(v->Find("s")->string_value(), "x\"\\/\b\f\n\r\t\xC3\xA9\xF0\x9F\x98\x80");
  EXPECT_TRUE(v->Find("o")->is_object());
  EXPECT_TRUE(v->Find("e")->is_array());
  EXPECT_EQ(v->Find("missing"), nullptr);
  EXPECT_EQ(v->Find("a")->Find("x"), nullptr);  // not an object
}

TEST(JsonParse, KeepsRawUtf8AndSkipsAByteOrderMark) {
  absl::StatusOr<Value> v = Parse("\xEF\xBB\xBF{\"k\": \"caf\xC3\xA9 \xE2\x82\xAC\"}");
  ASSERT_OK(v);
  EXPECT_EQ(v->Find("k")->string_value(), "caf\xC3\xA9 \xE2\x82\xAC");
}

TEST(JsonParse, UnderflowRoundsToZero) {
  absl::StatusOr<Value> v = Parse("[1e-400]");
  ASSERT_OK(v);
  EXPECT_EQ(v->array()[0].number(), 0.0);
}

TEST(JsonParse, RejectsMalformedText) {
  const std::pair<const char*, const char*> cases[] = {
      {"", "expected a value"},
      {"   ", "expected a value"},
      {"[1,]", "unexpected character"},
      {"{\"a\":1,}", "expected a string key"},
      {"{\"a\" 1}", "expected ':'"},
      {"{a:1}", "expected a string key"},
      {"['a']", "unexpected character"},
      {"[1 2]", "expected ',' or ']'"},
      {"{} x", "unexpected content after"},
      {"01", "leading zero"},
      {"-", "expected a digit"},
      {"1.", "after the decimal point"},
      {"1e", "in the exponent"},
      {"NaN", "unexpected character"},
      {"Infinity", "unexpected character"},
      {"-Infinity", "expected a digit"},
      {"tru", "expected 'true'"},
      {"// c\n{}", "unexpected character"},
      {"\"abc", "unterminated string"},
      {"\"a\x01\"", "unescaped control character"},
      {"\"\\x\"", "invalid escape"},
      {"\"\\u12zz\"", "invalid hex digit"},
      {"\"\\u12\"", "truncated \\u escape"},
      {"\"\\ud800\"", "lone high surrogate"},
      {"\"\\udc00\"", "lone low surrogate"},
      {"\"\\ud800\\u0041\"", "not followed by a low surrogate"},
      {"\"\xFF\"", "invalid UTF-8"},
      {"\"\xC0\xAF\"", "invalid UTF-8"},          // overlong '/'
      {"\"\xED\xA0\x80\"", "invalid UTF-8"},      // encoded surrogate
      {"\"\xF4\x90\x80\x80\"", "invalid UTF-8"},  // above U+10FFFF
      {"\"\xE2\x82\"", "invalid UTF-8"},          // truncated sequence
      {"{\"a\":1,\"a\":2}", "duplicate key 'a'"},
      {"1e400", "too large for a double"},
      {"-1e400", "too large for a double"},
  };
  for (const auto& [text, message] : cases) {
    EXPECT_THAT(Parse(text), StatusIs(kInvalid, {"json: ", message})) << text;
  }
}

TEST(JsonParse, ErrorsSayWhere) {
  EXPECT_THAT(Parse("{\n  \"a\": 1,\n  \"b\" 2\n}"),
              StatusIs(kInvalid, {"line 3, column 7", "expected ':'"}));
}

TEST(JsonParse, BoundsNestingDepth) {
  const auto nested = [](int depth) {
    return std::string(static_cast<size_t>(depth), '[') +
           std::string(static_cast<size_t>(depth), ']');
  };
  EXPECT_OK(Parse(nested(64)));
  EXPECT_THAT(Parse(nested(65)), StatusIs(kInvalid, {"nesting deeper than 64"}));
  // Far deeper input fails at the limit rather than exhausting the stack.
  EXPECT_THAT(Parse(std::string(500000, '[')), StatusIs(kInvalid, {"nesting deeper than 64"}));
  std::string objects;
  for (int i = 0; i < 100; ++i) objects += "{\"a\":";
  EXPECT_THAT(Parse(objects), StatusIs(kInvalid, {"nesting deeper than 64"}));
}

TEST(JsonParse, BoundsSizes) {
  Limits limits;
  limits.max_input_bytes = 64;
  EXPECT_THAT(Parse(std::string(65, ' '), limits), StatusIs(kInvalid, {"65 bytes; at most 64"}));

  limits = Limits();
  limits.max_string_bytes = 4;
  EXPECT_OK(Parse("\"abcd\"", limits));
  EXPECT_THAT(Parse("\"abcde\"", limits), StatusIs(kInvalid, {"string longer than 4"}));
  EXPECT_THAT(Parse("{\"abcdefgh\": 1}", limits), StatusIs(kInvalid, {"string longer than 4"}));

  limits = Limits();
  limits.max_array_elements = 3;
  EXPECT_OK(Parse("[1,2,3]", limits));
  EXPECT_THAT(Parse("[1,2,3,4]", limits), StatusIs(kInvalid, {"array longer than 3"}));

  limits = Limits();
  limits.max_object_members = 2;
  EXPECT_THAT(Parse("{\"a\":1,\"b\":2,\"c\":3}", limits),
              StatusIs(kInvalid, {"more than 2 members"}));

  limits = Limits();
  limits.max_values = 5;
  EXPECT_OK(Parse("[[1],[2]]", limits));
  EXPECT_THAT(Parse("[[1],[2],3]", limits), StatusIs(kInvalid, {"more than 5 values"}));

  EXPECT_THAT(Parse(std::string(300, '1')), StatusIs(kInvalid, {"longer than 256 characters"}));
  // The default input limit holds for a megabyte of whitespace plus one byte.
  EXPECT_THAT(Parse(std::string((1 << 20) + 1, ' ')), StatusIs(kInvalid, {"at most 1048576"}));
}

TEST(AsInt64, ExactIntegersOnly) {
  const auto parse_int = [](const std::string& text) {
    absl::StatusOr<Value> v = Parse(text);
    EXPECT_OK(v);
    return AsInt64(*v, "field");
  };
  EXPECT_EQ(*parse_int("4096"), 4096);
  EXPECT_EQ(*parse_int("-7"), -7);
  EXPECT_EQ(*parse_int("4096.0"), 4096);
  EXPECT_EQ(*parse_int("4.096e3"), 4096);
  EXPECT_EQ(*parse_int("9223372036854775807"), std::numeric_limits<int64_t>::max());
  EXPECT_EQ(*parse_int("-9223372036854775808"), std::numeric_limits<int64_t>::min());
  EXPECT_THAT(parse_int("9223372036854775808"),
              StatusIs(kInvalid, {"field", "does not fit in 64 bits"}));
  // 2^70.
  EXPECT_THAT(parse_int("1180591620717411303424"),
              StatusIs(kInvalid, {"'1180591620717411303424' does not fit in 64 bits"}));
  EXPECT_THAT(parse_int("1e300"), StatusIs(kInvalid, {"too large to be read as an exact"}));
  EXPECT_THAT(parse_int("32.5"), StatusIs(kInvalid, {"'32.5' is not an integer"}));
  EXPECT_THAT(parse_int("\"32\""), StatusIs(kInvalid, {"field: expected an integer, got string"}));
  EXPECT_THAT(parse_int("null"), StatusIs(kInvalid, {"got null"}));
}

// Every strict prefix of a valid document is an error, never a crash.
TEST(JsonParse, EveryTruncationFails) {
  const std::string doc =
      R"({"a": [1, 2.5, "x\u00e9y", {"b": null, "c": true}], "d": -0.5e-3, "e": "\ud83d\ude00"})";
  ASSERT_OK(Parse(doc));
  for (size_t n = 0; n < doc.size(); ++n) {
    EXPECT_THAT(Parse(doc.substr(0, n)), StatusIs(kInvalid)) << n;
  }
}

// Random byte mutations of a valid document either parse or fail with INVALID_ARGUMENT.
TEST(JsonParse, SurvivesMutations) {
  const std::string doc =
      R"({"num_hidden_layers": 32, "layer_types": ["sliding_attention", "full_attention"],
          "rope_scaling": {"factor": 8.0, "type": "llama3"}, "eos": [1, 2, 3], "n": null})";
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
    absl::StatusOr<Value> v = Parse(mutated);
    if (v.ok()) {
      ++ok;
    } else {
      ASSERT_EQ(v.status().code(), kInvalid) << v.status();
    }
  }
  EXPECT_GT(ok, 0);  // some mutations (e.g. digit changes) stay valid
}

}  // namespace
}  // namespace attend::planner::json
