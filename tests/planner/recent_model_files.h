// Published config.json files of models released in 2025-2026 whose layers need the planner's
// newer layer kinds and fields (issue 39), shared by the importer, catalog and CLI tests. Each
// comment names where the file was read; where a file is abridged or constructed it says so and
// which values come from where. No value was made up: a value that no published file gave comes
// from the named transformers configuration class's defaults.
#ifndef ATTEND_TESTS_PLANNER_RECENT_MODEL_FILES_H_
#define ATTEND_TESTS_PLANNER_RECENT_MODEL_FILES_H_

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace attend::planner::testing {

// DeepSeek-V3.2: constructed. DeepSeek-V3.2-Exp keeps DeepSeek-V3's shape (its config.json is
// deepseek-ai/DeepSeek-V3's, in hybrid_model_files.h, with model_type deepseek_v32) and adds the
// lightning indexer, whose values here are those of deepseek-ai/DeepSeek-V3.2-Exp
// inference/model.py (ModelArgs: index_n_heads 64, index_head_dim 128, index_topk 2048; the
// Indexer caches k_cache in float8_e4m3fn and k_scale_cache, head_dim / 128 float32 scales).
// Keys as in deepseek-ai/DeepSeek-V3 config.json (auto_map and quantization_config abridged).
inline constexpr char kDeepSeekV32[] = R"({
  "architectures": ["DeepseekV32ForCausalLM"],
  "attention_bias": false, "attention_dropout": 0.0, "bos_token_id": 0, "eos_token_id": 1,
  "ep_size": 1, "first_k_dense_replace": 3, "hidden_act": "silu", "hidden_size": 7168,
  "index_head_dim": 128, "index_n_heads": 64, "index_topk": 2048,
  "initializer_range": 0.02, "intermediate_size": 18432, "kv_lora_rank": 512,
  "max_position_embeddings": 163840, "model_type": "deepseek_v32", "moe_intermediate_size": 2048,
  "moe_layer_freq": 1, "n_group": 8, "n_routed_experts": 256, "n_shared_experts": 1,
  "norm_topk_prob": true, "num_attention_heads": 128, "num_experts_per_tok": 8,
  "num_hidden_layers": 61, "num_key_value_heads": 128, "num_nextn_predict_layers": 1,
  "q_lora_rank": 1536, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
  "rms_norm_eps": 1e-06,
  "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 1.0,
                   "mscale_all_dim": 1.0, "original_max_position_embeddings": 4096,
                   "type": "yarn"},
  "rope_theta": 10000, "routed_scaling_factor": 2.5, "scoring_func": "sigmoid", "seq_aux": true,
  "tie_word_embeddings": false, "topk_group": 4, "topk_method": "noaux_tc",
  "torch_dtype": "bfloat16", "use_cache": true, "v_head_dim": 128, "vocab_size": 129280
})";

// GLM-5: no published config.json was at hand, so this is transformers' GlmMoeDsaConfig
// (src/transformers/models/glm_moe_dsa/configuration_glm_moe_dsa.py, checkpoint zai-org/GLM-5)
// with its defaults as to_dict() writes them, the per-layer lists its __post_init__ derives
// included: layer_types all "deepseek_sparse_attention", indexer_types all "full"
// (index_topk_freq 1), mlp_layer_types 3 dense then sparse.
inline std::string Glm5Defaults() {
  std::vector<std::string> dsa(78, "\"deepseek_sparse_attention\"");
  std::vector<std::string> full(78, "\"full\"");
  std::vector<std::string> mlp(78, "\"sparse\"");
  for (int i = 0; i < 3; ++i) mlp[i] = "\"dense\"";
  return absl::StrCat(R"({
  "architectures": ["GlmMoeDsaForCausalLM"], "model_type": "glm_moe_dsa",
  "vocab_size": 154880, "hidden_size": 6144, "intermediate_size": 12288,
  "moe_intermediate_size": 2048, "num_hidden_layers": 78, "num_attention_heads": 64,
  "num_key_value_heads": 64, "n_shared_experts": 1, "n_routed_experts": 256,
  "routed_scaling_factor": 2.5, "kv_lora_rank": 512, "q_lora_rank": 2048,
  "qk_rope_head_dim": 64, "v_head_dim": 256, "qk_nope_head_dim": 192, "qk_head_dim": 256,
  "n_group": 1, "topk_group": 1, "num_experts_per_tok": 8, "norm_topk_prob": true,
  "hidden_act": "silu", "max_position_embeddings": 202752, "initializer_range": 0.02,
  "rms_norm_eps": 1e-05, "use_cache": true, "pad_token_id": null, "bos_token_id": 0,
  "eos_token_id": 1, "tie_word_embeddings": false, "rope_parameters": null,
  "attention_bias": false, "attention_dropout": 0.0, "index_topk": 2048, "index_head_dim": 128,
  "index_n_heads": 32, "mlp_bias": false, "head_dim": 64, "first_k_dense_replace": 3,
  "dtype": "bfloat16",
  "layer_types": [)",
                      absl::StrJoin(dsa, ", "), R"(],
  "indexer_types": [)",
                      absl::StrJoin(full, ", "), R"(],
  "mlp_layer_types": [)",
                      absl::StrJoin(mlp, ", "), R"(]
})");
}

// MiniMaxAI/MiniMax-M1-80k config.json, as published with the model (read from a copy of the
// repository's files; auto_map kept): attn_type_list has a softmax layer (1) after every seven
// lightning-attention layers (0).
inline constexpr char kMiniMaxM1[] = R"({
  "architectures": ["MiniMaxM1ForCausalLM"], "attention_dropout": 0.0,
  "attn_type_list": [
    0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0,
    0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0,
    0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 1],
  "auto_map": {"AutoConfig": "configuration_minimax_m1.MiniMaxM1Config",
               "AutoModelForCausalLM": "modeling_minimax_m1.MiniMaxM1ForCausalLM"},
  "bos_token_id": null, "eos_token_id": null, "head_dim": 128, "hidden_act": "silu",
  "hidden_size": 6144, "initializer_range": 0.02, "intermediate_size": 9216,
  "layernorm_full_attention_alpha": 3.5565588200778455, "layernorm_full_attention_beta": 1.0,
  "layernorm_linear_attention_alpha": 3.5565588200778455, "layernorm_linear_attention_beta": 1.0,
  "layernorm_mlp_alpha": 3.5565588200778455, "layernorm_mlp_beta": 1.0,
  "max_position_embeddings": 10240000, "model_type": "minimax_m1", "num_attention_heads": 64,
  "num_experts_per_tok": 2, "num_hidden_layers": 80, "num_key_value_heads": 8,
  "num_local_experts": 32, "output_router_logits": false, "postnorm": true,
  "rms_norm_eps": 1e-05, "rope_theta": 10000000, "rotary_dim": 64, "router_aux_loss_coef": 0.001,
  "router_jitter_noise": 0.0, "shared_intermediate_size": 0, "shared_moe_mode": "sigmoid",
  "sliding_window": null, "tie_word_embeddings": false, "transformers_version": "4.45.2",
  "use_cache": true, "vocab_size": 200064
})";

// moonshotai/Kimi-Linear-48B-A3B-Instruct config.json, abridged: the keys and values as
// third-party test fixtures of "the released 48B config" transcribe them (found by code search;
// the layer lists are 1-based). No max_position_embeddings (the file gives model_max_length).
inline constexpr char kKimiLinear[] = R"({
  "architectures": ["KimiLinearForCausalLM"], "model_type": "kimi_linear",
  "hidden_act": "silu", "q_lora_rank": null, "mla_use_nope": true,
  "moe_router_activation_func": "sigmoid", "num_expert_group": 1, "topk_group": 1,
  "moe_layer_freq": 1, "tie_word_embeddings": false, "hidden_size": 2304,
  "num_hidden_layers": 27, "vocab_size": 163840, "rms_norm_eps": 1e-05,
  "num_attention_heads": 32, "num_key_value_heads": 32, "head_dim": 72, "kv_lora_rank": 512,
  "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128, "num_experts": 256,
  "num_experts_per_token": 8, "num_shared_experts": 1, "moe_intermediate_size": 1024,
  "routed_scaling_factor": 2.446, "moe_renormalize": true, "first_k_dense_replace": 1,
  "intermediate_size": 9216, "eos_token_id": 163586, "model_max_length": 1048576,
  "torch_dtype": "bfloat16",
  "linear_attn_config": {
    "full_attn_layers": [4, 8, 12, 16, 20, 24, 27],
    "kda_layers": [1, 2, 3, 5, 6, 7, 9, 10, 11, 13, 14, 15, 17, 18, 19, 21, 22, 23, 25, 26],
    "head_dim": 128, "num_heads": 32, "short_conv_kernel_size": 4}
})";

// XiaomiMiMo/MiMo-V2-Flash config.json, abridged: the keys and values as a third-party test
// fixture of "the hub config" transcribes them (found by code search), with
// max_position_embeddings 262144 from another fixture of the same file. hybrid_layer_pattern: 0
// (full attention) on layer 0 and every sixth from layer 5, 1 (sliding) elsewhere.
inline constexpr char kMiMoV2Flash[] = R"({
  "architectures": ["MiMoV2FlashForCausalLM"], "model_type": "mimo_v2_flash",
  "vocab_size": 152576, "hidden_size": 4096, "num_hidden_layers": 48,
  "num_attention_heads": 64, "num_key_value_heads": 4, "head_dim": 192, "v_head_dim": 128,
  "swa_num_attention_heads": 64, "swa_num_key_value_heads": 8, "swa_head_dim": 192,
  "swa_v_head_dim": 128, "partial_rotary_factor": 0.334, "rope_theta": 5000000,
  "swa_rope_theta": 10000, "sliding_window": 128, "sliding_window_size": 128,
  "hybrid_layer_pattern": [
    0, 1, 1, 1, 1, 0, 1, 1, 1, 1, 1, 0, 1, 1, 1, 1, 1, 0, 1, 1, 1, 1, 1, 0, 1, 1, 1, 1, 1,
    0, 1, 1, 1, 1, 1, 0, 1, 1, 1, 1, 1, 0, 1, 1, 1, 1, 1, 0],
  "moe_layer_freq": [
    0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1,
    1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1],
  "add_swa_attention_sink_bias": true, "add_full_attention_sink_bias": false,
  "intermediate_size": 16384, "n_routed_experts": 256, "num_experts_per_tok": 8,
  "moe_intermediate_size": 2048, "routed_scaling_factor": null, "scoring_func": "sigmoid",
  "topk_method": "noaux_tc", "n_group": 1, "norm_topk_prob": true, "layernorm_epsilon": 1e-05,
  "attention_value_scale": 0.707, "max_position_embeddings": 262144
})";

// Qwen3.5-35B-A3B's config.json layout: InternScience/Agents-A1's config.json (a Qwen3.5-35B-A3B
// fine-tune whose file keeps the base model's keys), as printed from its Hugging Face snapshot;
// vision_config abridged. Its text_config has an explicit layer_types list, attn_output_gate and
// a multi-token-prediction layer (mtp_num_hidden_layers).
inline constexpr char kQwen35MoeA3B[] = R"({
  "architectures": ["Qwen3_5MoeForConditionalGeneration"], "image_token_id": 248056,
  "model_type": "qwen3_5_moe",
  "text_config": {
    "attention_bias": false, "attention_dropout": 0.0, "attn_output_gate": true,
    "dtype": "bfloat16", "eos_token_id": 248044, "full_attention_interval": 4, "head_dim": 256,
    "hidden_act": "silu", "hidden_size": 2048, "initializer_range": 0.02,
    "layer_types": [
      "linear_attention", "linear_attention", "linear_attention", "full_attention",
      "linear_attention", "linear_attention", "linear_attention", "full_attention",
      "linear_attention", "linear_attention", "linear_attention", "full_attention",
      "linear_attention", "linear_attention", "linear_attention", "full_attention",
      "linear_attention", "linear_attention", "linear_attention", "full_attention",
      "linear_attention", "linear_attention", "linear_attention", "full_attention",
      "linear_attention", "linear_attention", "linear_attention", "full_attention",
      "linear_attention", "linear_attention", "linear_attention", "full_attention",
      "linear_attention", "linear_attention", "linear_attention", "full_attention",
      "linear_attention", "linear_attention", "linear_attention", "full_attention"],
    "linear_conv_kernel_dim": 4, "linear_key_head_dim": 128, "linear_num_key_heads": 16,
    "linear_num_value_heads": 32, "linear_value_head_dim": 128,
    "max_position_embeddings": 262144, "mlp_only_layers": [], "model_type": "qwen3_5_moe_text",
    "moe_intermediate_size": 512, "mtp_num_hidden_layers": 1,
    "mtp_use_dedicated_embeddings": false, "num_attention_heads": 16, "num_experts": 256,
    "num_experts_per_tok": 8, "num_hidden_layers": 40, "num_key_value_heads": 2,
    "rms_norm_eps": 1e-06, "router_aux_loss_coef": 0.001, "shared_expert_intermediate_size": 512,
    "use_cache": true, "vocab_size": 248320, "mamba_ssm_dtype": "float32",
    "rope_parameters": {"mrope_interleaved": true, "mrope_section": [11, 11, 10],
                        "rope_type": "default", "rope_theta": 10000000,
                        "partial_rotary_factor": 0.25}
  },
  "tie_word_embeddings": false, "transformers_version": "4.57.0.dev0", "video_token_id": 248057,
  "vision_config": {"deepstack_visual_indexes": [], "depth": 27, "hidden_size": 1152,
                    "model_type": "qwen3_5_moe", "num_heads": 16, "out_hidden_size": 2048},
  "vision_end_token_id": 248054, "vision_start_token_id": 248053
})";

// Kimi-K2.5-style wrapper: constructed. The top level is the structure of moonshotai/Kimi-K2.5's
// config.json as TensorRT-LLM's Kimi-K2.5 test reproduces it (model_type kimi_k25, media and
// video placeholders, vision_config (abridged here to nothing), text_config); the text_config is
// moonshotai/Kimi-K2-Instruct's published config.json (hybrid_model_files.h's kKimiK2, auto_map
// abridged) with the defaults that transformers' PretrainedConfig.to_dict writes into a nested
// config (add_cross_attention, chunk_size_feed_forward, pruned_heads, ...), which made such files
// fail to import before.
inline constexpr char kKimiK25Style[] = R"({
  "architectures": ["KimiK25ForConditionalGeneration"], "model_type": "kimi_k25",
  "torch_dtype": "bfloat16", "media_placeholder_token_id": 163605, "pad_token_id": 163839,
  "bos_token_id": 163584, "eos_token_id": 163585, "use_unified_vision_chunk": true,
  "video_placeholder": "<|kimi_k25_video_placeholder|>", "tie_word_embeddings": false,
  "vision_config": {},
  "text_config": {
    "add_cross_attention": false, "architectures": ["DeepseekV3ForCausalLM"],
    "attention_bias": false, "attention_dropout": 0.0, "aux_loss_alpha": 0.001,
    "bad_words_ids": null, "begin_suppress_tokens": null, "bos_token_id": 163584,
    "chunk_size_feed_forward": 0, "cross_attention_hidden_size": null,
    "decoder_start_token_id": null, "diversity_penalty": 0.0, "do_sample": false,
    "early_stopping": false, "encoder_no_repeat_ngram_size": 0, "eos_token_id": 163585,
    "first_k_dense_replace": 1, "hidden_act": "silu", "hidden_size": 7168,
    "id2label": {"0": "LABEL_0", "1": "LABEL_1"}, "initializer_range": 0.02,
    "intermediate_size": 18432, "is_decoder": false, "is_encoder_decoder": false,
    "kv_lora_rank": 512, "label2id": {"LABEL_0": 0, "LABEL_1": 1}, "length_penalty": 1.0,
    "max_length": 20, "max_position_embeddings": 131072, "min_length": 0, "model_type": "kimi_k2",
    "moe_intermediate_size": 2048, "moe_layer_freq": 1, "n_group": 1, "n_routed_experts": 384,
    "n_shared_experts": 1, "no_repeat_ngram_size": 0, "norm_topk_prob": true,
    "num_attention_heads": 64, "num_beam_groups": 1, "num_beams": 1, "num_experts_per_tok": 8,
    "num_hidden_layers": 61, "num_key_value_heads": 64, "num_nextn_predict_layers": 0,
    "num_return_sequences": 1, "output_attentions": false, "output_hidden_states": false,
    "output_scores": false, "pretraining_tp": 1, "prefix": null, "problem_type": null,
    "pruned_heads": {}, "q_lora_rank": 1536, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
    "remove_invalid_values": false, "repetition_penalty": 1.0, "return_dict": true,
    "return_dict_in_generate": false, "rms_norm_eps": 1e-06,
    "rope_scaling": {"beta_fast": 1.0, "beta_slow": 1.0, "factor": 32.0, "mscale": 1.0,
                     "mscale_all_dim": 1.0, "original_max_position_embeddings": 4096,
                     "type": "yarn"},
    "rope_theta": 50000.0, "routed_scaling_factor": 2.827, "scoring_func": "sigmoid",
    "sep_token_id": null, "seq_aux": true, "suppress_tokens": null, "task_specific_params": null,
    "temperature": 1.0, "tf_legacy_loss": false, "tie_encoder_decoder": false,
    "tie_word_embeddings": false, "tokenizer_class": null, "top_k": 50, "top_p": 1.0,
    "topk_group": 1, "topk_method": "noaux_tc", "torch_dtype": "bfloat16", "torchscript": false,
    "typical_p": 1.0, "use_bfloat16": false, "use_cache": true, "v_head_dim": 128,
    "vocab_size": 163840
  }
})";

}  // namespace attend::planner::testing

#endif  // ATTEND_TESTS_PLANNER_RECENT_MODEL_FILES_H_
