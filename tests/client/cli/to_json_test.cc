// --json's rule for 64-bit integers: numbers while a double holds them exactly (|x| <= 2^53),
// strings beyond; walked alongside the descriptor, in nested, repeated and map fields.
// cli::ToJson: --json's rule for 64-bit integers, numbers while a double holds them exactly
// (|x| <= 2^53) and strings beyond, in nested, repeated and map fields (UnquoteExactInt64s).
#include <memory>
#include <string>

#include "attend/v1/kv_cache.pb.h"
#include "client/cli/render/format.h"
#include "gmock/gmock.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/descriptor.pb.h"
#include "google/protobuf/dynamic_message.h"
#include "google/protobuf/text_format.h"
#include "google/protobuf/util/json_util.h"
#include "google/protobuf/wrappers.pb.h"
#include "gtest/gtest.h"

namespace attend {
namespace {

using ::testing::HasSubstr;

constexpr int64_t k2To53 = int64_t{1} << 53;

TEST(ToJsonTest, CountsUpTo2To53AreNumbersAndLargerOnesStrings) {
  v1::ListSequencesResponse listed;
  v1::SequenceInfo* exact = listed.add_sequences();
  exact->set_sequence_id("9007199254740993");  // a string field of digits stays a string
  exact->set_tokens(k2To53);
  exact->add_layer_tokens(k2To53);
  exact->add_layer_tokens(k2To53 + 1);
  exact->mutable_config()->set_window_tokens(-k2To53);
  v1::SequenceInfo* large = listed.add_sequences();
  large->set_tokens(k2To53 + 1);
  large->mutable_config()->set_window_tokens(-k2To53 - 1);
  const std::string json = cli::ToJson(listed);
  EXPECT_THAT(json, HasSubstr("\"sequence_id\": \"9007199254740993\""));
  EXPECT_THAT(json, HasSubstr("\"tokens\": 9007199254740992,"));
  EXPECT_THAT(json, HasSubstr("\"tokens\": \"9007199254740993\","));
  EXPECT_THAT(json, HasSubstr("\"window_tokens\": -9007199254740992\n"));
  EXPECT_THAT(json, HasSubstr("\"window_tokens\": \"-9007199254740993\"\n"));
  EXPECT_THAT(json, HasSubstr("\"blocks\": 0,"));
  // Repeated: each element by its own value.
  EXPECT_THAT(json, ::testing::ContainsRegex(
                        "\"layer_tokens\": \\[\n *9007199254740992,\n *\"9007199254740993\"\n"));
  // Parsing it back gives the message (protobuf reads numbers and strings for int64 alike).
  v1::ListSequencesResponse parsed;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(json, &parsed).ok()) << json;
  EXPECT_EQ(parsed.SerializeAsString(), listed.SerializeAsString());
}

TEST(ToJsonTest, Uint64AndNestedTensorShapes) {
  v1::DecodeBatchResponse response;
  response.set_request_id(uint64_t{18446744073709551615u});
  response.add_results()->set_layer_tokens(7);
  response.mutable_results(0)->mutable_output()->add_shape(1);
  response.mutable_results(0)->mutable_output()->add_shape(k2To53 + 1);
  const std::string json = cli::ToJson(response);
  EXPECT_THAT(json, HasSubstr("\"request_id\": \"18446744073709551615\""));
  EXPECT_THAT(json, HasSubstr("\"layer_tokens\": 7"));
  EXPECT_THAT(json, ::testing::ContainsRegex("\"shape\": \\[\n *1,\n *\"9007199254740993\"\n"));
  response.set_request_id(static_cast<uint64_t>(k2To53));
  EXPECT_THAT(cli::ToJson(response), HasSubstr("\"request_id\": 9007199254740992"));
}

// A message type built at run time, for the kinds of 64-bit fields, maps and well-known types
// attend's API has none of.
class DynamicTypeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // The well-known types come from the generated pool, under this one.
    ASSERT_NE(google::protobuf::Int64Value::descriptor(), nullptr);
    google::protobuf::FileDescriptorProto file;
    ASSERT_TRUE(google::protobuf::TextFormat::ParseFromString(
        R"pb(
          name: "t.proto"
          package: "t"
          syntax: "proto3"
          dependency: "google/protobuf/wrappers.proto"
          message_type {
            name: "M"
            field { name: "u" number: 1 type: TYPE_UINT64 label: LABEL_OPTIONAL }
            field { name: "s" number: 2 type: TYPE_SINT64 label: LABEL_OPTIONAL }
            field { name: "f" number: 3 type: TYPE_SFIXED64 label: LABEL_REPEATED }
            field {
              name: "m"
              number: 4
              type: TYPE_MESSAGE
              type_name: ".t.M.MEntry"
              label: LABEL_REPEATED
            }
            field {
              name: "child"
              number: 5
              type: TYPE_MESSAGE
              type_name: ".t.M"
              label: LABEL_OPTIONAL
            }
            field { name: "i32" number: 6 type: TYPE_INT32 label: LABEL_OPTIONAL }
            field { name: "str" number: 7 type: TYPE_STRING label: LABEL_OPTIONAL }
            field {
              name: "wrapped"
              number: 8
              type: TYPE_MESSAGE
              type_name: ".google.protobuf.Int64Value"
              label: LABEL_OPTIONAL
            }
            field {
              name: "children"
              number: 9
              type: TYPE_MESSAGE
              type_name: ".t.M"
              label: LABEL_REPEATED
            }
            nested_type {
              name: "MEntry"
              options { map_entry: true }
              field { name: "key" number: 1 type: TYPE_STRING label: LABEL_OPTIONAL }
              field { name: "value" number: 2 type: TYPE_INT64 label: LABEL_OPTIONAL }
            }
          })pb",
        &file));
    ASSERT_NE(pool_.BuildFile(file), nullptr);
    type_ = pool_.FindMessageTypeByName("t.M");
  }

  // ToJson of the message of type M that `text` (text format) describes.
  std::string Json(const std::string& text) {
    std::unique_ptr<google::protobuf::Message> m(factory_.GetPrototype(type_)->New());
    EXPECT_TRUE(google::protobuf::TextFormat::ParseFromString(text, m.get())) << text;
    return cli::ToJson(*m);
  }

  google::protobuf::DescriptorPool pool_{google::protobuf::DescriptorPool::generated_pool()};
  google::protobuf::DynamicMessageFactory factory_;
  const google::protobuf::Descriptor* type_ = nullptr;
};

TEST_F(DynamicTypeTest, MapValuesRepeatedAndNestedFields) {
  EXPECT_EQ(Json(R"pb(
              u: 9007199254740992
              s: -9007199254740993
              f: [ 1, 9007199254740993 ]
              m { key: "9007199254740993" value: 5 }
              child {
                u: 9007199254740993
                child { s: -2 }
              }
              children { str: "12" }
              children {}
              str: "9007199254740992"
              wrapped { value: 7 }
            )pb"),
            R"({
 "u": 9007199254740992,
 "s": "-9007199254740993",
 "f": [
  1,
  "9007199254740993"
 ],
 "m": {
  "9007199254740993": 5
 },
 "child": {
  "u": "9007199254740993",
  "s": 0,
  "f": [],
  "m": {},
  "child": {
   "u": 0,
   "s": -2,
   "f": [],
   "m": {},
   "i32": 0,
   "str": "",
   "children": []
  },
  "i32": 0,
  "str": "",
  "children": []
 },
 "i32": 0,
 "str": "9007199254740992",
 "children": [
  {
   "u": 0,
   "s": 0,
   "f": [],
   "m": {},
   "i32": 0,
   "str": "12",
   "children": []
  },
  {
   "u": 0,
   "s": 0,
   "f": [],
   "m": {},
   "i32": 0,
   "str": "",
   "children": []
  }
 ],
 "wrapped": "7"
}
)");
}

TEST_F(DynamicTypeTest, TextInAnotherLayoutIsReturnedAsItIs) {
  for (const std::string in :
       {"", "{\"u\": \"1\"}", "[\n \"1\"\n]", "{\n \"u\": \"1\"\n", "{\n \"u\": \"1\"\n}\n}",
        "{\n \"u\" \"1\"\n}", "{\n \"u\": \"1\"\n}\n{\n}"}) {
    EXPECT_EQ(cli::UnquoteExactInt64s(in, *type_), in);
  }
  EXPECT_EQ(
      cli::UnquoteExactInt64s("{\n \"u\": \"1\",\n \"x\": \"2\",\n \"s\": \"1e3\"\n}", *type_),
      "{\n \"u\": 1,\n \"x\": \"2\",\n \"s\": \"1e3\"\n}");
  // A key with escaped quotes is read to its end.
  EXPECT_EQ(cli::UnquoteExactInt64s("{\n \"m\": {\n  \"a\\\": \\\"\": \"3\"\n }\n}", *type_),
            "{\n \"m\": {\n  \"a\\\": \\\"\": 3\n }\n}");
}

}  // namespace
}  // namespace attend
