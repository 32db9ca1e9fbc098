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
    "qk_head_dim",  // checked: qk_nope_head_dim + qk_rope_head_dim (or head_dim)
    // Gated delta-net (Qwen3-Next, Qwen3.5).
    "full_attention_interval",
    "linear_conv_kernel_dim",
    "linear_key_head_dim",
    "linear_value_head_dim",
    "linear_num_key_heads",
    "linear_num_value_heads",
    // Lightning attention (MiniMax-M1 / MiniMax-Text-01, MiniMax-M2's all-softmax list).
    "attn_type_list",
    // Per-layer key/value heads (MiMo-V2-Flash).
    "hybrid_layer_pattern",
    "swa_num_attention_heads",
    "swa_num_key_value_heads",
    "swa_head_dim",
    "swa_v_head_dim",
    // Kimi Delta Attention (Kimi Linear).
    "linear_attn_config",
    "num_experts_per_token",
    // DeepSeek sparse attention's indexer (DeepSeek-V3.2, GLM-5).
    "index_head_dim",
    "index_n_heads",
    "indexer_types",
    "index_topk_freq",
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

// Why keys are ignored; each entry below names one.
constexpr absl::string_view kBookkeeping =
    "bookkeeping, token ids and output switches: nothing a layer stores";
constexpr absl::string_view kNumerics =
    "activations, norms, dropout, biases and scalings: they change values, not what is cached";
constexpr absl::string_view kRope = "RoPE: how positions are encoded, not what is cached";
constexpr absl::string_view kMoe =
    "MoE routing and widths: the planner sizes the weights from intermediate_size only";
constexpr absl::string_view kMamba =
    "Mamba kernels and the time-step projection: neither is part of the state";
constexpr absl::string_view kTooling =
    "a tooling marker (llm-compressor's, in Llama 4's text_config)";
constexpr absl::string_view kContextView =
    "the tokenizer's or the serving stack's view of the context";
constexpr absl::string_view kQueryLora =
    "the query's own low-rank compression: queries are not cached";
constexpr absl::string_view kMtp =
    "multi-token prediction (MTP) and speculative heads: run only by speculative decoding; the "
    "plan sizes the base model (an engine that drafts with them adds their layers' cache)";
constexpr absl::string_view kNestedDefaults =
    "a PretrainedConfig default that transformers writes into nested configs; ignored only "
    "while off (null, false, 0 or empty): on, it would add cross-attention or prune heads";
constexpr absl::string_view kKernel =
    "which attention kernel transformers runs: not what is cached";
constexpr absl::string_view kOutputGate =
    "a gate on the attention output (Qwen3-Next / Qwen3.5): it widens the query projection, "
    "and caches nothing";
constexpr absl::string_view kSink =
    "a learned attention-sink logit per head (MiMo-V2-Flash): a term in the softmax, not a "
    "cached row";
constexpr absl::string_view kLayerNormScale =
    "MiniMax's DeepNorm residual scales per layer kind: values, not what is cached";
constexpr absl::string_view kStateDtypeHint =
    "the type an engine keeps the recurrent state in: the plan takes it from the request's "
    "state_dtype";
constexpr absl::string_view kTopK =
    "how many cached tokens the sparse-attention indexer selects for each query: every token's "
    "latent and indexer key is still cached";
constexpr absl::string_view kIndexerPositions =
    "how the indexer applies RoPE: positions, not what is cached";
constexpr absl::string_view kSkipOffset =
    "places the layers that share another layer's indexer selection, which only "
    "index_topk_freq > 1 or 'shared' indexer_types create (both refused)";
constexpr absl::string_view kMlpTypes =
    "dense or MoE MLP per layer: weights, not the attention layout";
constexpr absl::string_view kNope =
    "Kimi Linear's MLA skips RoPE on the rope part; the latent row is still kv_lora_rank + "
    "qk_rope_head_dim values";
constexpr absl::string_view kHybridBlock =
    "MiMo's block size of a hybrid pattern; ignored only while off (null or 0), since "
    "hybrid_layer_pattern is what the importer reads";

// Keys that do not change what a layer caches per token or per sequence, nor the counts above.
constexpr IgnoredHfField kIgnored[] = {
    // Bookkeeping and token ids.
    {"architectures", IgnoreWhen::kAlways, kBookkeeping},
    {"auto_map", IgnoreWhen::kAlways, kBookkeeping},
    {"transformers_version", IgnoreWhen::kAlways, kBookkeeping},
    {"bos_token_id", IgnoreWhen::kAlways, kBookkeeping},
    {"eos_token_id", IgnoreWhen::kAlways, kBookkeeping},
    {"pad_token_id", IgnoreWhen::kAlways, kBookkeeping},
    {"use_cache", IgnoreWhen::kAlways, kBookkeeping},
    {"initializer_range", IgnoreWhen::kAlways, kBookkeeping},
    {"quantization_config", IgnoreWhen::kAlways, kBookkeeping},
    {"torchscript", IgnoreWhen::kAlways, kBookkeeping},
    {"return_dict", IgnoreWhen::kAlways, kBookkeeping},
    {"output_attentions", IgnoreWhen::kAlways, kBookkeeping},
    {"output_hidden_states", IgnoreWhen::kAlways, kBookkeeping},
    {"is_decoder", IgnoreWhen::kAlways, kBookkeeping},
    // Activations, norms, dropout, biases, scalings.
    {"hidden_act", IgnoreWhen::kAlways, kNumerics},
    {"hidden_activation", IgnoreWhen::kAlways, kNumerics},
    {"mlp_hidden_act", IgnoreWhen::kAlways, kNumerics},
    {"mamba_hidden_act", IgnoreWhen::kAlways, kNumerics},
    {"rms_norm_eps", IgnoreWhen::kAlways, kNumerics},
    {"layer_norm_epsilon", IgnoreWhen::kAlways, kNumerics},
    {"layer_norm_eps", IgnoreWhen::kAlways, kNumerics},
    {"norm_eps", IgnoreWhen::kAlways, kNumerics},
    {"attention_bias", IgnoreWhen::kAlways, kNumerics},
    {"attention_dropout", IgnoreWhen::kAlways, kNumerics},
    {"hidden_dropout", IgnoreWhen::kAlways, kNumerics},
    {"mlp_bias", IgnoreWhen::kAlways, kNumerics},
    {"use_bias", IgnoreWhen::kAlways, kNumerics},
    {"bias", IgnoreWhen::kAlways, kNumerics},
    {"use_conv_bias", IgnoreWhen::kAlways, kNumerics},
    {"mamba_conv_bias", IgnoreWhen::kAlways, kNumerics},
    {"mamba_proj_bias", IgnoreWhen::kAlways, kNumerics},
    {"mamba_inner_layernorms", IgnoreWhen::kAlways, kNumerics},
    {"rms_norm", IgnoreWhen::kAlways, kNumerics},
    {"norm_before_gate", IgnoreWhen::kAlways, kNumerics},
    {"residual_in_fp32", IgnoreWhen::kAlways, kNumerics},
    {"rescale_prenorm_residual", IgnoreWhen::kAlways, kNumerics},
    {"query_pre_attn_scalar", IgnoreWhen::kAlways, kNumerics},
    {"attn_logit_softcapping", IgnoreWhen::kAlways, kNumerics},
    {"final_logit_softcapping", IgnoreWhen::kAlways, kNumerics},
    {"router_logit_softcapping", IgnoreWhen::kAlways, kNumerics},
    {"attention_multiplier", IgnoreWhen::kAlways, kNumerics},
    {"embedding_multiplier", IgnoreWhen::kAlways, kNumerics},
    {"residual_multiplier", IgnoreWhen::kAlways, kNumerics},
    {"logits_scaling", IgnoreWhen::kAlways, kNumerics},
    {"use_qk_norm", IgnoreWhen::kAlways, kNumerics},
    {"qk_layernorm", IgnoreWhen::kAlways, kNumerics},
    {"attn_temperature_tuning", IgnoreWhen::kAlways, kNumerics},
    {"floor_scale", IgnoreWhen::kAlways, kNumerics},
    {"attn_scale", IgnoreWhen::kAlways, kNumerics},
    {"swiglu_limit", IgnoreWhen::kAlways, kNumerics},
    {"parallel_attn", IgnoreWhen::kAlways, kNumerics},
    {"alibi", IgnoreWhen::kAlways, kNumerics},
    {"apply_residual_connection_post_layernorm", IgnoreWhen::kAlways, kNumerics},
    {"pretraining_tp", IgnoreWhen::kAlways, kNumerics},
    {"resid_pdrop", IgnoreWhen::kAlways, kNumerics},
    {"embd_pdrop", IgnoreWhen::kAlways, kNumerics},
    {"attn_pdrop", IgnoreWhen::kAlways, kNumerics},
    // RoPE: positions, not what is cached.
    {"rope_theta", IgnoreWhen::kAlways, kRope},
    {"rope_scaling", IgnoreWhen::kAlways, kRope},
    {"rope_parameters", IgnoreWhen::kAlways, kRope},
    {"partial_rotary_factor", IgnoreWhen::kAlways, kRope},
    {"rope_local_base_freq", IgnoreWhen::kAlways, kRope},
    {"original_max_position_embeddings", IgnoreWhen::kAlways, kRope},
    {"initial_context_length", IgnoreWhen::kAlways, kRope},
    // MoE routing and widths (the planner sizes the weights from intermediate_size only).
    {"moe_intermediate_size", IgnoreWhen::kAlways, kMoe},
    {"shared_expert_intermediate_size", IgnoreWhen::kAlways, kMoe},
    {"n_shared_experts", IgnoreWhen::kAlways, kMoe},
    {"routed_scaling_factor", IgnoreWhen::kAlways, kMoe},
    {"scoring_func", IgnoreWhen::kAlways, kMoe},
    {"topk_method", IgnoreWhen::kAlways, kMoe},
    {"topk_group", IgnoreWhen::kAlways, kMoe},
    {"n_group", IgnoreWhen::kAlways, kMoe},
    {"norm_topk_prob", IgnoreWhen::kAlways, kMoe},
    {"first_k_dense_replace", IgnoreWhen::kAlways, kMoe},
    {"moe_layer_freq", IgnoreWhen::kAlways, kMoe},
    {"ep_size", IgnoreWhen::kAlways, kMoe},
    {"aux_loss_alpha", IgnoreWhen::kAlways, kMoe},
    {"seq_aux", IgnoreWhen::kAlways, kMoe},
    {"decoder_sparse_step", IgnoreWhen::kAlways, kMoe},
    {"mlp_only_layers", IgnoreWhen::kAlways, kMoe},
    {"output_router_logits", IgnoreWhen::kAlways, kMoe},
    {"router_aux_loss_coef", IgnoreWhen::kAlways, kMoe},
    {"router_jitter_noise", IgnoreWhen::kAlways, kMoe},
    {"expert_layer_period", IgnoreWhen::kAlways, kMoe},
    {"expert_layer_offset", IgnoreWhen::kAlways, kMoe},
    {"experts_per_token", IgnoreWhen::kAlways, kMoe},
    {"interleave_moe_layer_step", IgnoreWhen::kAlways, kMoe},
    {"intermediate_size_mlp", IgnoreWhen::kAlways, kMoe},
    {"moe_layers", IgnoreWhen::kAlways, kMoe},
    {"moe_shared_expert_intermediate_size", IgnoreWhen::kAlways, kMoe},
    {"num_shared_experts", IgnoreWhen::kAlways, kMoe},
    // DeepSeek: the query's own compression.
    {"q_lora_rank", IgnoreWhen::kAlways, kQueryLora},
    // Multi-token prediction and speculative heads.
    {"num_nextn_predict_layers", IgnoreWhen::kAlways, kMtp},
    {"mtp_num_hidden_layers", IgnoreWhen::kAlways, kMtp},
    {"mtp_use_dedicated_embeddings", IgnoreWhen::kAlways, kMtp},
    {"mtp_transformer_layers", IgnoreWhen::kAlways, kMtp},
    {"num_mtp_modules", IgnoreWhen::kAlways, kMtp},
    {"use_mtp", IgnoreWhen::kAlways, kMtp},
    {"index_share_for_mtp_iteration", IgnoreWhen::kAlways, kMtp},
    // Mamba kernels and the time-step projection (neither is part of the state).
    {"time_step_rank", IgnoreWhen::kAlways, kMamba},
    {"time_step_min", IgnoreWhen::kAlways, kMamba},
    {"time_step_max", IgnoreWhen::kAlways, kMamba},
    {"time_step_floor", IgnoreWhen::kAlways, kMamba},
    {"time_step_limit", IgnoreWhen::kAlways, kMamba},
    {"time_step_scale", IgnoreWhen::kAlways, kMamba},
    {"time_step_init_scheme", IgnoreWhen::kAlways, kMamba},
    {"mamba_dt_rank", IgnoreWhen::kAlways, kMamba},
    {"mamba_dt_min", IgnoreWhen::kAlways, kMamba},
    {"mamba_dt_max", IgnoreWhen::kAlways, kMamba},
    {"mamba_dt_limit", IgnoreWhen::kAlways, kMamba},
    {"mamba_dt_init_floor", IgnoreWhen::kAlways, kMamba},
    {"use_mamba_kernels", IgnoreWhen::kAlways, kMamba},
    {"chunk_size", IgnoreWhen::kAlways, kMamba},
    {"mamba_chunk_size", IgnoreWhen::kAlways, kMamba},
    {"mamba_ssm_cache_dtype", IgnoreWhen::kAlways, kMamba},
    {"calc_logits_for_entire_prompt", IgnoreWhen::kAlways, kMamba},
    {"num_logits_to_keep", IgnoreWhen::kAlways, kMamba},
    // Tooling flags: llm-compressor's marker in Llama 4's text_config.
    {"for_llm_compressor", IgnoreWhen::kAlways, kTooling},
    // The tokenizer's and the serving stack's view of the context.
    {"cache_implementation", IgnoreWhen::kAlways, kContextView},
    {"n_ctx", IgnoreWhen::kAlways, kContextView},
    // Defaults transformers writes into nested configs (text_config), value-judged.
    {"add_cross_attention", IgnoreWhen::kOff, kNestedDefaults},
    {"cross_attention_hidden_size", IgnoreWhen::kOff, kNestedDefaults},
    {"pruned_heads", IgnoreWhen::kOff, kNestedDefaults},
    {"chunk_size_feed_forward", IgnoreWhen::kAlways, kNumerics},
    {"_attn_implementation", IgnoreWhen::kAlways, kKernel},
    {"_attn_implementation_autoset", IgnoreWhen::kAlways, kKernel},
    // Attention details that cache nothing.
    {"attn_output_gate", IgnoreWhen::kAlways, kOutputGate},
    {"output_gate_type", IgnoreWhen::kAlways, kOutputGate},
    {"add_swa_attention_sink_bias", IgnoreWhen::kAlways, kSink},
    {"add_full_attention_sink_bias", IgnoreWhen::kAlways, kSink},
    {"attention_value_scale", IgnoreWhen::kAlways, kNumerics},
    {"swa_rope_theta", IgnoreWhen::kAlways, kRope},
    {"layernorm_full_attention_alpha", IgnoreWhen::kAlways, kLayerNormScale},
    {"layernorm_full_attention_beta", IgnoreWhen::kAlways, kLayerNormScale},
    {"layernorm_linear_attention_alpha", IgnoreWhen::kAlways, kLayerNormScale},
    {"layernorm_linear_attention_beta", IgnoreWhen::kAlways, kLayerNormScale},
    {"layernorm_mlp_alpha", IgnoreWhen::kAlways, kLayerNormScale},
    {"layernorm_mlp_beta", IgnoreWhen::kAlways, kLayerNormScale},
    {"layernorm_epsilon", IgnoreWhen::kAlways, kNumerics},
    {"shared_intermediate_size", IgnoreWhen::kAlways, kMoe},
    {"shared_moe_mode", IgnoreWhen::kAlways, kMoe},
    {"mamba_ssm_dtype", IgnoreWhen::kAlways, kStateDtypeHint},
    {"mla_use_nope", IgnoreWhen::kAlways, kNope},
    {"mlp_layer_types", IgnoreWhen::kAlways, kMlpTypes},
    {"hybrid_block_size", IgnoreWhen::kOff, kHybridBlock},
    // DeepSeek sparse attention: what the indexer selects, not what it caches.
    {"index_topk", IgnoreWhen::kAlways, kTopK},
    {"indexer_rope_interleave", IgnoreWhen::kAlways, kIndexerPositions},
    {"index_skip_topk_offset", IgnoreWhen::kAlways, kSkipOffset},
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

const IgnoredHfField* FindIgnored(absl::string_view key) {
  for (const IgnoredHfField& f : kIgnored) {
    if (f.key == key) return &f;
  }
  return nullptr;
}

// Keys of DeepSeek sparse attention's indexer. They are read or ignored only beside
// index_head_dim, the indexer's key size: without it the cache of the indexer they describe
// cannot be sized, so they are judged as unknown keys (refused).
constexpr absl::string_view kIndexerKeys[] = {
    "index_topk",
    "index_n_heads",
    "indexer_types",
    "index_topk_freq",
    "indexer_rope_interleave",
    "index_skip_topk_offset",
    "index_share_for_mtp_iteration",
};

// null, false, 0, "" and empty arrays or objects.
bool IsOff(const json::Value& v) {
  if (v.is_null()) return true;
  if (v.is_bool()) return !v.bool_value();
  if (v.is_number()) return v.number_value() == 0.0;
  if (v.is_string()) return v.string_value().empty();
  if (v.is_array()) return v.size() == 0;
  if (v.is_object()) return v.members().empty();
  return false;
}

}  // namespace

bool IsReadHfField(absl::string_view key) { return In(key, kRead); }
bool IsIgnoredHfField(absl::string_view key) { return FindIgnored(key) != nullptr; }
bool ShapesCacheHfField(absl::string_view key) {
  // Read keys that name, type or weigh the model but do not change what a layer caches.
  static constexpr absl::string_view kNotLayout[] = {
      "model_type",
      "_name_or_path",
      "text_config",
      "torch_dtype",
      "dtype",
      "tie_word_embeddings",
      "vocab_size",
      "intermediate_size",
      "ffn_hidden_size",
      "max_position_embeddings",
      "num_local_experts",
      "num_experts",
      "n_routed_experts",
      "num_experts_per_tok",
      "num_experts_per_token",
  };
  return (IsReadHfField(key) && !In(key, kNotLayout)) || In(key, kIndexerKeys);
}
absl::Span<const IgnoredHfField> IgnoredHfFields() { return kIgnored; }

absl::Status CheckHfFields(const json::Value& config, absl::string_view prefix,
                           absl::string_view model_type) {
  const bool indexer = config.Find("index_head_dim") != nullptr;
  for (const json::Value::Member& member : config.members()) {
    const std::string& key = member.first;
    const bool known = indexer || !In(key, kIndexerKeys);
    if (known && IsReadHfField(key)) continue;
    if (const IgnoredHfField* ignored = known ? FindIgnored(key) : nullptr; ignored != nullptr) {
      if (ignored->when == IgnoreWhen::kAlways || IsOff(member.second)) continue;
      return absl::InvalidArgumentError(absl::StrCat(
          QuoteForError(absl::StrCat(prefix, key)), ": set (", member.second.type_name(),
          " that is not off) where only off is understood: ", ignored->reason, "; architecture ",
          QuoteForError(model_type.empty() ? "(no model_type)" : model_type),
          " is not modelled with it"));
    }
    // Sub-configs of other towers (vision_config, audio_config) hold no text-model cache. One
    // whose name says it shapes the text model's layers (a linear_attn_config the importer does
    // not read) is judged below like any key.
    if (absl::EndsWith(key, "_config") && member.second.is_object() &&
        !absl::StrContains(key, "attn") && !absl::StrContains(key, "attention")) {
      continue;
    }
    // The original Mamba configs carry an empty ssm_cfg (the mixer's defaults); an empty object
    // overrides nothing. One with entries is refused below.
    if (key == "ssm_cfg" && member.second.is_object() && member.second.members().empty()) continue;
    for (absl::string_view word : kLayoutWords) {
      if (absl::StrContains(key, word)) {
        return absl::InvalidArgumentError(absl::StrCat(
            QuoteForError(absl::StrCat(prefix, key)),
            ": not understood; it may change the attention layout, and architecture ",
            QuoteForError(model_type.empty() ? "(no model_type)" : model_type), " is not modelled",
            In(key, kIndexerKeys) ? " (the sparse-attention indexer's keys are read only beside "
                                    "index_head_dim, its cached key size)"
                                  : ""));
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace attend::planner
