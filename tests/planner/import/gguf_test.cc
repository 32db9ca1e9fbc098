#include "planner/import/gguf.h"

#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "planner/import/gguf_format.h"
#include "planner/kv_plan.h"
#include "tests/planner/model_files.h"
#include "tests/planner/planner_test_util.h"
#include "tests/test_util.h"

namespace attend::planner {
namespace {

using ::attend::planner::testing::ExpectSameShape;
using ::attend::planner::testing::GgufWriter;
using ::attend::planner::testing::Preset;
using ::attend::testing::StatusIs;

constexpr auto kInvalid = absl::StatusCode::kInvalidArgument;

// The metadata llama.cpp's converter writes for Meta-Llama-3-8B (bf16), without the tokenizer's
// large arrays.
GgufWriter Llama3Header() {
  GgufWriter w;
  w.Str("general.architecture", "llama")
      .Str("general.name", "Meta Llama 3 8B")
      .U32("llama.block_count", 32)
      .U32("llama.context_length", 8192)
      .U32("llama.embedding_length", 4096)
      .U32("llama.feed_forward_length", 14336)
      .U32("llama.attention.head_count", 32)
      .U32("llama.attention.head_count_kv", 8)
      .F32("llama.rope.freq_base", 500000.0f)
      .F32("llama.attention.layer_norm_rms_epsilon", 1e-5f)
      .U32("general.file_type", 32)
      .U32("llama.vocab_size", 128256)
      .U32("llama.rope.dimension_count", 128)
      .Str("tokenizer.ggml.model", "gpt2")
      .StrArray("tokenizer.ggml.tokens", {"!", "\"", "#"});
  return w;
}

TEST(ImportGguf, Llama3HeaderMatchesTheCatalog) {
  absl::StatusOr<ModelSpec> m = ImportGguf(Llama3Header().Build(), "");
  ASSERT_OK(m);
  EXPECT_EQ(m->name, "meta-llama-3-8b");
  EXPECT_EQ(m->display_name, "Meta Llama 3 8B");
  EXPECT_TRUE(absl::StrContains(m->source, "GGUF v3 header (architecture llama, 15 key/values)"))
      << m->source;
  ExpectSameShape(*m, Preset("llama-3-8b"));
}

TEST(ImportGguf, Version2AndTokenCountAsVocabulary) {
  GgufWriter w;
  w.Str("general.architecture", "qwen2")
      .U32("qwen2.block_count", 2)
      .U32("qwen2.embedding_length", 896)
      .U32("qwen2.attention.head_count", 14)
      .U32("qwen2.attention.head_count_kv", 2)
      .StrArray("tokenizer.ggml.tokens", std::vector<std::string>(1000, "tok"));
  absl::StatusOr<ModelSpec> m = ImportGguf(w.Build(2), "q");
  ASSERT_OK(m);
  EXPECT_EQ(m->vocab_size, 1000);
  EXPECT_EQ(m->head_dim, 64);
  EXPECT_EQ(m->name, "q");
  EXPECT_TRUE(m->weights_dtype.empty());  // no general.file_type
}

// Per-layer KV head counts (as llama.cpp writes for models such as OpenELM) become layer_specs;
// the model-wide count is their maximum, and the cache adds up layer by layer.
TEST(ImportGguf, PerLayerHeadCountKv) {
  GgufWriter w;
  w.Str("general.architecture", "llama")
      .U32("llama.block_count", 4)
      .U32("llama.embedding_length", 256)
      .U32("llama.context_length", 4096)
      .U32("llama.attention.head_count", 8)
      .Array<int32_t>("llama.attention.head_count_kv", gguf::kI32, {2, 2, 4, 1});
  absl::StatusOr<ModelSpec> m = ImportGguf(w.Build(), "per-layer");
  ASSERT_OK(m);
  EXPECT_EQ(m->n_head_kv, 4);
  ASSERT_EQ(m->layer_specs.size(), 4u);
  EXPECT_EQ(LayerKvHeads(*m, 0), 2);
  EXPECT_EQ(LayerKvHeads(*m, 2), 4);
  EXPECT_EQ(LayerKvHeads(*m, 3), 1);
  // f16, head 32: (2 + 2 + 4 + 1) heads x (32 + 32) values x 2 bytes per token.
  EXPECT_EQ(*KvBytesPerSequence(*m, KvDType::kFloat16, 1), 9 * 64 * 2);
  EXPECT_EQ(*KvBytesPerSequence(*m, KvDType::kFloat16, 4096), 9 * 64 * 2 * 4096);
}

TEST(ImportGguf, UniformPerLayerArrayNeedsNoLayerSpecs) {
  GgufWriter w;
  w.Str("general.architecture", "llama")
      .U32("llama.block_count", 3)
      .U32("llama.embedding_length", 256)
      .U32("llama.attention.head_count", 8)
      .Array<uint32_t>("llama.attention.head_count_kv", gguf::kU32, {2, 2, 2});
  absl::StatusOr<ModelSpec> m = ImportGguf(w.Build(), "u");
  ASSERT_OK(m);
  EXPECT_EQ(m->n_head_kv, 2);
  EXPECT_TRUE(m->layer_specs.empty());
}

TEST(ImportGguf, Gemma2SlidingWindowAlternates) {
  GgufWriter w;
  w.Str("general.architecture", "gemma2")
      .Str("general.name", "Gemma 2 9b")
      .U32("gemma2.block_count", 42)
      .U32("gemma2.context_length", 8192)
      .U32("gemma2.embedding_length", 3584)
      .U32("gemma2.feed_forward_length", 14336)
      .U32("gemma2.attention.head_count", 16)
      .U32("gemma2.attention.head_count_kv", 8)
      .U32("gemma2.attention.key_length", 256)
      .U32("gemma2.attention.value_length", 256)
      .U32("gemma2.attention.sliding_window", 4096)
      .F32("gemma2.attn_logit_softcapping", 50.0f)
      .U32("general.file_type", 0)
      .StrArray("tokenizer.ggml.tokens", std::vector<std::string>(256000, ""));
  absl::StatusOr<ModelSpec> m = ImportGguf(w.Build(), "");
  ASSERT_OK(m);
  ModelSpec expected = Preset("gemma-2-9b");
  // GGUF does not record tied embeddings (Gemma ties them), so the computed count lacks nothing
  // but gains a separate output matrix of vocab x d_model.
  EXPECT_FALSE(m->tied_embeddings);
  EXPECT_EQ(m->parameters, expected.parameters + 256000LL * 3584);
  expected.tied_embeddings = false;
  expected.parameters = expected.active_parameters = m->parameters;
  ExpectSameShape(*m, expected);
  EXPECT_EQ(m->name, "gemma-2-9b");
}

TEST(ImportGguf, SlidingWindowPatternAsPeriodOrBooleans) {
  GgufWriter w;
  w.Str("general.architecture", "gemma3")
      .U32("gemma3.block_count", 12)
      .U32("gemma3.embedding_length", 2560)
      .U32("gemma3.attention.head_count", 8)
      .U32("gemma3.attention.head_count_kv", 4)
      .U32("gemma3.attention.key_length", 256)
      .U32("gemma3.attention.sliding_window", 1024);
  absl::StatusOr<ModelSpec> m = ImportGguf(w.Build(), "g3");
  ASSERT_OK(m);
  for (int64_t i = 0; i < 12; ++i) EXPECT_EQ(LayerWindow(*m, i), i % 6 == 5 ? 0 : 1024) << i;

  GgufWriter b = w;
  b.Array<uint8_t>("gemma3.attention.sliding_window_pattern", gguf::kBool,
                   {1, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 0});
  m = ImportGguf(b.Build(), "g3");
  ASSERT_OK(m);
  EXPECT_EQ(LayerWindow(*m, 0), 1024);
  EXPECT_EQ(LayerWindow(*m, 1), 0);
  EXPECT_EQ(LayerWindow(*m, 2), 0);
  EXPECT_EQ(LayerWindow(*m, 11), 0);

  GgufWriter p = w;
  p.U32("gemma3.attention.sliding_window_pattern", 3);
  m = ImportGguf(p.Build(), "g3");
  ASSERT_OK(m);
  for (int64_t i = 0; i < 12; ++i) EXPECT_EQ(LayerWindow(*m, i), i % 3 == 2 ? 0 : 1024) << i;
}

// Every GGUF value type, arrays of each, and nested arrays are read (and skipped).
TEST(ImportGguf, ReadsEveryValueType) {
  GgufWriter w = Llama3Header();
  std::string nested;  // array of 2 arrays of u8
  GgufWriter::Put<uint32_t>(&nested, gguf::kArray);
  GgufWriter::Put<uint32_t>(&nested, gguf::kArray);
  GgufWriter::Put<uint64_t>(&nested, 2);
  for (int i = 0; i < 2; ++i) {
    GgufWriter::Put<uint32_t>(&nested, gguf::kU8);
    GgufWriter::Put<uint64_t>(&nested, 3);
    nested += "abc";
  }
  w.Scalar<uint8_t>("x.u8", gguf::kU8, 7)
      .Scalar<int8_t>("x.i8", gguf::kI8, -7)
      .Scalar<uint16_t>("x.u16", gguf::kU16, 700)
      .Scalar<int16_t>("x.i16", gguf::kI16, -700)
      .Scalar<int32_t>("x.i32", gguf::kI32, -70000)
      .Scalar<uint8_t>("x.bool", gguf::kBool, 1)
      .Scalar<int64_t>("x.i64", gguf::kI64, -7000000000)
      .Scalar<double>("x.f64", gguf::kF64, 0.5)
      .U64("x.u64", 7000000000)
      .Array<float>("x.f32s", gguf::kF32, {1.0f, 2.0f})
      .Array<double>("x.f64s", gguf::kF64, {1.0})
      .Array<int16_t>("x.i16s", gguf::kI16, {1, -1})
      .Array<uint64_t>("x.u64s", gguf::kU64, std::vector<uint64_t>(5000, 1))  // over the kept size
      .Raw("x.nested", nested)
      .Str("x." + std::string(300, 'k'), "a key too long to keep, still read");
  EXPECT_OK(ImportGguf(w.Build(), "all"));
}

// Every strict prefix of a valid header is refused with INVALID_ARGUMENT: the reader never reads
// past the end, whatever byte the input stops at.
TEST(ImportGguf, EveryTruncationFails) {
  const std::string full = Llama3Header().Build();
  ASSERT_OK(ImportGguf(full, "x"));
  for (size_t n = 0; n < full.size(); ++n) {
    EXPECT_THAT(ImportGguf(full.substr(0, n), "x"), StatusIs(kInvalid, {"gguf: "})) << n;
  }
  // Trailing bytes (tensor infos, data) are not read.
  EXPECT_OK(ImportGguf(full + std::string(1000, '\xAB'), "x"));
}

TEST(ImportGguf, RejectsBadHeaders) {
  EXPECT_THAT(ImportGguf("GG", ""), StatusIs(kInvalid, {"2 bytes, too short"}));
  EXPECT_THAT(ImportGguf("GGUX" + std::string(40, '\0'), ""),
              StatusIs(kInvalid, {"bad magic 'GGUX'"}));
  EXPECT_THAT(ImportGguf(GgufWriter::Header(1, 0, 0), ""),
              StatusIs(kInvalid, {"version 1 is not supported (2 or 3)"}));
  EXPECT_THAT(ImportGguf(GgufWriter::Header(4, 0, 0), ""),
              StatusIs(kInvalid, {"version 4 is not supported"}));
  EXPECT_THAT(ImportGguf(GgufWriter::Header(0x03000000, 0, 0), ""),
              StatusIs(kInvalid, {"big-endian"}));
  EXPECT_THAT(ImportGguf(GgufWriter::Header(3, uint64_t{1} << 40, 0), ""),
              StatusIs(kInvalid, {"tensor_count 1099511627776 is over the limit"}));
  EXPECT_THAT(ImportGguf(GgufWriter::Header(3, 0, uint64_t{1} << 60), ""),
              StatusIs(kInvalid, {"kv_count 1152921504606846976 is over the limit"}));
  // A plausible count that the input cannot hold is refused before reading any key.
  EXPECT_THAT(ImportGguf(GgufWriter::Header(3, 0, 1000) + std::string(100, 'x'), ""),
              StatusIs(kInvalid, {"kv_count 1000 key/values cannot fit in the 100 bytes"}));
  EXPECT_THAT(ImportGguf(GgufWriter::Header(3, 0, 0), ""),
              StatusIs(kInvalid, {"'general.architecture' is missing"}));
}

// A header whose first key/value is general.architecture = "llama" and whose second is `raw`
// (key included), with the kv_count saying 2.
std::string WithSecondKey(const std::string& key, const std::string& type_and_value,
                          size_t padding = 64) {
  GgufWriter w;
  w.Str("general.architecture", "llama").Raw(key, type_and_value);
  return w.Build() + std::string(padding, '\0');
}

std::string TypeAndValue(uint32_t type, const std::string& value) {
  std::string out;
  GgufWriter::Put(&out, type);
  return out + value;
}

std::string U64Bytes(uint64_t v) {
  std::string out;
  GgufWriter::Put(&out, v);
  return out;
}

TEST(ImportGguf, RefusesLengthsPastTheEnd) {
  // The string value of key 1 claims 2^40 bytes.
  const std::string input =
      WithSecondKey("llama.block_count", TypeAndValue(gguf::kString, U64Bytes(uint64_t{1} << 40)));
  EXPECT_THAT(ImportGguf(input, ""),
              StatusIs(kInvalid, {"gguf: key 1 'llama.block_count': string length 1099511627776",
                                  "runs past the end of the " + std::to_string(input.size()) +
                                      "-byte input"}));
  // A key whose length runs past the end.
  std::string key_too_long = GgufWriter::Header(3, 0, 1) + U64Bytes(uint64_t{1} << 40);
  key_too_long += std::string(20, 'k');
  EXPECT_THAT(ImportGguf(key_too_long, ""),
              StatusIs(kInvalid, {"key 0: key length 1099511627776 at offset 24 runs past"}));
  // An array whose element count cannot fit in what remains.
  std::string array;
  GgufWriter::Put<uint32_t>(&array, gguf::kU32);
  GgufWriter::Put<uint64_t>(&array, 1000000);
  EXPECT_THAT(ImportGguf(WithSecondKey("x.array", TypeAndValue(gguf::kArray, array)), ""),
              StatusIs(kInvalid,
                       {"key 1 'x.array': array of 1000000 uint32 elements", "runs past the end"}));
  // The same for an array of strings, each of which needs at least 8 bytes.
  array.clear();
  GgufWriter::Put<uint32_t>(&array, gguf::kString);
  GgufWriter::Put<uint64_t>(&array, uint64_t{1} << 62);
  EXPECT_THAT(ImportGguf(WithSecondKey("x.array", TypeAndValue(gguf::kArray, array)), ""),
              StatusIs(kInvalid, {"array of 4611686018427387904 string elements"}));
}

TEST(ImportGguf, RefusesMalformedValues) {
  EXPECT_THAT(ImportGguf(WithSecondKey("x.y", TypeAndValue(13, "")), ""),
              StatusIs(kInvalid, {"key 1 'x.y': value type 13 is not a GGUF type"}));
  std::string bad_element;
  GgufWriter::Put<uint32_t>(&bad_element, 20);
  GgufWriter::Put<uint64_t>(&bad_element, 1);
  EXPECT_THAT(ImportGguf(WithSecondKey("x.y", TypeAndValue(gguf::kArray, bad_element)), ""),
              StatusIs(kInvalid, {"array element type 20 is not a GGUF type"}));
  EXPECT_THAT(ImportGguf(WithSecondKey("x.y", TypeAndValue(gguf::kBool, "\x02")), ""),
              StatusIs(kInvalid, {"bool value 2 is neither 0 nor 1"}));
  EXPECT_THAT(ImportGguf(WithSecondKey("", TypeAndValue(gguf::kU8, "\x01")), ""),
              StatusIs(kInvalid, {"key 1: empty key"}));
  EXPECT_THAT(
      ImportGguf(WithSecondKey("general.architecture", TypeAndValue(gguf::kU8, "\x01")), ""),
      StatusIs(kInvalid, {"key 1 'general.architecture': duplicate key"}));
  // Arrays of arrays five levels deep.
  std::string nested;
  for (int i = 0; i < 5; ++i) {
    GgufWriter::Put<uint32_t>(&nested, gguf::kArray);
    GgufWriter::Put<uint64_t>(&nested, 1);
  }
  GgufWriter::Put<uint32_t>(&nested, gguf::kU8);
  GgufWriter::Put<uint64_t>(&nested, 0);
  EXPECT_THAT(ImportGguf(WithSecondKey("x.y", TypeAndValue(gguf::kArray, nested)), ""),
              StatusIs(kInvalid, {"arrays nested deeper than 4 levels"}));
}

TEST(ImportGguf, RefusesBadModelKeys) {
  const auto with = [](GgufWriter w) { return ImportGguf(w.Build(), "x"); };
  GgufWriter base;
  base.Str("general.architecture", "llama")
      .U32("llama.embedding_length", 4096)
      .U32("llama.attention.head_count", 32);

  EXPECT_THAT(with(base), StatusIs(kInvalid, {"'llama.block_count' is missing"}));
  EXPECT_THAT(with(GgufWriter(base).Str("llama.block_count", "32")),
              StatusIs(kInvalid, {"'llama.block_count': is a string; expected an integer"}));
  EXPECT_THAT(with(GgufWriter(base).U32("llama.block_count", 0)),
              StatusIs(kInvalid, {"'llama.block_count': 0; must be in [1, 4096]"}));
  EXPECT_THAT(with(GgufWriter(base).U64("llama.block_count", ~uint64_t{0})),
              StatusIs(kInvalid, {"'llama.block_count': 18446744073709551615 is above 2^63 - 1",
                                  "must be in [1, 4096]"}));
  EXPECT_THAT(with(GgufWriter(base).Scalar<int32_t>("llama.block_count", gguf::kI32, -4)),
              StatusIs(kInvalid, {"'llama.block_count': -4"}));

  GgufWriter four = GgufWriter(base).U32("llama.block_count", 4);
  EXPECT_OK(with(four));
  EXPECT_THAT(
      with(GgufWriter(four).U32("llama.attention.head_count_kv", 3)),
      StatusIs(kInvalid, {"'llama.attention.head_count_kv': 3 does not divide head_count 32"}));
  EXPECT_THAT(with(GgufWriter(four).U32("llama.attention.head_count_kv", 64)),
              StatusIs(kInvalid, {"'llama.attention.head_count_kv': 64; must be in [1, 32]"}));
  EXPECT_THAT(with(GgufWriter(four).Array<int32_t>("llama.attention.head_count_kv", gguf::kI32,
                                                   {8, 8, 6, 8})),
              StatusIs(kInvalid, {"'llama.attention.head_count_kv[2]': 6 does not divide"}));
  EXPECT_THAT(with(GgufWriter(four).Array<int32_t>("llama.attention.head_count_kv", gguf::kI32,
                                                   {8, 0, 8, 8})),
              StatusIs(kInvalid, {"'llama.attention.head_count_kv[1]': 0; must be in [1, 32]"}));
  EXPECT_THAT(
      with(GgufWriter(four).Array<int32_t>("llama.attention.head_count_kv", gguf::kI32, {8, 8, 8})),
      StatusIs(kInvalid, {"has 3 values for 4 layers"}));
  EXPECT_THAT(with(GgufWriter(four).StrArray("llama.attention.head_count_kv", {"8"})),
              StatusIs(kInvalid, {"is an array of string; expected integers"}));

  GgufWriter odd;
  odd.Str("general.architecture", "llama")
      .U32("llama.block_count", 2)
      .U32("llama.embedding_length", 100)
      .U32("llama.attention.head_count", 32);
  EXPECT_THAT(with(odd), StatusIs(kInvalid, {"100 is not a multiple of head_count 32"}));

  GgufWriter heads;
  heads.Str("general.architecture", "llama")
      .U32("llama.block_count", 2)
      .U32("llama.embedding_length", 256)
      .Array<int32_t>("llama.attention.head_count", gguf::kI32, {8, 4});
  EXPECT_THAT(with(heads), StatusIs(kInvalid, {"per-layer query head counts that differ"}));

  GgufWriter arch;
  arch.Str("general.architecture", "../x\xFF");
  EXPECT_THAT(with(arch), StatusIs(kInvalid, {"is not a plain name", "\\xff"}));
  GgufWriter no_arch;
  no_arch.U32("general.architecture", 1);
  EXPECT_THAT(with(no_arch), StatusIs(kInvalid, {"'general.architecture': is a uint32"}));
}

// Key/values the importer does not read are dropped; decoys of the keys it does read are
// bounded.
TEST(ImportGguf, BoundsTheKeysItKeeps) {
  GgufWriter w = Llama3Header();
  for (uint32_t i = 0; i < 2000; ++i) w.U32("x.unused" + std::to_string(i), i);
  EXPECT_OK(ImportGguf(w.Build(), "x"));
  GgufWriter decoys = Llama3Header();
  for (int i = 0; i < 300; ++i) decoys.U32("d" + std::to_string(i) + ".block_count", 1);
  EXPECT_THAT(ImportGguf(decoys.Build(), "x"), StatusIs(kInvalid, {"more than 256 model keys"}));
}

// Random corruption of a valid header either imports or fails with INVALID_ARGUMENT.
TEST(ImportGguf, SurvivesByteCorruption) {
  const std::string full = Llama3Header().Build();
  uint64_t state = 12345;
  const auto next = [&] {
    state = state * 6364136223846793005ULL + 1442695040888963407ULL;
    return state >> 33;
  };
  for (int i = 0; i < 20000; ++i) {
    std::string corrupted = full;
    for (int e = 0; e < 3; ++e) {
      corrupted[next() % corrupted.size()] = static_cast<char>(next() & 0xFF);
    }
    absl::StatusOr<ModelSpec> m = ImportGguf(corrupted, "");
    if (!m.ok()) {
      ASSERT_EQ(m.status().code(), kInvalid) << m.status();
    }
  }
}

}  // namespace
}  // namespace attend::planner
