// Attention requests read from JSON: tensors, masks and scales, and errors that name their field
// (or, for syntax errors, the line and column). The parser itself is tested in
// tests/common/json_test.cc.
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
