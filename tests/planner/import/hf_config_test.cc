// ImportHfConfig: published config.json files reproduce the catalog's presets, names come from
// the input, sliding windows follow each config's rules, and hostile or wrong input is refused
// naming the key. Falcon's configs have their own file, hf_config_falcon_test.cc.
#include "planner/import/hf_config.h"

#include <string>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "planner/model.h"
#include "tests/planner/model_files.h"
#include "tests/planner/planner_test_util.h"
#include "tests/test_util.h"

namespace attend::planner {
namespace {

using ::attend::planner::testing::ExpectSameShape;
using ::attend::planner::testing::kLlama3_8BConfig;
using ::attend::planner::testing::Preset;
using ::attend::testing::StatusIs;

constexpr auto kInvalid = absl::StatusCode::kInvalidArgument;

// The published config.json files, as on the Hugging Face model pages (Llama 3 8B is shared:
// tests/planner/model_files.h).
constexpr char kLlama31_405B[] = R"({
  "architectures": [
    "LlamaForCausalLM"
  ],
  "attention_bias": false,
  "attention_dropout": 0.0,
  "bos_token_id": 128000,
  "eos_token_id": [
    128001,
    128008,
    128009
  ],
  "hidden_act": "silu",
  "hidden_size": 16384,
  "initializer_range": 0.02,
  "intermediate_size": 53248,
  "max_position_embeddings": 131072,
  "mlp_bias": false,
  "model_type": "llama",
  "num_attention_heads": 128,
  "num_hidden_layers": 126,
  "num_key_value_heads": 8,
  "pretraining_tp": 1,
  "rms_norm_eps": 1e-05,
  "rope_scaling": {
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
    "rope_type": "llama3"
  },
  "rope_theta": 500000.0,
  "tie_word_embeddings": false,
  "torch_dtype": "bfloat16",
  "transformers_version": "4.43.0.dev0",
  "use_cache": true,
  "vocab_size": 128256
}
)";

constexpr char kQwen2_0_5B[] = R"({
  "architectures": [
    "Qwen2ForCausalLM"
  ],
  "attention_dropout": 0.0,
  "bos_token_id": 151643,
  "eos_token_id": 151643,
  "hidden_act": "silu",
  "hidden_size": 896,
  "initializer_range": 0.02,
  "intermediate_size": 4864,
  "max_position_embeddings": 131072,
  "max_window_layers": 24,
  "model_type": "qwen2",
  "num_attention_heads": 14,
  "num_hidden_layers": 24,
  "num_key_value_heads": 2,
  "rms_norm_eps": 1e-06,
  "rope_theta": 1000000.0,
  "sliding_window": 131072,
  "tie_word_embeddings": true,
  "torch_dtype": "bfloat16",
  "transformers_version": "4.40.1",
  "use_cache": true,
  "use_sliding_window": false,
  "vocab_size": 151936
}
)";

constexpr char kGemma2_9B[] = R"({
  "architectures": [
    "Gemma2ForCausalLM"
  ],
  "attention_bias": false,
  "attention_dropout": 0.0,
  "attn_logit_softcapping": 50.0,
  "bos_token_id": 2,
  "cache_implementation": "hybrid",
  "eos_token_id": 1,
  "final_logit_softcapping": 30.0,
  "head_dim": 256,
  "hidden_act": "gelu_pytorch_tanh",
  "hidden_activation": "gelu_pytorch_tanh",
  "hidden_size": 3584,
  "initializer_range": 0.02,
  "intermediate_size": 14336,
  "max_position_embeddings": 8192,
  "model_type": "gemma2",
  "num_attention_heads": 16,
  "num_hidden_layers": 42,
  "num_key_value_heads": 8,
  "pad_token_id": 0,
  "query_pre_attn_scalar": 256,
  "rms_norm_eps": 1e-06,
  "rope_theta": 10000.0,
  "sliding_window": 4096,
  "sliding_window_size": 4096,
  "torch_dtype": "float32",
  "transformers_version": "4.42.0.dev0",
  "use_cache": true,
  "vocab_size": 256000
}
)";

constexpr char kMistral7B_v01[] = R"({
  "architectures": [
    "MistralForCausalLM"
  ],
  "bos_token_id": 1,
  "eos_token_id": 2,
  "hidden_act": "silu",
  "hidden_size": 4096,
  "initializer_range": 0.02,
  "intermediate_size": 14336,
  "max_position_embeddings": 32768,
  "model_type": "mistral",
  "num_attention_heads": 32,
  "num_hidden_layers": 32,
  "num_key_value_heads": 8,
  "rms_norm_eps": 1e-05,
  "rope_theta": 10000.0,
  "sliding_window": 4096,
  "tie_word_embeddings": false,
  "torch_dtype": "bfloat16",
  "transformers_version": "4.34.0.dev0",
  "use_cache": true,
  "vocab_size": 32000
}
)";

constexpr char kMixtral8x7B[] = R"({
  "architectures": [
    "MixtralForCausalLM"
  ],
  "attention_dropout": 0.0,
  "bos_token_id": 1,
  "eos_token_id": 2,
  "hidden_act": "silu",
  "hidden_size": 4096,
  "initializer_range": 0.02,
  "intermediate_size": 14336,
  "max_position_embeddings": 32768,
  "model_type": "mixtral",
  "num_attention_heads": 32,
  "num_experts_per_tok": 2,
  "num_hidden_layers": 32,
  "num_key_value_heads": 8,
  "num_local_experts": 8,
  "output_router_logits": false,
  "rms_norm_eps": 1e-05,
  "rope_theta": 1000000.0,
  "router_aux_loss_coef": 0.02,
  "sliding_window": null,
  "tie_word_embeddings": false,
  "torch_dtype": "bfloat16",
  "transformers_version": "4.36.0.dev0",
  "use_cache": true,
  "vocab_size": 32000
}
)";

constexpr char kLlama2_7B[] = R"({
  "_name_or_path": "meta-llama/Llama-2-7b-hf",
  "architectures": [
    "LlamaForCausalLM"
  ],
  "bos_token_id": 1,
  "eos_token_id": 2,
  "hidden_act": "silu",
  "hidden_size": 4096,
  "initializer_range": 0.02,
  "intermediate_size": 11008,
  "max_position_embeddings": 4096,
  "model_type": "llama",
  "num_attention_heads": 32,
  "num_hidden_layers": 32,
  "num_key_value_heads": 32,
  "pretraining_tp": 1,
  "rms_norm_eps": 1e-05,
  "rope_scaling": null,
  "tie_word_embeddings": false,
  "torch_dtype": "float16",
  "transformers_version": "4.31.0.dev0",
  "use_cache": true,
  "vocab_size": 32000
}
)";

// Each published config imports to the catalog preset's shape, and the parameter count computed
// from the imported shape equals the preset's published count.
TEST(ImportHfConfig, PublishedConfigsMatchTheCatalog) {
  const std::pair<const char*, const char*> cases[] = {
      {kLlama3_8BConfig, "llama-3-8b"}, {kLlama31_405B, "llama-3.1-405b"},
      {kQwen2_0_5B, "qwen2-0.5b"},      {kGemma2_9B, "gemma-2-9b"},
      {kMistral7B_v01, "mistral-7b"},   {kMixtral8x7B, "mixtral-8x7b"},
      {kLlama2_7B, "llama-2-7b"},
  };
  for (const auto& [json, preset] : cases) {
    SCOPED_TRACE(preset);
    absl::StatusOr<ModelSpec> m = ImportHfConfig(json, preset);
    ASSERT_OK(m);
    EXPECT_EQ(m->name, preset);
    ExpectSameShape(*m, Preset(preset));
    EXPECT_TRUE(absl::StartsWith(m->parameters_source, "computed from the shape"));
    EXPECT_TRUE(absl::StartsWith(m->source, "Hugging Face config.json"));
  }
}

TEST(ImportHfConfig, NamesFromTheInput) {
  absl::StatusOr<ModelSpec> m = ImportHfConfig(kLlama2_7B, "");
  ASSERT_OK(m);
  EXPECT_EQ(m->name, "llama-2-7b-hf");
  EXPECT_EQ(m->display_name, "Llama-2-7b-hf");
  m = ImportHfConfig(kLlama3_8BConfig, "");
  ASSERT_OK(m);
  EXPECT_EQ(m->name, "llama");  // no _name_or_path: the model_type
}

TEST(ImportHfConfig, DefaultsToMultiHeadAndDerivedHeadDim) {
  absl::StatusOr<ModelSpec> m = ImportHfConfig(
      R"({"num_hidden_layers": 2, "num_attention_heads": 12, "hidden_size": 768})", "x");
  ASSERT_OK(m);
  EXPECT_EQ(m->n_head_kv, 12);
  EXPECT_EQ(m->head_dim, 64);
  EXPECT_EQ(m->head_dim_v, 64);
  EXPECT_TRUE(m->layer_specs.empty());
  EXPECT_EQ(m->parameters, 0);  // no vocab / intermediate: the count is unknown, and says so
  EXPECT_TRUE(absl::StartsWith(m->parameters_source, "unknown"));
  EXPECT_FALSE(m->tied_embeddings);
}

TEST(ImportHfConfig, Qwen2SlidingWindowAppliesFromMaxWindowLayers) {
  std::string json = absl::StrReplaceAll(
      kQwen2_0_5B, {{"\"use_sliding_window\": false", "\"use_sliding_window\": true"},
                    {"\"max_window_layers\": 24", "\"max_window_layers\": 20"},
                    {"\"sliding_window\": 131072", "\"sliding_window\": 4096"}});
  absl::StatusOr<ModelSpec> m = ImportHfConfig(json, "q");
  ASSERT_OK(m);
  ASSERT_EQ(m->layer_specs.size(), 24u);
  for (int64_t i = 0; i < 24; ++i) EXPECT_EQ(LayerWindow(*m, i), i >= 20 ? 4096 : 0) << i;
}

TEST(ImportHfConfig, LayerTypesDecideWhichLayersSlide) {
  absl::StatusOr<ModelSpec> m = ImportHfConfig(R"({
      "num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 2,
      "hidden_size": 256, "sliding_window": 128, "model_type": "gemma2",
      "layer_types": ["full_attention", "sliding_attention", "full_attention"]})",
                                               "t");
  ASSERT_OK(m);
  EXPECT_EQ(LayerWindow(*m, 0), 0);
  EXPECT_EQ(LayerWindow(*m, 1), 128);
  EXPECT_EQ(LayerWindow(*m, 2), 0);
  EXPECT_TRUE(m->tied_embeddings);  // Gemma's default
}

TEST(ImportHfConfig, SlidingWindowPatternAndTextConfig) {
  // Gemma 3 style: every 6th layer is global; the text model sits in text_config.
  absl::StatusOr<ModelSpec> m = ImportHfConfig(R"({
      "model_type": "gemma3", "torch_dtype": "bfloat16",
      "text_config": {"model_type": "gemma3_text", "num_hidden_layers": 12,
                      "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256,
                      "hidden_size": 2560, "sliding_window": 1024,
                      "sliding_window_pattern": 6}})",
                                               "g3");
  ASSERT_OK(m);
  EXPECT_EQ(m->layers, 12);
  EXPECT_EQ(m->weights_dtype, "bfloat16");
  EXPECT_EQ(m->architecture, "gemma3_text");
  for (int64_t i = 0; i < 12; ++i) EXPECT_EQ(LayerWindow(*m, i), (i + 1) % 6 == 0 ? 0 : 1024);
}

TEST(ImportHfConfig, RejectsHostileAndWrongInput) {
  const std::string base =
      R"({"num_hidden_layers": LAYERS, "num_attention_heads": HEADS, "num_key_value_heads": KV,
          "hidden_size": 4096})";
  const auto config = [&](const std::string& layers, const std::string& heads,
                          const std::string& kv) {
    return absl::StrReplaceAll(base, {{"LAYERS", layers}, {"HEADS", heads}, {"KV", kv}});
  };
  EXPECT_OK(ImportHfConfig(config("32", "32", "8"), "ok"));
  EXPECT_THAT(ImportHfConfig(config("1e400", "32", "8"), "x"),
              StatusIs(kInvalid, {"config.json: line 1, column 23: number '1e400' is too large"}));
  EXPECT_THAT(ImportHfConfig(config("1180591620717411303424", "32", "8"), "x"),
              StatusIs(kInvalid, {"num_hidden_layers", "does not fit in 64 bits"}));
  EXPECT_THAT(ImportHfConfig(config("1000000000", "32", "8"), "x"),
              StatusIs(kInvalid, {"num_hidden_layers: 1000000000; must be in [1, 4096]"}));
  EXPECT_THAT(ImportHfConfig(config("32", "-32", "8"), "x"),
              StatusIs(kInvalid, {"num_attention_heads: -32"}));
  EXPECT_THAT(ImportHfConfig(config("32", "32", "-8"), "x"),
              StatusIs(kInvalid, {"num_key_value_heads: -8"}));
  EXPECT_THAT(
      ImportHfConfig(config("32", "32", "5"), "x"),
      StatusIs(kInvalid, {"num_key_value_heads: 5 does not divide num_attention_heads 32"}));
  EXPECT_THAT(ImportHfConfig(config("32", "32", "64"), "x"),
              StatusIs(kInvalid, {"num_key_value_heads: 64 does not divide"}));
  EXPECT_THAT(ImportHfConfig(config("\"32\"", "32", "8"), "x"),
              StatusIs(kInvalid, {"num_hidden_layers: expected an integer, got a string"}));
  EXPECT_THAT(ImportHfConfig(config("32.5", "32", "8"), "x"),
              StatusIs(kInvalid, {"num_hidden_layers: '32.5' is not an integer"}));
  EXPECT_THAT(ImportHfConfig(config("32", "30", "6"), "x"),
              StatusIs(kInvalid, {"hidden_size 4096 is not a multiple of num_attention_heads 30"}));
  EXPECT_THAT(ImportHfConfig(R"({"num_attention_heads": 4, "hidden_size": 64})", "x"),
              StatusIs(kInvalid, {"num_hidden_layers is missing"}));
  EXPECT_THAT(ImportHfConfig("[1, 2]", "x"),
              StatusIs(kInvalid, {"config.json: the top level is not an object (got an array)"}));
  std::string deep;
  for (int i = 0; i < 100; ++i) deep += "{\"a\": ";
  EXPECT_THAT(ImportHfConfig(deep, "x"),
              StatusIs(kInvalid, {"config.json: line 1, column ", "nesting deeper than 64"}));
  EXPECT_THAT(
      ImportHfConfig(R"({"num_hidden_layers": 2, "num_attention_heads": 4, "hidden_size": 64,
                         "torch_dtype": "float64"})",
                     "x"),
      StatusIs(kInvalid, {"torch_dtype: 'float64' is not a known type"}));
  EXPECT_THAT(
      ImportHfConfig(R"({"num_hidden_layers": 2, "num_attention_heads": 4, "hidden_size": 64,
                         "sliding_window": 16, "layer_types": ["full_attention"]})",
                     "x"),
      StatusIs(kInvalid, {"layer_types: 1 entries for 2 layers"}));
  EXPECT_THAT(
      ImportHfConfig(R"({"num_hidden_layers": 2, "num_attention_heads": 4, "hidden_size": 64,
                         "sliding_window": 16,
                         "layer_types": ["full_attention", "chunked_attention"]})",
                     "x"),
      StatusIs(kInvalid,
               {"layer_types[1]: chunked_attention but attention_chunk_size is not set"}));
  EXPECT_THAT(
      ImportHfConfig(R"({"num_hidden_layers": 2, "num_attention_heads": 4, "hidden_size": 64,
                         "layer_types": ["full_attention", "mamba"]})",
                     "x"),
      StatusIs(kInvalid, {"layer_types[1]: 'mamba' is not modelled"}));
  EXPECT_THAT(
      ImportHfConfig(R"({"num_hidden_layers": 2, "num_attention_heads": 4, "hidden_size": 64,
                         "layer_types": ["full_attention", "sliding_attention"]})",
                     "x"),
      StatusIs(kInvalid, {"layer_types[1]: sliding_attention but sliding_window is not set"}));
  EXPECT_THAT(
      ImportHfConfig(R"({"num_hidden_layers": 2, "num_attention_heads": 4, "hidden_size": 64,
                         "num_local_experts": 8})",
                     "x"),
      StatusIs(kInvalid, {"num_experts_per_tok is missing for a model with 8 experts"}));
  EXPECT_THAT(
      ImportHfConfig(R"({"num_hidden_layers": 2, "num_attention_heads": 4, "hidden_size": 64,
                         "sliding_window": -5})",
                     "x"),
      StatusIs(kInvalid, {"sliding_window: -5"}));
  EXPECT_THAT(
      ImportHfConfig(R"({"num_hidden_layers": 2, "num_attention_heads": 4, "hidden_size": 64,
                         "tie_word_embeddings": "yes"})",
                     "x"),
      StatusIs(kInvalid, {"tie_word_embeddings: expected a boolean, got a string"}));
  EXPECT_THAT(ImportHfConfig(R"({"text_config": {"num_hidden_layers": 0,
                                 "num_attention_heads": 4, "hidden_size": 64}})",
                             "x"),
              StatusIs(kInvalid, {"text_config.num_hidden_layers: 0"}));
}

// config.json is parsed with HfConfigJsonLimits (small, for a few KiB of keys), not with the JSON
// parser's defaults (large, for requests of tensors).
TEST(ImportHfConfig, ParsesWithConfigJsonLimits) {
  const json::Limits limits = HfConfigJsonLimits();
  EXPECT_EQ(limits.max_input_bytes, size_t{1} << 20);
  EXPECT_EQ(limits.max_depth, 64);
  EXPECT_EQ(limits.max_string_bytes, size_t{1} << 16);
  EXPECT_EQ(limits.max_number_chars, 256u);
  EXPECT_EQ(limits.max_array_elements, size_t{1} << 16);
  EXPECT_EQ(limits.max_object_members, size_t{1} << 14);
  EXPECT_EQ(limits.max_values, size_t{1} << 16);

  EXPECT_THAT(
      ImportHfConfig(std::string((1 << 20) + 1, ' '), "x"),
      StatusIs(kInvalid, {"config.json: the input is 1048577 bytes; the limit is 1048576"}));
  EXPECT_THAT(
      ImportHfConfig(absl::StrCat("{\"num_hidden_layers\": ", std::string(300, '1'), "}"), "x"),
      StatusIs(kInvalid, {"config.json: line 1, column 23: number longer than 256"}));
  std::string many = "{\"eos_token_id\": [";
  for (int i = 0; i < 70000; ++i) absl::StrAppend(&many, i == 0 ? "" : ",", "1");
  EXPECT_THAT(ImportHfConfig(many + "]}", "x"),
              StatusIs(kInvalid, {"config.json: line 1, column ", "more than 65536 values"}));
}

// layer_types must hold strings: an array of numbers (which the parser stores densely) and a
// number among strings are both refused, naming the element.
TEST(ImportHfConfig, LayerTypesMustBeStrings) {
  const std::string base =
      R"({"num_hidden_layers": 2, "num_attention_heads": 4, "hidden_size": 64,
          "sliding_window": 16, "layer_types": TYPES})";
  const auto config = [&](const std::string& types) {
    return absl::StrReplaceAll(base, {{"TYPES", types}});
  };
  EXPECT_OK(ImportHfConfig(config(R"(["sliding_attention", "full_attention"])"), "ok"));
  EXPECT_THAT(ImportHfConfig(config("[0, 1]"), "x"),
              StatusIs(kInvalid, {"layer_types[0]: expected a string, got a number"}));
  EXPECT_THAT(ImportHfConfig(config(R"(["full_attention", 1])"), "x"),
              StatusIs(kInvalid, {"layer_types[1]: expected a string, got a number"}));
  EXPECT_THAT(ImportHfConfig(config("[]"), "x"),
              StatusIs(kInvalid, {"layer_types: 0 entries for 2 layers"}));
  EXPECT_THAT(ImportHfConfig(config("[1, 2, 3]"), "x"),
              StatusIs(kInvalid, {"layer_types: 3 entries for 2 layers"}));
  EXPECT_THAT(ImportHfConfig(config(R"("full_attention")"), "x"),
              StatusIs(kInvalid, {"layer_types: expected an array, got a string"}));
}

}  // namespace
}  // namespace attend::planner
