#include "planner/import/gguf_layers.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "core/base/status_macros.h"

namespace attend::planner {
namespace {

absl::Status Bad(const std::string& key, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("gguf: ", QuoteForError(key), ": ", what));
}

absl::Status Missing(const std::string& key, absl::string_view why) {
  return absl::InvalidArgumentError(
      absl::StrCat("gguf: ", QuoteForError(key), " is missing ", why));
}

bool IsDeltaNetArch(const std::string& arch) {
  return arch == "qwen3next" || arch == "qwen35" || arch == "qwen35moe";
}

// Latent attention: the expanded sizes on the model, the latent on every attention layer.
absl::Status ReadLatent(const GgufInts& md, const std::string& a, ModelSpec* m) {
  ATTEND_ASSIGN_OR_RETURN(std::optional<int64_t> rank,
                          md.scalar(a + "attention.kv_lora_rank", 1, kMaxHeadDim));
  ATTEND_ASSIGN_OR_RETURN(std::optional<int64_t> rope,
                          md.scalar(a + "rope.dimension_count", 0, kMaxHeadDim));
  if (!rope) return Missing(a + "rope.dimension_count", "for a latent-attention model");
  ATTEND_ASSIGN_OR_RETURN(std::optional<int64_t> k_mla,
                          md.scalar(a + "attention.key_length_mla", 1, kMaxHeadDim));
  ATTEND_ASSIGN_OR_RETURN(std::optional<int64_t> v_mla,
                          md.scalar(a + "attention.value_length_mla", 1, kMaxHeadDim));
  if (k_mla) {
    // The MQA form: key_length is the cached row, which must be the latent and the RoPE key.
    if (m->head_dim != *rank + *rope) {
      return Bad(a + "attention.key_length",
                 absl::StrCat(m->head_dim, " is not kv_lora_rank ", *rank,
                              " + rope.dimension_count ", *rope));
    }
    m->head_dim = *k_mla;
    m->head_dim_v = v_mla.value_or(*k_mla);
    m->n_head_kv = m->n_head;
  }
  if (*rope > m->head_dim) {
    return Bad(a + "rope.dimension_count",
               absl::StrCat(*rope, " is larger than the key head size ", m->head_dim));
  }
  for (LayerSpec& l : m->layer_specs) {
    if (l.kind != LayerKind::kAttention) continue;
    l.kind = LayerKind::kLatentAttention;
    l.n_head_kv = m->n_head_kv;
    l.kv_lora_rank = *rank;
    l.qk_rope_head_dim = *rope;
  }
  return absl::OkStatus();
}

// The state of one recurrent layer (llama_hparams::n_embd_r / n_embd_s).
absl::StatusOr<LayerSpec> RecurrentState(const GgufInts& md, const std::string& a, LayerKind kind) {
  constexpr int64_t kMax = int64_t{1} << 20;  // bounds each factor; products stay below 2^62
  ATTEND_ASSIGN_OR_RETURN(std::optional<int64_t> conv, md.scalar(a + "ssm.conv_kernel", 1, kMax));
  ATTEND_ASSIGN_OR_RETURN(std::optional<int64_t> inner, md.scalar(a + "ssm.inner_size", 1, kMax));
  ATTEND_ASSIGN_OR_RETURN(std::optional<int64_t> state, md.scalar(a + "ssm.state_size", 1, kMax));
  // Mamba-1 mixers (mamba, jamba, falcon_mamba) have no groups; Mamba-2 mixers and gated
  // delta-nets size their convolution by them, so there it is required and at least 1.
  const bool grouped = a != "mamba." && a != "jamba." && a != "falcon_mamba.";
  ATTEND_ASSIGN_OR_RETURN(std::optional<int64_t> groups,
                          md.scalar(a + "ssm.group_count", grouped ? 1 : 0, kMax));
  if (grouped && !groups) return Missing(a + "ssm.group_count", "for Mamba-2 and delta-net layers");
  for (const auto& [key, value] :
       {std::pair<const char*, bool>{"ssm.conv_kernel", conv.has_value()},
        {"ssm.inner_size", inner.has_value()},
        {"ssm.state_size", state.has_value()}}) {
    if (!value) return Missing(a + key, "for a model with recurrent layers");
  }
  LayerSpec l;
  l.kind = kind;
  l.conv_state_values = (*conv - 1) * (*inner + 2 * groups.value_or(0) * *state);
  l.recurrent_state_values = *state * *inner;
  if (l.conv_state_values > kMaxStateValues || l.recurrent_state_values > kMaxStateValues) {
    return Bad(a + "ssm.inner_size",
               absl::StrCat("the state of one layer is over ", kMaxStateValues, " values"));
  }
  return l;
}

// Which layers are recurrent (and which are MLP-only), per the architecture's rule above.
absl::Status MarkRecurrent(const GgufInts& md, const std::string& arch,
                           const std::vector<int64_t>& kv, ModelSpec* m, bool* any) {
  const std::string a = arch + ".";
  std::vector<int64_t> ffn;
  if (arch == "nemotron_h") {
    ATTEND_ASSIGN_OR_RETURN(ffn, md.per_layer(a + "feed_forward_length", 0, kMaxIntermediate));
  }
  int64_t interval = 4;
  if (IsDeltaNetArch(arch)) {
    ATTEND_ASSIGN_OR_RETURN(std::optional<int64_t> given,
                            md.scalar(a + "full_attention_interval", 1, m->layers));
    interval = given.value_or(4);
  }
  *any = false;
  for (int64_t i = 0; i < m->layers; ++i) {
    const size_t l = static_cast<size_t>(i);
    const int64_t heads = kv.size() == 1 ? kv[0] : kv[l];
    LayerKind kind = LayerKind::kAttention;
    if (GgufArchIsStateSpaceOnly(arch)) {
      kind = LayerKind::kStateSpace;
    } else if (IsDeltaNetArch(arch)) {
      if ((i + 1) % interval != 0) kind = LayerKind::kLinearAttention;
    } else if (GgufArchHasZeroKvLayers(arch) && heads == 0) {
      const int64_t ff = ffn.empty() ? 0 : (ffn.size() == 1 ? ffn[0] : ffn[l]);
      kind = ff > 0 ? LayerKind::kFeedForward : LayerKind::kStateSpace;
    }
    if (kind == LayerKind::kAttention) continue;
    m->layer_specs[l] = LayerSpec{};
    m->layer_specs[l].kind = kind;
    *any = *any || HoldsState(kind);
  }
  return absl::OkStatus();
}

}  // namespace

bool GgufArchHasZeroKvLayers(const std::string& arch) {
  return arch == "jamba" || arch == "plamo2" || arch == "granitehybrid" || arch == "nemotron_h";
}

bool GgufArchIsStateSpaceOnly(const std::string& arch) {
  return arch == "mamba" || arch == "mamba2";
}

absl::Status ReadGgufLayerKinds(const GgufInts& md, const std::string& arch,
                                const std::vector<int64_t>& kv, ModelSpec* m) {
  const std::string a = arch + ".";
  // llama.cpp's head sizes of the sliding-window layers (mimo2): the planner has one head size
  // per model, so sliding layers with their own are refused (as config.json's swa_head_dim is).
  for (const auto& [key, model_value] :
       {std::pair<const char*, int64_t>{"attention.key_length_swa", m->head_dim},
        {"attention.value_length_swa", m->head_dim_v}}) {
    ATTEND_ASSIGN_OR_RETURN(std::optional<int64_t> swa, md.scalar(a + key, 1, kMaxHeadDim));
    if (swa && *swa != model_value) {
      return Bad(a + key, absl::StrCat(*swa, " differs from the model's ", model_value,
                                       "; sliding layers with their own head size are not "
                                       "modelled"));
    }
  }
  bool recurrent = false;
  ATTEND_RETURN_IF_ERROR(MarkRecurrent(md, arch, kv, m, &recurrent));
  if (!recurrent) {
    for (const char* key : {"ssm.conv_kernel", "ssm.inner_size", "ssm.state_size"}) {
      if (md.has(a + key)) {
        return Bad(a + key, absl::StrCat("recurrent layers of architecture ", QuoteForError(arch),
                                         " are not modelled"));
      }
    }
  } else {
    const bool delta = IsDeltaNetArch(arch);
    ATTEND_ASSIGN_OR_RETURN(
        const LayerSpec state,
        RecurrentState(md, a, delta ? LayerKind::kLinearAttention : LayerKind::kStateSpace));
    for (LayerSpec& l : m->layer_specs) {
      if (HoldsState(l.kind)) l = state;
    }
  }
  if (md.has(a + "attention.kv_lora_rank")) {
    ATTEND_RETURN_IF_ERROR(ReadLatent(md, a, m));
  } else if (arch == "deepseek2") {
    // Without the rank the layers would read as full multi-head attention, which DeepSeek's
    // latent layers are not.
    return Missing(a + "attention.kv_lora_rank", "for architecture 'deepseek2'");
  }
  // DeepSeek sparse attention's indexer (llama.cpp's LLM_KV_ATTENTION_INDEXER_KEY_LENGTH,
  // written for glm-dsa): a key per token beside each latent row.
  ATTEND_ASSIGN_OR_RETURN(std::optional<int64_t> index_dim,
                          md.scalar(a + "attention.indexer.key_length", 1, kMaxHeadDim));
  if (index_dim) {
    if (!md.has(a + "attention.kv_lora_rank")) {
      return Bad(a + "attention.indexer.key_length",
                 "a sparse-attention indexer without latent attention (attention.kv_lora_rank) "
                 "is not modelled");
    }
    for (LayerSpec& l : m->layer_specs) {
      if (l.kind == LayerKind::kLatentAttention) l.index_head_dim = *index_dim;
    }
  } else if (arch == "glm-dsa") {
    return Missing(a + "attention.indexer.key_length", "for architecture 'glm-dsa'");
  } else if (md.has(a + "attention.indexer.head_count")) {
    // An indexer whose key size is not given could not be sized: refused, as config.json's
    // index_n_heads without index_head_dim is.
    return Missing(a + "attention.indexer.key_length",
                   absl::StrCat("beside ", a,
                                "attention.indexer.head_count (the indexer's "
                                "cached key size)"));
  }
  if (arch == "llama4") {
    ATTEND_ASSIGN_OR_RETURN(std::optional<int64_t> window,
                            md.scalar(a + "attention.sliding_window", 0, kMaxContextTokens));
    if (window.value_or(1) != 0) {
      for (int64_t i = 0; i < m->layers; ++i) {
        LayerSpec& l = m->layer_specs[static_cast<size_t>(i)];
        if (i % 4 < 3) {
          l.kind = LayerKind::kChunkedAttention;
          l.window_tokens = 8192;
        } else {
          l.window_tokens = 0;
        }
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace attend::planner
