// ImportHfConfig on the architectures whose layers are not all plain attention: latent
// attention, hybrids of attention with Mamba or gated delta-net layers, state-space models,
// chunked and sliding layers. Each published config (tests/planner/hybrid_model_files.h) is
// planned in bfloat16 and checked against bytes computed by hand in the comment above it; the
// formulas are those of planner/import/hf_layers.h.
#include <string>
#include <vector>

#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "planner/import/hf_config.h"
#include "planner/kv_plan.h"
#include "planner/model.h"
#include "tests/planner/hybrid_model_files.h"
#include "tests/test_util.h"

namespace attend::planner {
namespace {

using ::attend::testing::StatusIs;
namespace files = ::attend::planner::testing;

constexpr auto kInvalid = absl::StatusCode::kInvalidArgument;

KvPlan PlanBf16(const char* json, int64_t context) {
  absl::StatusOr<ModelSpec> m = ImportHfConfig(json, "");
  EXPECT_TRUE(m.ok()) << m.status();
  if (!m.ok()) return KvPlan{};
  KvPlanRequest r;
  r.kv_dtype = KvDType::kBFloat16;
  r.context_tokens = context;
  absl::StatusOr<KvPlan> plan = PlanKvCache(*m, r);
  EXPECT_TRUE(plan.ok()) << plan.status();
  return plan.ok() ? *plan : KvPlan{};
}

int64_t CountKind(const ModelSpec& m, LayerKind kind) {
  int64_t n = 0;
  for (const LayerSpec& l : m.layer_specs) n += l.kind == kind ? 1 : 0;
  return n;
}

// DeepSeek-V3 caches the latent: 61 layers x (kv_lora_rank 512 + qk_rope_head_dim 64) x 2 bytes
// = 70,272 bytes per token. Expanded it would be 61 x 128 heads x (192 + 128) x 2 = 4,997,120.
// Kimi K2 has the same latent (70,272) and 64 heads: 61 x 64 x 320 x 2 = 2,498,560 expanded.
TEST(ImportHfHybrid, LatentAttentionCachesTheLatent) {
  const KvPlan v3 = PlanBf16(files::kDeepSeekV3, 4096);
  EXPECT_EQ(v3.bytes_per_token, 70272);
  EXPECT_EQ(v3.expanded_bytes_per_token, 4997120);
  EXPECT_EQ(v3.state_bytes_per_sequence, 0);
  EXPECT_EQ(v3.bytes_per_sequence, 70272 * 4096);
  EXPECT_EQ(v3.model.head_dim, 192);
  EXPECT_EQ(v3.model.head_dim_v, 128);
  EXPECT_EQ(v3.model.experts, 256);
  EXPECT_EQ(CountKind(v3.model, LayerKind::kLatentAttention), 61);
  // The latent row is the key half; the values are read from it.
  EXPECT_EQ(v3.k_bytes_per_token, 70272);
  EXPECT_EQ(v3.v_bytes_per_token, 0);
  // The MHA variant is the expanded cache.
  ASSERT_FALSE(v3.variants.empty());
  EXPECT_EQ(v3.variants[0].variant, "MHA");
  EXPECT_EQ(v3.variants[0].bytes_per_token, 4997120);
  const KvPlan k2 = PlanBf16(files::kKimiK2, 4096);
  EXPECT_EQ(k2.bytes_per_token, 70272);
  EXPECT_EQ(k2.expanded_bytes_per_token, 2498560);
}

// Jamba-v0.1: layers 4, 12, 20, 28 attend (i % 8 == 4): 4 x 8 KV heads x 128 x 2 (K, V) x 2 bytes
// = 16,384 bytes per token. The other 28 are Mamba mixers with d_inner = 2 x 4096 = 8192: conv
// (4 - 1) x 8192 = 24,576 values and SSM 8192 x 16 = 131,072, so 155,648 x 2 = 311,296 bytes each
// and 28 x 311,296 = 8,716,288 bytes of state per sequence.
TEST(ImportHfHybrid, JambaAttendsEveryEighthLayerAndHoldsMambaState) {
  const KvPlan p = PlanBf16(files::kJamba, 1000);
  EXPECT_EQ(p.bytes_per_token, 16384);
  EXPECT_EQ(p.state_bytes_per_sequence, 8716288);
  EXPECT_EQ(p.bytes_per_sequence, 16384 * 1000 + 8716288);
  ASSERT_EQ(p.model.layer_specs.size(), 32u);
  for (int i = 0; i < 32; ++i) {
    EXPECT_EQ(p.model.layer_specs[i].kind,
              i % 8 == 4 ? LayerKind::kAttention : LayerKind::kStateSpace)
        << i;
  }
  EXPECT_EQ(p.model.layer_specs[0].conv_state_values, 24576);
  EXPECT_EQ(p.model.layer_specs[0].recurrent_state_values, 131072);
  // The two groups of the breakdown add up to the sequence.
  ASSERT_EQ(p.layer_groups.size(), 2u);
  EXPECT_EQ(p.layer_groups[0].bytes_per_sequence + p.layer_groups[1].bytes_per_sequence,
            p.bytes_per_sequence);
}

// Qwen3-Next-80B-A3B: every fourth layer is full attention, 12 x 2 KV heads x 256 x 2 x 2 =
// 24,576 bytes per token. The 36 gated delta-net layers: key_dim 16 x 128 = 2048, value_dim
// 32 x 128 = 4096; conv (4 - 1) x (2 x 2048 + 4096) = 24,576 values, recurrent 32 x 128 x 128 =
// 524,288; 548,864 x 2 = 1,097,728 bytes each, 36 x 1,097,728 = 39,518,208 per sequence.
TEST(ImportHfHybrid, QwenNextFullAttentionEveryFourthLayer) {
  const KvPlan p = PlanBf16(files::kQwen3Next, 4096);
  EXPECT_EQ(p.bytes_per_token, 24576);
  EXPECT_EQ(p.state_bytes_per_sequence, 39518208);
  EXPECT_EQ(CountKind(p.model, LayerKind::kLinearAttention), 36);
  EXPECT_EQ(p.model.layer_specs[3].kind, LayerKind::kAttention);
  EXPECT_EQ(p.model.layer_specs[2].kind, LayerKind::kLinearAttention);
}

// The issue's Qwen3.5-style row, from its text_config: 16 full layers x 4 x 256 x 2 x 2 = 65,536
// bytes per token; 48 linear layers of 1,097,728 bytes (as above) = 52,690,944 per sequence.
TEST(ImportHfHybrid, Qwen35StyleReadsTextConfig) {
  const KvPlan p = PlanBf16(files::kQwen35Style, 4096);
  EXPECT_EQ(p.bytes_per_token, 65536);
  EXPECT_EQ(p.state_bytes_per_sequence, 52690944);
  EXPECT_EQ(p.model.architecture, "qwen3_5_text");
}

// mamba-2.8b: no KV cache. d_inner = 2 x 2560 = 5120; conv 3 x 5120 = 15,360 and SSM 5120 x 16 =
// 81,920 values per layer, 97,280 x 2 bytes x 64 layers = 12,451,840 bytes per sequence at any
// context.
TEST(ImportHfHybrid, MambaHoldsOnlyAFixedState) {
  const KvPlan short_plan = PlanBf16(files::kMamba, 10);
  const KvPlan long_plan = PlanBf16(files::kMamba, 1000000);
  EXPECT_EQ(short_plan.bytes_per_token, 0);
  EXPECT_EQ(short_plan.state_bytes_per_sequence, 12451840);
  EXPECT_EQ(short_plan.bytes_per_sequence, 12451840);
  EXPECT_EQ(long_plan.bytes_per_sequence, 12451840);
  EXPECT_EQ(short_plan.model.n_head, 0);
  EXPECT_TRUE(short_plan.variants.empty());
}

// Mamba-Codestral-7B (Mamba-2): d_inner = 128 heads x 64 = 8192; conv 3 x (8192 + 2 x 8 x 128) =
// 30,720 values, SSM 128 x 64 x 128 = 1,048,576; 1,079,296 x 2 bytes x 64 layers = 138,149,888.
// Nemotron-H-8B: 4 attention layers ('*') x 8 x 128 x 2 x 2 = 16,384 bytes per token, 24 Mamba-2
// layers ('M') of the same mixer, 24 x 2,158,592 = 51,806,208, and 24 MLP layers ('-').
TEST(ImportHfHybrid, MambaTwoAndNemotronH) {
  const KvPlan m2 = PlanBf16(files::kMamba2, 4096);
  EXPECT_EQ(m2.bytes_per_token, 0);
  EXPECT_EQ(m2.state_bytes_per_sequence, 138149888);
  const KvPlan nh = PlanBf16(files::kNemotronH8B, 4096);
  EXPECT_EQ(nh.bytes_per_token, 16384);
  EXPECT_EQ(nh.state_bytes_per_sequence, 51806208);
  EXPECT_EQ(CountKind(nh.model, LayerKind::kFeedForward), 24);
  EXPECT_EQ(CountKind(nh.model, LayerKind::kStateSpace), 24);
}

// Llama 4 Scout: 36 chunked layers (8192) and 12 global NoPE layers (3, 7, ...): 48 x 8 x 128 x
// 2 x 2 = 196,608 bytes per token within a chunk, 12 x 4096 = 49,152 once chunks are full.
// gpt-oss-120b: 36 layers x 8 x 64 x 2 x 2 = 73,728 within the 128-token windows, 18 x 4096 =
// 36,864 past them. Gemma 3 27B: 62 x 16 x 128 x 4 = 507,904, and its 10 global layers 81,920.
TEST(ImportHfHybrid, ChunkedAndSlidingLayers) {
  const KvPlan scout = PlanBf16(files::kLlama4Scout, 100000);
  EXPECT_EQ(scout.bytes_per_token, 196608);
  EXPECT_EQ(scout.full_attention_bytes_per_token, 49152);
  EXPECT_EQ(CountKind(scout.model, LayerKind::kChunkedAttention), 36);
  EXPECT_EQ(scout.model.layer_specs[3].kind, LayerKind::kAttention);
  EXPECT_EQ(scout.bytes_per_sequence, 36 * 4096 * int64_t{8192} + 49152 * int64_t{100000});
  const KvPlan oss = PlanBf16(files::kGptOss120B, 4096);
  EXPECT_EQ(oss.bytes_per_token, 73728);
  EXPECT_EQ(oss.full_attention_bytes_per_token, 36864);
  const KvPlan gemma = PlanBf16(files::kGemma3_27B, 4096);
  EXPECT_EQ(gemma.bytes_per_token, 507904);
  EXPECT_EQ(gemma.full_attention_bytes_per_token, 81920);
}

// Hostile and unknown layouts are refused naming the field.
// The field that makes an architecture latent or hybrid, absent or null: refused naming it, not
// planned as plain attention (DeepSeek-V3 read as 128 heads of 56, 24x its cache).
TEST(ImportHfHybrid, RefusesArchitecturesWithoutTheirLayoutField) {
  const auto without = [](const char* config, const std::string& from, const std::string& to) {
    return ImportHfConfig(absl::StrReplaceAll(config, {{from, to}}), "");
  };
  for (const char* to : {"\"kv_lora_rank\": null,", ""}) {
    EXPECT_THAT(without(files::kDeepSeekV3, "\"kv_lora_rank\": 512,", to),
                StatusIs(kInvalid, {"kv_lora_rank: missing or null", "'deepseek_v3' needs it"}))
        << to;
  }
  EXPECT_THAT(without(files::kNemotronH8B,
                      "\"hybrid_override_pattern\": "
                      "\"M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M-\",",
                      ""),
              StatusIs(kInvalid, {"hybrid_override_pattern: missing or null", "'nemotron_h'"}));
  const std::string gpt_oss = files::kGptOss120B;
  const size_t types = gpt_oss.find("\"layer_types\"");
  ASSERT_NE(types, std::string::npos);
  const size_t end = gpt_oss.find("],", types);
  ASSERT_NE(end, std::string::npos);
  EXPECT_THAT(ImportHfConfig(gpt_oss.substr(0, types) + gpt_oss.substr(end + 2), ""),
              StatusIs(kInvalid, {"layer_types: missing or null", "'gpt_oss' needs it"}));
}

// Fields of published configs that change no layout: Llama 4's llm-compressor flag, the
// original Mamba configs' empty ssm_cfg.
TEST(ImportHfHybrid, AcceptsTheFlagsOfPublishedConfigs) {
  EXPECT_TRUE(
      ImportHfConfig(absl::StrReplaceAll(files::kLlama4Scout, {{"\"attention_bias\": false,",
                                                                "\"attention_bias\": false, "
                                                                "\"for_llm_compressor\": false,"}}),
                     "")
          .ok());
  EXPECT_TRUE(ImportHfConfig(absl::StrReplaceAll(files::kMamba, {{"\"state_size\": 16,",
                                                                  "\"state_size\": 16, "
                                                                  "\"ssm_cfg\": {},"}}),
                             "")
                  .ok());
  EXPECT_THAT(
      ImportHfConfig(absl::StrReplaceAll(files::kMamba, {{"\"state_size\": 16,",
                                                          "\"state_size\": 16, "
                                                          "\"ssm_cfg\": {\"d_state\": 8},"}}),
                     ""),
      StatusIs(kInvalid, {"'ssm_cfg': not understood"}));
}

// layer_types and full_attention_interval both given but describing different layers, and a
// text_config that is not an object: refused naming the field.
TEST(ImportHfHybrid, RefusesContradictionsAndMisshapenTextConfig) {
  // Qwen3.5-style with layer_types written out (three linear layers, then a full one) beside
  // an interval: 4 agrees, 2 does not.
  std::vector<std::string> types;
  for (int i = 0; i < 64; ++i) {
    types.push_back((i + 1) % 4 == 0 ? "\"full_attention\"" : "\"linear_attention\"");
  }
  const auto both = [&](int interval) {
    return ImportHfConfig(
        absl::StrReplaceAll(
            files::kQwen35Style,
            {{"\"full_attention_interval\": 4",
              absl::StrCat("\"full_attention_interval\": ", interval, ", \"layer_types\": [",
                           absl::StrJoin(types, ", "), "]")}}),
        "");
  };
  EXPECT_TRUE(both(4).ok()) << both(4).status();
  EXPECT_THAT(both(2), StatusIs(kInvalid, {"full_attention_interval: disagrees with layer_types "
                                           "at layer 1 (linear_attention)"}));
  for (const char* text : {"\"text_config\": \"qwen\"", "\"text_config\": [1]"}) {
    EXPECT_THAT(ImportHfConfig(absl::StrCat("{", text, "}"), ""),
                StatusIs(kInvalid, {"text_config: expected an object"}))
        << text;
  }
}

TEST(ImportHfHybrid, RefusesHostileLayouts) {
  const auto jamba = [](const std::string& from, const std::string& to) {
    return ImportHfConfig(absl::StrReplaceAll(files::kJamba, {{from, to}}), "");
  };
  EXPECT_THAT(jamba("\"attn_layer_period\": 8", "\"attn_layer_period\": 0"),
              StatusIs(kInvalid, {"attn_layer_period: 0; must be in [1, 4096]"}));
  EXPECT_THAT(jamba("\"attn_layer_offset\": 4", "\"attn_layer_offset\": 8"),
              StatusIs(kInvalid, {"attn_layer_offset: 8 is not below attn_layer_period 8"}));
  EXPECT_THAT(ImportHfConfig(
                  absl::StrReplaceAll(files::kJamba,
                                      {{"\"attn_layer_period\": 8", "\"attn_layer_period\": 64"},
                                       {"\"attn_layer_offset\": 4", "\"attn_layer_offset\": 40"}}),
                  ""),
              StatusIs(kInvalid, {"attn_layer_offset: 40 is past the 32 layers"}));
  const auto v3 = [](const std::string& to) {
    return ImportHfConfig(absl::StrReplaceAll(files::kDeepSeekV3, {{"\"kv_lora_rank\": 512", to}}),
                          "");
  };
  EXPECT_THAT(v3("\"kv_lora_rank\": 0"), StatusIs(kInvalid, {"kv_lora_rank: 0; must be in [1,"}));
  EXPECT_THAT(v3("\"kv_lora_rank\": 1099511627776"),
              StatusIs(kInvalid, {"kv_lora_rank: 1099511627776; must be in [1, 65536]"}));
  EXPECT_THAT(
      v3("\"kv_lora_rank\": 512, \"index_topk\": 2048"),
      StatusIs(kInvalid, {"'index_topk': not understood", "'deepseek_v3' is not modelled"}));
  EXPECT_THAT(
      ImportHfConfig(absl::StrReplaceAll(files::kQwen3Next, {{"\"full_attention_interval\": 4",
                                                              "\"full_attention_interval\": 0"}}),
                     ""),
      StatusIs(kInvalid, {"full_attention_interval: 0; must be in [1, 4096]"}));
  EXPECT_THAT(
      ImportHfConfig(absl::StrReplaceAll(files::kNemotronH8B, {{"M-M-M-M-M-\"", "M-M-M-\""}}), ""),
      StatusIs(kInvalid, {"hybrid_override_pattern: 48 characters for 52 layers"}));
  EXPECT_THAT(
      ImportHfConfig(absl::StrReplaceAll(files::kNemotronH8B, {{"M-M-M-M*-", "M-M-M-MX-"}}), ""),
      StatusIs(kInvalid, {"hybrid_override_pattern[7]: 'X' is not modelled"}));
  EXPECT_THAT(ImportHfConfig(absl::StrReplaceAll(files::kMamba, {{"\"state_size\": 16,", ""}}), ""),
              StatusIs(kInvalid, {"state_size is missing"}));
  // A layout field from another family on a plain config: refused, not ignored.
  EXPECT_THAT(ImportHfConfig(R"({"num_hidden_layers": 2, "num_attention_heads": 4,
                                 "hidden_size": 64, "model_type": "gemma3n",
                                 "num_kv_shared_layers": 1})",
                             ""),
              StatusIs(kInvalid, {"'num_kv_shared_layers': not understood",
                                  "architecture 'gemma3n' is not modelled"}));
}

}  // namespace
}  // namespace attend::planner
