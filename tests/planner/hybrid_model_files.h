// Published config.json files of models whose layers are not all plain attention, shared by the
// importer, catalog and CLI tests. Each is the model page's config.json on Hugging Face (named
// above it), with its keys and values as published; where one is abridged the comment says so.
#ifndef ATTEND_TESTS_PLANNER_HYBRID_MODEL_FILES_H_
#define ATTEND_TESTS_PLANNER_HYBRID_MODEL_FILES_H_

namespace attend::planner::testing {

// deepseek-ai/DeepSeek-V3 config.json (auto_map abridged).
inline constexpr char kDeepSeekV3[] = R"({
  "architectures": ["DeepseekV3ForCausalLM"],
  "attention_bias": false, "attention_dropout": 0.0,
  "auto_map": {"AutoConfig": "configuration_deepseek.DeepseekV3Config"},
  "aux_loss_alpha": 0.001, "bos_token_id": 0, "eos_token_id": 1, "ep_size": 1,
  "first_k_dense_replace": 3, "hidden_act": "silu", "hidden_size": 7168,
  "initializer_range": 0.02, "intermediate_size": 18432, "kv_lora_rank": 512,
  "max_position_embeddings": 163840, "model_type": "deepseek_v3", "moe_intermediate_size": 2048,
  "moe_layer_freq": 1, "n_group": 8, "n_routed_experts": 256, "n_shared_experts": 1,
  "norm_topk_prob": true, "num_attention_heads": 128, "num_experts_per_tok": 8,
  "num_hidden_layers": 61, "num_key_value_heads": 128, "num_nextn_predict_layers": 1,
  "pretraining_tp": 1, "q_lora_rank": 1536, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
  "quantization_config": {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                          "weight_block_size": [128, 128]},
  "rms_norm_eps": 1e-06,
  "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 1.0,
                   "mscale_all_dim": 1.0, "original_max_position_embeddings": 4096,
                   "type": "yarn"},
  "rope_theta": 10000, "routed_scaling_factor": 2.5, "scoring_func": "sigmoid", "seq_aux": true,
  "tie_word_embeddings": false, "topk_group": 4, "topk_method": "noaux_tc",
  "torch_dtype": "bfloat16", "transformers_version": "4.33.1", "use_cache": true,
  "v_head_dim": 128, "vocab_size": 129280
})";

// moonshotai/Kimi-K2-Instruct config.json (auto_map abridged).
inline constexpr char kKimiK2[] = R"({
  "architectures": ["DeepseekV3ForCausalLM"],
  "attention_bias": false, "attention_dropout": 0.0, "aux_loss_alpha": 0.001,
  "bos_token_id": 163584, "eos_token_id": 163585, "first_k_dense_replace": 1,
  "hidden_act": "silu", "hidden_size": 7168, "initializer_range": 0.02,
  "intermediate_size": 18432, "kv_lora_rank": 512, "max_position_embeddings": 131072,
  "model_type": "kimi_k2", "moe_intermediate_size": 2048, "moe_layer_freq": 1, "n_group": 1,
  "n_routed_experts": 384, "n_shared_experts": 1, "norm_topk_prob": true,
  "num_attention_heads": 64, "num_experts_per_tok": 8, "num_hidden_layers": 61,
  "num_key_value_heads": 64, "num_nextn_predict_layers": 0, "pretraining_tp": 1,
  "q_lora_rank": 1536, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
  "rms_norm_eps": 1e-06,
  "rope_scaling": {"beta_fast": 1.0, "beta_slow": 1.0, "factor": 32.0, "mscale": 1.0,
                   "mscale_all_dim": 1.0, "original_max_position_embeddings": 4096,
                   "type": "yarn"},
  "rope_theta": 50000.0, "routed_scaling_factor": 2.827, "scoring_func": "sigmoid",
  "seq_aux": true, "tie_word_embeddings": false, "topk_group": 1, "topk_method": "noaux_tc",
  "torch_dtype": "bfloat16", "transformers_version": "4.48.3", "use_cache": true,
  "v_head_dim": 128, "vocab_size": 163840
})";

// ai21labs/Jamba-v0.1 config.json.
inline constexpr char kJamba[] = R"({
  "architectures": ["JambaForCausalLM"],
  "attention_dropout": 0.0, "attn_layer_offset": 4, "attn_layer_period": 8,
  "bos_token_id": 1, "calc_logits_for_entire_prompt": false, "eos_token_id": 2,
  "expert_layer_offset": 1, "expert_layer_period": 2, "hidden_act": "silu",
  "hidden_size": 4096, "initializer_range": 0.02, "intermediate_size": 14336,
  "mamba_conv_bias": true, "mamba_d_conv": 4, "mamba_d_state": 16, "mamba_dt_rank": 256,
  "mamba_expand": 2, "mamba_inner_layernorms": true, "mamba_proj_bias": false,
  "max_position_embeddings": 262144, "model_type": "jamba", "n_ctx": 262144,
  "num_attention_heads": 32, "num_experts": 16, "num_experts_per_tok": 2,
  "num_hidden_layers": 32, "num_key_value_heads": 8, "output_router_logits": false,
  "pad_token_id": 0, "rms_norm_eps": 1e-06, "router_aux_loss_coef": 0.001,
  "sliding_window": null, "tie_word_embeddings": false, "torch_dtype": "bfloat16",
  "transformers_version": "4.40.0.dev0", "use_cache": true, "use_mamba_kernels": true,
  "vocab_size": 65536
})";

// Qwen/Qwen3-Next-80B-A3B-Instruct config.json.
inline constexpr char kQwen3Next[] = R"({
  "architectures": ["Qwen3NextForCausalLM"],
  "attention_bias": false, "attention_dropout": 0.0, "bos_token_id": 151643,
  "decoder_sparse_step": 1, "eos_token_id": 151645, "full_attention_interval": 4,
  "head_dim": 256, "hidden_act": "silu", "hidden_size": 2048, "initializer_range": 0.02,
  "intermediate_size": 5120, "linear_conv_kernel_dim": 4, "linear_key_head_dim": 128,
  "linear_num_key_heads": 16, "linear_num_value_heads": 32, "linear_value_head_dim": 128,
  "max_position_embeddings": 262144, "mlp_only_layers": [], "model_type": "qwen3_next",
  "moe_intermediate_size": 512, "norm_topk_prob": true, "num_attention_heads": 16,
  "num_experts": 512, "num_experts_per_tok": 10, "num_hidden_layers": 48,
  "num_key_value_heads": 2, "output_router_logits": false, "partial_rotary_factor": 0.25,
  "rms_norm_eps": 1e-06, "rope_scaling": null, "rope_theta": 10000000,
  "router_aux_loss_coef": 0.001, "shared_expert_intermediate_size": 512,
  "tie_word_embeddings": false, "torch_dtype": "bfloat16", "transformers_version": "4.57.0.dev0",
  "use_cache": true, "use_sliding_window": false, "vocab_size": 151936
})";

// The issue's Qwen3.5-style row: a multimodal config whose text_config (model_type
// qwen3_5_text) has 64 layers, full_attention_interval 4, 4 key/value heads of 256 and, for the
// linear layers, Qwen3_5TextConfig's defaults (16 key and 32 value heads of 128, kernel 4).
// Constructed, not a model page's file.
inline constexpr char kQwen35Style[] = R"({
  "architectures": ["Qwen3_5ForConditionalGeneration"], "model_type": "qwen3_5",
  "image_token_id": 248056, "tie_word_embeddings": false,
  "vision_config": {"depth": 27, "hidden_size": 1152, "num_heads": 16},
  "text_config": {
    "model_type": "qwen3_5_text", "num_hidden_layers": 64, "full_attention_interval": 4,
    "num_attention_heads": 24, "num_key_value_heads": 4, "head_dim": 256, "hidden_size": 5120,
    "intermediate_size": 17408, "vocab_size": 248320, "max_position_embeddings": 262144,
    "linear_conv_kernel_dim": 4, "linear_key_head_dim": 128, "linear_value_head_dim": 128,
    "linear_num_key_heads": 16, "linear_num_value_heads": 32, "rms_norm_eps": 1e-06,
    "dtype": "bfloat16", "attention_bias": false, "partial_rotary_factor": 0.25
  }
})";

// state-spaces/mamba-2.8b-hf config.json.
inline constexpr char kMamba[] = R"({
  "architectures": ["MambaForCausalLM"], "bos_token_id": 0, "conv_kernel": 4,
  "eos_token_id": 0, "expand": 2, "hidden_act": "silu", "hidden_size": 2560,
  "initializer_range": 0.1, "intermediate_size": 5120, "layer_norm_epsilon": 1e-05,
  "model_type": "mamba", "n_layer": 64, "num_hidden_layers": 64, "pad_token_id": 0,
  "rescale_prenorm_residual": false, "residual_in_fp32": true, "state_size": 16,
  "time_step_floor": 0.0001, "time_step_init_scheme": "random", "time_step_max": 0.1,
  "time_step_min": 0.001, "time_step_rank": 160, "time_step_scale": 1.0,
  "torch_dtype": "float32", "transformers_version": "4.39.0.dev0", "use_bias": false,
  "use_cache": true, "use_conv_bias": true, "vocab_size": 50280
})";

// mistralai/Mamba-Codestral-7B-v0.1 config.json (Mamba-2), Infinity as Python writes it.
inline constexpr char kMamba2[] = R"({
  "architectures": ["Mamba2ForCausalLM"], "bos_token_id": 0, "chunk_size": 256,
  "conv_kernel": 4, "eos_token_id": 0, "expand": 2, "head_dim": 64, "hidden_act": "silu",
  "hidden_size": 4096, "initializer_range": 0.1, "layer_norm_epsilon": 1e-05,
  "model_type": "mamba2", "n_groups": 8, "norm_before_gate": true, "num_heads": 128,
  "num_hidden_layers": 64, "pad_token_id": 0, "rescale_prenorm_residual": false,
  "residual_in_fp32": true, "rms_norm": true, "state_size": 128, "tie_word_embeddings": false,
  "time_step_floor": 0.0001, "time_step_init_scheme": "random",
  "time_step_limit": [0.0, Infinity], "time_step_max": 0.1, "time_step_min": 0.001,
  "time_step_rank": 256, "time_step_scale": 1.0, "torch_dtype": "bfloat16",
  "transformers_version": "4.44.0.dev0", "use_bias": false, "use_cache": true,
  "use_conv_bias": true, "vocab_size": 32768
})";

// nvidia/Nemotron-H-8B-Base-8K config.json (auto_map abridged).
inline constexpr char kNemotronH8B[] = R"({
  "architectures": ["NemotronHForCausalLM"], "attention_bias": false,
  "attention_dropout": 0.0, "attention_head_dim": 128, "bos_token_id": 1, "chunk_size": 128,
  "conv_kernel": 4, "eos_token_id": 2, "expand": 2, "hidden_dropout": 0.0, "hidden_size": 4096,
  "hybrid_override_pattern": "M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M-",
  "initializer_range": 0.02, "intermediate_size": 21504, "layer_norm_epsilon": 1e-05,
  "mamba_head_dim": 64, "mamba_hidden_act": "silu", "mamba_num_heads": 128,
  "mamba_proj_bias": false, "max_position_embeddings": 8192, "mlp_bias": false,
  "mlp_hidden_act": "relu2", "model_type": "nemotron_h", "n_groups": 8,
  "num_attention_heads": 32, "num_hidden_layers": 52, "num_key_value_heads": 8,
  "num_logits_to_keep": 1, "pad_token_id": 0, "rescale_prenorm_residual": true,
  "residual_in_fp32": false, "rms_norm_eps": 1e-05, "sliding_window": null,
  "ssm_state_size": 128, "tie_word_embeddings": false, "time_step_floor": 0.0001,
  "time_step_limit": [0.0, Infinity], "time_step_max": 0.1, "time_step_min": 0.001,
  "time_step_rank": 256, "torch_dtype": "bfloat16", "transformers_version": "4.48.0.dev0",
  "use_bias": false, "use_cache": true, "use_conv_bias": true, "use_mamba_kernels": true,
  "vocab_size": 131072
})";

// meta-llama/Llama-4-Scout-17B-16E config.json (vision_config abridged; no_rope_layers as
// published: empty, so Llama4TextConfig makes every fourth layer NoPE).
inline constexpr char kLlama4Scout[] = R"({
  "architectures": ["Llama4ForConditionalGeneration"], "boi_token_index": 200080,
  "eoi_token_index": 200081, "image_token_index": 200092, "model_type": "llama4",
  "text_config": {
    "attention_bias": false, "attention_chunk_size": 8192, "attention_dropout": 0.0,
    "attn_scale": 0.1, "attn_temperature_tuning": true, "bos_token_id": 200000,
    "eos_token_id": [200001, 200007, 200008], "floor_scale": 8192, "head_dim": 128,
    "hidden_act": "silu", "hidden_size": 5120, "initializer_range": 0.02,
    "interleave_moe_layer_step": 1, "intermediate_size": 8192, "intermediate_size_mlp": 16384,
    "max_position_embeddings": 10485760, "model_type": "llama4_text", "moe_layers": [],
    "no_rope_layers": [], "num_attention_heads": 40, "num_experts_per_tok": 1,
    "num_hidden_layers": 48, "num_key_value_heads": 8, "num_local_experts": 16,
    "output_router_logits": false, "pad_token_id": 200018, "rms_norm_eps": 1e-05,
    "rope_scaling": {"factor": 16.0, "high_freq_factor": 1.0, "low_freq_factor": 1.0,
                     "original_max_position_embeddings": 8192, "rope_type": "llama3"},
    "rope_theta": 500000.0, "router_aux_loss_coef": 0.001, "router_jitter_noise": 0.0,
    "torch_dtype": "bfloat16", "use_cache": true, "use_qk_norm": true, "vocab_size": 202048
  },
  "tie_word_embeddings": false, "torch_dtype": "bfloat16", "transformers_version": "4.51.0.dev0",
  "vision_config": {"hidden_size": 1408, "num_hidden_layers": 34, "model_type": "llama4_vision_model"}
})";

// openai/gpt-oss-120b config.json (quantization_config abridged).
inline constexpr char kGptOss120B[] = R"({
  "architectures": ["GptOssForCausalLM"], "attention_bias": true, "attention_dropout": 0.0,
  "eos_token_id": 200002, "experts_per_token": 4, "head_dim": 64, "hidden_act": "silu",
  "hidden_size": 2880, "initial_context_length": 4096, "initializer_range": 0.02,
  "intermediate_size": 2880,
  "layer_types": ["sliding_attention", "full_attention", "sliding_attention", "full_attention",
    "sliding_attention", "full_attention", "sliding_attention", "full_attention",
    "sliding_attention", "full_attention", "sliding_attention", "full_attention",
    "sliding_attention", "full_attention", "sliding_attention", "full_attention",
    "sliding_attention", "full_attention", "sliding_attention", "full_attention",
    "sliding_attention", "full_attention", "sliding_attention", "full_attention",
    "sliding_attention", "full_attention", "sliding_attention", "full_attention",
    "sliding_attention", "full_attention", "sliding_attention", "full_attention",
    "sliding_attention", "full_attention", "sliding_attention", "full_attention"],
  "max_position_embeddings": 131072, "model_type": "gpt_oss", "num_attention_heads": 64,
  "num_experts_per_tok": 4, "num_hidden_layers": 36, "num_key_value_heads": 8,
  "num_local_experts": 128, "output_router_logits": false, "pad_token_id": 199999,
  "quantization_config": {"quant_method": "mxfp4"}, "rms_norm_eps": 1e-05,
  "rope_scaling": {"beta_fast": 32.0, "beta_slow": 1.0, "factor": 32.0,
                   "original_max_position_embeddings": 4096, "rope_type": "yarn",
                   "truncate": false},
  "rope_theta": 150000, "router_aux_loss_coef": 0.9, "sliding_window": 128,
  "swiglu_limit": 7.0, "tie_word_embeddings": false, "transformers_version": "4.55.0.dev0",
  "use_cache": true, "vocab_size": 201088
})";

// google/gemma-3-27b-it config.json (vision_config abridged).
inline constexpr char kGemma3_27B[] = R"({
  "architectures": ["Gemma3ForConditionalGeneration"], "boi_token_index": 255999,
  "eoi_token_index": 256000, "eos_token_id": [1, 106], "image_token_index": 262144,
  "initializer_range": 0.02, "mm_tokens_per_image": 256, "model_type": "gemma3",
  "text_config": {
    "head_dim": 128, "hidden_size": 5376, "intermediate_size": 21504, "model_type": "gemma3_text",
    "num_attention_heads": 32, "num_hidden_layers": 62, "num_key_value_heads": 16,
    "query_pre_attn_scalar": 168, "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
    "sliding_window": 1024, "sliding_window_pattern": 6
  },
  "torch_dtype": "bfloat16", "transformers_version": "4.50.0.dev0",
  "vision_config": {"hidden_size": 1152, "model_type": "siglip_vision_model"}
})";

}  // namespace attend::planner::testing

#endif  // ATTEND_TESTS_PLANNER_HYBRID_MODEL_FILES_H_
