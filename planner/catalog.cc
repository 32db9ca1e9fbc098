#include "planner/catalog.h"

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "planner/catalog_hybrid.h"
#include "planner/catalog_recent.h"
#include "planner/parameter_counts.h"

namespace attend::planner {
namespace {

constexpr char kComputed[] =
    "computed from the shape (ComputeParameters: embeddings, attention, gated MLP, norms)";

// Which layers of a preset slide over window_tokens tokens.
enum class Windows {
  kNone,        // every layer attends to the whole context
  kEveryLayer,  // every layer slides
  // Layers 0, 2, 4, ... slide and the odd ones are global. Gemma 2 alternates local and global
  // attention, starting with a local layer: Hugging Face's Gemma2 marks layer i as sliding when
  // i is even (layer_types "sliding_attention" for (i+1) % 2), and llama.cpp's swa pattern 2
  // agrees.
  kEvenLayers,
};

// The attention shape and the widths that size the weights (ModelSpec's fields of these names).
struct Shape {
  int64_t layers;
  int64_t n_head;
  int64_t n_head_kv;
  int64_t head_dim;
  int64_t head_dim_v;
  int64_t d_model;
  int64_t vocab_size;
  int64_t intermediate_size;
};

struct Experts {
  int64_t experts;  // 0: dense
  int64_t experts_active;
};
constexpr Experts kDense{0, 0};

struct Parameters {
  int64_t total;
  int64_t active;  // 0: `total` (dense)
  const char* source;
};

struct Sliding {
  Windows windows;
  int64_t window_tokens;
};
constexpr Sliding kFullAttention{Windows::kNone, 0};

// One preset: every field of its ModelSpec, the layer_specs described by `sliding`.
struct PresetRow {
  const char* name;
  const char* display_name;
  const char* source;
  const char* architecture;
  Shape shape;
  Experts experts;
  Parameters parameters;
  Sliding sliding;
  int64_t max_context_tokens;
  const char* weights_dtype;
  bool tied_embeddings;
};

// In Catalog() order. Shape{layers, n_head, n_head_kv, head_dim, head_dim_v, d_model,
// vocab_size, intermediate_size}; the numbers are those of the source each row names.
constexpr PresetRow kPresets[] = {
    // The lessons' tiny test model: the shape is the lesson's (KV cache 4,194,304 bytes at 4096
    // tokens in f16, as llama.cpp prints); d_model is 8 heads x 32. The lessons give no
    // vocabulary, MLP width or weight type, so these three are chosen here and the count is
    // computed.
    {"tiny", "Tiny test model (lessons)",
     "lesson 3, Example 10: 4 layers, 8 query heads, 2 key/value heads, head size 32, 4096-token "
     "context; d_model 256 = 8 x 32; vocab 32000, intermediate 768 and float16 weights chosen "
     "here (not given by the lessons)",
     "llama", Shape{4, 8, 2, 32, 32, 256, 32000, 768}, kDense, Parameters{19400960, 0, kComputed},
     kFullAttention, /*max_context_tokens=*/4096, "float16", /*tied_embeddings=*/false},
    {"llama-2-7b", "Llama 2 7B",
     "Hugging Face meta-llama/Llama-2-7b-hf config.json (multi-head: 32 KV heads)", "llama",
     Shape{32, 32, 32, 128, 128, 4096, 32000, 11008}, kDense,
     Parameters{6738415616, 0,
                "published: safetensors total on the Hugging Face model page (6.74B)"},
     kFullAttention, /*max_context_tokens=*/4096, "float16", /*tied_embeddings=*/false},
    {"llama-3-8b", "Llama 3 8B", "Hugging Face meta-llama/Meta-Llama-3-8B config.json", "llama",
     Shape{32, 32, 8, 128, 128, 4096, 128256, 14336}, kDense,
     Parameters{8030261248, 0,
                "published: safetensors total on the Hugging Face model page (8.03B)"},
     kFullAttention, /*max_context_tokens=*/8192, "bfloat16", /*tied_embeddings=*/false},
    {"llama-3-70b", "Llama 3 70B", "Hugging Face meta-llama/Meta-Llama-3-70B config.json", "llama",
     Shape{80, 64, 8, 128, 128, 8192, 128256, 28672}, kDense,
     Parameters{70553706496, 0,
                "published: safetensors total on the Hugging Face model page (70.6B)"},
     kFullAttention, /*max_context_tokens=*/8192, "bfloat16", /*tied_embeddings=*/false},
    {"llama-3.1-405b", "Llama 3.1 405B", "Hugging Face meta-llama/Llama-3.1-405B config.json",
     "llama", Shape{126, 128, 8, 128, 128, 16384, 128256, 53248}, kDense,
     Parameters{405853388800, 0, "computed from the shape (Meta quotes 405B)"}, kFullAttention,
     /*max_context_tokens=*/131072, "bfloat16", /*tied_embeddings=*/false},
    // v0.1 is the Mistral 7B with a sliding window (4096 tokens on every layer); v0.2 and v0.3
    // dropped it. Its config allows 32768 positions, but no layer caches more than 4096 tokens.
    {"mistral-7b", "Mistral 7B v0.1",
     "Hugging Face mistralai/Mistral-7B-v0.1 config.json (sliding_window 4096)", "mistral",
     Shape{32, 32, 8, 128, 128, 4096, 32000, 14336}, kDense,
     Parameters{7241732096, 0,
                "published: safetensors total on the Hugging Face model page (7.24B)"},
     Sliding{Windows::kEveryLayer, 4096}, /*max_context_tokens=*/32768, "bfloat16",
     /*tied_embeddings=*/false},
    {"mixtral-8x7b", "Mixtral 8x7B v0.1",
     "Hugging Face mistralai/Mixtral-8x7B-v0.1 config.json (8 experts, 2 per token, no sliding "
     "window)",
     "mixtral", Shape{32, 32, 8, 128, 128, 4096, 32000, 14336}, Experts{8, 2},
     Parameters{46702792704, 12879925248,
                "total published: safetensors total on the Hugging Face model page (46.7B); "
                "active computed from the shape (Mistral AI quotes 12.9B)"},
     kFullAttention, /*max_context_tokens=*/32768, "bfloat16", /*tied_embeddings=*/false},
    // Qwen2's configs carry sliding_window 131072 with use_sliding_window false: no window.
    {"qwen2-0.5b", "Qwen2 0.5B",
     "Hugging Face Qwen/Qwen2-0.5B config.json (max_position_embeddings 131072; the model card "
     "states a 32768-token context)",
     "qwen2", Shape{24, 14, 2, 64, 64, 896, 151936, 4864}, kDense,
     Parameters{494032768, 0, "published: safetensors total on the Hugging Face model page (494M)"},
     kFullAttention, /*max_context_tokens=*/131072, "bfloat16", /*tied_embeddings=*/true},
    {"qwen2-7b", "Qwen2 7B",
     "Hugging Face Qwen/Qwen2-7B config.json (max_position_embeddings 131072)", "qwen2",
     Shape{28, 28, 4, 128, 128, 3584, 152064, 18944}, kDense,
     Parameters{7615616512, 0,
                "published: safetensors total on the Hugging Face model page (7.62B)"},
     kFullAttention, /*max_context_tokens=*/131072, "bfloat16", /*tied_embeddings=*/false},
    {"gemma-2-9b", "Gemma 2 9B",
     "Hugging Face google/gemma-2-9b config.json (head_dim 256; even layers slide over 4096 "
     "tokens, odd layers are global)",
     "gemma2", Shape{42, 16, 8, 256, 256, 3584, 256000, 14336}, kDense,
     Parameters{9241705984, 0,
                "published: safetensors total on the Hugging Face model page (9.24B)"},
     Sliding{Windows::kEvenLayers, 4096}, /*max_context_tokens=*/8192, "float32",
     /*tied_embeddings=*/true},
};

std::vector<LayerSpec> LayerSpecs(const PresetRow& p) {
  const size_t layers = static_cast<size_t>(p.shape.layers);
  const LayerSpec sliding{p.shape.n_head_kv, p.sliding.window_tokens};
  switch (p.sliding.windows) {
    case Windows::kNone:
      return {};
    case Windows::kEveryLayer:
      return std::vector<LayerSpec>(layers, sliding);
    case Windows::kEvenLayers: {
      std::vector<LayerSpec> specs(layers, LayerSpec{p.shape.n_head_kv, 0});
      for (size_t i = 0; i < layers; i += 2) specs[i] = sliding;
      return specs;
    }
  }
  return {};
}

ModelSpec ToModelSpec(const PresetRow& p) {
  ModelSpec m;
  m.name = p.name;
  m.display_name = p.display_name;
  m.source = p.source;
  m.architecture = p.architecture;
  m.layers = p.shape.layers;
  m.n_head = p.shape.n_head;
  m.n_head_kv = p.shape.n_head_kv;
  m.head_dim = p.shape.head_dim;
  m.head_dim_v = p.shape.head_dim_v;
  m.d_model = p.shape.d_model;
  m.vocab_size = p.shape.vocab_size;
  m.intermediate_size = p.shape.intermediate_size;
  m.experts = p.experts.experts;
  m.experts_active = p.experts.experts == 0 ? 0 : p.experts.experts_active;
  m.parameters = p.parameters.total;
  m.active_parameters = p.parameters.active == 0 ? p.parameters.total : p.parameters.active;
  m.parameters_source = p.parameters.source;
  m.layer_specs = LayerSpecs(p);
  m.max_context_tokens = p.max_context_tokens;
  m.weights_dtype = p.weights_dtype;
  m.tied_embeddings = p.tied_embeddings;
  return m;
}

std::vector<ModelSpec> BuildCatalog() {
  std::vector<ModelSpec> c;
  for (const PresetRow& p : kPresets) c.push_back(ToModelSpec(p));
  for (ModelSpec& m : HybridPresets()) c.push_back(std::move(m));
  for (ModelSpec& m : RecentPresets()) c.push_back(std::move(m));
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

absl::StatusOr<ModelSpec> FindModel(absl::string_view name, absl::string_view field) {
  const std::string key = absl::AsciiStrToLower(name);
  for (const ModelSpec& m : Catalog()) {
    if (m.name == key) return m;
  }
  const std::string message =
      absl::StrCat("model ", QuoteForError(name),
                   " is not in the catalog; known models: ", absl::StrJoin(CatalogNames(), ", "));
  return absl::NotFoundError(field.empty() ? message : absl::StrCat(field, ": ", message));
}

}  // namespace attend::planner
