// The per-layer kinds of a GGUF header's model, from the keys llama.cpp writes for latent
// attention, hybrids and state-space models: the per-layer part of ImportGguf (gguf.h).
//
//   - <arch>.attention.kv_lora_rank (deepseek2 and its relatives): every attention layer is
//     latent with qk_rope_head_dim = <arch>.rope.dimension_count. Converters since llama.cpp's
//     MLA rewrite write the expanded head sizes as attention.key_length_mla / value_length_mla
//     (and key_length = kv_lora_rank + rope, head_count_kv 1); older ones wrote them as
//     key_length / value_length with head_count_kv heads. Either way the model's head_dim /
//     head_dim_v and n_head_kv become the expanded ones.
//   - <arch>.attention.indexer.key_length (glm-dsa, GLM-5; llama.cpp's
//     LLM_KV_ATTENTION_INDEXER_KEY_LENGTH): every latent layer also caches a sparse-attention
//     indexer key per token (LayerSpec::index_head_dim); required for glm-dsa, refused without
//     kv_lora_rank. (llama.cpp writes no keys for lightning attention, Kimi Delta Attention or
//     per-layer-kind head counts beyond the per-layer head_count_kv array, which is read.)
//   - Recurrent layers, as llama.cpp's llm_arch loaders mark them: every layer of mamba and
//     mamba2; a layer with head_count_kv 0 of jamba, plamo2 and granitehybrid; of nemotron_h a
//     layer with head_count_kv 0 and feed_forward_length 0 (with feed_forward_length > 0 it is
//     an MLP layer); of qwen3next, qwen35 and qwen35moe the layers with (i + 1) %
//     full_attention_interval != 0 (default 4), which are gated delta-nets (linear attention).
//   - Their state, as llama_hparams::n_embd_r and n_embd_s size it: conv (ssm.conv_kernel - 1)
//     x (ssm.inner_size + 2 x ssm.group_count x ssm.state_size), recurrent ssm.state_size x
//     ssm.inner_size (for Qwen3-Next's delta-net: state_size = head_k_dim, inner_size =
//     num_v_heads x head_v_dim, group_count = num_k_heads, so the same formulas as
//     hf_layers.h's).
//   - llama4: chunked attention of 8192 tokens on layers with i % 4 < 3 (llama.cpp hard-codes
//     both), unless attention.sliding_window is 0.
// ssm.* keys on another architecture are refused: its recurrent layers are not known.
//
// Thread-safety: pure functions.
#ifndef ATTEND_PLANNER_IMPORT_GGUF_LAYERS_H_
#define ATTEND_PLANNER_IMPORT_GGUF_LAYERS_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "planner/model.h"

namespace attend::planner {

// How the layer reader sees the header: an integer key in [lo, hi] (nullopt when absent), and
// a key given as a scalar or one value per layer (empty when absent). Errors name the key.
struct GgufInts {
  std::function<absl::StatusOr<std::optional<int64_t>>(const std::string& key, int64_t lo,
                                                       int64_t hi)>
      scalar;
  std::function<absl::StatusOr<std::vector<int64_t>>(const std::string& key, int64_t lo,
                                                     int64_t hi)>
      per_layer;
  std::function<bool(const std::string& key)> has;
};

// Whether `arch` marks recurrent layers by head_count_kv 0 (so 0 is a valid per-layer count),
// and whether it has no attention at all.
bool GgufArchHasZeroKvLayers(const std::string& arch);
bool GgufArchIsStateSpaceOnly(const std::string& arch);

// Turns m->layer_specs (attention layers with their heads and windows, one per layer) into the
// kinds above and sizes their latent rows and states. `kv` are the per-layer head_count_kv
// values (one value when uniform). REQUIRES: m->layers and the attention shape are read.
absl::Status ReadGgufLayerKinds(const GgufInts& md, const std::string& arch,
                                const std::vector<int64_t>& kv, ModelSpec* m);

}  // namespace attend::planner

#endif  // ATTEND_PLANNER_IMPORT_GGUF_LAYERS_H_
