#include "planner/import/hf_layers.h"

#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/base/status_macros.h"

namespace attend::planner {
namespace {

absl::Status Invalid(absl::string_view field, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(field, ": ", what));
}

LayerSpec Attention(int64_t n_head_kv, int64_t window = 0) { return LayerSpec{n_head_kv, window}; }

LayerSpec OfKind(LayerKind kind) {
  LayerSpec l;
  l.kind = kind;
  return l;
}

// The elements of a string array of exactly `layers` entries.
absl::StatusOr<std::vector<std::string>> StringList(const ConfigReader& r, absl::string_view key,
                                                    int64_t layers) {
  const json::Value* v = r.Get(key);
  if (!v->is_array())
    return Invalid(r.Field(key), absl::StrCat("expected an array, got ", v->type_name()));
  if (static_cast<int64_t>(v->size()) != layers) {
    return Invalid(r.Field(key), absl::StrCat(v->size(), " entries for ", layers, " layers"));
  }
  // The parser keeps an array of numbers only as doubles (no Values): every element, the first
  // included, is then a number where a string belongs.
  if (v->all_numbers() && v->size() > 0) {
    return Invalid(absl::StrCat(r.Field(key), "[0]"), "expected a string, got a number");
  }
  std::vector<std::string> out;
  for (size_t i = 0; i < v->size(); ++i) {
    const json::Value& t = v->items()[i];
    if (!t.is_string()) {
      return Invalid(absl::StrCat(r.Field(key), "[", i, "]"),
                     absl::StrCat("expected a string, got ", t.type_name()));
    }
    out.push_back(t.string_value());
  }
  return out;
}

// layer_types: one kind per layer (hf_layers.h).
absl::StatusOr<std::vector<LayerSpec>> FromLayerTypes(const ConfigReader& r, const ModelSpec& m) {
  ATTEND_ASSIGN_OR_RETURN(const std::vector<std::string> types,
                          StringList(r, "layer_types", m.layers));
  ATTEND_ASSIGN_OR_RETURN(std::optional<int64_t> window,
                          r.Int("sliding_window", 0, kMaxContextTokens));
  ATTEND_ASSIGN_OR_RETURN(std::optional<int64_t> chunk,
                          r.Int("attention_chunk_size", 1, kMaxContextTokens));
  std::vector<LayerSpec> specs;
  for (size_t i = 0; i < types.size(); ++i) {
    const std::string field = absl::StrCat(r.Field("layer_types"), "[", i, "]");
    const std::string& t = types[i];
    if (r.Get("index_head_dim") != nullptr && t != "deepseek_sparse_attention") {
      // GLM-5 writes deepseek_sparse_attention for every layer; whether a layer of another type
      // keeps the sparse-attention indexer is not modelled, so a mix is refused.
      return Invalid(field, absl::StrCat(QuoteForError(t), " beside ", r.Field("index_head_dim"),
                                         ": whether this layer keeps the sparse-attention indexer "
                                         "is not modelled (only deepseek_sparse_attention layers, "
                                         "every one with its indexer)"));
    }
    if (t == "full_attention") {
      specs.push_back(Attention(m.n_head_kv));
    } else if (t == "sliding_attention") {
      if (window.value_or(0) == 0) {
        return Invalid(field, absl::StrCat("sliding_attention but ", r.Field("sliding_window"),
                                           " is not set"));
      }
      specs.push_back(Attention(m.n_head_kv, *window));
    } else if (t == "chunked_attention") {
      if (!chunk) {
        return Invalid(field, absl::StrCat("chunked_attention but ",
                                           r.Field("attention_chunk_size"), " is not set"));
      }
      LayerSpec l = Attention(m.n_head_kv, *chunk);
      l.kind = LayerKind::kChunkedAttention;
      specs.push_back(l);
    } else if (t == "linear_attention") {
      specs.push_back(OfKind(LayerKind::kLinearAttention));
    } else if (t == "deepseek_sparse_attention" && r.Get("kv_lora_rank") != nullptr &&
               r.Get("index_head_dim") != nullptr) {
      // GLM-5 (GlmMoeDsaConfig) writes this for every layer: latent attention with an indexer,
      // which ReadLayerLayout adds to every attention layer.
      specs.push_back(Attention(m.n_head_kv));
    } else {
      return Invalid(field, absl::StrCat(QuoteForError(t),
                                         " is not modelled (expected full_attention, "
                                         "sliding_attention, chunked_attention, "
                                         "linear_attention, or deepseek_sparse_attention with "
                                         "kv_lora_rank and index_head_dim); the architecture is "
                                         "not supported"));
    }
  }
  return specs;
}

// Which layers slide when the config has no layer_types, per the precedence in hf_config.h.
absl::StatusOr<std::vector<LayerSpec>> FromWindows(const ConfigReader& r, const ModelSpec& m,
                                                   const std::string& model_type) {
  ATTEND_ASSIGN_OR_RETURN(std::optional<int64_t> window_opt,
                          r.Int("sliding_window", 0, kMaxContextTokens));
  const int64_t window = window_opt.value_or(0);
  std::vector<LayerSpec> specs(static_cast<size_t>(m.layers), Attention(m.n_head_kv));
  if (window == 0) return specs;
  ATTEND_ASSIGN_OR_RETURN(std::optional<bool> use_window, r.Bool("use_sliding_window"));
  if (use_window.has_value()) {
    if (!*use_window) return specs;
    // Transformers' Qwen2: the first max_window_layers layers attend fully, the rest slide.
    ATTEND_ASSIGN_OR_RETURN(std::optional<int64_t> full_layers,
                            r.Int("max_window_layers", 0, kMaxLayers));
    for (int64_t i = full_layers.value_or(0); i < m.layers; ++i) {
      specs[static_cast<size_t>(i)].window_tokens = window;
    }
    return specs;
  }
  ATTEND_ASSIGN_OR_RETURN(std::optional<int64_t> pattern,
                          r.Int("sliding_window_pattern", 1, kMaxLayers));
  // The configs' defaults when the file leaves the pattern out: Gemma2Config alternates,
  // Gemma3TextConfig makes every sixth layer global.
  if (!pattern && model_type == "gemma2") pattern = 2;
  if (!pattern && (model_type == "gemma3" || model_type == "gemma3_text")) pattern = 6;
  for (int64_t i = 0; i < m.layers; ++i) {
    const bool global = pattern && (i + 1) % *pattern == 0;
    specs[static_cast<size_t>(i)].window_tokens = global ? 0 : window;
  }
  return specs;
}

// Nemotron-H: hybrid_override_pattern, or layers_block_type.
absl::StatusOr<std::vector<LayerSpec>> FromPattern(const ConfigReader& r, const ModelSpec& m) {
  std::vector<LayerSpec> specs;
  if (r.Get("hybrid_override_pattern") != nullptr) {
    ATTEND_ASSIGN_OR_RETURN(std::optional<std::string> pattern,
                            r.String("hybrid_override_pattern"));
    if (static_cast<int64_t>(pattern->size()) != m.layers) {
      return Invalid(r.Field("hybrid_override_pattern"),
                     absl::StrCat(pattern->size(), " characters for ", m.layers,
                                  " layers (num_hidden_layers); give one per layer"));
    }
    for (size_t i = 0; i < pattern->size(); ++i) {
      const char c = (*pattern)[i];
      if (c == 'M') {
        specs.push_back(OfKind(LayerKind::kStateSpace));
      } else if (c == '*') {
        specs.push_back(Attention(m.n_head_kv));
      } else if (c == '-' || c == 'E') {
        specs.push_back(OfKind(LayerKind::kFeedForward));
      } else {
        return Invalid(absl::StrCat(r.Field("hybrid_override_pattern"), "[", i, "]"),
                       absl::StrCat(QuoteForError(pattern->substr(i, 1)),
                                    " is not modelled (expected M, *, - or E)"));
      }
    }
    return specs;
  }
  ATTEND_ASSIGN_OR_RETURN(const std::vector<std::string> types,
                          StringList(r, "layers_block_type", m.layers));
  for (size_t i = 0; i < types.size(); ++i) {
    if (types[i] == "mamba") {
      specs.push_back(OfKind(LayerKind::kStateSpace));
    } else if (types[i] == "attention") {
      specs.push_back(Attention(m.n_head_kv));
    } else if (types[i] == "mlp" || types[i] == "moe") {
      specs.push_back(OfKind(LayerKind::kFeedForward));
    } else {
      return Invalid(absl::StrCat(r.Field("layers_block_type"), "[", i, "]"),
                     absl::StrCat(QuoteForError(types[i]),
                                  " is not modelled (expected mamba, attention, mlp or moe)"));
    }
  }
  return specs;
}

// Jamba: attention on layer i when i % attn_layer_period == attn_layer_offset.
absl::StatusOr<std::vector<LayerSpec>> FromPeriod(const ConfigReader& r, const ModelSpec& m) {
  ATTEND_ASSIGN_OR_RETURN(const int64_t period, r.RequiredInt("attn_layer_period", 1, kMaxLayers));
  ATTEND_ASSIGN_OR_RETURN(const int64_t offset, r.RequiredInt("attn_layer_offset", 0, kMaxLayers));
  if (offset >= period) {
    return Invalid(r.Field("attn_layer_offset"),
                   absl::StrCat(offset, " is not below attn_layer_period ", period));
  }
  if (offset >= m.layers) {
    return Invalid(r.Field("attn_layer_offset"),
                   absl::StrCat(offset, " is past the ", m.layers, " layers: no layer attends"));
  }
  std::vector<LayerSpec> specs;
  for (int64_t i = 0; i < m.layers; ++i) {
    specs.push_back(i % period == offset ? Attention(m.n_head_kv) : OfKind(LayerKind::kStateSpace));
  }
  return specs;
}

// Qwen3-Next / Qwen3.5 without layer_types: full attention every interval-th layer.
absl::StatusOr<std::vector<LayerSpec>> FromInterval(const ConfigReader& r, const ModelSpec& m) {
  ATTEND_ASSIGN_OR_RETURN(std::optional<int64_t> interval,
                          r.Int("full_attention_interval", 1, kMaxLayers));
  const int64_t every = interval.value_or(4);  // Qwen3NextConfig's default
  if (every > m.layers) {
    return Invalid(
        r.Field("full_attention_interval"),
        absl::StrCat(every, " is past the ", m.layers, " layers: no layer would attend fully"));
  }
  std::vector<LayerSpec> specs;
  for (int64_t i = 0; i < m.layers; ++i) {
    specs.push_back((i + 1) % every == 0 ? Attention(m.n_head_kv)
                                         : OfKind(LayerKind::kLinearAttention));
  }
  return specs;
}

// Llama 4: chunked layers, and full attention on the NoPE layers.
absl::StatusOr<std::vector<LayerSpec>> FromChunks(const ConfigReader& r, const ModelSpec& m) {
  ATTEND_ASSIGN_OR_RETURN(const int64_t chunk,
                          r.RequiredInt("attention_chunk_size", 1, kMaxContextTokens));
  std::vector<bool> rope(static_cast<size_t>(m.layers), true);
  const json::Value* list = r.Get("no_rope_layers");
  if (list != nullptr && !(list->is_array() && list->size() == 0)) {
    if (!list->is_array() || !list->all_numbers()) {
      return Invalid(r.Field("no_rope_layers"), "expected an array of 0 and 1");
    }
    if (static_cast<int64_t>(list->size()) != m.layers) {
      return Invalid(r.Field("no_rope_layers"),
                     absl::StrCat(list->size(), " entries for ", m.layers, " layers"));
    }
    for (size_t i = 0; i < list->size(); ++i) {
      const double v = list->numbers()[i];
      if (v != 0.0 && v != 1.0) {
        return Invalid(absl::StrCat(r.Field("no_rope_layers"), "[", i, "]"),
                       "expected 0 (NoPE, full attention) or 1 (RoPE, chunked)");
      }
      rope[i] = v == 1.0;
    }
  } else {
    ATTEND_ASSIGN_OR_RETURN(std::optional<int64_t> interval,
                            r.Int("no_rope_layer_interval", 1, kMaxLayers));
    for (int64_t i = 0; i < m.layers; ++i) {
      rope[static_cast<size_t>(i)] = (i + 1) % interval.value_or(4) != 0;
    }
  }
  std::vector<LayerSpec> specs;
  for (bool chunked : rope) {
    LayerSpec l = Attention(m.n_head_kv, chunked ? chunk : 0);
    if (chunked) l.kind = LayerKind::kChunkedAttention;
    specs.push_back(l);
  }
  return specs;
}

// The elements of an array of exactly `layers` integers, each in [lo, hi].
absl::StatusOr<std::vector<int64_t>> IntList(const ConfigReader& r, absl::string_view key,
                                             int64_t layers, int64_t lo, int64_t hi) {
  const json::Value* v = r.Get(key);
  if (!v->is_array() || (v->size() > 0 && !v->all_numbers())) {
    return Invalid(r.Field(key), "expected an array of integers, one per layer");
  }
  if (static_cast<int64_t>(v->size()) != layers) {
    return Invalid(r.Field(key), absl::StrCat(v->size(), " entries for ", layers, " layers"));
  }
  std::vector<int64_t> out;
  for (size_t i = 0; i < v->size(); ++i) {
    const double x = v->numbers()[i];
    if (x != static_cast<double>(static_cast<int64_t>(x)) || x < static_cast<double>(lo) ||
        x > static_cast<double>(hi)) {
      return Invalid(absl::StrCat(r.Field(key), "[", i, "]"),
                     absl::StrCat(x, "; must be an integer in [", lo, ", ", hi, "]"));
    }
    out.push_back(static_cast<int64_t>(x));
  }
  return out;
}

// MiniMax-M1 / MiniMax-Text-01: attn_type_list, 0 = lightning attention, 1 = softmax attention
// (vLLM's and SGLang's MiniMaxText01 read it so; MiniMax-M2 lists only 1s).
absl::StatusOr<std::vector<LayerSpec>> FromAttnTypeList(const ConfigReader& r, const ModelSpec& m) {
  ATTEND_ASSIGN_OR_RETURN(const std::vector<int64_t> types,
                          IntList(r, "attn_type_list", m.layers, 0, 1));
  std::vector<LayerSpec> specs;
  for (int64_t t : types) {
    specs.push_back(t == 1 ? Attention(m.n_head_kv) : OfKind(LayerKind::kLightningAttention));
  }
  return specs;
}

// MiMo-V2-Flash: hybrid_layer_pattern, 0 = full attention, 1 = sliding window (sliding_window);
// the sliding layers' key/value heads are set by ReadLayerLayout (swa_num_key_value_heads).
absl::StatusOr<std::vector<LayerSpec>> FromHybridPattern(const ConfigReader& r,
                                                         const ModelSpec& m) {
  ATTEND_ASSIGN_OR_RETURN(const std::vector<int64_t> pattern,
                          IntList(r, "hybrid_layer_pattern", m.layers, 0, 1));
  ATTEND_ASSIGN_OR_RETURN(std::optional<int64_t> window,
                          r.Int("sliding_window", 0, kMaxContextTokens));
  std::vector<LayerSpec> specs;
  for (size_t i = 0; i < pattern.size(); ++i) {
    if (pattern[i] == 1 && window.value_or(0) == 0) {
      return Invalid(
          absl::StrCat(r.Field("hybrid_layer_pattern"), "[", i, "]"),
          absl::StrCat("1 (sliding window) but ", r.Field("sliding_window"), " is not set"));
    }
    specs.push_back(Attention(m.n_head_kv, pattern[i] == 1 ? *window : 0));
  }
  return specs;
}

// The 1-based layer numbers of linear_attn_config[key] (Kimi Linear: "kda_layers",
// "full_attn_layers"), checked against the layer count.
absl::StatusOr<std::vector<int64_t>> OneBasedLayers(const json::Value& config,
                                                    const std::string& field, int64_t layers) {
  const json::Value* v = config.Find(field.substr(field.rfind('.') + 1));
  if (v == nullptr || v->is_null()) return std::vector<int64_t>();
  if (!v->is_array() || (v->size() > 0 && !v->all_numbers())) {
    return Invalid(field, "expected an array of layer numbers (1-based)");
  }
  std::vector<int64_t> out;
  for (size_t i = 0; i < v->size(); ++i) {
    const double x = v->numbers()[i];
    if (x != static_cast<double>(static_cast<int64_t>(x)) || x < 1 ||
        x > static_cast<double>(layers)) {
      return Invalid(absl::StrCat(field, "[", i, "]"),
                     absl::StrCat(x, "; layers are numbered 1 to ", layers));
    }
    out.push_back(static_cast<int64_t>(x));
  }
  return out;
}

// Kimi Linear: linear_attn_config.kda_layers and full_attn_layers, 1-based (KimiLinearConfig's
// is_kda_layer tests layer_idx + 1), must name every layer exactly once. Full layers are MLA
// (latent, made so by ReadLayerLayout with kv_lora_rank).
absl::StatusOr<std::vector<LayerSpec>> FromLinearAttnConfig(const ConfigReader& r,
                                                            const ModelSpec& m) {
  const json::Value* c = r.Get("linear_attn_config");
  if (!c->is_object()) {
    return Invalid(r.Field("linear_attn_config"),
                   absl::StrCat("expected an object, got ", c->type_name()));
  }
  const std::string base = r.Field("linear_attn_config");
  // Fail closed inside the sub-config too: every key it holds is read here or by KdaState (the
  // layer lists, and the KDA state's heads, head size and kernel); any other (a head_k_dim or
  // num_kv_heads of its own) could change the state, and is refused.
  static constexpr absl::string_view kReadInLinearAttnConfig[] = {
      "kda_layers",              // which layers are KDA (1-based)
      "full_attn_layers",        // which layers are MLA (1-based)
      "num_heads",               // the KDA state's heads
      "head_dim",                // the KDA state's head size (keys and values alike)
      "short_conv_kernel_size",  // the short convolutions' kernel
  };
  for (const json::Value::Member& member : c->members()) {
    bool read = false;
    for (absl::string_view k : kReadInLinearAttnConfig) read = read || k == member.first;
    if (!read) {
      return Invalid(QuoteForError(absl::StrCat(base, ".", member.first)),
                     "not understood; it may change the Kimi Delta Attention state, which is "
                     "sized from kda_layers, full_attn_layers, num_heads, head_dim and "
                     "short_conv_kernel_size only");
    }
  }
  ATTEND_ASSIGN_OR_RETURN(const std::vector<int64_t> kda,
                          OneBasedLayers(*c, base + ".kda_layers", m.layers));
  ATTEND_ASSIGN_OR_RETURN(const std::vector<int64_t> full,
                          OneBasedLayers(*c, base + ".full_attn_layers", m.layers));
  std::vector<int> seen(static_cast<size_t>(m.layers), 0);
  std::vector<LayerSpec> specs(static_cast<size_t>(m.layers));
  for (int64_t n : kda) {
    ++seen[static_cast<size_t>(n - 1)];
    specs[static_cast<size_t>(n - 1)] = OfKind(LayerKind::kKimiDeltaAttention);
  }
  for (int64_t n : full) {
    ++seen[static_cast<size_t>(n - 1)];
    specs[static_cast<size_t>(n - 1)] = Attention(m.n_head_kv);
  }
  for (size_t i = 0; i < seen.size(); ++i) {
    if (seen[i] != 1) {
      return Invalid(base, absl::StrCat("layer ", i + 1, " (1-based) is named ", seen[i],
                                        " times by kda_layers and full_attn_layers; each layer "
                                        "must be named once"));
    }
  }
  return specs;
}

// A layer's kind and window, for messages.
std::string Describe(const LayerSpec& l) {
  return l.window_tokens > 0 ? absl::StrCat(LayerKindName(l.kind), ", window ", l.window_tokens)
                             : std::string(LayerKindName(l.kind));
}

// Two per-layer lists given at once must describe the same layers (kinds and windows).
absl::Status SameLayers(const ConfigReader& r, absl::string_view first,
                        const std::vector<LayerSpec>& a, absl::string_view second,
                        const std::vector<LayerSpec>& b) {
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    if (a[i].kind == b[i].kind && a[i].window_tokens == b[i].window_tokens) continue;
    return absl::InvalidArgumentError(
        absl::StrCat(QuoteForError(r.Field(second)), " and ", QuoteForError(r.Field(first)),
                     " describe different layers (layer ", i, ": ", Describe(b[i]), " and ",
                     Describe(a[i]), "); only one would be read, so the pair is not modelled"));
  }
  return absl::OkStatus();
}

// The layouts of attn_type_list (MiniMax) and linear_attn_config (Kimi Linear) read no window:
// their references (vLLM's MiniMaxText01Attention keeps sliding_window but does not pass it to
// its Attention; Kimi Linear's MLA layers have none) attend over the whole context. A window set
// beside them is refused rather than dropped (transformers' own `minimax` model would apply it).
absl::Status NoWindow(const ConfigReader& r, absl::string_view layout) {
  ATTEND_ASSIGN_OR_RETURN(std::optional<int64_t> window,
                          r.Int("sliding_window", 0, kMaxContextTokens));
  ATTEND_ASSIGN_OR_RETURN(std::optional<bool> use, r.Bool("use_sliding_window"));
  if (use.value_or(false)) {
    return Invalid(r.Field("use_sliding_window"),
                   absl::StrCat("true, but the layout of ", layout,
                                " has no sliding-window layers; not modelled"));
  }
  if (window.value_or(0) != 0) {
    return Invalid(r.Field("sliding_window"),
                   absl::StrCat(*window, ", but the layout of ", layout,
                                " has no sliding-window layers (its reference attends over the "
                                "whole context); not modelled"));
  }
  return absl::OkStatus();
}

using LayoutReader = absl::StatusOr<std::vector<LayerSpec>> (*)(const ConfigReader&,
                                                                const ModelSpec&);
struct ListedLayout {
  const char* key;
  LayoutReader read;
};
// The per-layer lists, in order of precedence (hf_layers.h).
constexpr ListedLayout kListedLayouts[] = {
    {"attn_type_list", FromAttnTypeList},
    {"linear_attn_config", FromLinearAttnConfig},
    {"hybrid_layer_pattern", FromHybridPattern},
    {"layer_types", FromLayerTypes},
};

// The layers' kinds (and windows) by the precedence in hf_layers.h.
absl::StatusOr<std::vector<LayerSpec>> LayerKinds(const ConfigReader& r,
                                                  const std::string& model_type,
                                                  const ModelSpec& m) {
  if (IsStateSpaceOnly(model_type)) {
    return std::vector<LayerSpec>(static_cast<size_t>(m.layers), OfKind(LayerKind::kStateSpace));
  }
  if (model_type == "minimax" && r.Get("layer_types") != nullptr) {
    // transformers' own MiniMax (MiniMaxConfig) calls its lightning-attention layers
    // "linear_attention", which layer_types otherwise reads as gated DeltaNet.
    return Invalid(r.Field("layer_types"),
                   "model_type 'minimax' (transformers' MiniMax) writes its lightning-attention "
                   "layers as 'linear_attention', which layer_types reads as gated DeltaNet; this "
                   "format is not modelled (MiniMax's own config.json, model_type minimax_m1 or "
                   "minimax_text_01 with attn_type_list, is)");
  }
  if (r.Get("hybrid_override_pattern") != nullptr || r.Get("layers_block_type") != nullptr) {
    return FromPattern(r, m);
  }
  if (r.Get("attn_layer_period") != nullptr || r.Get("attn_layer_offset") != nullptr ||
      model_type == "jamba") {
    return FromPeriod(r, m);
  }
  // Per-layer lists: the first one given is the layout; any other given must describe the same
  // layers, or the config says two different things and one would be ignored.
  const char* listed = nullptr;
  std::vector<LayerSpec> specs;
  for (const ListedLayout& l : kListedLayouts) {
    if (r.Get(l.key) == nullptr) continue;
    ATTEND_ASSIGN_OR_RETURN(std::vector<LayerSpec> these, l.read(r, m));
    if (listed == nullptr) {
      listed = l.key;
      specs = std::move(these);
      continue;
    }
    ATTEND_RETURN_IF_ERROR(SameLayers(r, listed, specs, l.key, these));
  }
  if (listed != nullptr) {
    // Both given (Qwen3.5 writes layer_types and the interval): they must describe the same
    // layers.
    if (r.Get("full_attention_interval") != nullptr) {
      ATTEND_ASSIGN_OR_RETURN(const std::vector<LayerSpec> every, FromInterval(r, m));
      for (size_t i = 0; i < specs.size(); ++i) {
        if (HoldsKv(specs[i].kind) != HoldsKv(every[i].kind)) {
          return Invalid(r.Field("full_attention_interval"),
                         absl::StrCat("disagrees with ", listed, " at layer ", i, " (",
                                      LayerKindName(specs[i].kind), ")"));
        }
      }
    }
    if (absl::string_view(listed) == "attn_type_list" ||
        absl::string_view(listed) == "linear_attn_config") {
      ATTEND_RETURN_IF_ERROR(NoWindow(r, listed));
    }
    return specs;
  }
  if (r.Get("full_attention_interval") != nullptr || model_type == "qwen3_next" ||
      model_type == "qwen3_5_text" || model_type == "qwen3_5_moe_text") {
    return FromInterval(r, m);
  }
  if (r.Get("attention_chunk_size") != nullptr) return FromChunks(r, m);
  return FromWindows(r, m, model_type);
}

// (kernel - 1) x channels + recurrent values of one sequence, checked against the bounds.
absl::Status SetState(const ConfigReader& r, absl::string_view kernel_key, int64_t kernel,
                      int64_t channels, int64_t recurrent, LayerSpec* l) {
  if (channels > kMaxStateValues || recurrent > kMaxStateValues ||
      (kernel - 1) * channels > kMaxStateValues) {
    return Invalid(r.Field(kernel_key),
                   absl::StrCat("the state of one layer is over ", kMaxStateValues, " values"));
  }
  l->conv_state_values = (kernel - 1) * channels;
  l->recurrent_state_values = recurrent;
  return absl::OkStatus();
}

// Each factor is bounded by kMaxHeads or kMaxHeadDim (2^16) or kMaxDModel (2^20), so products of
// three stay below 2^52 before SetState compares them with the bound.
constexpr int64_t kMaxStateFactor = int64_t{1} << 16;

// Mamba-1 (mamba, falcon_mamba) and Jamba mixers (hf_layers.h).
absl::Status MambaState(const ConfigReader& r, const ModelSpec& m, bool jamba, LayerSpec* l) {
  ATTEND_ASSIGN_OR_RETURN(const int64_t state, r.RequiredInt(jamba ? "mamba_d_state" : "state_size",
                                                             1, kMaxStateFactor));
  const std::string kernel_key = jamba ? "mamba_d_conv" : "conv_kernel";
  ATTEND_ASSIGN_OR_RETURN(const int64_t kernel, r.RequiredInt(kernel_key, 1, kMaxStateFactor));
  ATTEND_ASSIGN_OR_RETURN(const int64_t expand,
                          r.RequiredInt(jamba ? "mamba_expand" : "expand", 1, 64));
  const int64_t inner = expand * m.d_model;
  return SetState(r, kernel_key, kernel, inner, inner * state, l);
}

// Mamba-2 (mamba2) and Nemotron-H mixers (hf_layers.h).
absl::Status Mamba2State(const ConfigReader& r, const ModelSpec& m, bool nemotron, LayerSpec* l) {
  const std::string heads_key = nemotron ? "mamba_num_heads" : "num_heads";
  const std::string dim_key = nemotron ? "mamba_head_dim" : "head_dim";
  ATTEND_ASSIGN_OR_RETURN(const int64_t heads, r.RequiredInt(heads_key, 1, kMaxStateFactor));
  ATTEND_ASSIGN_OR_RETURN(const int64_t dim, r.RequiredInt(dim_key, 1, kMaxStateFactor));
  ATTEND_ASSIGN_OR_RETURN(
      const int64_t state,
      r.RequiredInt(nemotron ? "ssm_state_size" : "state_size", 1, kMaxStateFactor));
  const std::string groups_key =
      nemotron ? KeyOrAlias(r, "n_groups", "mamba_n_groups") : "n_groups";
  ATTEND_ASSIGN_OR_RETURN(const int64_t groups, r.RequiredInt(groups_key, 1, kMaxStateFactor));
  const std::string kernel_key =
      nemotron ? KeyOrAlias(r, "conv_kernel", "mamba_d_conv") : "conv_kernel";
  ATTEND_ASSIGN_OR_RETURN(const int64_t kernel, r.RequiredInt(kernel_key, 1, kMaxStateFactor));
  if (!nemotron) {
    // Mamba2Mixer sizes its projections by expand x hidden_size and its state by the heads: a
    // config where they disagree describes no model that loads.
    ATTEND_ASSIGN_OR_RETURN(const int64_t expand, r.RequiredInt("expand", 1, 64));
    if (heads * dim != expand * m.d_model) {
      return Invalid(r.Field("num_heads"),
                     absl::StrCat(heads, " x head_dim ", dim, " is not expand ", expand,
                                  " x hidden_size ", m.d_model));
    }
  }
  const int64_t inner = heads * dim;
  return SetState(r, kernel_key, kernel, inner + 2 * groups * state, inner * state, l);
}

// Gated delta-net (Qwen3-Next, Qwen3.5; hf_layers.h).
absl::Status DeltaNetState(const ConfigReader& r, LayerSpec* l) {
  ATTEND_ASSIGN_OR_RETURN(const int64_t kernel,
                          r.RequiredInt("linear_conv_kernel_dim", 1, kMaxStateFactor));
  ATTEND_ASSIGN_OR_RETURN(const int64_t dk,
                          r.RequiredInt("linear_key_head_dim", 1, kMaxStateFactor));
  ATTEND_ASSIGN_OR_RETURN(const int64_t dv,
                          r.RequiredInt("linear_value_head_dim", 1, kMaxStateFactor));
  ATTEND_ASSIGN_OR_RETURN(const int64_t nk,
                          r.RequiredInt("linear_num_key_heads", 1, kMaxStateFactor));
  ATTEND_ASSIGN_OR_RETURN(const int64_t nv,
                          r.RequiredInt("linear_num_value_heads", 1, kMaxStateFactor));
  return SetState(r, "linear_conv_kernel_dim", kernel, 2 * nk * dk + nv * dv, nv * dk * dv, l);
}

// Lightning attention (MiniMax-M1): one num_attention_heads x head_dim x head_dim recurrent
// state per sequence and no convolution (SGLang's MiniMaxText01Config.state_shape, vLLM's
// MiniMaxText01LinearAttention).
absl::Status LightningState(const ConfigReader& r, const ModelSpec& m, LayerSpec* l) {
  if (m.n_head > kMaxStateFactor || m.head_dim > kMaxStateFactor) {
    return Invalid(r.Field("head_dim"), "too large for a lightning-attention state");
  }
  return SetState(r, "head_dim", 1, 0, m.n_head * m.head_dim * m.head_dim, l);
}

// Kimi Delta Attention (Kimi Linear; vLLM's kda_state_shape): short convolutions of q, k and v,
// each (short_conv_kernel_size - 1) x num_heads x head_dim, and a num_heads x head_dim x head_dim
// recurrent state, all from linear_attn_config.
absl::Status KdaState(const ConfigReader& r, LayerSpec* l) {
  const ConfigReader c(*r.Get("linear_attn_config"), r.Field("linear_attn_config."));
  ATTEND_ASSIGN_OR_RETURN(const int64_t heads, c.RequiredInt("num_heads", 1, kMaxStateFactor));
  ATTEND_ASSIGN_OR_RETURN(const int64_t dim, c.RequiredInt("head_dim", 1, kMaxStateFactor));
  ATTEND_ASSIGN_OR_RETURN(const int64_t kernel,
                          c.RequiredInt("short_conv_kernel_size", 1, kMaxStateFactor));
  return SetState(c, "short_conv_kernel_size", kernel, 3 * heads * dim, heads * dim * dim, l);
}

// qk_head_dim, which GLM-5's config writes beside the sizes it is made of: the same, or refused.
absl::Status SameQkHeadDim(const ConfigReader& r, int64_t head_dim, absl::string_view of) {
  ATTEND_ASSIGN_OR_RETURN(std::optional<int64_t> qk, r.Int("qk_head_dim", 1, kMaxHeadDim));
  if (qk && *qk != head_dim) {
    return Invalid(r.Field("qk_head_dim"), absl::StrCat(*qk, " differs from ", of, " ", head_dim));
  }
  return absl::OkStatus();
}

// Multi-head latent attention: the expanded head sizes on the model, the latent on each layer.
absl::Status LatentAttention(const ConfigReader& r, ModelSpec* m) {
  ATTEND_ASSIGN_OR_RETURN(const int64_t rank, r.RequiredInt("kv_lora_rank", 1, kMaxHeadDim));
  ATTEND_ASSIGN_OR_RETURN(const int64_t rope, r.RequiredInt("qk_rope_head_dim", 0, kMaxHeadDim));
  ATTEND_ASSIGN_OR_RETURN(const int64_t nope, r.RequiredInt("qk_nope_head_dim", 0, kMaxHeadDim));
  ATTEND_ASSIGN_OR_RETURN(const int64_t v, r.RequiredInt("v_head_dim", 1, kMaxHeadDim));
  if (rope + nope < 1 || rope + nope > kMaxHeadDim) {
    return Invalid(r.Field("qk_nope_head_dim"), absl::StrCat(nope, " + qk_rope_head_dim ", rope,
                                                             " is not in [1, ", kMaxHeadDim, "]"));
  }
  m->head_dim = rope + nope;
  m->head_dim_v = v;
  ATTEND_RETURN_IF_ERROR(SameQkHeadDim(r, m->head_dim, "qk_nope_head_dim + qk_rope_head_dim"));
  for (LayerSpec& l : m->layer_specs) {
    if (l.kind != LayerKind::kAttention) continue;
    l.kind = LayerKind::kLatentAttention;
    l.kv_lora_rank = rank;
    l.qk_rope_head_dim = rope;
  }
  return absl::OkStatus();
}

// MiMo-V2-Flash-style sliding layers with their own key/value heads: swa_num_key_value_heads on
// every sliding-window attention layer. The query heads and head sizes of the sliding layers must
// be the model's (the planner has one head size per model): a config where they differ is
// refused, naming the key.
absl::Status SlidingLayerHeads(const ConfigReader& r, ModelSpec* m) {
  ATTEND_ASSIGN_OR_RETURN(std::optional<int64_t> kv,
                          r.Int("swa_num_key_value_heads", 1, kMaxHeads));
  const struct {
    const char* key;
    int64_t model;
    const char* model_key;
  } same[] = {{"swa_num_attention_heads", m->n_head, "num_attention_heads"},
              {"swa_head_dim", m->head_dim, "head_dim"}};
  for (const auto& s : same) {
    ATTEND_ASSIGN_OR_RETURN(std::optional<int64_t> v, r.Int(s.key, 1, kMaxHeadDim));
    if (v && *v != s.model) {
      return Invalid(r.Field(s.key), absl::StrCat(*v, " differs from ", s.model_key, " ", s.model,
                                                  "; sliding layers with their own query heads "
                                                  "or head size are not modelled"));
    }
  }
  if (r.Get("swa_v_head_dim") != nullptr) {
    ATTEND_ASSIGN_OR_RETURN(const int64_t sv, r.RequiredInt("swa_v_head_dim", 1, kMaxHeadDim));
    ATTEND_ASSIGN_OR_RETURN(std::optional<int64_t> v, r.Int("v_head_dim", 1, kMaxHeadDim));
    if (sv != v.value_or(m->head_dim)) {
      return Invalid(r.Field("swa_v_head_dim"),
                     absl::StrCat(sv, " differs from v_head_dim ", v.value_or(m->head_dim),
                                  "; sliding layers with their own value head size are not "
                                  "modelled"));
    }
  }
  if (!kv) return absl::OkStatus();
  if (*kv > m->n_head || m->n_head % *kv != 0) {
    return Invalid(r.Field("swa_num_key_value_heads"),
                   absl::StrCat(*kv, " does not divide num_attention_heads ", m->n_head));
  }
  bool any = false;
  for (LayerSpec& l : m->layer_specs) {
    if (l.kind == LayerKind::kAttention && l.window_tokens > 0) {
      l.n_head_kv = *kv;
      any = true;
    }
  }
  if (!any && *kv != m->n_head_kv) {
    return Invalid(r.Field("swa_num_key_value_heads"),
                   "given, but no layer slides (hybrid_layer_pattern or layer_types)");
  }
  return absl::OkStatus();
}

// DeepSeek sparse attention (DeepSeek-V3.2, GLM-5): index_head_dim on every latent layer. Only
// with latent attention, and only when every layer runs its own indexer: GLM-5.2-style
// IndexShare layers ("shared" indexer_types, index_topk_freq > 1) reuse another layer's
// selection, and whether they cache indexer keys is not modelled.
absl::Status Indexer(const ConfigReader& r, ModelSpec* m) {
  ATTEND_ASSIGN_OR_RETURN(std::optional<int64_t> dim, r.Int("index_head_dim", 1, kMaxHeadDim));
  // Query heads of the indexer and how many tokens it selects: not cached, read for their
  // bounds only.
  ATTEND_RETURN_IF_ERROR(r.Int("index_n_heads", 1, kMaxHeads).status());
  ATTEND_RETURN_IF_ERROR(r.Int("index_topk", 1, kMaxContextTokens).status());
  ATTEND_ASSIGN_OR_RETURN(std::optional<int64_t> freq, r.Int("index_topk_freq", 1, kMaxLayers));
  if (freq.value_or(1) != 1) {
    return Invalid(r.Field("index_topk_freq"),
                   absl::StrCat(*freq,
                                ": layers that share another layer's indexer selection "
                                "are not modelled (only 1, every layer its own indexer)"));
  }
  if (r.Get("indexer_types") != nullptr) {
    ATTEND_ASSIGN_OR_RETURN(const std::vector<std::string> types,
                            StringList(r, "indexer_types", m->layers));
    for (size_t i = 0; i < types.size(); ++i) {
      if (types[i] != "full") {
        return Invalid(absl::StrCat(r.Field("indexer_types"), "[", i, "]"),
                       absl::StrCat(QuoteForError(types[i]),
                                    " is not modelled (only 'full': every layer its own "
                                    "indexer)"));
      }
    }
  }
  if (!dim) return absl::OkStatus();
  if (r.Get("kv_lora_rank") == nullptr) {
    return Invalid(r.Field("index_head_dim"),
                   "a sparse-attention indexer without latent attention (kv_lora_rank) is not "
                   "modelled");
  }
  for (LayerSpec& l : m->layer_specs) {
    if (l.kind == LayerKind::kLatentAttention) l.index_head_dim = *dim;
  }
  return absl::OkStatus();
}

}  // namespace

bool IsStateSpaceOnly(absl::string_view model_type) {
  return model_type == "mamba" || model_type == "falcon_mamba" || model_type == "mamba2";
}

std::optional<int64_t> PatternLayers(const ConfigReader& r) {
  const json::Value* pattern = r.Get("hybrid_override_pattern");
  if (pattern != nullptr && pattern->is_string()) {
    return static_cast<int64_t>(pattern->string_value().size());
  }
  const json::Value* types = r.Get("layers_block_type");
  if (types != nullptr && types->is_array()) return static_cast<int64_t>(types->size());
  return std::nullopt;
}

// Architectures whose layout comes from one field: without it (absent or null) the config would
// read as plain attention, which these models are not. Refused rather than guessed at.
absl::Status RequireLayoutFields(const ConfigReader& r, const std::string& model_type) {
  struct Required {
    const char* model_type;
    const char* field;
    const char* alternative;  // also accepted in its place, or null
    const char* what;
  };
  static constexpr Required kRequired[] = {
      {"deepseek_v2", "kv_lora_rank", nullptr, "the latent attention's rank"},
      {"deepseek_v3", "kv_lora_rank", nullptr, "the latent attention's rank"},
      {"kimi_k2", "kv_lora_rank", nullptr, "the latent attention's rank"},
      {"nemotron_h", "hybrid_override_pattern", "layers_block_type", "which layers are Mamba"},
      {"gpt_oss", "layer_types", nullptr, "which layers slide"},
      {"deepseek_v32", "kv_lora_rank", nullptr, "the latent attention's rank"},
      {"deepseek_v32", "index_head_dim", nullptr, "the sparse-attention indexer's key size"},
      {"glm_moe_dsa", "kv_lora_rank", nullptr, "the latent attention's rank"},
      {"glm_moe_dsa", "index_head_dim", nullptr, "the sparse-attention indexer's key size"},
      {"minimax_m1", "attn_type_list", nullptr, "which layers are lightning attention"},
      {"minimax_text_01", "attn_type_list", nullptr, "which layers are lightning attention"},
      {"kimi_linear", "linear_attn_config", nullptr, "which layers are Kimi Delta Attention"},
      {"mimo_v2_flash", "hybrid_layer_pattern", nullptr, "which layers slide"},
  };
  for (const Required& q : kRequired) {
    if (model_type != q.model_type || r.Get(q.field) != nullptr) continue;
    if (q.alternative != nullptr && r.Get(q.alternative) != nullptr) continue;
    return Invalid(r.Field(q.field),
                   absl::StrCat("missing or null; model_type '", model_type, "' needs it (", q.what,
                                "), and without it the layout is not modelled"));
  }
  return absl::OkStatus();
}

absl::Status ReadLayerLayout(const ConfigReader& r, const std::string& model_type, ModelSpec* m) {
  ATTEND_RETURN_IF_ERROR(RequireLayoutFields(r, model_type));
  // Gemma 2's published config repeats its window as sliding_window_size; one that disagrees
  // with sliding_window describes no model this importer knows.
  ATTEND_ASSIGN_OR_RETURN(std::optional<int64_t> window,
                          r.Int("sliding_window", 0, kMaxContextTokens));
  ATTEND_ASSIGN_OR_RETURN(std::optional<int64_t> window_size,
                          r.Int("sliding_window_size", 0, kMaxContextTokens));
  if (window_size && window_size != window) {
    return Invalid(r.Field("sliding_window_size"),
                   absl::StrCat(*window_size, " differs from sliding_window ",
                                window ? absl::StrCat(*window) : "(not set)"));
  }
  ATTEND_ASSIGN_OR_RETURN(m->layer_specs, LayerKinds(r, model_type, *m));
  ATTEND_RETURN_IF_ERROR(SlidingLayerHeads(r, m));
  if (r.Get("kv_lora_rank") != nullptr) {
    ATTEND_RETURN_IF_ERROR(LatentAttention(r, m));
  } else if (r.Get("v_head_dim") != nullptr) {
    // Without a latent, v_head_dim is the value heads' size (MiMo-V2-Flash: 192 / 128).
    ATTEND_ASSIGN_OR_RETURN(m->head_dim_v, r.RequiredInt("v_head_dim", 1, kMaxHeadDim));
  }
  if (r.Get("kv_lora_rank") == nullptr) {
    ATTEND_RETURN_IF_ERROR(SameQkHeadDim(r, m->head_dim, "head_dim"));
  }
  ATTEND_RETURN_IF_ERROR(Indexer(r, m));
  // Every recurrent layer of one kind has the same mixer, so its state is sized once per kind.
  std::map<LayerKind, LayerSpec> states;
  for (LayerSpec& l : m->layer_specs) {
    if (!HoldsState(l.kind)) continue;
    auto it = states.find(l.kind);
    if (it == states.end()) {
      LayerSpec s = l;
      if (l.kind == LayerKind::kLinearAttention) {
        ATTEND_RETURN_IF_ERROR(DeltaNetState(r, &s));
      } else if (l.kind == LayerKind::kLightningAttention) {
        ATTEND_RETURN_IF_ERROR(LightningState(r, *m, &s));
      } else if (l.kind == LayerKind::kKimiDeltaAttention) {
        ATTEND_RETURN_IF_ERROR(KdaState(r, &s));
      } else if (model_type == "mamba2" || model_type == "nemotron_h" ||
                 r.Get("hybrid_override_pattern") != nullptr ||
                 r.Get("layers_block_type") != nullptr) {
        ATTEND_RETURN_IF_ERROR(Mamba2State(r, *m, model_type != "mamba2", &s));
      } else {
        ATTEND_RETURN_IF_ERROR(MambaState(r, *m, !IsStateSpaceOnly(model_type), &s));
      }
      it = states.emplace(l.kind, s).first;
    }
    l = it->second;
  }
  return absl::OkStatus();
}

}  // namespace attend::planner
