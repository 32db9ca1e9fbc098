// ImportHfConfig on the 2025-2026 releases that need the planner's newer layer kinds and fields
// (tests/planner/recent_model_files.h names each file's source): DeepSeek sparse attention's
// indexer (DeepSeek-V3.2, GLM-5), lightning attention (MiniMax-M1), Kimi Delta Attention mixed
// with MLA (Kimi Linear), per-layer key/value heads (MiMo-V2-Flash), gated delta-net with an
// explicit layer list and an output gate (Qwen3.5), and a multimodal wrapper around a modelled
// text model (Kimi-K2.5). Each is planned in bfloat16 and checked against bytes computed by hand
// in the comment above it (formulas: planner/import/hf_layers.h, planner/kv_plan.h).
#include <initializer_list>
#include <optional>
#include <set>
#include <string>
#include <tuple>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "core/base/status_macros.h"
#include "planner/catalog.h"
#include "planner/import/hf_config.h"
#include "planner/import/hf_fields.h"
#include "planner/kv_plan.h"
#include "planner/model.h"
#include "tests/planner/hybrid_model_files.h"
#include "tests/planner/recent_model_files.h"
#include "tests/test_util.h"

namespace attend::planner {
namespace {

using ::attend::testing::StatusIs;
using ::testing::HasSubstr;
namespace files = ::attend::planner::testing;

constexpr auto kInvalid = absl::StatusCode::kInvalidArgument;

absl::StatusOr<KvPlan> Plan(const std::string& json, int64_t context,
                            std::optional<KvDType> indexer = std::nullopt,
                            KvDType kv = KvDType::kBFloat16) {
  ATTEND_ASSIGN_OR_RETURN(const ModelSpec m, ImportHfConfig(json, ""));
  KvPlanRequest r;
  r.kv_dtype = kv;
  r.context_tokens = context;
  r.indexer_dtype = indexer;
  return PlanKvCache(m, r);
}

KvPlan PlanBf16(const std::string& json, int64_t context) {
  absl::StatusOr<KvPlan> p = Plan(json, context);
  EXPECT_TRUE(p.ok()) << p.status();
  return p.ok() ? *p : KvPlan{};
}

int64_t CountKind(const ModelSpec& m, LayerKind kind) {
  int64_t n = 0;
  for (const LayerSpec& l : m.layer_specs) n += l.kind == kind ? 1 : 0;
  return n;
}

// The imported model has the catalog preset's layers (the preset is built from the same file).
void ExpectPresetLayers(const KvPlan& imported, const std::string& preset) {
  absl::StatusOr<ModelSpec> p = FindModel(preset);
  ASSERT_TRUE(p.ok()) << p.status();
  absl::StatusOr<ModelSpec> c = CanonicalModel(*p);
  ASSERT_TRUE(c.ok()) << c.status();
  ASSERT_EQ(imported.model.layer_specs.size(), c->layer_specs.size());
  for (size_t i = 0; i < c->layer_specs.size(); ++i) {
    const LayerSpec& a = imported.model.layer_specs[i];
    const LayerSpec& b = c->layer_specs[i];
    EXPECT_EQ(a.kind, b.kind) << i;
    EXPECT_EQ(a.n_head_kv, b.n_head_kv) << i;
    EXPECT_EQ(a.window_tokens, b.window_tokens) << i;
    EXPECT_EQ(a.kv_lora_rank, b.kv_lora_rank) << i;
    EXPECT_EQ(a.qk_rope_head_dim, b.qk_rope_head_dim) << i;
    EXPECT_EQ(a.index_head_dim, b.index_head_dim) << i;
    EXPECT_EQ(a.conv_state_values, b.conv_state_values) << i;
    EXPECT_EQ(a.recurrent_state_values, b.recurrent_state_values) << i;
  }
  EXPECT_EQ(imported.model.head_dim, c->head_dim);
  EXPECT_EQ(imported.model.head_dim_v, c->head_dim_v);
  EXPECT_EQ(imported.model.n_head, c->n_head);
}

// DeepSeek-V3.2: each of the 61 latent layers caches 512 + 64 = 576 bf16 values (1,152 bytes)
// and the indexer's key, 128 fp8 values + one float32 scale = 132 bytes: 1,284 bytes per layer,
// 61 x 1,284 = 78,324 per token, of which 61 x 132 = 8,052 are the indexer's. The indexer is a
// key cache: the key half is all of it. In the KV type asked for (bf16): 128 x 2 = 256 bytes,
// 61 x (1,152 + 256) = 85,888. With fp8 latents and the published indexer: 61 x (576 + 132) =
// 43,188. Expanded heads: 61 x (128 x (192 + 128) x 2 + 132) = 61 x 82,052 = 5,005,172.
TEST(ImportHfRecent, DeepSeekV32CachesTheIndexerBesideTheLatent) {
  const KvPlan p = PlanBf16(files::kDeepSeekV32, 4096);
  EXPECT_EQ(p.bytes_per_token, 78324);
  EXPECT_EQ(p.indexer_bytes_per_token, 8052);
  EXPECT_EQ(p.indexer_bytes_per_sequence, 8052 * 4096);
  EXPECT_EQ(p.k_bytes_per_token, 78324);
  EXPECT_EQ(p.v_bytes_per_token, 0);
  EXPECT_EQ(p.expanded_bytes_per_token, 5005172);
  EXPECT_EQ(p.bytes_per_sequence, 78324 * 4096);
  EXPECT_THAT(p.indexer_format, HasSubstr("fp8"));
  EXPECT_EQ(p.model.architecture, "deepseek_v32");
  EXPECT_EQ(CountKind(p.model, LayerKind::kLatentAttention), 61);
  EXPECT_EQ(p.model.layer_specs[0].index_head_dim, 128);
  // The breakdown shows the indexer part of each layer.
  ASSERT_EQ(p.layer_groups.size(), 1u);
  EXPECT_EQ(p.layer_groups[0].bytes_per_token, 1284);
  EXPECT_EQ(p.layer_groups[0].indexer_bytes_per_token, 132);

  absl::StatusOr<KvPlan> kv_typed = Plan(files::kDeepSeekV32, 4096, KvDType::kBFloat16);
  ASSERT_TRUE(kv_typed.ok()) << kv_typed.status();
  EXPECT_EQ(kv_typed->bytes_per_token, 85888);
  EXPECT_EQ(kv_typed->indexer_bytes_per_token, 61 * 256);
  EXPECT_EQ(kv_typed->indexer_format, "bfloat16");
  absl::StatusOr<KvPlan> fp8 = Plan(files::kDeepSeekV32, 4096, std::nullopt, KvDType::kFp8);
  ASSERT_TRUE(fp8.ok()) << fp8.status();
  EXPECT_EQ(fp8->bytes_per_token, 43188);
  // DeepSeek-V3 (no indexer) is unchanged: 70,272.
  EXPECT_EQ(PlanBf16(files::kDeepSeekV3, 4096).bytes_per_token, 70272);
  EXPECT_EQ(PlanBf16(files::kDeepSeekV3, 4096).indexer_bytes_per_token, 0);
  ExpectPresetLayers(p, "deepseek-v3.2");
}

// GLM-5 (GlmMoeDsaConfig's defaults): 78 latent layers of 576 bf16 values (1,152 bytes) plus the
// 132-byte indexer key: 78 x 1,284 = 100,152 bytes per token; 78 x 132 = 10,296 the indexer's.
TEST(ImportHfRecent, Glm5DefaultsPlanEveryLayerWithItsIndexer) {
  const KvPlan p = PlanBf16(files::Glm5Defaults(), 8192);
  EXPECT_EQ(p.bytes_per_token, 100152);
  EXPECT_EQ(p.indexer_bytes_per_token, 10296);
  EXPECT_EQ(p.model.head_dim, 256);
  EXPECT_EQ(p.model.head_dim_v, 256);
  EXPECT_EQ(CountKind(p.model, LayerKind::kLatentAttention), 78);
  ExpectPresetLayers(p, "glm-5");
  // GLM-5.2-style IndexShare (layers reusing another's selection) is refused, naming the field.
  const std::string shared = absl::StrReplaceAll(
      files::Glm5Defaults(), {{R"("indexer_types": ["full", "full", "full", "full")",
                               R"("indexer_types": ["full", "full", "full", "shared")"}});
  EXPECT_THAT(ImportHfConfig(shared, "").status(), StatusIs(kInvalid, {"indexer_types[3]"}));
  const std::string freq = absl::StrReplaceAll(
      files::Glm5Defaults(),
      {{R"("index_topk": 2048,)", R"("index_topk": 2048, "index_topk_freq": 4,)"}});
  EXPECT_THAT(ImportHfConfig(freq, "").status(), StatusIs(kInvalid, {"index_topk_freq"}));
}

// MiniMax-M1: 10 softmax layers (every eighth) x 8 KV heads x (128 + 128) x 2 bytes = 40,960
// bytes per token. 70 lightning layers hold 64 heads x 128 x 128 = 1,048,576 recurrent values
// and no convolution: 2,097,152 bytes each in bf16, 70 x 2,097,152 = 146,800,640 per sequence
// (293,601,280 in float32, as SGLang keeps it). At 4,096 tokens: 40,960 x 4,096 + 146,800,640 =
// 314,572,800.
TEST(ImportHfRecent, MiniMaxM1LightningLayersHoldARecurrentState) {
  const KvPlan p = PlanBf16(files::kMiniMaxM1, 4096);
  EXPECT_EQ(p.bytes_per_token, 40960);
  EXPECT_EQ(p.state_bytes_per_sequence, 146800640);
  EXPECT_EQ(p.bytes_per_sequence, 314572800);
  EXPECT_EQ(CountKind(p.model, LayerKind::kLightningAttention), 70);
  EXPECT_EQ(p.model.layer_specs[7].kind, LayerKind::kAttention);
  EXPECT_EQ(p.model.layer_specs[0].conv_state_values, 0);
  EXPECT_EQ(p.model.layer_specs[0].recurrent_state_values, 1048576);
  ASSERT_EQ(p.layer_groups.size(), 2u);
  EXPECT_EQ(p.layer_groups[0].layer.kind, LayerKind::kLightningAttention);
  EXPECT_EQ(p.layer_groups[0].state_bytes_per_sequence, 2097152);
  EXPECT_EQ(p.layer_groups[0].bytes_per_sequence + p.layer_groups[1].bytes_per_sequence,
            p.bytes_per_sequence);
  ModelSpec m = *ImportHfConfig(files::kMiniMaxM1, "");
  EXPECT_EQ(*StateBytesPerSequence(m, KvDType::kFloat32), 293601280);
  ExpectPresetLayers(p, "minimax-m1");
}

// Kimi Linear 48B-A3B: the 1-based full_attn_layers 4, 8, ..., 24, 27 are MLA, 7 x (512 + 64) x 2
// = 8,064 bytes per token. The 20 KDA layers: conv 3 (q, k, v) x (4 - 1) x 32 x 128 = 36,864
// values, recurrent 32 x 128 x 128 = 524,288; 561,152 x 2 = 1,122,304 bytes each, 20 x
// 1,122,304 = 22,446,080 per sequence.
TEST(ImportHfRecent, KimiLinearMixesKdaWithLatentLayers) {
  const KvPlan p = PlanBf16(files::kKimiLinear, 4096);
  EXPECT_EQ(p.bytes_per_token, 8064);
  EXPECT_EQ(p.state_bytes_per_sequence, 22446080);
  EXPECT_EQ(CountKind(p.model, LayerKind::kKimiDeltaAttention), 20);
  EXPECT_EQ(CountKind(p.model, LayerKind::kLatentAttention), 7);
  EXPECT_EQ(p.model.layer_specs[3].kind, LayerKind::kLatentAttention);  // layer 4, 1-based
  EXPECT_EQ(p.model.layer_specs[26].kind, LayerKind::kLatentAttention);
  EXPECT_EQ(p.model.layer_specs[0].conv_state_values, 36864);
  EXPECT_EQ(p.model.layer_specs[0].recurrent_state_values, 524288);
  EXPECT_EQ(p.model.experts_active, 8);  // num_experts_per_token
  ExpectPresetLayers(p, "kimi-linear-48b");
  // A layer named twice, or by neither list, is refused.
  const std::string twice =
      absl::StrReplaceAll(files::kKimiLinear, {{"[1, 2, 3,", "[1, 2, 3, 4,"}});
  EXPECT_THAT(ImportHfConfig(twice, "").status(),
              StatusIs(kInvalid, {"layer 4 (1-based) is named 2 times"}));
  const std::string past = absl::StrReplaceAll(files::kKimiLinear, {{"24, 27]", "24, 28]"}});
  EXPECT_THAT(ImportHfConfig(past, "").status(),
              StatusIs(kInvalid, {"linear_attn_config.full_attn_layers[6]"}));
}

// MiMo-V2-Flash: 9 full layers with 4 KV heads of (192 + 128) x 2 bytes = 2,560 bytes per token
// each (23,040), 39 sliding layers of 128 tokens with 8 KV heads, 5,120 each (199,680): 222,720
// bytes per token within the window, 23,040 past it. At 4,096 tokens: 23,040 x 4,096 + 199,680 x
// 128 = 94,371,840 + 25,559,040 = 119,930,880.
TEST(ImportHfRecent, MimoV2FlashSlidingLayersHaveTheirOwnKvHeads) {
  const KvPlan p = PlanBf16(files::kMiMoV2Flash, 4096);
  EXPECT_EQ(p.bytes_per_token, 222720);
  EXPECT_EQ(p.full_attention_bytes_per_token, 23040);
  EXPECT_EQ(p.bytes_per_sequence, 119930880);
  EXPECT_EQ(p.model.head_dim_v, 128);
  EXPECT_EQ(p.model.layer_specs[0].n_head_kv, 4);
  EXPECT_EQ(p.model.layer_specs[1].n_head_kv, 8);
  EXPECT_EQ(p.model.layer_specs[1].window_tokens, 128);
  EXPECT_EQ(p.model.layer_specs[5].n_head_kv, 4);
  ASSERT_EQ(p.layer_groups.size(), 2u);
  EXPECT_EQ(p.layer_groups[0].layer_indices.size(), 9u);
  EXPECT_EQ(p.layer_groups[0].bytes_per_token, 2560);
  EXPECT_EQ(p.layer_groups[1].layer_indices.size(), 39u);
  EXPECT_EQ(p.layer_groups[1].bytes_per_token, 5120);
  ExpectPresetLayers(p, "mimo-v2-flash");
  // Sliding layers with their own head size are not modelled: refused, naming the key.
  const std::string other = absl::StrReplaceAll(
      files::kMiMoV2Flash, {{R"("swa_head_dim": 192)", R"("swa_head_dim": 128)"}});
  EXPECT_THAT(ImportHfConfig(other, "").status(), StatusIs(kInvalid, {"swa_head_dim"}));
}

// Qwen3.5-35B-A3B: layer_types lists every fourth layer as full attention, 10 x 2 KV heads x 256
// x 2 x 2 = 20,480 bytes per token; the 30 gated delta-net layers hold 1,097,728 bytes each (as
// Qwen3-Next's, hf_hybrid_test.cc), 32,931,840 per sequence. attn_output_gate and the MTP layer
// do not change the cache.
TEST(ImportHfRecent, Qwen35ListsItsLayersAndGatesItsOutput) {
  const KvPlan p = PlanBf16(files::kQwen35MoeA3B, 4096);
  EXPECT_EQ(p.bytes_per_token, 20480);
  EXPECT_EQ(p.state_bytes_per_sequence, 32931840);
  EXPECT_EQ(CountKind(p.model, LayerKind::kLinearAttention), 30);
  EXPECT_EQ(p.model.architecture, "qwen3_5_moe_text");
  EXPECT_THAT(p.model.source, HasSubstr("planned from its text_config"));
}

// Kimi-K2.5-style: the wrapper is planned from its kimi_k2 text_config, as Kimi K2 itself:
// 61 x 576 x 2 = 70,272 bytes per token; transformers' nested defaults are ignored while off.
TEST(ImportHfRecent, MultimodalWrapperPlansFromItsTextConfig) {
  const KvPlan p = PlanBf16(files::kKimiK25Style, 4096);
  EXPECT_EQ(p.bytes_per_token, 70272);
  EXPECT_EQ(p.model.architecture, "kimi_k2");
  EXPECT_THAT(p.model.source, HasSubstr("model_type kimi_k25"));
  EXPECT_THAT(p.model.source, HasSubstr("planned from its text_config (model_type kimi_k2)"));
  // Set, they would change the layout: refused, naming the key.
  for (const auto& [from, to, field] :
       {std::tuple<const char*, const char*, const char*>{R"("add_cross_attention": false)",
                                                          R"("add_cross_attention": true)",
                                                          "'text_config.add_cross_attention'"},
        {R"("pruned_heads": {})", R"("pruned_heads": {"0": [1]})", "'text_config.pruned_heads'"}}) {
    const std::string set = absl::StrReplaceAll(files::kKimiK25Style, {{from, to}});
    EXPECT_THAT(ImportHfConfig(set, "").status(), StatusIs(kInvalid, {field}));
  }
}

// Every ignored key has a reason, no key is both read and ignored, and none is listed twice.
TEST(ImportHfRecent, IgnoredKeysAreDocumented) {
  std::set<std::string> seen;
  for (const IgnoredHfField& f : IgnoredHfFields()) {
    EXPECT_FALSE(f.reason.empty()) << f.key;
    EXPECT_FALSE(IsReadHfField(f.key)) << f.key;
    EXPECT_TRUE(seen.insert(std::string(f.key)).second) << f.key;
  }
  for (const char* key : {"mtp_num_hidden_layers", "mtp_transformer_layers",
                          "num_nextn_predict_layers", "attn_output_gate", "add_cross_attention"}) {
    EXPECT_TRUE(IsIgnoredHfField(key)) << key;
  }
}

// Still refused: keys that may change the layout and that nothing reads.
TEST(ImportHfRecent, UnknownLayoutKeysAreStillRefused) {
  const std::string unknown = absl::StrReplaceAll(
      files::kMiniMaxM1, {{R"("postnorm": true,)", R"("postnorm": true, "kv_share_layers": 2,)"}});
  EXPECT_THAT(ImportHfConfig(unknown, "").status(),
              StatusIs(kInvalid, {"'kv_share_layers': not understood"}));
  // A sub-config that names attention is judged, not skipped as another tower's.
  const std::string sub = absl::StrReplaceAll(
      files::kMiniMaxM1,
      {{R"("postnorm": true,)", R"("postnorm": true, "sparse_attn_config": {},)"}});
  EXPECT_THAT(ImportHfConfig(sub, "").status(), StatusIs(kInvalid, {"sparse_attn_config"}));
  // An indexer needs latent attention; attn_type_list needs one 0 or 1 per layer.
  const std::string bad_list = absl::StrReplaceAll(
      files::kMiniMaxM1, {{"\"attn_type_list\": [\n    0,", "\"attn_type_list\": [\n    2,"}});
  EXPECT_THAT(ImportHfConfig(bad_list, "").status(), StatusIs(kInvalid, {"attn_type_list[0]"}));
  const std::string no_list =
      absl::StrReplaceAll(files::kMiniMaxM1, {{"\"attn_type_list\"", "\"attn_type_list_\""}});
  EXPECT_FALSE(ImportHfConfig(no_list, "").ok());
}

// Breaker finding 1: a multimodal wrapper is planned from its text_config, so a layout key at
// its top level would be silently ignored: refused, naming the key, unless text_config says the
// same.
TEST(ImportHfRecent, WrapperTopLevelLayoutKeysAreRefused) {
  for (const auto& [add, field] : std::initializer_list<std::pair<const char*, const char*>>{
           {R"("index_head_dim": 128,)", "'index_head_dim'"},
           {R"("sparse_attn_config": {"topk": 2048},)", "'sparse_attn_config'"},
           {R"("sliding_window": 4096,)", "'sliding_window'"},
           {R"("layer_types": ["sliding_attention"],)", "'layer_types'"},
           {R"("kv_lora_rank": 256,)", "'kv_lora_rank'"},
           {R"("num_key_value_heads": 8,)", "'num_key_value_heads'"}}) {
    const std::string set = absl::StrReplaceAll(
        files::kKimiK25Style,
        {{R"("vision_config": {},)", absl::StrCat(R"("vision_config": {},)", add)}});
    EXPECT_THAT(ImportHfConfig(set, "").status(),
                StatusIs(kInvalid, {field, "planned from its text_config"}))
        << add;
  }
  // The same value as text_config's is a copy, not a second layout.
  const std::string copy = absl::StrReplaceAll(
      files::kKimiK25Style,
      {{R"("vision_config": {},)", R"("vision_config": {}, "kv_lora_rank": 512,)"}});
  EXPECT_EQ(PlanBf16(copy, 4096).bytes_per_token, 70272);
}

// The Kimi-K2.5-style text_config's members, as the text of an object's members.
std::string KimiK2TextMembers() {
  const std::string s = files::kKimiK25Style;
  const size_t begin = s.find("\"text_config\": {") + std::string("\"text_config\": {").size();
  const size_t end = s.rfind('}', s.rfind('}') - 1);
  return s.substr(begin, end - begin);
}

// Breaker finding 2: a wrapper with its own num_hidden_layers is planned from its top level; a
// text_config that disagrees with it is refused, naming both keys. One that agrees is accepted.
TEST(ImportHfRecent, WrapperTopLevelDisagreeingWithTextConfigIsRefused) {
  const std::string members = KimiK2TextMembers();
  const std::string agree = absl::StrCat("{", members, R"(, "text_config": {)", members, "}}");
  EXPECT_EQ(PlanBf16(agree, 4096).bytes_per_token, 70272);
  const std::string disagree = absl::StrCat(
      R"({"model_type": "kimi_k25", "num_hidden_layers": 10, "hidden_size": 1024,
          "num_attention_heads": 8, "text_config": {)",
      members, "}}");
  EXPECT_THAT(
      ImportHfConfig(disagree, "").status(),
      StatusIs(kInvalid, {"'hidden_size' (1024) and 'text_config.hidden_size' (7168) disagree"}));
  const std::string layers = absl::StrCat(
      R"({"model_type": "kimi_k25", "num_hidden_layers": 10, "text_config": {)", members, "}}");
  EXPECT_THAT(
      ImportHfConfig(layers, "").status(),
      StatusIs(kInvalid, {"'num_hidden_layers' (10) and 'text_config.num_hidden_layers' (61)"}));
}

// `n` copies of `item`, comma-separated, in brackets.
std::string JsonList(absl::string_view item, int n) {
  std::string out = "[";
  for (int i = 0; i < n; ++i) absl::StrAppend(&out, i == 0 ? "" : ", ", item);
  return absl::StrCat(out, "]");
}

// `json` (an object's text) with `members` added after its opening brace.
std::string With(absl::string_view json, absl::string_view members) {
  return absl::StrCat("{", members, ",", json.substr(json.find('{') + 1));
}

// Breaker finding 3: two layout keys that describe different layers, of which only one would be
// read, are refused naming both; two that describe the same layers are accepted.
TEST(ImportHfRecent, TwoDifferentLayoutsAreRefused) {
  // Qwen3.5's layer_types (30 linear, 10 full) beside an all-full MiMo pattern, an all-lightning
  // attn_type_list, or a linear_attn_config.
  const std::string q35 = files::kQwen35MoeA3B;
  const auto in_text = [&](absl::string_view members) {
    return absl::StrReplaceAll(
        q35, {{R"("text_config": {)", absl::StrCat(R"("text_config": {)", members, ",")}});
  };
  for (const auto& [members, key] : std::initializer_list<std::pair<std::string, const char*>>{
           {absl::StrCat(R"("hybrid_layer_pattern": )", JsonList("0", 40)),
            "'text_config.hybrid_layer_pattern'"},
           {absl::StrCat(R"("attn_type_list": )", JsonList("0", 40)),
            "'text_config.attn_type_list'"},
           {R"("linear_attn_config": {"kda_layers": [], "full_attn_layers": [)"
            R"(1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20,21,22,23,24,25,26,27,28,29,)"
            R"(30,31,32,33,34,35,36,37,38,39,40], "num_heads": 1, "head_dim": 1,)"
            R"( "short_conv_kernel_size": 1})",
            "'text_config.linear_attn_config'"}}) {
    EXPECT_THAT(ImportHfConfig(in_text(members), "").status(),
                StatusIs(kInvalid, {key, "'text_config.layer_types'"}))
        << members;
  }
  // MiniMax-M1 with layer_types all sliding; MiMo-V2-Flash with layer_types all full.
  const std::string minimax_window = absl::StrReplaceAll(
      files::kMiniMaxM1, {{R"("sliding_window": null)", R"("sliding_window": 4096)"}});
  EXPECT_THAT(
      ImportHfConfig(With(minimax_window, absl::StrCat(R"("layer_types": )",
                                                       JsonList("\"sliding_attention\"", 80))),
                     "")
          .status(),
      StatusIs(kInvalid, {"'attn_type_list'", "'layer_types'"}));
  EXPECT_THAT(
      ImportHfConfig(With(files::kMiMoV2Flash,
                          absl::StrCat(R"("layer_types": )", JsonList("\"full_attention\"", 48))),
                     "")
          .status(),
      StatusIs(kInvalid, {"'hybrid_layer_pattern'", "'layer_types'"}));
  // The same layers twice: MiMo's pattern spelled as layer_types too.
  std::string mimo_types = "[";
  const std::string mimo = files::kMiMoV2Flash;
  const size_t at = mimo.find('[', mimo.find("\"hybrid_layer_pattern\""));
  for (size_t i = at + 1; mimo[i] != ']'; ++i) {
    if (mimo[i] == '0' || mimo[i] == '1') {
      absl::StrAppend(&mimo_types, mimo_types.size() > 1 ? ", " : "",
                      mimo[i] == '0' ? "\"full_attention\"" : "\"sliding_attention\"");
    }
  }
  mimo_types += "]";
  EXPECT_EQ(
      PlanBf16(With(mimo, absl::StrCat(R"("layer_types": )", mimo_types)), 4096).bytes_per_token,
      222720);
}

// Breaker finding 4: MiniMax-M1 and Kimi Linear read no sliding_window (their references apply
// none to their softmax / MLA layers); a window set on them is refused, not dropped.
TEST(ImportHfRecent, SlidingWindowOnFamiliesThatReadNoneIsRefused) {
  const std::string minimax = absl::StrReplaceAll(
      files::kMiniMaxM1, {{R"("sliding_window": null)", R"("sliding_window": 4096)"}});
  ASSERT_NE(minimax, files::kMiniMaxM1);
  EXPECT_THAT(ImportHfConfig(minimax, "").status(), StatusIs(kInvalid, {"sliding_window"}));
  EXPECT_THAT(ImportHfConfig(With(files::kKimiLinear, R"("sliding_window": 4096)"), "").status(),
              StatusIs(kInvalid, {"sliding_window"}));
  EXPECT_THAT(
      ImportHfConfig(With(files::kKimiLinear, R"("use_sliding_window": true)"), "").status(),
      StatusIs(kInvalid, {"use_sliding_window"}));
  // Off, it is accepted (MiniMax-M1's published file says null).
  EXPECT_EQ(
      PlanBf16(With(files::kKimiLinear, R"("sliding_window": null, "use_sliding_window": false)"),
               4096)
          .bytes_per_token,
      8064);
}

// Breaker finding 6: GLM-5's layer_types mixing full_attention with deepseek_sparse_attention
// (whether those layers keep an indexer is not modelled) is refused, naming the layer.
TEST(ImportHfRecent, Glm5MixedLayerTypesAreRefused) {
  std::string glm = files::Glm5Defaults();
  const size_t at = glm.find("\"deepseek_sparse_attention\"");
  glm.replace(at, std::string("\"deepseek_sparse_attention\"").size(), "\"full_attention\"");
  EXPECT_THAT(ImportHfConfig(glm, "").status(),
              StatusIs(kInvalid, {"layer_types[0]", "full_attention"}));
  const std::string all_full = absl::StrReplaceAll(
      files::Glm5Defaults(), {{"\"deepseek_sparse_attention\"", "\"full_attention\""}});
  EXPECT_THAT(ImportHfConfig(all_full, "").status(), StatusIs(kInvalid, {"layer_types[0]"}));
}

// Breaker finding 5: keys inside linear_attn_config that are not read are refused, naming
// linear_attn_config.<key> (head_k_dim or num_kv_heads would change the state).
TEST(ImportHfRecent, UnknownLinearAttnConfigKeysAreRefused) {
  for (const char* key : {"num_kv_heads", "head_k_dim", "foo"}) {
    const std::string set = absl::StrReplaceAll(
        files::kKimiLinear,
        {{R"("head_dim": 128,)", absl::StrCat(R"("head_dim": 128, ")", key, R"(": 16,)")}});
    ASSERT_NE(set, files::kKimiLinear);
    EXPECT_THAT(ImportHfConfig(set, "").status(),
                StatusIs(kInvalid, {absl::StrCat("'linear_attn_config.", key, "'")}));
  }
}

// Breaker finding 7: MiMo-V2-Flash's experts are moe_intermediate_size (2048) wide, not
// intermediate_size (16384, its dense layer's): the shape rules would count 2.48T parameters, so
// the import reports the count as unknown (0), as for the other new families; the preset keeps
// the published 309B / 15B.
TEST(ImportHfRecent, MimoV2FlashParameterCountIsUnknownNotWrong) {
  absl::StatusOr<ModelSpec> m = ImportHfConfig(files::kMiMoV2Flash, "");
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->parameters, 0);
  EXPECT_EQ(m->active_parameters, 0);
  EXPECT_THAT(m->parameters_source, HasSubstr("moe_intermediate_size"));
  absl::StatusOr<ModelSpec> preset = FindModel("mimo-v2-flash");
  ASSERT_TRUE(preset.ok()) << preset.status();
  EXPECT_GT(preset->parameters, int64_t{300'000'000'000});
  // The other new families' imports report unknown too (their layers are not plain attention).
  for (const std::string& json :
       {std::string(files::kDeepSeekV32), files::Glm5Defaults(), std::string(files::kMiniMaxM1),
        std::string(files::kKimiLinear), std::string(files::kQwen35MoeA3B)}) {
    absl::StatusOr<ModelSpec> other = ImportHfConfig(json, "");
    ASSERT_TRUE(other.ok()) << other.status();
    EXPECT_EQ(other->parameters, 0) << other->architecture;
  }
}

// Breaker finding 9: a family's required key is named as missing even when its sibling keys
// (the indexer's index_n_heads, index_topk) are present.
TEST(ImportHfRecent, MissingRequiredKeyIsNamedBesideItsSiblings) {
  const std::string glm =
      absl::StrReplaceAll(files::Glm5Defaults(), {{R"("index_head_dim": 128,)", ""}});
  ASSERT_NE(glm, files::Glm5Defaults());
  EXPECT_THAT(ImportHfConfig(glm, "").status(),
              StatusIs(kInvalid, {"index_head_dim: missing or null; model_type 'glm_moe_dsa'"}));
  const std::string ds =
      absl::StrReplaceAll(files::kDeepSeekV32, {{R"("index_head_dim": 128,)", ""}});
  ASSERT_NE(ds, files::kDeepSeekV32);
  EXPECT_THAT(ImportHfConfig(ds, "").status(),
              StatusIs(kInvalid, {"index_head_dim: missing or null; model_type 'deepseek_v32'"}));
}

// Breaker finding 10: wrappers whose text model is not in a text_config object say so.
TEST(ImportHfRecent, UnmodelledWrapperFormsSaySo) {
  const std::string null_text = absl::StrCat(
      R"({"model_type": "kimi_k25", "ignore_index": -100, "vision_config": {}, "text_config": null})");
  EXPECT_THAT(ImportHfConfig(null_text, "").status(),
              StatusIs(kInvalid, {"text_config: null", "num_hidden_layers"}));
  for (const char* key : {"llm_config", "language_config"}) {
    const std::string other =
        absl::StrCat(R"({"model_type": "internvl_chat", "ignore_index": -100, ")", key,
                     R"(": {"num_hidden_layers": 2}})");
    EXPECT_THAT(ImportHfConfig(other, "").status(),
                StatusIs(kInvalid, {absl::StrCat("'", key, "'"), "only text_config"}));
  }
}

// Breaker finding 13: transformers' own MiniMax (model_type minimax) calls its lightning layers
// linear_attention; they are not gated DeltaNet, and the format is refused clearly.
TEST(ImportHfRecent, TransformersMiniMaxLayerTypesAreRefusedClearly) {
  const std::string hf_minimax = absl::StrCat(
      R"({"model_type": "minimax", "num_hidden_layers": 2, "hidden_size": 64,
          "num_attention_heads": 4, "head_dim": 16, "layer_types": ["linear_attention",
          "full_attention"], "linear_conv_kernel_dim": 4, "linear_key_head_dim": 16,
          "linear_value_head_dim": 16, "linear_num_key_heads": 4, "linear_num_value_heads": 4})");
  EXPECT_THAT(ImportHfConfig(hf_minimax, "").status(),
              StatusIs(kInvalid, {"layer_types", "'minimax'", "lightning"}));
}

// Breaker finding 14: refusals read "set (a number ...)", not "set (a a number ...)".
TEST(ImportHfRecent, RefusalsReadWell) {
  const std::string set =
      absl::StrReplaceAll(files::kKimiK25Style,
                          {{R"("add_cross_attention": false)", R"("add_cross_attention": true)"}});
  const absl::Status s = ImportHfConfig(set, "").status();
  EXPECT_THAT(s, StatusIs(kInvalid, {"set (a boolean that is not off)"}));
  EXPECT_FALSE(absl::StrContains(s.message(), "a a ")) << s;
}

// Breaker finding 15: keys the importer ignores for the cache are still checked where their
// value can be judged: index_topk must be a positive count, and qk_head_dim must be
// qk_nope_head_dim + qk_rope_head_dim (GLM-5 writes 256 = 192 + 64).
TEST(ImportHfRecent, IgnoredKeysWithImpossibleValuesAreRefused) {
  for (const char* topk : {R"("x")", "-1", "1e15", "0"}) {
    const std::string bad = absl::StrReplaceAll(
        files::kDeepSeekV32, {{R"("index_topk": 2048)", absl::StrCat(R"("index_topk": )", topk)}});
    EXPECT_THAT(ImportHfConfig(bad, "").status(), StatusIs(kInvalid, {"index_topk"})) << topk;
  }
  const std::string qk = absl::StrReplaceAll(files::Glm5Defaults(),
                                             {{R"("qk_head_dim": 256)", R"("qk_head_dim": 999)"}});
  ASSERT_NE(qk, files::Glm5Defaults());
  EXPECT_THAT(ImportHfConfig(qk, "").status(), StatusIs(kInvalid, {"qk_head_dim: 999"}));
  EXPECT_EQ(PlanBf16(files::Glm5Defaults(), 8192).bytes_per_token, 100152);
}

// Breaker finding 16: a wrapper without _name_or_path is named after its own model_type, and
// the source gives the text model's type only when text_config says it.
TEST(ImportHfRecent, WrapperNamesAndSources) {
  absl::StatusOr<ModelSpec> m = ImportHfConfig(files::kKimiK25Style, "");
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->display_name, "kimi_k25");
  EXPECT_EQ(m->architecture, "kimi_k2");
  const std::string untyped =
      absl::StrReplaceAll(files::kKimiK25Style, {{R"("model_type": "kimi_k2",)", ""}});
  ASSERT_NE(untyped, files::kKimiK25Style);
  absl::StatusOr<ModelSpec> u = ImportHfConfig(untyped, "");
  ASSERT_TRUE(u.ok()) << u.status();
  EXPECT_THAT(u->source, HasSubstr("(model_type kimi_k25), planned from its text_config;"));
}

}  // namespace
}  // namespace attend::planner
