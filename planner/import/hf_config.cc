#include "planner/import/hf_config.h"

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "core/base/status_macros.h"
#include "planner/import/hf_config_reader.h"
#include "planner/import/hf_fields.h"
#include "planner/import/hf_layers.h"
#include "planner/import/imported_model.h"

namespace attend::planner {
namespace {

// Falcon's model_type; its first releases, for their own modelling code, said RefinedWebModel
// (falcon-7b) and RefinedWeb (falcon-40b).
bool IsFalconModelType(absl::string_view model_type) {
  return model_type == "falcon" || model_type == "RefinedWebModel" || model_type == "RefinedWeb";
}

// Falcon's key/value heads, as Transformers' FalconAttention decides them: the new decoder
// architecture (falcon-40b, falcon-180B) groups the query heads by num_kv_heads (n_head_kv in
// RefinedWeb configs; default one per query head); otherwise multi_query (default true, as in
// Transformers' FalconConfig) shares one key/value head, and without it every query head has its
// own, whatever num_kv_heads says (the fused projection is then 3 x hidden_size wide). The
// RefinedWeb modelling code always used the new architecture, so its configs lack the flag.
// Sets *field to the key the count came from, for errors.
absl::StatusOr<int64_t> FalconKvHeads(const ConfigReader& r, absl::string_view model_type,
                                      int64_t n_head, std::string* field) {
  ATTEND_ASSIGN_OR_RETURN(std::optional<bool> new_architecture, r.Bool("new_decoder_architecture"));
  ATTEND_ASSIGN_OR_RETURN(std::optional<bool> multi_query, r.Bool("multi_query"));
  if (new_architecture.value_or(model_type == "RefinedWeb")) {
    *field = KeyOrAlias(r, "num_kv_heads", "n_head_kv");
    ATTEND_ASSIGN_OR_RETURN(std::optional<int64_t> kv, r.Int(*field, 1, kMaxHeads));
    return kv.value_or(n_head);
  }
  *field = "multi_query";
  return multi_query.value_or(true) ? 1 : n_head;
}

// Whether two JSON values are the same (numbers by value, objects by members in any order).
bool SameValue(const json::Value& a, const json::Value& b) {
  if (a.type() != b.type()) return false;
  switch (a.type()) {
    case json::Value::Type::kNull:
      return true;
    case json::Value::Type::kBool:
      return a.bool_value() == b.bool_value();
    case json::Value::Type::kNumber:
      return a.number_value() == b.number_value();
    case json::Value::Type::kString:
      return a.string_value() == b.string_value();
    case json::Value::Type::kArray:
      if (a.size() != b.size()) return false;
      if (a.all_numbers() || b.all_numbers()) {
        return a.all_numbers() && b.all_numbers() && a.numbers() == b.numbers();
      }
      for (size_t i = 0; i < a.size(); ++i) {
        if (!SameValue(a.items()[i], b.items()[i])) return false;
      }
      return true;
    case json::Value::Type::kObject:
      if (a.members().size() != b.members().size()) return false;
      for (const json::Value::Member& m : a.members()) {
        const json::Value* other = b.Find(m.first);
        if (other == nullptr || !SameValue(m.second, *other)) return false;
      }
      return true;
  }
  return false;
}

// A value for an error message: a number or short string as written, else its type.
std::string Shown(const json::Value& v) {
  if (v.is_number()) return v.number_text();
  if (v.is_string()) return QuoteForError(v.string_value());
  if (v.is_bool()) return v.bool_value() ? "true" : "false";
  return std::string(v.type_name());
}

// Whether a key at a wrapper's top level may describe the text model's attention: a key the
// importer reads that shapes the cache, or an attention sub-config or key it does not read
// (sparse_attn_config).
bool DescribesTextLayout(absl::string_view key) {
  if (ShapesCacheHfField(key)) return true;
  if (IsReadHfField(key) || IsIgnoredHfField(key)) return false;
  return absl::StrContains(key, "attn") || absl::StrContains(key, "attention");
}

// A multimodal config that gives its text model's layout twice, once at the top level and once
// in text_config. Planned from text_config (`from_text`), a layout key at the top level that
// text_config does not repeat with the same value would be ignored: refused, naming it. Planned
// from the top level, a key that both give with different values is refused, naming both.
absl::Status CheckWrapperLayout(const json::Value& root, const json::Value& text_config,
                                bool from_text) {
  const json::Value& other = from_text ? root : text_config;
  const json::Value& planned = from_text ? text_config : root;
  for (const json::Value::Member& member : other.members()) {
    const std::string& key = member.first;
    if (key == "text_config" || member.second.is_null() || !DescribesTextLayout(key)) continue;
    const json::Value* same = planned.Find(key);
    const bool given = same != nullptr && !same->is_null();
    if (given && SameValue(*same, member.second)) continue;
    if (from_text) {
      return absl::InvalidArgumentError(absl::StrCat(
          QuoteForError(key), ": ", Shown(member.second),
          " at the top level of a multimodal config that is planned from its text_config (",
          QuoteForError(absl::StrCat("text_config.", key)),
          given ? absl::StrCat(" is ", Shown(*same)) : std::string(" is not set"),
          "); a layout key beside text_config is not modelled"));
    }
    if (!given)
      continue;  // the top level is what is planned; a key only text_config has is
                 // text_config's default for it, judged nowhere else
    return absl::InvalidArgumentError(absl::StrCat(
        QuoteForError(key), " (", Shown(*same), ") and ",
        QuoteForError(absl::StrCat("text_config.", key)), " (", Shown(member.second),
        ") disagree: the config describes its text model twice, differently; which one holds "
        "the cache is not modelled"));
  }
  return absl::OkStatus();
}

// The parsed text, which must be an object. Parser errors keep their position and say that they
// are about config.json.
absl::StatusOr<json::Value> ParseConfig(absl::string_view text) {
  absl::StatusOr<json::Value> parsed = json::Parse(text, HfConfigJsonLimits());
  if (!parsed.ok()) {
    // The parser's message says where; this says what was being read.
    return absl::Status(parsed.status().code(),
                        absl::StrCat("config.json: ", parsed.status().message()));
  }
  if (!parsed->is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "config.json: the top level is not an object (got ", parsed->type_name(), ")"));
  }
  return parsed;
}

// A layer count taken from a pattern's length, checked as num_hidden_layers would be.
absl::Status CheckLayerCount(const ConfigReader& r, int64_t layers) {
  if (layers < 1 || layers > kMaxLayers) {
    return absl::InvalidArgumentError(absl::StrCat(r.Field("hybrid_override_pattern"), ": ", layers,
                                                   " layers; must be in [1, ", kMaxLayers, "]"));
  }
  return absl::OkStatus();
}

// Layers, query and key/value heads, hidden size and head size (layers and hidden size only for
// a model without attention). `model_type` is the config's
// (sanitised); `falcon` whether it is one of Falcon's.
absl::Status ReadAttentionShape(const ConfigReader& r, const std::string& model_type, bool falcon,
                                ModelSpec* m) {
  // Falcon's first configs say n_layer and n_head, as GPT-2's do.
  const std::string layers_key =
      falcon ? KeyOrAlias(r, "num_hidden_layers", "n_layer") : "num_hidden_layers";
  const std::string heads_key =
      falcon ? KeyOrAlias(r, "num_attention_heads", "n_head") : "num_attention_heads";
  // Mamba's configs say both num_hidden_layers and n_layer; newer Nemotron-H configs give only
  // the pattern, whose length is the layer count.
  const std::optional<int64_t> pattern_layers = PatternLayers(r);
  if (r.Get(layers_key) == nullptr && pattern_layers) {
    ATTEND_RETURN_IF_ERROR(CheckLayerCount(r, *pattern_layers));
    m->layers = *pattern_layers;
  } else {
    ATTEND_ASSIGN_OR_RETURN(m->layers, r.RequiredInt(layers_key, 1, kMaxLayers));
  }
  ATTEND_ASSIGN_OR_RETURN(m->d_model, r.RequiredInt("hidden_size", 1, kMaxDModel));
  if (IsStateSpaceOnly(model_type)) return absl::OkStatus();  // no attention heads
  ATTEND_ASSIGN_OR_RETURN(m->n_head, r.RequiredInt(heads_key, 1, kMaxHeads));
  std::string kv_field = "num_key_value_heads";
  if (falcon) {
    ATTEND_ASSIGN_OR_RETURN(m->n_head_kv, FalconKvHeads(r, model_type, m->n_head, &kv_field));
  } else {
    ATTEND_ASSIGN_OR_RETURN(std::optional<int64_t> kv, r.Int(kv_field, 1, kMaxHeads));
    m->n_head_kv = kv.value_or(m->n_head);
  }
  if (m->n_head_kv > m->n_head || m->n_head % m->n_head_kv != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        r.Field(kv_field), ": ", m->n_head_kv, " does not divide num_attention_heads ", m->n_head));
  }
  // Nemotron-H's first configs call the attention head size attention_head_dim.
  ATTEND_ASSIGN_OR_RETURN(std::optional<int64_t> head_dim,
                          r.Int(KeyOrAlias(r, "head_dim", "attention_head_dim"), 1, kMaxHeadDim));
  if (!head_dim) {
    if (m->d_model % m->n_head != 0) {
      return absl::InvalidArgumentError(absl::StrCat(r.Field("hidden_size"), " ", m->d_model,
                                                     " is not a multiple of num_attention_heads ",
                                                     m->n_head, " and head_dim is not given"));
    }
    head_dim = m->d_model / m->n_head;
  }
  m->head_dim = *head_dim;
  m->head_dim_v = *head_dim;
  return absl::OkStatus();
}

// Vocabulary, MLP width and context length.
absl::Status ReadSizes(const ConfigReader& r, bool falcon, ModelSpec* m) {
  ATTEND_ASSIGN_OR_RETURN(std::optional<int64_t> vocab, r.Int("vocab_size", 0, kMaxVocab));
  m->vocab_size = vocab.value_or(0);
  if (falcon) {
    // Falcon's MLP is 4 x hidden_size wide unless ffn_hidden_size says otherwise (Transformers'
    // FalconConfig); its configs have no intermediate_size. 4 x kMaxDModel <= kMaxIntermediate.
    ATTEND_ASSIGN_OR_RETURN(std::optional<int64_t> ffn,
                            r.Int("ffn_hidden_size", 0, kMaxIntermediate));
    m->intermediate_size = ffn.value_or(4 * m->d_model);
  } else {
    ATTEND_ASSIGN_OR_RETURN(std::optional<int64_t> inter,
                            r.Int("intermediate_size", 0, kMaxIntermediate));
    m->intermediate_size = inter.value_or(0);
  }
  ATTEND_ASSIGN_OR_RETURN(std::optional<int64_t> context,
                          r.Int("max_position_embeddings", 0, kMaxContextTokens));
  m->max_context_tokens = context.value_or(0);
  return absl::OkStatus();
}

// The weights' dtype and whether the embeddings are tied; a multimodal config may give either at
// its top level instead of in text_config.
absl::Status ReadWeights(const ConfigReader& r, const ConfigReader& top, bool falcon,
                         ModelSpec* m) {
  ATTEND_ASSIGN_OR_RETURN(std::optional<std::string> dtype, r.String("torch_dtype"));
  if (!dtype) {
    ATTEND_ASSIGN_OR_RETURN(dtype, r.String("dtype"));
  }
  if (!dtype) {
    ATTEND_ASSIGN_OR_RETURN(dtype, top.String("torch_dtype"));
  }
  if (dtype) {
    ATTEND_ASSIGN_OR_RETURN(const KvDType w, ParseDType(*dtype, r.Field("torch_dtype")));
    m->weights_dtype = std::string(DTypeName(w));
  }
  // Transformers' LlamaConfig, MistralConfig, MixtralConfig and Qwen2Config default to untied
  // embeddings; the Gemma configs default to tied ones, and so does FalconConfig (it keeps
  // PretrainedConfig's default, and FalconForCausalLM ties lm_head to the word embeddings).
  ATTEND_ASSIGN_OR_RETURN(std::optional<bool> tied, r.Bool("tie_word_embeddings"));
  if (!tied) {
    ATTEND_ASSIGN_OR_RETURN(tied, top.Bool("tie_word_embeddings"));
  }
  m->tied_embeddings = tied.value_or(absl::StartsWith(m->architecture, "gemma") || falcon);
  return absl::OkStatus();
}

// Mixture of experts: a model with more than one expert must say how many a token uses.
absl::Status ReadExperts(const ConfigReader& r, ModelSpec* m) {
  ATTEND_ASSIGN_OR_RETURN(std::optional<int64_t> experts,
                          r.Int("num_local_experts", 0, kMaxExperts));
  if (!experts) {
    ATTEND_ASSIGN_OR_RETURN(experts, r.Int("num_experts", 0, kMaxExperts));
  }
  if (!experts) {
    // DeepSeek-V2/V3 and Kimi K2 (routed experts; the shared one is part of every token).
    ATTEND_ASSIGN_OR_RETURN(experts, r.Int("n_routed_experts", 0, kMaxExperts));
  }
  m->experts = experts.value_or(0);
  if (m->experts <= 1) {
    m->experts_active = m->experts;
    return absl::OkStatus();
  }
  // Kimi Linear spells it num_experts_per_token.
  const std::string per_token_key = KeyOrAlias(r, "num_experts_per_tok", "num_experts_per_token");
  ATTEND_ASSIGN_OR_RETURN(std::optional<int64_t> per_token, r.Int(per_token_key, 1, m->experts));
  if (!per_token) {
    return absl::InvalidArgumentError(absl::StrCat(
        r.Field("num_experts_per_tok"), " is missing for a model with ", m->experts, " experts"));
  }
  m->experts_active = *per_token;
  return absl::OkStatus();
}

// What the model is called in the config: the last part of _name_or_path, else the architecture.
absl::StatusOr<std::string> ReadLabel(const ConfigReader& top, const std::string& architecture) {
  ATTEND_ASSIGN_OR_RETURN(std::optional<std::string> path, top.String("_name_or_path"));
  std::string label = path.value_or("");
  if (const size_t slash = label.find_last_of('/'); slash != std::string::npos) {
    label = label.substr(slash + 1);
  }
  if (label.empty()) label = architecture;
  return label;
}

// MiMo-V2-Flash's routed experts are moe_intermediate_size wide, narrower than its dense
// layers' intermediate_size, and some layers are dense (moe_layer_freq): ComputeParameters, which
// sizes every expert at intermediate_size, would count 2.48T parameters for a 309B model. Its
// count is reported as unknown (0) instead, as for the other 2025-26 families (whose layers the
// shape rules do not describe). Earlier families keep their computed counts unchanged.
absl::Status UnknownWhenExpertsAreNarrower(const ConfigReader& r, ModelSpec* m) {
  if (m->architecture != "mimo_v2_flash" || m->parameters == 0 || m->experts <= 1) {
    return absl::OkStatus();
  }
  ATTEND_ASSIGN_OR_RETURN(std::optional<int64_t> moe,
                          r.Int("moe_intermediate_size", 0, kMaxIntermediate));
  if (!moe || *moe == m->intermediate_size) return absl::OkStatus();
  m->parameters = 0;
  m->active_parameters = 0;
  m->parameters_source =
      absl::StrCat("unknown: the experts are ", r.Field("moe_intermediate_size"), " ", *moe,
                   " wide, not intermediate_size ", m->intermediate_size,
                   ", and the shape rules size every expert at intermediate_size");
  return absl::OkStatus();
}

}  // namespace

json::Limits HfConfigJsonLimits() {
  json::Limits limits;
  limits.max_input_bytes = size_t{1} << 20;  // config.json files are a few KiB
  limits.max_depth = 64;
  limits.max_string_bytes = size_t{1} << 16;
  limits.max_number_chars = 256;  // longer numbers are not plausible and would only cost time
  limits.max_array_elements = size_t{1} << 16;
  limits.max_object_members = size_t{1} << 14;
  limits.max_values = size_t{1} << 16;
  // transformers saves configs with Python's json module, which writes Infinity (Mamba-2's and
  // Nemotron-H's time_step_limit); no value the importer reads can be one, since AsInt64
  // refuses them.
  limits.allow_python_non_finite = true;
  return limits;
}

absl::StatusOr<ModelSpec> ImportHfConfig(absl::string_view text, absl::string_view name) {
  ATTEND_ASSIGN_OR_RETURN(const json::Value root, ParseConfig(text));
  // A multimodal config keeps its text model's keys in text_config.
  const json::Value* config = &root;
  std::string prefix;
  const json::Value* text_config = root.Find("text_config");
  if (text_config != nullptr && !text_config->is_null() && !text_config->is_object()) {
    return absl::InvalidArgumentError("text_config: expected an object (the text model's keys)");
  }
  const bool has_layers =
      root.Find("num_hidden_layers") != nullptr || root.Find("n_layer") != nullptr ||
      root.Find("hybrid_override_pattern") != nullptr || root.Find("layers_block_type") != nullptr;
  if (!has_layers && text_config != nullptr && text_config->is_null()) {
    return absl::InvalidArgumentError(
        "text_config: null, and the top level has no num_hidden_layers: the config holds no "
        "text model to plan (a multimodal wrapper is planned from a text_config object)");
  }
  if (!has_layers && text_config == nullptr) {
    // InternVL (llm_config), DeepSeek-VL2 (language_config): wrappers of another form.
    for (const char* key : {"llm_config", "language_config"}) {
      const json::Value* v = root.Find(key);
      if (v != nullptr && v->is_object()) {
        return absl::InvalidArgumentError(
            absl::StrCat(QuoteForError(key), ": a multimodal config whose text model is in ", key,
                         " is not modelled (only text_config is read, and the top level has no "
                         "num_hidden_layers)"));
      }
    }
  }
  if (root.Find("num_hidden_layers") == nullptr && text_config != nullptr &&
      text_config->is_object()) {
    config = text_config;
    prefix = "text_config.";
  }
  if (text_config != nullptr && text_config->is_object()) {
    ATTEND_RETURN_IF_ERROR(CheckWrapperLayout(root, *text_config, config == text_config));
  }
  const ConfigReader r(*config, prefix);
  const ConfigReader top(root, "");

  ATTEND_ASSIGN_OR_RETURN(std::optional<std::string> model_type, r.String("model_type"));
  if (!model_type) {
    ATTEND_ASSIGN_OR_RETURN(model_type, top.String("model_type"));
  }
  const std::string given_type = SanitizeText(model_type.value_or(""));
  // Every Falcon config is one architecture, "falcon" as in Transformers and GGUF, so that the
  // parameter count applies Falcon's rules (HasGatedMlp) whichever model_type it was saved with.
  const bool falcon = IsFalconModelType(given_type);
  // A family's required layout key is named as missing before its siblings (index_n_heads
  // without index_head_dim) are judged as unknown.
  ATTEND_RETURN_IF_ERROR(RequireLayoutFields(r, given_type));
  ATTEND_RETURN_IF_ERROR(CheckHfFields(*config, prefix, given_type));
  ModelSpec m;
  m.architecture = falcon ? "falcon" : given_type;
  ATTEND_RETURN_IF_ERROR(ReadAttentionShape(r, given_type, falcon, &m));
  ATTEND_RETURN_IF_ERROR(ReadSizes(r, falcon, &m));
  ATTEND_RETURN_IF_ERROR(ReadWeights(r, top, falcon, &m));
  ATTEND_RETURN_IF_ERROR(ReadExperts(r, &m));

  ATTEND_RETURN_IF_ERROR(ReadLayerLayout(r, m.architecture, &m));

  // A wrapper without _name_or_path is named after its own model_type (kimi_k25), not its text
  // model's.
  ATTEND_ASSIGN_OR_RETURN(std::optional<std::string> wrapper_type, top.String("model_type"));
  ATTEND_ASSIGN_OR_RETURN(const std::string label, ReadLabel(top, !prefix.empty() && wrapper_type
                                                                      ? SanitizeText(*wrapper_type)
                                                                      : m.architecture));
  NameImportedModel(name, label, "imported", &m);
  m.source = given_type.empty()
                 ? "Hugging Face config.json"
                 : absl::StrCat("Hugging Face config.json (model_type ", given_type, ")");
  if (!prefix.empty()) {
    // A multimodal wrapper: say that the plan is its text model's, whose layers hold the cache.
    // The text model's type only when text_config gives one (given_type falls back to the
    // wrapper's).
    ATTEND_ASSIGN_OR_RETURN(std::optional<std::string> text_type, r.String("model_type"));
    m.source = absl::StrCat(
        "Hugging Face config.json",
        wrapper_type ? absl::StrCat(" (model_type ", SanitizeText(*wrapper_type), ")") : "",
        ", planned from its text_config",
        text_type ? absl::StrCat(" (model_type ", SanitizeText(*text_type), ")") : "",
        "; the other towers hold no KV cache");
  }
  ATTEND_ASSIGN_OR_RETURN(ModelSpec done, FinishImportedModel(std::move(m)));
  ATTEND_RETURN_IF_ERROR(UnknownWhenExpertsAreNarrower(r, &done));
  return done;
}

}  // namespace attend::planner
