#include "planner/model.h"

#include <limits>

#include "planner/parameter_counts.h"
#include "tests/planner/planner_test_util.h"
#include "tests/test_util.h"

namespace attend::planner {
namespace {

using ::attend::planner::testing::Preset;
using ::attend::testing::StatusIs;

constexpr auto kInvalid = absl::StatusCode::kInvalidArgument;

ModelSpec Shape(int64_t layers, int64_t n_head, int64_t n_head_kv, int64_t head_dim) {
  ModelSpec m;
  m.name = "shape";
  m.layers = layers;
  m.n_head = n_head;
  m.n_head_kv = n_head_kv;
  m.head_dim = head_dim;
  return m;
}

TEST(StorageBytes, PlainTypesAreValuesTimesWidth) {
  EXPECT_EQ(StorageBytes(KvDType::kFloat32, 128), 512);
  EXPECT_EQ(StorageBytes(KvDType::kFloat16, 128), 256);
  EXPECT_EQ(StorageBytes(KvDType::kBFloat16, 128), 256);
  EXPECT_EQ(StorageBytes(KvDType::kFp8, 128), 128);
  EXPECT_EQ(StorageBytes(KvDType::kInt8, 128), 128);
}

TEST(StorageBytes, BlockTypesRoundUpToWholeBlocksOf32) {
  // 128 values = 4 blocks: 4 x 34 and 4 x 18.
  EXPECT_EQ(StorageBytes(KvDType::kQ8_0, 128), 136);
  EXPECT_EQ(StorageBytes(KvDType::kQ4_0, 128), 72);
  // 80 values need ceil(80 / 32) = 3 blocks; 1 value still takes a whole block.
  EXPECT_EQ(StorageBytes(KvDType::kQ8_0, 80), 102);
  EXPECT_EQ(StorageBytes(KvDType::kQ4_0, 1), 18);
  EXPECT_EQ(StorageBytes(KvDType::kQ4_0, 0), 0);
}

TEST(StorageBytes, OverflowAndNegativeAreNullopt) {
  EXPECT_FALSE(StorageBytes(KvDType::kFloat32, std::numeric_limits<int64_t>::max()).has_value());
  EXPECT_FALSE(StorageBytes(KvDType::kQ8_0, std::numeric_limits<int64_t>::max()).has_value());
  EXPECT_FALSE(StorageBytes(KvDType::kFloat16, -1).has_value());
  // The largest q4_0 count that fits: ceil(INT64_MAX / 32) blocks x 18 bytes < 2^63.
  EXPECT_TRUE(StorageBytes(KvDType::kQ4_0, std::numeric_limits<int64_t>::max()).has_value());
}

TEST(BytesPerValue, BlockFormatsAreFractional) {
  EXPECT_DOUBLE_EQ(BytesPerValue(KvDType::kQ8_0), 8.5 / 8);
  EXPECT_DOUBLE_EQ(BytesPerValue(KvDType::kQ4_0), 4.5 / 8);
  EXPECT_DOUBLE_EQ(BytesPerValue(KvDType::kFloat16), 2.0);
}

TEST(ParseDType, AcceptsNamesAndAliases) {
  EXPECT_EQ(*ParseDType("BF16", "f"), KvDType::kBFloat16);
  EXPECT_EQ(*ParseDType("fp16", "f"), KvDType::kFloat16);
  EXPECT_EQ(*ParseDType("float8_e4m3fn", "f"), KvDType::kFp8);
  EXPECT_EQ(*ParseDType("q8_0", "f"), KvDType::kQ8_0);
  for (KvDType t : {KvDType::kFloat32, KvDType::kFloat16, KvDType::kBFloat16, KvDType::kFp8,
                    KvDType::kInt8, KvDType::kQ8_0, KvDType::kQ4_0}) {
    EXPECT_EQ(*ParseDType(DTypeName(t), "f"), t);
  }
  EXPECT_THAT(ParseDType("float64", "kv_dtype"),
              StatusIs(kInvalid, {"kv_dtype", "'float64'", "q4_0"}));
}

TEST(CanonicalModel, FillsDefaults) {
  ModelSpec m = Shape(2, 8, 0, 64);
  m.layer_specs = {{0, 0}, {4, 16}};
  m.parameters = 100;
  m.weights_dtype = "BF16";
  absl::StatusOr<ModelSpec> c = CanonicalModel(m);
  ASSERT_OK(c);
  EXPECT_EQ(c->n_head_kv, 8);
  EXPECT_EQ(c->head_dim_v, 64);
  EXPECT_EQ(c->active_parameters, 100);
  EXPECT_EQ(c->weights_dtype, "bfloat16");
  EXPECT_EQ(c->layer_specs[0].n_head_kv, 8);
  EXPECT_EQ(c->layer_specs[1].n_head_kv, 4);
  EXPECT_EQ(LayerKvHeads(*c, 1), 4);
  EXPECT_EQ(LayerWindow(*c, 1), 16);
  EXPECT_TRUE(HasSlidingWindows(*c));
}

TEST(CanonicalModel, RejectsBadShapesNamingTheField) {
  EXPECT_THAT(ValidateModel(Shape(0, 8, 2, 32)), StatusIs(kInvalid, {"layers: 0"}));
  EXPECT_THAT(ValidateModel(Shape(4, -8, 2, 32)), StatusIs(kInvalid, {"n_head: -8"}));
  EXPECT_THAT(ValidateModel(Shape(4, 8, -2, 32)), StatusIs(kInvalid, {"n_head_kv: -2"}));
  EXPECT_THAT(ValidateModel(Shape(4, 32, 3, 32)),
              StatusIs(kInvalid, {"n_head_kv: 3 does not divide n_head 32"}));
  EXPECT_THAT(ValidateModel(Shape(4, 8, 16, 32)), StatusIs(kInvalid, {"n_head_kv: 16"}));
  EXPECT_THAT(ValidateModel(Shape(4, 8, 2, 0)), StatusIs(kInvalid, {"head_dim: 0"}));
  EXPECT_THAT(ValidateModel(Shape(kMaxLayers + 1, 8, 2, 32)), StatusIs(kInvalid, {"layers"}));
  EXPECT_THAT(ValidateModel(Shape(4, 8, 2, int64_t{1} << 40)), StatusIs(kInvalid, {"head_dim"}));

  ModelSpec m = Shape(4, 8, 2, 32);
  m.layer_specs = {{2, 0}, {2, 0}};
  EXPECT_THAT(ValidateModel(m), StatusIs(kInvalid, {"layer_specs: 2 entries for 4 layers"}));
  m.layer_specs = {{2, 0}, {2, 0}, {3, 0}, {2, 0}};
  EXPECT_THAT(ValidateModel(m),
              StatusIs(kInvalid, {"layer_specs[2].n_head_kv: 3 does not divide n_head 8"}));
  m.layer_specs = {{2, 0}, {2, -1}, {2, 0}, {2, 0}};
  EXPECT_THAT(ValidateModel(m), StatusIs(kInvalid, {"layer_specs[1].window_tokens: -1"}));

  m = Shape(4, 8, 2, 32);
  m.weights_dtype = "float64";
  EXPECT_THAT(ValidateModel(m), StatusIs(kInvalid, {"weights_dtype"}));
  m = Shape(4, 8, 2, 32);
  m.experts = 8;
  m.experts_active = 9;
  EXPECT_THAT(ValidateModel(m), StatusIs(kInvalid, {"experts_active: 9"}));
  m = Shape(4, 8, 2, 32);
  m.parameters = 10;
  m.active_parameters = 11;
  EXPECT_THAT(ValidateModel(m), StatusIs(kInvalid, {"active_parameters: 11"}));
  m = Shape(4, 8, 2, 32);
  m.name = std::string(kMaxNameBytes + 1, 'x');
  EXPECT_THAT(ValidateModel(m), StatusIs(kInvalid, {"name: 257 bytes"}));
  m = Shape(4, 8, 2, 32);
  m.max_context_tokens = -1;
  EXPECT_THAT(ValidateModel(m), StatusIs(kInvalid, {"max_context_tokens: -1"}));
}

// A caller that checks a model nested in a request passes its path: every field is named under it.
TEST(CanonicalModel, NamesFieldsUnderTheGivenPrefix) {
  EXPECT_THAT(ValidateModel(Shape(4, 32, 3, 32), "model.spec"),
              StatusIs(kInvalid, {"model.spec.n_head_kv: 3 does not divide n_head 32"}));
  ModelSpec m = Shape(4, 8, 2, 32);
  m.layer_specs = {{2, 0}, {2, -1}, {2, 0}, {2, 0}};
  EXPECT_THAT(CanonicalModel(m, "model.spec"),
              StatusIs(kInvalid, {"model.spec.layer_specs[1].window_tokens: -1"}));
  m = Shape(4, 8, 2, 32);
  m.weights_dtype = "float64";
  EXPECT_THAT(ValidateModel(m, "spec"), StatusIs(kInvalid, {"spec.weights_dtype: 'float64'"}));
  m = Shape(4, 8, 2, 32);
  m.experts = 8;
  m.experts_active = 2;
  m.parameters = 10;
  EXPECT_THAT(ValidateModel(m, "spec"),
              StatusIs(kInvalid, {"spec.active_parameters: 0 for a mixture-of-experts model"}));
  EXPECT_EQ(FieldPath("", "layers"), "layers");
  EXPECT_EQ(FieldPath("model.spec", "layer_specs[2]"), "model.spec.layer_specs[2]");
}

// Names are printed by the CLI and echoed in answers: control characters (escape sequences,
// newlines) are refused, as they are in sequence ids; other UTF-8 text is kept.
TEST(CanonicalModel, RejectsControlCharactersInNames) {
  for (const std::string& name : {std::string("\x1b[2J\x1b[31mpwned"), std::string("a\r\nb"),
                                  std::string("tab\there"), std::string("del\x7f"),
                                  std::string("csi\xc2\x9b"
                                              "2J"),
                                  std::string("nel\xc2\x85")}) {
    ModelSpec m = Shape(4, 8, 2, 32);
    m.name = name;
    EXPECT_THAT(ValidateModel(m, "model.spec"),
                StatusIs(kInvalid, {"model.spec.name", "control character"}));
    m = Shape(4, 8, 2, 32);
    m.display_name = name;
    EXPECT_THAT(ValidateModel(m), StatusIs(kInvalid, {"display_name", "control character"}));
  }
  ModelSpec m = Shape(4, 8, 2, 32);
  m.name = "my-model";
  m.display_name = "Modèle 8B (été)";
  EXPECT_OK(ValidateModel(m));
}

// Lesson 3, Example 10: the per-layer projections of the 8B shape, and the parameter count built
// on them.
TEST(ComputeParameters, LessonPerLayerProjections) {
  const ModelSpec m = Preset("llama-3-8b");
  const ProjectionParameters c = LayerProjectionParameters(m, 0);
  EXPECT_EQ(c.wq, 16777216);
  EXPECT_EQ(c.wk, 4194304);
  EXPECT_EQ(c.wv, 4194304);
  EXPECT_EQ(c.wo, 16777216);
  absl::StatusOr<ParameterCount> p = ComputeParameters(m);
  ASSERT_OK(p);
  EXPECT_EQ(p->per_layer_attention, 16777216 + 4194304 + 4194304 + 16777216);
  EXPECT_EQ(p->per_layer_mlp, 3LL * 4096 * 14336);
  EXPECT_EQ(p->embedding, 128256LL * 4096);
  EXPECT_EQ(p->lm_head, 128256LL * 4096);
}

TEST(ComputeParameters, HandCountOfTheTinyModel) {
  const ModelSpec m = Preset("tiny");
  // Embeddings and head 2 x 32000 x 256; per layer Wq 256x256, Wk/Wv 256x64, Wo 256x256,
  // MLP 3 x 256 x 768, 2 norms of 256; final norm 256.
  const int64_t per_layer = 65536 + 16384 + 16384 + 65536 + 3 * 256 * 768 + 2 * 256;
  const int64_t expected = 2LL * 32000 * 256 + 4 * per_layer + 256;
  absl::StatusOr<ParameterCount> p = ComputeParameters(m);
  ASSERT_OK(p);
  EXPECT_EQ(p->total, expected);
  EXPECT_EQ(m.parameters, expected);
}

// Falcon's MLP is not gated: two d_model x intermediate matrices (and a GELU), where a Llama
// layer has three (gate, up, down). Its norms are LayerNorms, a weight and a bias each: one per
// multi-query layer (Falcon-7B's parallel block), two per layer otherwise (ln_attn and ln_mlp of
// the new decoder architecture), and a final one.
TEST(ComputeParameters, FalconMlpHasTwoMatrices) {
  ModelSpec m = Shape(2, 8, 1, 32);
  m.d_model = 256;
  m.vocab_size = 1000;
  m.intermediate_size = 1024;
  m.tied_embeddings = true;
  m.architecture = "falcon";
  // Per layer: Wq 256 x 256, Wk and Wv 256 x 32 each, Wo 256 x 256, MLP 2 x 256 x 1024, one
  // LayerNorm 2 x 256; final LayerNorm 2 x 256; embeddings 1000 x 256 (tied).
  const int64_t attention = 65536 + 8192 + 8192 + 65536;
  const int64_t multi_query_layer = attention + 2 * 256 * 1024 + 2 * 256;
  absl::StatusOr<ParameterCount> p = ComputeParameters(*CanonicalModel(m));
  ASSERT_OK(p);
  EXPECT_EQ(p->per_layer_mlp, 2 * 256 * 1024);
  EXPECT_EQ(p->total, 1000 * 256 + 2 * multi_query_layer + 2 * 256);

  // With 4 key/value groups: Wk and Wv 256 x 128 each, and two LayerNorms per layer.
  m.n_head_kv = 4;
  const int64_t grouped_layer = 65536 + 2 * 32768 + 65536 + 2 * 256 * 1024 + 4 * 256;
  p = ComputeParameters(*CanonicalModel(m));
  ASSERT_OK(p);
  EXPECT_EQ(p->total, 1000 * 256 + 2 * grouped_layer + 2 * 256);

  // The same shape as a Llama-style model keeps its gated MLP and RMSNorms.
  m.architecture = "llama";
  p = ComputeParameters(*CanonicalModel(m));
  ASSERT_OK(p);
  EXPECT_EQ(p->per_layer_mlp, 3 * 256 * 1024);
  EXPECT_EQ(p->total,
            1000 * 256 + 2 * (65536 + 2 * 32768 + 65536 + 3 * 256 * 1024 + 2 * 256) + 256);
}

TEST(ComputeParameters, NeedsTheWholeShape) {
  ModelSpec m = *CanonicalModel(Shape(4, 8, 2, 32));
  EXPECT_THAT(ComputeParameters(m), StatusIs(kInvalid, {"d_model is unknown"}));
  m.d_model = 256;
  m.vocab_size = 100;
  EXPECT_THAT(ComputeParameters(m), StatusIs(kInvalid, {"intermediate_size is unknown"}));
}

TEST(ComputeParameters, PerLayerKvHeadsChangeOnlyWkWv) {
  ModelSpec m = Shape(2, 8, 2, 32);
  m.d_model = 256;
  m.vocab_size = 10;
  m.intermediate_size = 16;
  m.tied_embeddings = true;
  const int64_t uniform = ComputeParameters(*CanonicalModel(m))->total;
  m.layer_specs = {{2, 0}, {8, 0}};
  // Layer 1 gains (8 - 2) KV heads of Wk and Wv: 2 x 256 x 6 x 32.
  EXPECT_EQ(ComputeParameters(*CanonicalModel(m))->total, uniform + 2 * 256 * 6 * 32);
}

TEST(PlannerFormat, BytesCountsAndQuotes) {
  EXPECT_EQ(FormatBytes(4194304), "4.00 MiB");
  EXPECT_EQ(FormatBytes(int64_t{1} << 30), "1.00 GiB");
  EXPECT_EQ(FormatBytes(512 * 1024), "512.00 KiB");
  EXPECT_EQ(FormatBytes(100), "100 bytes");
  EXPECT_EQ(FormatCount(4194304), "4,194,304");
  EXPECT_EQ(FormatCount(-1234), "-1,234");
  EXPECT_EQ(FormatCount(std::numeric_limits<int64_t>::min()), "-9,223,372,036,854,775,808");
  EXPECT_EQ(QuoteForError("a\x01z"), "'a\\x01z'");
  EXPECT_EQ(QuoteForError(std::string(100, 'x'), 3), "'xxx...'");
}

}  // namespace
}  // namespace attend::planner
