#include "planner/import/hf_fields.h"

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "planner/model.h"

namespace attend::planner {
namespace {

// Every key any part of the importer reads (hf_config.cc, hf_layers.cc).
constexpr absl::string_view kRead[] = {
    // Shape, sizes, names and types.
    "model_type",
    "_name_or_path",
    "text_config",
    "num_hidden_layers",
    "n_layer",
    "num_attention_heads",
    "n_head",
    "num_key_value_heads",
    "num_kv_heads",
    "n_head_kv",
    "new_decoder_architecture",
    "multi_query",
    "head_dim",
    "attention_head_dim",
    "hidden_size",
    "vocab_size",
    "intermediate_size",
    "ffn_hidden_size",
    "max_position_embeddings",
    "torch_dtype",
    "dtype",
    "tie_word_embeddings",
    "num_local_experts",
    "num_experts",
    "n_routed_experts",
    "num_experts_per_tok",
    // Sliding windows and per-layer types.
    "sliding_window",
    "sliding_window_size",
    "layer_types",
    "use_sliding_window",
    "max_window_layers",
    "sliding_window_pattern",
    // Chunked attention (Llama 4).
    "attention_chunk_size",
    "no_rope_layers",
    "no_rope_layer_interval",
    // Latent attention (DeepSeek-V2/V3, Kimi K2).
    "kv_lora_rank",
    "qk_rope_head_dim",
    "qk_nope_head_dim",
    "v_head_dim",
    // Gated delta-net (Qwen3-Next, Qwen3.5).
    "full_attention_interval",
    "linear_conv_kernel_dim",
    "linear_key_head_dim",
    "linear_value_head_dim",
    "linear_num_key_heads",
    "linear_num_value_heads",
    // Mamba, Mamba-2, Jamba, Nemotron-H.
    "state_size",
    "conv_kernel",
    "expand",
    "num_heads",
    "n_groups",
    "attn_layer_period",
    "attn_layer_offset",
    "mamba_d_state",
    "mamba_d_conv",
    "mamba_expand",
    "hybrid_override_pattern",
    "layers_block_type",
    "mamba_num_heads",
    "mamba_head_dim",
    "mamba_n_groups",
    "ssm_state_size",
};

// Keys that do not change what a layer caches per token or per sequence, nor the counts above.
constexpr absl::string_view kIgnored[] = {
    // Bookkeeping and token ids.
    "architectures",
    "auto_map",
    "transformers_version",
    "bos_token_id",
    "eos_token_id",
    "pad_token_id",
    "use_cache",
    "initializer_range",
    "quantization_config",
    "torchscript",
    "return_dict",
    "output_attentions",
    "output_hidden_states",
    "is_decoder",
    // Activations, norms, dropout, biases, scalings.
    "hidden_act",
    "hidden_activation",
    "mlp_hidden_act",
    "mamba_hidden_act",
    "rms_norm_eps",
    "layer_norm_epsilon",
    "layer_norm_eps",
    "norm_eps",
    "attention_bias",
    "attention_dropout",
    "hidden_dropout",
    "mlp_bias",
    "use_bias",
    "bias",
    "use_conv_bias",
    "mamba_conv_bias",
    "mamba_proj_bias",
    "mamba_inner_layernorms",
    "rms_norm",
    "norm_before_gate",
    "residual_in_fp32",
    "rescale_prenorm_residual",
    "query_pre_attn_scalar",
    "attn_logit_softcapping",
    "final_logit_softcapping",
    "router_logit_softcapping",
    "attention_multiplier",
    "embedding_multiplier",
    "residual_multiplier",
    "logits_scaling",
    "use_qk_norm",
    "qk_layernorm",
    "attn_temperature_tuning",
    "floor_scale",
    "attn_scale",
    "swiglu_limit",
    "parallel_attn",
    "alibi",
    "apply_residual_connection_post_layernorm",
    "pretraining_tp",
    "resid_pdrop",
    "embd_pdrop",
    "attn_pdrop",
    // RoPE: positions, not what is cached.
    "rope_theta",
    "rope_scaling",
    "rope_parameters",
    "partial_rotary_factor",
    "rope_local_base_freq",
    "original_max_position_embeddings",
    "initial_context_length",
    // MoE routing and widths (the planner sizes the weights from intermediate_size only).
    "moe_intermediate_size",
    "shared_expert_intermediate_size",
    "n_shared_experts",
    "routed_scaling_factor",
    "scoring_func",
    "topk_method",
    "topk_group",
    "n_group",
    "norm_topk_prob",
    "first_k_dense_replace",
    "moe_layer_freq",
    "ep_size",
    "aux_loss_alpha",
    "seq_aux",
    "decoder_sparse_step",
    "mlp_only_layers",
    "output_router_logits",
    "router_aux_loss_coef",
    "router_jitter_noise",
    "expert_layer_period",
    "expert_layer_offset",
    "experts_per_token",
    "interleave_moe_layer_step",
    "intermediate_size_mlp",
    "moe_layers",
    "moe_shared_expert_intermediate_size",
    "num_shared_experts",
    // DeepSeek: the query's own compression, and the multi-token-prediction module, which only
    // speculative decoding runs (an engine that uses it adds one layer's cache).
    "q_lora_rank",
    "num_nextn_predict_layers",
    // Mamba kernels and the time-step projection (neither is part of the state).
    "time_step_rank",
    "time_step_min",
    "time_step_max",
    "time_step_floor",
    "time_step_limit",
    "time_step_scale",
    "time_step_init_scheme",
    "mamba_dt_rank",
    "mamba_dt_min",
    "mamba_dt_max",
    "mamba_dt_limit",
    "mamba_dt_init_floor",
    "use_mamba_kernels",
    "chunk_size",
    "mamba_chunk_size",
    "mamba_ssm_cache_dtype",
    "calc_logits_for_entire_prompt",
    "num_logits_to_keep",
    // Tooling flags: llm-compressor's marker in Llama 4's text_config.
    "for_llm_compressor",
    // The tokenizer's and the serving stack's view of the context.
    "cache_implementation",
    "n_ctx",
};

// Name fragments of fields that can change what a layer caches.
constexpr absl::string_view kLayoutWords[] = {
    "window",    "chunk", "lora",      "rope_head", "nope",   "kv",     "layer",  "block_type",
    "pattern",   "attn",  "attention", "ssm",       "mamba",  "linear", "conv",   "state",
    "recurrent", "head",  "global",    "local",     "cross",  "shared", "index",  "compress",
    "rwkv",      "wkv",   "interval",  "delta",     "hybrid", "expand", "latent", "sparse",
};

bool In(absl::string_view key, absl::Span<const absl::string_view> list) {
  for (absl::string_view k : list) {
    if (k == key) return true;
  }
  return false;
}

}  // namespace

bool IsReadHfField(absl::string_view key) { return In(key, kRead); }
bool IsIgnoredHfField(absl::string_view key) { return In(key, kIgnored); }

absl::Status CheckHfFields(const json::Value& config, absl::string_view prefix,
                           absl::string_view model_type) {
  for (const json::Value::Member& member : config.members()) {
    const std::string& key = member.first;
    if (IsReadHfField(key) || IsIgnoredHfField(key)) continue;
    // Sub-configs of other towers (vision_config, audio_config) hold no text-model cache.
    if (absl::EndsWith(key, "_config") && member.second.is_object()) continue;
    // The original Mamba configs carry an empty ssm_cfg (the mixer's defaults); an empty object
    // overrides nothing. One with entries is refused below.
    if (key == "ssm_cfg" && member.second.is_object() && member.second.members().empty()) continue;
    for (absl::string_view word : kLayoutWords) {
      if (absl::StrContains(key, word)) {
        return absl::InvalidArgumentError(
            absl::StrCat(QuoteForError(absl::StrCat(prefix, key)),
                         ": not understood; it may change the attention layout, and architecture ",
                         QuoteForError(model_type.empty() ? "(no model_type)" : model_type),
                         " is not modelled"));
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace attend::planner
