#include "planner/catalog_hybrid.h"

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

// The shared fields; the caller sets the rest.
ModelSpec Base(const char* name, const char* display, const char* source, const char* arch) {
  ModelSpec m;
  m.name = name;
  m.display_name = display;
  m.source = source;
  m.architecture = arch;
  return m;
}

void Shape(ModelSpec* m, int64_t layers, int64_t n_head, int64_t n_head_kv, int64_t head_dim,
           int64_t head_dim_v, int64_t d_model, int64_t vocab, int64_t intermediate) {
  m->layers = layers;
  m->n_head = n_head;
  m->n_head_kv = n_head_kv;
  m->head_dim = head_dim;
  m->head_dim_v = head_dim_v;
  m->d_model = d_model;
  m->vocab_size = vocab;
  m->intermediate_size = intermediate;
}

void Parameters(ModelSpec* m, int64_t experts, int64_t active_experts, int64_t total,
                int64_t active, const char* source) {
  m->experts = experts;
  m->experts_active = active_experts;
  m->parameters = total;
  m->active_parameters = active;
  m->parameters_source = source;
}

ModelSpec DeepSeekV3() {
  ModelSpec m = Base("deepseek-v3", "DeepSeek-V3",
                     "Hugging Face deepseek-ai/DeepSeek-V3 config.json (multi-head latent "
                     "attention: kv_lora_rank 512, qk_rope_head_dim 64, 128 heads of 192/128)",
                     "deepseek_v3");
  Shape(&m, 61, 128, 128, 192, 128, 7168, 129280, 2048);
  Parameters(&m, 256, 8, 671000000000, 37000000000,
             "published: the model card (671B total, 37B activated; the 14B multi-token "
             "prediction module not counted)");
  LayerSpec latent = Attention(128);
  latent.kind = LayerKind::kLatentAttention;
  latent.kv_lora_rank = 512;
  latent.qk_rope_head_dim = 64;
  m.layer_specs.assign(61, latent);
  m.max_context_tokens = 163840;
  m.weights_dtype = "fp8";
  return m;
}

// Gated delta-net layers: conv (4 - 1) x (2 x 16 x 128 + 32 x 128) = 24,576 values, recurrent
// 32 x 128 x 128 = 524,288 (planner/import/hf_layers.h).
ModelSpec QwenNext() {
  ModelSpec m = Base("qwen3-next-80b", "Qwen3-Next 80B-A3B",
                     "Hugging Face Qwen/Qwen3-Next-80B-A3B-Instruct config.json "
                     "(full_attention_interval 4; gated delta-net layers of 16 key and 32 value "
                     "heads of 128, kernel 4)",
                     "qwen3_next");
  Shape(&m, 48, 16, 2, 256, 256, 2048, 151936, 512);
  Parameters(&m, 512, 10, 80000000000, 3000000000,
             "published: the model card (80B total, 3B activated)");
  for (int64_t i = 0; i < 48; ++i) {
    m.layer_specs.push_back(
        (i + 1) % 4 == 0 ? Attention(2) : Recurrent(LayerKind::kLinearAttention, 24576, 524288));
  }
  m.max_context_tokens = 262144;
  m.weights_dtype = "bfloat16";
  return m;
}

// Mamba layers: d_inner 2 x 4096 = 8192; conv 3 x 8192 = 24,576, SSM 8192 x 16 = 131,072.
ModelSpec Jamba() {
  ModelSpec m = Base("jamba-v0.1", "Jamba v0.1",
                     "Hugging Face ai21labs/Jamba-v0.1 config.json (attn_layer_period 8, "
                     "attn_layer_offset 4: 4 attention and 28 Mamba layers, mamba_d_state 16, "
                     "mamba_d_conv 4, mamba_expand 2)",
                     "jamba");
  Shape(&m, 32, 32, 8, 128, 128, 4096, 65536, 14336);
  Parameters(&m, 16, 2, 52000000000, 12000000000,
             "published: the model card (52B total, 12B active)");
  for (int64_t i = 0; i < 32; ++i) {
    m.layer_specs.push_back(i % 8 == 4 ? Attention(8)
                                       : Recurrent(LayerKind::kStateSpace, 24576, 131072));
  }
  m.max_context_tokens = 262144;
  m.weights_dtype = "bfloat16";
  return m;
}

ModelSpec GptOss() {
  ModelSpec m = Base("gpt-oss-120b", "gpt-oss-120b",
                     "Hugging Face openai/gpt-oss-120b config.json (layer_types: even layers "
                     "slide over 128 tokens, odd layers are global; weights in mxfp4, a type the "
                     "planner does not size)",
                     "gpt_oss");
  Shape(&m, 36, 64, 8, 64, 64, 2880, 201088, 2880);
  Parameters(&m, 128, 4, 117000000000, 5100000000,
             "published: the model card (117B total, 5.1B active)");
  for (int64_t i = 0; i < 36; ++i) m.layer_specs.push_back(Attention(8, i % 2 == 0 ? 128 : 0));
  m.max_context_tokens = 131072;
  return m;
}

ModelSpec Llama4Scout() {
  ModelSpec m = Base("llama-4-scout", "Llama 4 Scout 17B-16E",
                     "Hugging Face meta-llama/Llama-4-Scout-17B-16E config.json (text_config: "
                     "attention_chunk_size 8192; every fourth layer NoPE and global)",
                     "llama4_text");
  Shape(&m, 48, 40, 8, 128, 128, 5120, 202048, 8192);
  Parameters(&m, 16, 1, 109000000000, 17000000000,
             "published: the model card (109B total, 17B active)");
  for (int64_t i = 0; i < 48; ++i) {
    LayerSpec l = Attention(8, (i + 1) % 4 == 0 ? 0 : 8192);
    if (l.window_tokens > 0) l.kind = LayerKind::kChunkedAttention;
    m.layer_specs.push_back(l);
  }
  m.max_context_tokens = 10485760;
  m.weights_dtype = "bfloat16";
  return m;
}

// Mamba-2 mixers: d_inner 128 x 64 = 8192; conv 3 x (8192 + 2 x 8 x 128) = 30,720, SSM
// 128 x 64 x 128 = 1,048,576.
ModelSpec MambaCodestral() {
  ModelSpec m = Base("mamba2-7b", "Mamba-Codestral 7B (Mamba-2)",
                     "Hugging Face mistralai/Mamba-Codestral-7B-v0.1 config.json (64 Mamba-2 "
                     "layers: 128 heads of 64, state_size 128, n_groups 8, conv_kernel 4; no "
                     "attention; no max_position_embeddings, the 262,144-token context is the "
                     "one Mistral AI's announcement says it was tested to)",
                     "mamba2");
  Shape(&m, 64, 0, 0, 0, 0, 4096, 32768, 0);
  Parameters(&m, 0, 0, 7290000000, 7290000000,
             "published: the Hugging Face model page (7.29B, rounded)");
  m.layer_specs.assign(64, Recurrent(LayerKind::kStateSpace, 30720, 1048576));
  m.max_context_tokens = 262144;
  m.weights_dtype = "bfloat16";
  return m;
}

}  // namespace

std::vector<ModelSpec> HybridPresets() {
  return {DeepSeekV3(), QwenNext(), Jamba(), GptOss(), Llama4Scout(), MambaCodestral()};
}

}  // namespace attend::planner
