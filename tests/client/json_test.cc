// The client's JSON reader (strict grammar, limits, dense number arrays, errors with line and
// column) and the attention requests read from JSON (every error names its field).
#include "client/json.h"

#include <cmath>
#include <string>

#include "client/json_input.h"
#include "tests/test_util.h"

namespace attend::client {
namespace {

using ::attend::testing::StatusIs;
using json::Value;

TEST(Json, ReadsEveryKindOfValue) {
  absl::StatusOr<Value> v = json::Parse(
      " {\"a\": [1, -2.5, 3e2, 0], \"b\": {\"c\": true, \"d\": null}, \"e\": \"x\\u00e9\\n\","
      " \"f\": [1, \"two\", [3]], \"g\": [], \"h\": false, \"i\": \"\\ud83d\\ude00\"} ");
  ASSERT_OK(v);
  ASSERT_TRUE(v->is_object());
  const Value* a = v->Find("a");
  ASSERT_NE(a, nullptr);
  ASSERT_TRUE(a->all_numbers());
  EXPECT_EQ(a->numbers(), (std::vector<double>{1, -2.5, 300, 0}));
  EXPECT_TRUE(v->Find("b")->Find("c")->boolean());
  EXPECT_EQ(v->Find("b")->Find("d")->kind(), Value::Kind::kNull);
  EXPECT_EQ(v->Find("e")->string(), "x\xC3\xA9\n");
  const Value* f = v->Find("f");
  ASSERT_FALSE(f->all_numbers());
  ASSERT_EQ(f->items().size(), 3u);
  EXPECT_EQ(f->items()[0].number(), 1);  // the number before the string kept its place
  EXPECT_EQ(f->items()[1].string(), "two");
  EXPECT_TRUE(f->items()[2].all_numbers());
  EXPECT_TRUE(v->Find("g")->all_numbers());
  EXPECT_EQ(v->Find("g")->size(), 0u);
  EXPECT_FALSE(v->Find("h")->boolean());
  EXPECT_EQ(v->Find("i")->string(), "\xF0\x9F\x98\x80");  // a surrogate pair
  EXPECT_EQ(v->Find("nope"), nullptr);
}

TEST(Json, NumbersAreExactDoubles) {
  absl::StatusOr<Value> v = json::Parse("[0.1, 1e-400, -0, 123456789012345678, 1.5E+3]");
  ASSERT_OK(v);
  EXPECT_EQ(v->numbers()[0], 0.1);
  EXPECT_EQ(v->numbers()[1], 0.0);  // underflow rounds to zero
  EXPECT_TRUE(std::signbit(v->numbers()[2]));
  EXPECT_EQ(v->numbers()[3], 123456789012345678.0);
  EXPECT_EQ(v->numbers()[4], 1500.0);
}

TEST(Json, RefusesWhatRfc8259Refuses) {
  const std::pair<const char*, const char*> cases[] = {
      {"[1, 2,]", "trailing ','"},
      {"{\"a\": 1,}", "trailing ','"},
      {"[01]", "do not start with 0"},
      {"[+1]", "unexpected character '+'"},
      {"[1.]", "after '.'"},
      {"[1e]", "exponent"},
      {"[NaN]", "NaN and Infinity"},
      {"[-Infinity]", "NaN and Infinity"},
      {"[1e400]", "too large"},
      {"{\"a\": 1, \"a\": 2}", "'a' appears twice"},
      {"{a: 1}", "member name in double quotes"},
      {"[1] [2]", "after the JSON document"},
      {"[\"a\tb\"]", "control character"},
      {"[\"\\x\"]", "unknown escape"},
      {"[\"\\ud800\"]", "high surrogate"},
      {"[\"\\udc00\"]", "lone low surrogate"},
      {"[\"\xC0\xAF\"]", "invalid UTF-8"},
      {"// c\n[1]", "unexpected character '/'"},
      {"[1, 2", "expected ',' or ']'"},
      {"", "unexpected end"},
      {"tru", "unexpected character 't'"},
  };
  for (const auto& [text, message] : cases) {
    EXPECT_THAT(json::Parse(text), StatusIs(absl::StatusCode::kInvalidArgument, {message})) << text;
  }
}

TEST(Json, SaysWhereTheProblemIs) {
  EXPECT_THAT(json::Parse("{\n  \"q\": {\n    \"shape\": [1, 1] \"values\": []\n  }\n}"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       {"line 3, column 21: expected ',' or '}' after an object member"}));
}

TEST(Json, EnforcesItsLimits) {
  json::Limits limits;
  limits.max_depth = 3;
  EXPECT_OK(json::Parse("[[[1]]]", limits));
  EXPECT_THAT(json::Parse("[[[[1]]]]", limits),
              StatusIs(absl::StatusCode::kInvalidArgument, {"deeper than 3"}));
  limits = json::Limits();
  limits.max_values = 4;
  EXPECT_OK(json::Parse("[1, 2, 3]", limits));  // the array and its three numbers
  EXPECT_THAT(json::Parse("[1, 2, 3, 4]", limits),
              StatusIs(absl::StatusCode::kInvalidArgument, {"more than 4 values"}));
  limits = json::Limits();
  limits.max_string_bytes = 4;
  EXPECT_THAT(json::Parse("[\"abcdefgh\"]", limits),
              StatusIs(absl::StatusCode::kInvalidArgument, {"longer than 4 bytes"}));
  limits = json::Limits();
  limits.max_input_bytes = 3;
  EXPECT_THAT(json::Parse("[1, 2]", limits),
              StatusIs(absl::StatusCode::kInvalidArgument, {"6 bytes"}));
  // Deep nesting of a hostile text ends in an error, not a stack overflow.
  EXPECT_THAT(json::Parse(std::string(100000, '[')),
              StatusIs(absl::StatusCode::kInvalidArgument, {"deeper than 32"}));
}

TEST(Json, Utf8SequenceAt) {
  uint32_t cp = 0;
  EXPECT_EQ(json::Utf8SequenceAt("a", 0, &cp), 1u);
  EXPECT_EQ(cp, 'a');
  EXPECT_EQ(json::Utf8SequenceAt("\xE2\x82\xAC", 0, &cp), 3u);
  EXPECT_EQ(cp, 0x20ACu);
  EXPECT_EQ(json::Utf8SequenceAt("\xED\xA0\x80", 0), 0u);      // a surrogate
  EXPECT_EQ(json::Utf8SequenceAt("\xE0\x80\x80", 0), 0u);      // overlong
  EXPECT_EQ(json::Utf8SequenceAt("\xF4\x90\x80\x80", 0), 0u);  // above U+10FFFF
  EXPECT_EQ(json::Utf8SequenceAt("\xE2\x82", 0), 0u);          // cut short
}

constexpr char kItRequest[] = R"({
  "q": {"shape": [1, 1, 4], "values": [1, 1, 1, 1]},
  "k": {"shape": [3, 1, 4], "values": [1, 1, 1, 1, 1, 1, 0, 0, 1, 0, 0, 0]},
  "v": {"shape": [3, 1, 2], "values": [1, 0, 0, 1, 1, 1]},
  "mask": {"causal": true, "window_tokens": 2},
  "scale": 0.5
})";

TEST(JsonInput, ReadsAnAttendRequest) {
  absl::StatusOr<AttendInput> input = AttendInputFromJson(kItRequest);
  ASSERT_OK(input);
  EXPECT_EQ(input->q.shape, (std::vector<int64_t>{1, 1, 4}));
  EXPECT_EQ(input->k.values, (std::vector<float>{1, 1, 1, 1, 1, 1, 0, 0, 1, 0, 0, 0}));
  EXPECT_EQ(input->v.shape, (std::vector<int64_t>{3, 1, 2}));
  EXPECT_TRUE(input->mask.causal);
  EXPECT_EQ(input->mask.window_tokens, 2);
  ASSERT_TRUE(input->scale.has_value());
  EXPECT_EQ(*input->scale, 0.5f);
  // Mask and scale are optional.
  absl::StatusOr<AttendInput> plain = AttendInputFromJson(
      R"({"q": {"shape": [1], "values": [1]}, "k": {"shape": [1], "values": [2]},
          "v": {"shape": [1], "values": [3]}})");
  ASSERT_OK(plain);
  EXPECT_FALSE(plain->mask.causal);
  EXPECT_FALSE(plain->scale.has_value());
}

TEST(JsonInput, ErrorsNameTheField) {
  const std::string q = R"("q": {"shape": [1, 1, 4], "values": [1, 1, 1, 1]})";
  const std::string kv =
      R"("k": {"shape": [1, 1, 4], "values": [1, 1, 1, 1]}, "v": {"shape": [1, 1, 1], "values": [1]})";
  const std::pair<std::string, std::vector<std::string>> cases[] = {
      {"{" + kv + "}", {"q: missing"}},
      {R"({"q": {"shape": [1, 1, 4], "values": [1, 1, "x", 1]}, )" + kv + "}",
       {"q.values[2]: expected a number, got a string"}},
      {R"({"q": {"shape": [1, 1, 4], "values": [1, 1, null, 1]}, )" + kv + "}",
       {"q.values[2]: expected a number, got null"}},
      {R"({"q": {"shape": [1, 1, 4], "values": [[1, 1], [1, 1]]}, )" + kv + "}",
       {"q.values[0]", "flat, row-major"}},
      {R"({"q": {"shape": [1, 1, 4], "values": [1, 1, 1]}, )" + kv + "}",
       {"q: shape [1, 1, 4] holds 4 values; 'values' has 3"}},
      {R"({"q": {"shape": [1, 1.5, 4], "values": [1]}, )" + kv + "}",
       {"q.shape[1]: expected a positive integer, got 1.5"}},
      {R"({"q": {"shape": [1, 0, 4], "values": []}, )" + kv + "}", {"q.shape[1]"}},
      {R"({"q": {"shape": [], "values": []}, )" + kv + "}", {"q.shape: empty"}},
      {R"({"q": {"shape": [1, 1, 4], "values": [1, 1, 1e39, 1]}, )" + kv + "}",
       {"q.values[2]", "float32"}},
      {R"({"q": {"shape": [1, 1, 4], "valuez": [1, 1, 1, 1]}, )" + kv + "}",
       {"q: unknown member 'valuez' (known: shape, values)"}},
      {R"({"q": [1, 1, 1, 1], )" + kv + "}", {"q: expected a tensor object"}},
      {R"({"k": {"values": [1]}, )" + q + "}", {"k.shape: missing"}},
      {"{" + q + ", " + kv + R"(, "mask": {"causal": "yes"}})",
       {"mask.causal: expected true or false, got a string"}},
      {"{" + q + ", " + kv + R"(, "mask": {"causl": true}})", {"mask: unknown member 'causl'"}},
      {"{" + q + ", " + kv + R"(, "mask": {"window_tokens": -1}})", {"mask.window_tokens"}},
      {"{" + q + ", " + kv + R"(, "scale": "half"})", {"scale: expected a number"}},
      {"{" + q + ", " + kv + R"(, "qq": 1})", {"the request: unknown member 'qq'"}},
      {"[1]", {"must be a JSON object, got an array"}},
      {"{" + q + ", " + kv, {"line 1", "expected ',' or '}'"}},
  };
  for (const auto& [text, messages] : cases) {
    EXPECT_THAT(AttendInputFromJson(text), StatusIs(absl::StatusCode::kInvalidArgument, messages))
        << text;
  }
}

TEST(JsonInput, ReadsAMultiHeadRequest) {
  absl::StatusOr<MultiHeadInput> input = MultiHeadInputFromJson(R"({
    "x": {"shape": [2, 2], "values": [1, 0, 0, 1]},
    "wq": {"shape": [2, 2], "values": [1, 0, 0, 1]},
    "wk": {"shape": [2, 1], "values": [1, 1]},
    "wv": {"shape": [2, 1], "values": [2, 3]},
    "n_head": 2, "n_head_kv": 1, "mask": {"causal": true}})");
  ASSERT_OK(input);
  EXPECT_EQ(input->n_head, 2);
  EXPECT_EQ(input->n_head_kv, 1);
  EXPECT_FALSE(input->wo.has_value());
  EXPECT_TRUE(input->mask.causal);
  EXPECT_EQ(input->wv.values, (std::vector<float>{2, 3}));
  EXPECT_THAT(MultiHeadInputFromJson(R"({"x": {"shape": [1], "values": [1]},
    "wq": {"shape": [1], "values": [1]}, "wk": {"shape": [1], "values": [1]},
    "wv": {"shape": [1], "values": [1]}})"),
              StatusIs(absl::StatusCode::kInvalidArgument, {"n_head: missing"}));
  EXPECT_THAT(MultiHeadInputFromJson(R"({"x": {"shape": [1], "values": [1]}, "n_head": 2.5})"),
              StatusIs(absl::StatusCode::kInvalidArgument, {"wq: missing"}));
}

}  // namespace
}  // namespace attend::client
