// Attention requests read from JSON (proto3 JSON, by protobuf's parser): tensors, masks and
// scales, the members refused, and errors that name their field (or, for syntax errors, the line
// and column).
#include "client/json_input.h"

#include <string>
#include <vector>

#include "tests/test_util.h"

namespace attend::client {
namespace {

using ::attend::testing::StatusIs;

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
       {"q.values[2]: expected a number (float32), got \"x\""}},
      // protobuf skips null elements: the count is reported, with the likely cause.
      {R"({"q": {"shape": [1, 1, 4], "values": [1, 1, null, 1]}, )" + kv + "}",
       {"q: shape [1, 1, 4] holds 4 values; 'values' has 3 (a null, as --json prints NaN"}},
      {R"({"q": {"shape": [1, 1, 4], "values": [1, 1, "NaN", 1]}, )" + kv + "}",
       {"q.values[2]: expected a finite number, got nan"}},
      {R"({"q": {"shape": [1, 1, 4], "values": [1, 1, 1, "-Infinity"]}, )" + kv + "}",
       {"q.values[3]: expected a finite number, got -inf"}},
      {R"({"q": {"shape": [1, 1, 4], "values": [1, 1, 1]}, )" + kv + "}",
       {"q: shape [1, 1, 4] holds 4 values; 'values' has 3"}},
      {R"({"q": {"shape": [1, 1.5, 4], "values": [1]}, )" + kv + "}",
       {"q.shape[1]: expected an integer, got 1.5"}},
      {R"({"q": {"shape": [1, 0, 4], "values": []}, )" + kv + "}",
       {"q.shape[1]: expected a positive integer, got 0"}},
      {R"({"q": {"shape": [1, -2, 4], "values": []}, )" + kv + "}",
       {"q.shape[1]: expected a positive integer, got -2"}},
      // Over the bound of a dimension, and beyond int64 (which protobuf prints as a double).
      {R"({"q": {"shape": [9223372036854775807, 1, 4], "values": []}, )" + kv + "}",
       {"q.shape[0]: 9223372036854775807 is over the limit of 2^40 (1099511627776) for a "
        "dimension"}},
      {R"({"q": {"shape": [99999999999999999999, 1, 4], "values": []}, )" + kv + "}",
       {"q.shape[0]: expected an integer, got a number out of its range (about 1e+20)"}},
      {R"({"q": {"shape": [-99999999999999999999, 1, 4], "values": []}, )" + kv + "}",
       {"q.shape[0]: expected an integer, got a number out of its range (about -1e+20)"}},
      {R"({"q": {"shape": [1099511627776, 1099511627776], "values": []}, )" + kv + "}",
       {"q.shape: more than 2^53 elements"}},
      {R"({"q": {"shape": [], "values": []}, )" + kv + "}", {"q.shape: missing or empty"}},
      // Beyond float32's range (protobuf refuses it rather than rounding it to infinity).
      {R"({"q": {"shape": [1, 1, 4], "values": [1, 1, 1e39, 1]}, )" + kv + "}",
       {"q.values[2]: expected a number (float32), got 1e+39, beyond float32's range (about "
        "3.4e38)"}},
      {R"({"q": {"shape": [1, 1, 4], "values": [1, 1, 1, -5e38]}, )" + kv + "}",
       {"q.values[3]: expected a number (float32), got -5e+38, beyond float32's range (about "
        "3.4e38)"}},
      {"{" + q + ", " + kv + R"(, "scale": 1e39})",
       {"scale: expected a number (float32), got 1e+39, beyond float32's range (about 3.4e38)"}},
      // proto3 JSON's numbers in strings, as given.
      {R"({"q": {"shape": [1, 1, 4], "values": [1, 1, 1, "1e39"]}, )" + kv + "}",
       {"q.values[3]: expected a number (float32), got \"1e39\", beyond float32's range (about "
        "3.4e38)"}},
      {R"({"q": {"shape": [1, 1, 4], "valuez": [1, 1, 1, 1]}, )" + kv + "}",
       {"q: unknown member 'valuez' (known: shape, values)"}},
      {R"({"q": [1, 1, 1, 1], )" + kv + "}", {"q: got an array; this member is not a list"}},
      {R"({"q": 5, )" + kv + "}",
       {"q: expected a tensor {\"shape\": [...], \"values\": [...]}, got 5"}},
      {R"({"k": {"values": [1]}, )" + q + "}", {"k.shape: missing"}},
      {"{" + q + ", " + kv + R"(, "mask": {"causal": "maybe"}})",
       {"mask.causal: expected true or false, got \"maybe\""}},
      {"{" + q + ", " + kv + R"(, "mask": {"causl": true}})",
       {"mask: unknown member 'causl' (known: causal, window_tokens)"}},
      {"{" + q + ", " + kv + R"(, "mask": {"window_tokens": -1}})",
       {"mask.window_tokens: expected a non-negative integer, got -1"}},
      {"{" + q + ", " + kv + R"(, "scale": "half"})",
       {"scale: expected a number (float32), got \"half\""}},
      {"{" + q + ", " + kv + R"(, "scale": "Infinity"})", {"scale: expected a finite number"}},
      {"{" + q + ", " + kv + R"(, "qq": 1})",
       {"the request: unknown member 'qq' (known: q, k, v, mask, scale)"}},
      // The request's other fields are the command's flags; a tensor's packed bytes are not
      // read either.
      {"{" + q + ", " + kv + R"(, "precision": "PRECISION_BFLOAT16"})",
       {"precision: not read from request files, which hold q, k, v, mask, scale"}},
      {"{" + q + ", " + kv + R"(, "return_weights": true})", {"return_weights: not read"}},
      {R"({"q": {"shape": [1], "data": "AAAAAA=="}, )" + kv + "}",
       {"q.data: not read from request files; give the numbers in 'values'"}},
      {R"({"q": {"shape": [1], "values": [1], "dtype": "BFLOAT16"}, )" + kv + "}",
       {"q.dtype: 'values' are float32"}},
      {"[1]", {"the request must be a JSON object"}},
      {"{" + q + ", " + kv, {"line 1, column 144: Unexpected end of string. Expected , or }"}},
      {"{\"q\": {\"shape\": [1]\n\"values\": [1]}}", {"line 2, column 1: Expected , or }"}},
      {"{\"q\": \"\\u0001\"}", {"q: expected a tensor", "got \"\\x01\""}},
      {"{\"q\": \"\xff\"}", {"line 1, column 8: Encountered non UTF-8 code points"}},
  };
  for (const auto& [text, messages] : cases) {
    EXPECT_THAT(AttendInputFromJson(text), StatusIs(absl::StatusCode::kInvalidArgument, messages))
        << text;
  }
  // "inf" is no number of proto3 JSON ("Infinity" is): not called out of float32's range.
  EXPECT_EQ(AttendInputFromJson(R"({"q": {"shape": [1], "values": ["inf"]}, )" + kv + "}")
                .status()
                .message(),
            "q.values[0]: expected a number (float32), got \"inf\"");
}

// What proto3 JSON allows besides the CLI's own form, which protobuf's parser reads.
TEST(JsonInput, ReadsProto3JsonForms) {
  absl::StatusOr<AttendInput> input = AttendInputFromJson(
      "\xEF\xBB\xBF"  // a byte order mark
      R"({"q": {"shape": ["1", 2], "values": [[1, 2]], "dtype": "FLOAT32"},
          "k": {"shape": [1], "values": ["0.5"]}, "v": {"shape": [1], "values": [3]},
          "mask": {"windowTokens": "3"}, "scale": null})");
  ASSERT_OK(input);
  EXPECT_EQ(input->q.shape, (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(input->q.values, (std::vector<float>{1, 2}));  // nested arrays flattened
  EXPECT_EQ(input->k.values, (std::vector<float>{0.5f}));
  EXPECT_EQ(input->mask.window_tokens, 3);
  EXPECT_FALSE(input->scale.has_value());
  // A field the flags set may be written with its default value.
  EXPECT_OK(AttendInputFromJson(
      R"({"q": {"shape": [1], "values": [1]}, "k": {"shape": [1], "values": [2]},
          "v": {"shape": [1], "values": [3]}, "precision": "PRECISION_UNSPECIFIED"})"));
}

TEST(JsonInput, ReadsATensor) {
  absl::StatusOr<FloatTensor> t = TensorFromJson(R"({"shape": [2], "values": [1, 2]})", "output");
  ASSERT_OK(t);
  EXPECT_EQ(t->values, (std::vector<float>{1, 2}));
  EXPECT_THAT(TensorFromJson(R"({"shape": [2], "values": [1, "a"]})", "output"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       {"output.values[1]: expected a number (float32), got \"a\""}));
  EXPECT_THAT(TensorFromJson(R"({"shape": [2], "valus": [1, 2]})", "output"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       {"output: unknown member 'valus' (known: shape, values)"}));
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
  EXPECT_THAT(MultiHeadInputFromJson(R"({"x": {"shape": [1], "values": [1]}, "n_head": 2})"),
              StatusIs(absl::StatusCode::kInvalidArgument, {"wq: missing"}));
  EXPECT_THAT(MultiHeadInputFromJson(R"({"n_head": 2.5})"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       {"n_head: expected an integer (32-bit), got 2.5"}));
  EXPECT_THAT(MultiHeadInputFromJson(R"({"n_head": 99999999999})"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       {"n_head: expected an integer (32-bit), got a number out of its range "
                        "(99999999999)"}));
  const std::string tensors = R"("x": {"shape": [1], "values": [1]},
    "wq": {"shape": [1], "values": [1]}, "wk": {"shape": [1], "values": [1]},
    "wv": {"shape": [1], "values": [1]})";
  const std::pair<std::string, std::string> cases[] = {
      {R"({"nhead": 1})",
       "the request: unknown member 'nhead' (known: x, wq, wk, wv, wo, "
       "n_head, n_head_kv, mask, scale)"},
      {R"({"init": {}, "n_head": 1})", "init: not read from request files"},
      {"{" + tensors + R"(, "n_head": 0})", "n_head: missing or 0"},
      {"{" + tensors + R"(, "n_head": -1})", "n_head: expected a positive integer, got -1"},
      {"{" + tensors + R"(, "n_head": 3000000000})", "n_head: expected an integer (32-bit)"},
      {"{" + tensors + R"(, "n_head": 1, "n_head_kv": -1})",
       "n_head_kv: expected a non-negative integer, got -1"},
      {"{" + tensors + R"(, "n_head": 1, "wo": {"shape": [2], "values": [1]}})",
       "wo: shape [2] holds 2 values; 'values' has 1"},
  };
  for (const auto& [text, message] : cases) {
    EXPECT_THAT(MultiHeadInputFromJson(text),
                StatusIs(absl::StatusCode::kInvalidArgument, {message}))
        << text;
  }
}

}  // namespace
}  // namespace attend::client
