#include "planner/catalog.h"

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "planner/parameter_counts.h"

namespace attend::planner {
namespace {

constexpr char kComputed[] =
    "computed from the shape (ComputeParameters: embeddings, attention, gated MLP, norms)";

// Gemma 2 alternates local and global attention, starting with a local layer: Hugging Face's
// Gemma2 marks layer i as sliding when i is even (layer_types "sliding_attention" for (i+1) % 2),
// and llama.cpp's swa pattern 2 agrees.
std::vector<LayerSpec> Alternating(int64_t layers, int64_t n_head_kv, int64_t window) {
  std::vector<LayerSpec> specs(static_cast<size_t>(layers), LayerSpec{n_head_kv, 0});
  for (int64_t i = 0; i < layers; i += 2) specs[static_cast<size_t>(i)].window_tokens = window;
  return specs;
}

std::vector<LayerSpec> AllWindowed(int64_t layers, int64_t n_head_kv, int64_t window) {
  return std::vector<LayerSpec>(static_cast<size_t>(layers), LayerSpec{n_head_kv, window});
}

std::vector<ModelSpec> BuildCatalog() {
  std::vector<ModelSpec> c;
  ModelSpec m;

  // The lessons' tiny test model: the shape is the lesson's (KV cache 4,194,304 bytes at 4096
  // tokens in f16, as llama.cpp prints); d_model is 8 heads x 32. The lessons give no vocabulary,
  // MLP width or weight type, so these three are chosen here and the count is computed.
  m = ModelSpec{};
  m.name = "tiny";
  m.display_name = "Tiny test model (lessons)";
  m.source =
      "lesson 3, Example 10: 4 layers, 8 query heads, 2 key/value heads, head size 32, 4096-token "
      "context; d_model 256 = 8 x 32; vocab 32000, intermediate 768 and float16 weights chosen "
      "here (not given by the lessons)";
  m.architecture = "llama";
  m.layers = 4;
  m.n_head = 8;
  m.n_head_kv = 2;
  m.head_dim = 32;
  m.head_dim_v = 32;
  m.d_model = 256;
  m.vocab_size = 32000;
  m.intermediate_size = 768;
  m.parameters = 19400960;
  m.parameters_source = kComputed;
  m.max_context_tokens = 4096;
  m.weights_dtype = "float16";
  c.push_back(m);

  m = ModelSpec{};
  m.name = "llama-2-7b";
  m.display_name = "Llama 2 7B";
  m.source = "Hugging Face meta-llama/Llama-2-7b-hf config.json (multi-head: 32 KV heads)";
  m.architecture = "llama";
  m.layers = 32;
  m.n_head = 32;
  m.n_head_kv = 32;
  m.head_dim = 128;
  m.head_dim_v = 128;
  m.d_model = 4096;
  m.vocab_size = 32000;
  m.intermediate_size = 11008;
  m.parameters = 6738415616;
  m.parameters_source = "published: safetensors total on the Hugging Face model page (6.74B)";
  m.max_context_tokens = 4096;
  m.weights_dtype = "float16";
  c.push_back(m);

  m = ModelSpec{};
  m.name = "llama-3-8b";
  m.display_name = "Llama 3 8B";
  m.source = "Hugging Face meta-llama/Meta-Llama-3-8B config.json";
  m.architecture = "llama";
  m.layers = 32;
  m.n_head = 32;
  m.n_head_kv = 8;
  m.head_dim = 128;
  m.head_dim_v = 128;
  m.d_model = 4096;
  m.vocab_size = 128256;
  m.intermediate_size = 14336;
  m.parameters = 8030261248;
  m.parameters_source = "published: safetensors total on the Hugging Face model page (8.03B)";
  m.max_context_tokens = 8192;
  m.weights_dtype = "bfloat16";
  c.push_back(m);

  m = ModelSpec{};
  m.name = "llama-3-70b";
  m.display_name = "Llama 3 70B";
  m.source = "Hugging Face meta-llama/Meta-Llama-3-70B config.json";
  m.architecture = "llama";
  m.layers = 80;
  m.n_head = 64;
  m.n_head_kv = 8;
  m.head_dim = 128;
  m.head_dim_v = 128;
  m.d_model = 8192;
  m.vocab_size = 128256;
  m.intermediate_size = 28672;
  m.parameters = 70553706496;
  m.parameters_source = "published: safetensors total on the Hugging Face model page (70.6B)";
  m.max_context_tokens = 8192;
  m.weights_dtype = "bfloat16";
  c.push_back(m);

  m = ModelSpec{};
  m.name = "llama-3.1-405b";
  m.display_name = "Llama 3.1 405B";
  m.source = "Hugging Face meta-llama/Llama-3.1-405B config.json";
  m.architecture = "llama";
  m.layers = 126;
  m.n_head = 128;
  m.n_head_kv = 8;
  m.head_dim = 128;
  m.head_dim_v = 128;
  m.d_model = 16384;
  m.vocab_size = 128256;
  m.intermediate_size = 53248;
  m.parameters = 405853388800;
  m.parameters_source = "computed from the shape (Meta quotes 405B)";
  m.max_context_tokens = 131072;
  m.weights_dtype = "bfloat16";
  c.push_back(m);

  // v0.1 is the Mistral 7B with a sliding window (4096 tokens on every layer); v0.2 and v0.3
  // dropped it. Its config allows 32768 positions, but no layer caches more than 4096 tokens.
  m = ModelSpec{};
  m.name = "mistral-7b";
  m.display_name = "Mistral 7B v0.1";
  m.source = "Hugging Face mistralai/Mistral-7B-v0.1 config.json (sliding_window 4096)";
  m.architecture = "mistral";
  m.layers = 32;
  m.n_head = 32;
  m.n_head_kv = 8;
  m.head_dim = 128;
  m.head_dim_v = 128;
  m.d_model = 4096;
  m.vocab_size = 32000;
  m.intermediate_size = 14336;
  m.parameters = 7241732096;
  m.parameters_source = "published: safetensors total on the Hugging Face model page (7.24B)";
  m.layer_specs = AllWindowed(32, 8, 4096);
  m.max_context_tokens = 32768;
  m.weights_dtype = "bfloat16";
  c.push_back(m);

  m = ModelSpec{};
  m.name = "mixtral-8x7b";
  m.display_name = "Mixtral 8x7B v0.1";
  m.source =
      "Hugging Face mistralai/Mixtral-8x7B-v0.1 config.json (8 experts, 2 per token, no sliding "
      "window)";
  m.architecture = "mixtral";
  m.layers = 32;
  m.n_head = 32;
  m.n_head_kv = 8;
  m.head_dim = 128;
  m.head_dim_v = 128;
  m.d_model = 4096;
  m.vocab_size = 32000;
  m.intermediate_size = 14336;
  m.experts = 8;
  m.experts_active = 2;
  m.parameters = 46702792704;
  m.active_parameters = 12879925248;
  m.parameters_source =
      "total published: safetensors total on the Hugging Face model page (46.7B); active computed "
      "from the shape (Mistral AI quotes 12.9B)";
  m.max_context_tokens = 32768;
  m.weights_dtype = "bfloat16";
  c.push_back(m);

  // Qwen2's configs carry sliding_window 131072 with use_sliding_window false: no window.
  m = ModelSpec{};
  m.name = "qwen2-0.5b";
  m.display_name = "Qwen2 0.5B";
  m.source =
      "Hugging Face Qwen/Qwen2-0.5B config.json (max_position_embeddings 131072; the model card "
      "states a 32768-token context)";
  m.architecture = "qwen2";
  m.layers = 24;
  m.n_head = 14;
  m.n_head_kv = 2;
  m.head_dim = 64;
  m.head_dim_v = 64;
  m.d_model = 896;
  m.vocab_size = 151936;
  m.intermediate_size = 4864;
  m.parameters = 494032768;
  m.parameters_source = "published: safetensors total on the Hugging Face model page (494M)";
  m.max_context_tokens = 131072;
  m.weights_dtype = "bfloat16";
  m.tied_embeddings = true;
  c.push_back(m);

  m = ModelSpec{};
  m.name = "qwen2-7b";
  m.display_name = "Qwen2 7B";
  m.source = "Hugging Face Qwen/Qwen2-7B config.json (max_position_embeddings 131072)";
  m.architecture = "qwen2";
  m.layers = 28;
  m.n_head = 28;
  m.n_head_kv = 4;
  m.head_dim = 128;
  m.head_dim_v = 128;
  m.d_model = 3584;
  m.vocab_size = 152064;
  m.intermediate_size = 18944;
  m.parameters = 7615616512;
  m.parameters_source = "published: safetensors total on the Hugging Face model page (7.62B)";
  m.max_context_tokens = 131072;
  m.weights_dtype = "bfloat16";
  c.push_back(m);

  m = ModelSpec{};
  m.name = "gemma-2-9b";
  m.display_name = "Gemma 2 9B";
  m.source =
      "Hugging Face google/gemma-2-9b config.json (head_dim 256; even layers slide over 4096 "
      "tokens, odd layers are global)";
  m.architecture = "gemma2";
  m.layers = 42;
  m.n_head = 16;
  m.n_head_kv = 8;
  m.head_dim = 256;
  m.head_dim_v = 256;
  m.d_model = 3584;
  m.vocab_size = 256000;
  m.intermediate_size = 14336;
  m.parameters = 9241705984;
  m.parameters_source = "published: safetensors total on the Hugging Face model page (9.24B)";
  m.layer_specs = Alternating(42, 8, 4096);
  m.max_context_tokens = 8192;
  m.weights_dtype = "float32";
  m.tied_embeddings = true;
  c.push_back(m);

  for (ModelSpec& model : c) {
    if (model.active_parameters == 0) model.active_parameters = model.parameters;
    if (model.experts == 0) model.experts_active = 0;
  }
  return c;
}

}  // namespace

const std::vector<ModelSpec>& Catalog() {
  static const std::vector<ModelSpec>* const catalog = new std::vector<ModelSpec>(BuildCatalog());
  return *catalog;
}

std::vector<std::string> CatalogNames() {
  std::vector<std::string> names;
  for (const ModelSpec& m : Catalog()) names.push_back(m.name);
  return names;
}

absl::StatusOr<ModelSpec> FindModel(absl::string_view name) {
  const std::string key = absl::AsciiStrToLower(name);
  for (const ModelSpec& m : Catalog()) {
    if (m.name == key) return m;
  }
  return absl::NotFoundError(
      absl::StrCat("model ", QuoteForError(name),
                   " is not in the catalog; known models: ", absl::StrJoin(CatalogNames(), ", ")));
}

}  // namespace attend::planner
