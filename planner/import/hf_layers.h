// Which kind each layer of a Hugging Face config.json is, and what it holds per sequence: the
// per-layer part of ImportHfConfig (hf_config.h).
//
// Layouts, in order of precedence (the first that the config describes):
//   - model_type mamba / falcon_mamba / mamba2: every layer is a state-space mixer.
//   - hybrid_override_pattern (Nemotron-H; one character per layer: M Mamba-2, * attention, - MLP,
//     E MoE) or layers_block_type ("mamba", "attention", "mlp", "moe").
//   - attn_layer_period / attn_layer_offset (Jamba): layer i attends when i % period == offset,
//     the others are Mamba mixers (transformers' JambaConfig.layers_block_type).
//   - attn_type_list (MiniMax-M1, MiniMax-Text-01; MiniMax-M2 lists only 1s): 0 = lightning
//     attention, 1 = softmax attention.
//   - linear_attn_config (Kimi Linear): kda_layers and full_attn_layers, 1-based, naming every
//     layer once; the full layers are latent (MLA) with kv_lora_rank.
//   - hybrid_layer_pattern (MiMo-V2-Flash): 0 = full attention, 1 = sliding window.
//   - layer_types: "full_attention", "sliding_attention" (sliding_window), "chunked_attention"
//     (attention_chunk_size), "linear_attention" (gated delta-net), "deepseek_sparse_attention"
//     (GLM-5: latent attention with an indexer; needs kv_lora_rank and index_head_dim).
//   - full_attention_interval (Qwen3-Next, Qwen3.5; default 4 for their model_types): layer i is
//     full attention when (i + 1) % interval == 0, else linear attention (Qwen3NextConfig).
//   - attention_chunk_size (Llama 4): chunked, except the NoPE layers (no_rope_layers[i] == 0,
//     default every no_rope_layer_interval-th, 4), which attend fully (Llama4TextConfig).
//   - otherwise the sliding-window rules of hf_config.h.
// With kv_lora_rank (DeepSeek-V2/V3, Kimi K2) every attention layer is latent: it caches
// kv_lora_rank + qk_rope_head_dim values per token, and head_dim / head_dim_v become the
// expanded qk_nope_head_dim + qk_rope_head_dim and v_head_dim (DeepseekV3Attention). Without
// it, v_head_dim is the value heads' size. With index_head_dim (DeepSeek-V3.2, GLM-5) every
// latent layer also caches a sparse-attention indexer key per token (LayerSpec::index_head_dim);
// index_head_dim without kv_lora_rank, index_topk_freq > 1 and indexer_types other than "full"
// (layers sharing another's selection) are refused.
// swa_num_key_value_heads (MiMo-V2-Flash) gives every sliding-window layer its own key/value
// head count; swa_num_attention_heads, swa_head_dim and swa_v_head_dim must equal the model's.
//
// State sizes per sequence and layer, from the models' definitions. The convolution keeps
// kernel - 1 columns, as llama.cpp (llama_hparams::n_embd_r) and vLLM do; transformers' caches
// keep kernel columns, one of which is shifted out before it is read.
//   - Mamba (modeling_mamba.py, MambaMixer): d_inner = expand x hidden_size; conv (conv_kernel -
//     1) x d_inner; SSM d_inner x state_size. Jamba the same with mamba_expand, mamba_d_conv,
//     mamba_d_state.
//   - Mamba-2 (modeling_mamba2.py, Mamba2Mixer): d_inner = num_heads x head_dim (= expand x
//     hidden_size); conv (conv_kernel - 1) x (d_inner + 2 x n_groups x state_size); SSM
//     num_heads x head_dim x state_size. Nemotron-H the same with mamba_num_heads,
//     mamba_head_dim, n_groups, ssm_state_size, conv_kernel (modeling_nemotron_h.py).
//   - Gated delta-net (modeling_qwen3_next.py, Qwen3NextGatedDeltaNet): key_dim =
//     linear_num_key_heads x linear_key_head_dim, value_dim = linear_num_value_heads x
//     linear_value_head_dim; conv (linear_conv_kernel_dim - 1) x (2 x key_dim + value_dim);
//     recurrent linear_num_value_heads x linear_key_head_dim x linear_value_head_dim.
//   - Lightning attention (SGLang's MiniMaxText01Config.state_shape, vLLM's
//     MiniMaxText01LinearAttention): no convolution; recurrent num_attention_heads x head_dim x
//     head_dim.
//   - Kimi Delta Attention (vLLM's kda_state_shape): conv (short_conv_kernel_size - 1) x 3 x
//     num_heads x head_dim (q, k and v), recurrent num_heads x head_dim x head_dim, all from
//     linear_attn_config.
// Every count is read with its bound, and hostile layouts (an interval or period of 0, an offset
// past the layer count, a pattern or list of the wrong length, an unknown layer type) are
// INVALID_ARGUMENT naming the field.
//
// Thread-safety: pure functions.
#ifndef ATTEND_PLANNER_IMPORT_HF_LAYERS_H_
#define ATTEND_PLANNER_IMPORT_HF_LAYERS_H_

#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "planner/import/hf_config_reader.h"
#include "planner/model.h"

namespace attend::planner {

// Whether `model_type` has no attention at all (Mamba, Falcon Mamba, Mamba-2).
bool IsStateSpaceOnly(absl::string_view model_type);

// The layer count of a Nemotron-H config that gives only its pattern (the length of
// hybrid_override_pattern or layers_block_type); nullopt when it gives neither.
std::optional<int64_t> PatternLayers(const ConfigReader& r);

// INVALID_ARGUMENT naming the key when `model_type` is one of the architectures whose layout
// comes from one key (kv_lora_rank, index_head_dim, attn_type_list, ...) and the config lacks
// it: "index_head_dim: missing or null; model_type 'glm_moe_dsa' needs it ...".
absl::Status RequireLayoutFields(const ConfigReader& r, const std::string& model_type);

// Sets m->layer_specs (one per layer) and, for latent attention, m->head_dim and m->head_dim_v.
// REQUIRES: m->layers, and for models with attention m->n_head_kv, are read.
absl::Status ReadLayerLayout(const ConfigReader& r, const std::string& model_type, ModelSpec* m);

}  // namespace attend::planner

#endif  // ATTEND_PLANNER_IMPORT_HF_LAYERS_H_
