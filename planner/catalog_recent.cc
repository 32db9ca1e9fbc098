#include "planner/catalog_recent.h"

#include <cstdint>

namespace attend::planner {
namespace {

LayerSpec Attention(int64_t n_head_kv, int64_t window = 0) { return LayerSpec{n_head_kv, window}; }

LayerSpec Recurrent(LayerKind kind, int64_t conv, int64_t recurrent) {
  LayerSpec l;
  l.kind = kind;
  l.conv_state_values = conv;
  l.recurrent_state_values = recurrent;
  return l;
}

LayerSpec Latent(int64_t n_head_kv, int64_t rank, int64_t rope, int64_t index_head_dim = 0) {
  LayerSpec l = Attention(n_head_kv);
  l.kind = LayerKind::kLatentAttention;
  l.kv_lora_rank = rank;
  l.qk_rope_head_dim = rope;
  l.index_head_dim = index_head_dim;
  return l;
}

struct Shape {
  int64_t layers, n_head, n_head_kv, head_dim, head_dim_v, d_model, vocab, intermediate;
  int64_t experts, experts_active, parameters, active_parameters;
};

ModelSpec Make(const char* name, const char* display, const char* source, const char* arch,
               const Shape& s, const char* parameters_source, int64_t max_context,
               const char* weights_dtype) {
  ModelSpec m;
  m.name = name;
  m.display_name = display;
  m.source = source;
  m.architecture = arch;
  m.layers = s.layers;
  m.n_head = s.n_head;
  m.n_head_kv = s.n_head_kv;
  m.head_dim = s.head_dim;
  m.head_dim_v = s.head_dim_v;
  m.d_model = s.d_model;
  m.vocab_size = s.vocab;
  m.intermediate_size = s.intermediate;
  m.experts = s.experts;
  m.experts_active = s.experts_active;
  m.parameters = s.parameters;
  m.active_parameters = s.active_parameters;
  m.parameters_source = parameters_source;
  m.max_context_tokens = max_context;
  m.weights_dtype = weights_dtype;
  return m;
}

// DeepSeek-V3's MLA (61 layers, kv_lora_rank 512, qk_rope_head_dim 64) with the lightning
// indexer of DeepSeek-V3.2-Exp's inference/model.py: a 128-value key per token per layer.
ModelSpec DeepSeekV32() {
  ModelSpec m = Make(
      "deepseek-v3.2", "DeepSeek-V3.2",
      "deepseek-ai/DeepSeek-V3.2-Exp: DeepSeek-V3's config.json shape (model_type deepseek_v32) "
      "with the sparse-attention indexer of its inference/model.py (index_n_heads 64, "
      "index_head_dim 128, index_topk 2048; keys cached as fp8 with a float32 scale)",
      "deepseek_v32",
      {61, 128, 128, 192, 128, 7168, 129280, 2048, 256, 8, 671000000000, 37000000000},
      "published: DeepSeek-V3's model card (671B total, 37B activated), whose shape V3.2 keeps; "
      "the indexer's weights are not counted",
      163840, "fp8");
  m.layer_specs.assign(61, Latent(128, 512, 64, 128));
  return m;
}

// GlmMoeDsaConfig's defaults (transformers, checkpoint zai-org/GLM-5): no published config.json
// was at hand, so the configuration class's values are used, as its docstring names them; the
// technical report's architecture table (arXiv:2602.15763) agrees on every cache-relevant one.
ModelSpec Glm5() {
  ModelSpec m = Make(
      "glm-5", "GLM-5",
      "transformers GlmMoeDsaConfig defaults (checkpoint zai-org/GLM-5): 78 latent layers, "
      "kv_lora_rank 512, qk_rope_head_dim 64, 64 heads of 256/256, index_head_dim 128 on every "
      "layer (indexer_types all 'full')",
      "glm_moe_dsa", {78, 64, 64, 256, 256, 6144, 154880, 2048, 256, 8, 744000000000, 40000000000},
      "published: the GLM-5 technical report (arXiv:2602.15763), its architecture table: 744B "
      "total, 40B activated, 3 dense + 75 MoE layers, KV LoRA 512, indexer 32 heads of 128, as "
      "the configuration class's defaults have them",
      202752, "bfloat16");
  m.layer_specs.assign(78, Latent(64, 512, 64, 128));
  return m;
}

// Lightning layers: 64 heads x 128 x 128 = 1,048,576 recurrent values, no convolution.
ModelSpec MiniMaxM1() {
  ModelSpec m = Make(
      "minimax-m1", "MiniMax-M1",
      "Hugging Face MiniMaxAI/MiniMax-M1-80k config.json (attn_type_list: a softmax layer after "
      "every 7 lightning-attention layers; 64 heads of 128, 8 key/value heads)",
      "minimax_m1", {80, 64, 8, 128, 128, 6144, 200064, 9216, 32, 2, 456000000000, 45900000000},
      "published: the model card (456B total, 45.9B activated per token)", 10240000, "bfloat16");
  for (int64_t i = 0; i < 80; ++i) {
    m.layer_specs.push_back(
        (i + 1) % 8 == 0 ? Attention(8) : Recurrent(LayerKind::kLightningAttention, 0, 1048576));
  }
  return m;
}

// KDA layers: conv 3 x 3 x 32 x 128 = 36,864, recurrent 32 x 128 x 128 = 524,288; MLA on the
// 1-based layers 4, 8, ..., 24 and 27.
ModelSpec KimiLinear() {
  ModelSpec m = Make(
      "kimi-linear-48b", "Kimi Linear 48B-A3B",
      "Hugging Face moonshotai/Kimi-Linear-48B-A3B-Instruct config.json (linear_attn_config: "
      "full_attn_layers 4, 8, ..., 24, 27 are MLA with kv_lora_rank 512 and qk_rope_head_dim "
      "64, the other 20 Kimi Delta Attention of 32 heads of 128, kernel 4)",
      "kimi_linear", {27, 32, 32, 192, 128, 2304, 163840, 1024, 256, 8, 48000000000, 3000000000},
      "published: the Kimi Linear README (48B total, 3B activated)", 1048576, "bfloat16");
  for (int64_t n = 1; n <= 27; ++n) {
    const bool full = n % 4 == 0 || n == 27;
    m.layer_specs.push_back(full ? Latent(32, 512, 64)
                                 : Recurrent(LayerKind::kKimiDeltaAttention, 36864, 524288));
  }
  return m;
}

// Layer 0 and every sixth from layer 5 attend fully with 4 key/value heads; the other 39 slide
// over 128 tokens with 8.
ModelSpec MimoV2Flash() {
  ModelSpec m = Make(
      "mimo-v2-flash", "MiMo-V2-Flash",
      "Hugging Face XiaomiMiMo/MiMo-V2-Flash config.json (hybrid_layer_pattern: 9 full-attention "
      "layers with 4 key/value heads, 39 sliding-window layers of 128 tokens with 8 "
      "(swa_num_key_value_heads); heads of 192/128)",
      "mimo_v2_flash", {48, 64, 4, 192, 128, 4096, 152576, 2048, 256, 8, 309000000000, 15000000000},
      "published: the model card (309B total, 15B active)", 262144, "fp8");
  for (int64_t i = 0; i < 48; ++i) {
    const bool full = i == 0 || (i + 1) % 6 == 0;
    m.layer_specs.push_back(full ? Attention(4) : Attention(8, 128));
  }
  return m;
}

}  // namespace

std::vector<ModelSpec> RecentPresets() {
  return {DeepSeekV32(), Glm5(), MiniMaxM1(), KimiLinear(), MimoV2Flash()};
}

}  // namespace attend::planner
