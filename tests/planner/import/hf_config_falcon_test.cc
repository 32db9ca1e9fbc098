// ImportHfConfig on Falcon's configs: their own key names and model_types, the flags that decide
// the key/value heads, and the two-matrix MLP that the parameter count follows.
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_replace.h"
#include "planner/import/hf_config.h"
#include "planner/kv_plan.h"
#include "tests/test_util.h"

namespace attend::planner {
namespace {

using ::attend::testing::StatusIs;

constexpr auto kInvalid = absl::StatusCode::kInvalidArgument;

// Falcon's configs name their keys differently from Llama's and describe the key/value heads
// with flags: falcon-7b is multi-query (one key/value head shared by 71 query heads).
constexpr char kFalcon7B[] = R"({
  "alibi": false,
  "apply_residual_connection_post_layernorm": false,
  "architectures": [
    "FalconForCausalLM"
  ],
  "attention_dropout": 0.0,
  "bias": false,
  "bos_token_id": 11,
  "eos_token_id": 11,
  "hidden_dropout": 0.0,
  "hidden_size": 4544,
  "initializer_range": 0.02,
  "layer_norm_epsilon": 1e-05,
  "model_type": "falcon",
  "multi_query": true,
  "new_decoder_architecture": false,
  "num_attention_heads": 71,
  "num_hidden_layers": 32,
  "parallel_attn": true,
  "torch_dtype": "bfloat16",
  "transformers_version": "4.27.4",
  "use_cache": true,
  "vocab_size": 65024
}
)";

// The same model as first published, for its own modelling code: model_type RefinedWebModel,
// n_head and n_layer, no new_decoder_architecture.
constexpr char kFalcon7B_RefinedWebModel[] = R"({
  "alibi": false,
  "apply_residual_connection_post_layernorm": false,
  "architectures": [
    "RWForCausalLM"
  ],
  "attention_dropout": 0.0,
  "auto_map": {
    "AutoConfig": "configuration_RW.RWConfig",
    "AutoModelForCausalLM": "modelling_RW.RWForCausalLM"
  },
  "bias": false,
  "bos_token_id": 11,
  "eos_token_id": 11,
  "hidden_dropout": 0.0,
  "hidden_size": 4544,
  "initializer_range": 0.02,
  "layer_norm_epsilon": 1e-05,
  "model_type": "RefinedWebModel",
  "multi_query": true,
  "n_head": 71,
  "n_layer": 32,
  "parallel_attn": true,
  "torch_dtype": "bfloat16",
  "transformers_version": "4.27.4",
  "use_cache": true,
  "vocab_size": 65024
}
)";

// falcon-40b uses the new decoder architecture: 8 key/value groups (n_head_kv) and two
// LayerNorms per layer.
constexpr char kFalcon40B[] = R"({
  "alibi": false,
  "apply_residual_connection_post_layernorm": false,
  "architectures": [
    "FalconForCausalLM"
  ],
  "attention_dropout": 0.0,
  "bias": false,
  "bos_token_id": 11,
  "eos_token_id": 11,
  "hidden_dropout": 0.0,
  "hidden_size": 8192,
  "initializer_range": 0.02,
  "layer_norm_epsilon": 1e-05,
  "model_type": "falcon",
  "n_head": 128,
  "n_head_kv": 8,
  "n_layer": 60,
  "new_decoder_architecture": true,
  "parallel_attn": true,
  "torch_dtype": "bfloat16",
  "transformers_version": "4.27.4",
  "use_cache": true,
  "vocab_size": 65024
}
)";

// The first falcon-40b config: model_type RefinedWeb, whose modelling code always used the new
// decoder architecture, so the flag is absent.
constexpr char kFalcon40B_RefinedWeb[] = R"({
  "alibi": false,
  "apply_residual_connection_post_layernorm": false,
  "architectures": [
    "RWForCausalLM"
  ],
  "attention_dropout": 0.0,
  "bias": false,
  "bos_token_id": 11,
  "eos_token_id": 11,
  "hidden_dropout": 0.0,
  "hidden_size": 8192,
  "initializer_range": 0.02,
  "layer_norm_epsilon": 1e-05,
  "model_type": "RefinedWeb",
  "n_head": 128,
  "n_head_kv": 8,
  "n_layer": 60,
  "parallel_attn": true,
  "torch_dtype": "bfloat16",
  "transformers_version": "4.27.4",
  "use_cache": true,
  "vocab_size": 65024
}
)";

constexpr char kFalcon180B[] = R"({
  "alibi": false,
  "architectures": [
    "FalconForCausalLM"
  ],
  "attention_dropout": 0.0,
  "bias": false,
  "bos_token_id": 11,
  "eos_token_id": 11,
  "hidden_dropout": 0.0,
  "hidden_size": 14848,
  "initializer_range": 0.02,
  "layer_norm_epsilon": 1e-05,
  "model_type": "falcon",
  "multi_query": true,
  "new_decoder_architecture": true,
  "num_attention_heads": 232,
  "num_hidden_layers": 80,
  "num_kv_heads": 8,
  "parallel_attn": true,
  "torch_dtype": "bfloat16",
  "transformers_version": "4.32.0",
  "use_cache": true,
  "vocab_size": 65024
}
)";

// falcon-rw-1b: neither multi-query nor the new architecture, so every query head has its own
// key/value head.
constexpr char kFalconRw1B[] = R"({
  "alibi": true,
  "apply_residual_connection_post_layernorm": false,
  "architectures": [
    "FalconForCausalLM"
  ],
  "attention_dropout": 0.0,
  "bias": true,
  "bos_token_id": 1,
  "eos_token_id": 2,
  "hidden_dropout": 0.0,
  "hidden_size": 2048,
  "initializer_range": 0.02,
  "layer_norm_epsilon": 1e-05,
  "model_type": "falcon",
  "multi_query": false,
  "new_decoder_architecture": false,
  "num_attention_heads": 32,
  "num_hidden_layers": 24,
  "parallel_attn": false,
  "torch_dtype": "bfloat16",
  "transformers_version": "4.27.4",
  "use_cache": true,
  "vocab_size": 50304
}
)";

// falcon-7b caches one key/value head per layer: 2 (K and V) x 32 layers x 1 head x 64 values
// (4544 / 71) x 2 bytes (bfloat16) = 8,192 bytes per token, not the 581,632 of 71 heads.
TEST(ImportHfConfig, FalconMultiQueryCachesOneKeyValueHead) {
  for (const char* json : {kFalcon7B, kFalcon7B_RefinedWebModel}) {
    absl::StatusOr<ModelSpec> m = ImportHfConfig(json, "falcon-7b");
    ASSERT_OK(m);
    EXPECT_EQ(m->architecture, "falcon");
    EXPECT_EQ(m->layers, 32);
    EXPECT_EQ(m->n_head, 71);
    EXPECT_EQ(m->n_head_kv, 1);
    EXPECT_EQ(m->head_dim, 64);
    EXPECT_EQ(m->d_model, 4544);
    EXPECT_EQ(m->vocab_size, 65024);
    EXPECT_EQ(m->weights_dtype, "bfloat16");
    absl::StatusOr<int64_t> per_token = KvBytesPerSequence(*m, KvDType::kBFloat16, 1);
    ASSERT_OK(per_token);
    EXPECT_EQ(*per_token, 2 * 32 * 1 * 64 * 2);
    EXPECT_EQ(*per_token, 8192);
  }
}

// Falcon's MLP is two matrices with a GELU between them (dense_h_to_4h, dense_4h_to_h), 4 x
// hidden_size wide, and its norms are LayerNorms with biases; Transformers ties lm_head to the
// embeddings. falcon-7b by hand:
//   embeddings              65024 x 4544                      =   295,469,056
//   per layer  query        4544 x 4544                       =    20,647,936
//              key, value   2 x 4544 x 64 (one head)          =       581,632
//              dense out    4544 x 4544                       =    20,647,936
//              MLP          2 x 4544 x 18176                  =   165,183,488
//              LayerNorm    one (parallel attention), 2 x 4544 =        9,088
//              sum                                            =   207,070,080
//   32 layers               32 x 207,070,080                  = 6,626,242,560
//   final LayerNorm         2 x 4544                          =         9,088
//   total                                                     = 6,921,720,704
TEST(ImportHfConfig, FalconSevenBParametersFromItsNonGatedMlp) {
  for (const char* json : {kFalcon7B, kFalcon7B_RefinedWebModel}) {
    absl::StatusOr<ModelSpec> m = ImportHfConfig(json, "falcon-7b");
    ASSERT_OK(m);
    EXPECT_EQ(m->intermediate_size, 4 * 4544);
    EXPECT_TRUE(m->tied_embeddings);
    EXPECT_EQ(m->parameters, 6921720704);
    EXPECT_EQ(m->active_parameters, 6921720704);
    EXPECT_TRUE(absl::StartsWith(m->parameters_source, "computed from the shape"))
        << m->parameters_source;
    EXPECT_TRUE(absl::StrContains(m->parameters_source, "two-matrix MLP")) << m->parameters_source;
  }
}

// falcon-40b: 8 key/value heads (n_head_kv), whether the config says new_decoder_architecture
// or is the RefinedWeb one that implies it. 2 x 60 layers x 8 heads x 64 x 2 bytes = 122,880
// bytes per token. Parameters by hand:
//   embeddings              65024 x 8192                      =    532,676,608
//   per layer  query, key,  8192 x (128 + 2 x 8) x 64         =     75,497,472
//              value
//              dense out    8192 x 8192                       =     67,108,864
//              MLP          2 x 8192 x 32768                  =    536,870,912
//              LayerNorms   two (ln_attn, ln_mlp), 4 x 8192   =         32,768
//              sum                                            =    679,510,016
//   60 layers               60 x 679,510,016                  = 40,770,600,960
//   final LayerNorm         2 x 8192                          =         16,384
//   total                                                     = 41,303,293,952
TEST(ImportHfConfig, FalconFortyBGroupsKeyValueHeads) {
  for (const char* json : {kFalcon40B, kFalcon40B_RefinedWeb}) {
    absl::StatusOr<ModelSpec> m = ImportHfConfig(json, "falcon-40b");
    ASSERT_OK(m);
    EXPECT_EQ(m->layers, 60);
    EXPECT_EQ(m->n_head, 128);
    EXPECT_EQ(m->n_head_kv, 8);
    EXPECT_EQ(m->head_dim, 64);
    EXPECT_EQ(m->intermediate_size, 32768);
    EXPECT_EQ(*KvBytesPerSequence(*m, KvDType::kBFloat16, 1), 2 * 60 * 8 * 64 * 2);
    EXPECT_EQ(m->parameters, 41303293952);
  }
}

// falcon-180B names its groups num_kv_heads: 2 x 80 layers x 8 heads x 64 (14848 / 232) x 2
// bytes = 163,840 bytes per token.
TEST(ImportHfConfig, FalconOneEightyBReadsNumKvHeads) {
  absl::StatusOr<ModelSpec> m = ImportHfConfig(kFalcon180B, "falcon-180b");
  ASSERT_OK(m);
  EXPECT_EQ(m->n_head, 232);
  EXPECT_EQ(m->n_head_kv, 8);
  EXPECT_EQ(m->head_dim, 64);
  EXPECT_EQ(*KvBytesPerSequence(*m, KvDType::kBFloat16, 1), 163840);
}

// Without multi_query and the new architecture every query head keeps its own key/value head,
// whatever num_kv_heads would say; an explicit ffn_hidden_size replaces 4 x hidden_size.
TEST(ImportHfConfig, FalconFlagsDecideTheKeyValueHeads) {
  absl::StatusOr<ModelSpec> m = ImportHfConfig(kFalconRw1B, "falcon-rw-1b");
  ASSERT_OK(m);
  EXPECT_EQ(m->n_head, 32);
  EXPECT_EQ(m->n_head_kv, 32);
  EXPECT_EQ(m->intermediate_size, 4 * 2048);
  EXPECT_EQ(*KvBytesPerSequence(*m, KvDType::kBFloat16, 1), 2 * 24 * 32 * 64 * 2);

  const std::string with_kv = absl::StrReplaceAll(
      kFalconRw1B, {{"\"multi_query\": false", "\"multi_query\": false, \"num_kv_heads\": 4"}});
  m = ImportHfConfig(with_kv, "x");
  ASSERT_OK(m);
  EXPECT_EQ(m->n_head_kv, 32);

  const std::string multi_query =
      absl::StrReplaceAll(kFalconRw1B, {{"\"multi_query\": false", "\"multi_query\": true"}});
  m = ImportHfConfig(multi_query, "x");
  ASSERT_OK(m);
  EXPECT_EQ(m->n_head_kv, 1);

  const std::string ffn = absl::StrReplaceAll(
      kFalcon180B,
      {{"\"hidden_size\": 14848", "\"hidden_size\": 14848, \"ffn_hidden_size\": 1024"}});
  m = ImportHfConfig(ffn, "x");
  ASSERT_OK(m);
  EXPECT_EQ(m->intermediate_size, 1024);

  const std::string bad_kv =
      absl::StrReplaceAll(kFalcon180B, {{"\"num_kv_heads\": 8", "\"num_kv_heads\": 7"}});
  EXPECT_THAT(ImportHfConfig(bad_kv, "x"),
              StatusIs(kInvalid, {"num_kv_heads: 7 does not divide num_attention_heads 232"}));
  const std::string bad_flag =
      absl::StrReplaceAll(kFalcon7B, {{"\"multi_query\": true", "\"multi_query\": \"yes\""}});
  EXPECT_THAT(ImportHfConfig(bad_flag, "x"),
              StatusIs(kInvalid, {"multi_query: expected a boolean, got a string"}));
}

}  // namespace
}  // namespace attend::planner
