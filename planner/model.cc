#include "planner/model.h"

#include <algorithm>
#include <limits>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/utf8.h"
#include "core/base/status_macros.h"
#include "core/base/tensor.h"

namespace attend::planner {
namespace {

// The checks below name the field by FieldPath(prefix, field), built only for an error.
absl::Status CheckRange(absl::string_view prefix, absl::string_view field, int64_t value,
                        int64_t lo, int64_t hi) {
  if (value < lo || value > hi) {
    return absl::InvalidArgumentError(
        absl::StrCat(FieldPath(prefix, field), ": ", value, "; must be in [", lo, ", ", hi, "]"));
  }
  return absl::OkStatus();
}

absl::Status CheckLength(absl::string_view prefix, absl::string_view field,
                         const std::string& value, size_t max_bytes) {
  if (value.size() > max_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(FieldPath(prefix, field), ": ", value.size(), " bytes; at most ", max_bytes));
  }
  return absl::OkStatus();
}

// Names are printed to terminals and echoed in answers: no control characters, C0 (below 0x20),
// DEL or C1 (U+0080 to U+009F, which terminals also obey: U+009B is an escape sequence's
// start).
absl::Status CheckPrintable(absl::string_view prefix, absl::string_view field,
                            absl::string_view value) {
  for (size_t i = 0; i < value.size();) {
    uint32_t c = 0;
    const size_t n = utf8::SequenceAt(value, i, &c);
    if (n == 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          FieldPath(prefix, field), ": ", QuoteForError(value), " is not UTF-8 at byte ", i));
    }
    if (c < 0x20 || (c >= 0x7F && c <= 0x9F)) {
      return absl::InvalidArgumentError(absl::StrCat(
          FieldPath(prefix, field), ": ", QuoteForError(value), " has a control character (",
          absl::StrFormat("U+%04X", c), ") at byte ", i, "; names are printable text"));
    }
    i += n;
  }
  return absl::OkStatus();
}

absl::Status CheckDivides(absl::string_view prefix, absl::string_view field, int64_t n_head_kv,
                          int64_t n_head) {
  if (n_head % n_head_kv != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(FieldPath(prefix, field), ": ", n_head_kv, " does not divide n_head ", n_head,
                     "; each key/value head must serve a whole group of query heads"));
  }
  return absl::OkStatus();
}

// One entry of layer_specs, checked by its kind; fills a KV layer's n_head_kv default.
absl::Status CheckLayer(const ModelSpec& m, const std::string& layer, LayerSpec* l) {
  const auto must_be_zero = [&](absl::string_view field, int64_t value,
                                absl::string_view which) -> absl::Status {
    if (value == 0) return absl::OkStatus();
    return absl::InvalidArgumentError(absl::StrCat(FieldPath(layer, field), ": ", value, " on a ",
                                                   LayerKindName(l->kind), " layer; only ", which,
                                                   " layers have one"));
  };
  if (!HoldsKv(l->kind)) {
    ATTEND_RETURN_IF_ERROR(must_be_zero("n_head_kv", l->n_head_kv, "attention"));
    ATTEND_RETURN_IF_ERROR(must_be_zero("window_tokens", l->window_tokens, "attention"));
  } else {
    if (l->n_head_kv == 0) l->n_head_kv = m.n_head_kv;
    ATTEND_RETURN_IF_ERROR(CheckRange(layer, "n_head_kv", l->n_head_kv, 1, m.n_head));
    ATTEND_RETURN_IF_ERROR(CheckDivides(layer, "n_head_kv", l->n_head_kv, m.n_head));
    const int64_t min_window = l->kind == LayerKind::kChunkedAttention ? 1 : 0;
    ATTEND_RETURN_IF_ERROR(
        CheckRange(layer, "window_tokens", l->window_tokens, min_window, kMaxContextTokens));
  }
  if (l->kind == LayerKind::kLatentAttention) {
    ATTEND_RETURN_IF_ERROR(CheckRange(layer, "kv_lora_rank", l->kv_lora_rank, 1, kMaxHeadDim));
    ATTEND_RETURN_IF_ERROR(
        CheckRange(layer, "qk_rope_head_dim", l->qk_rope_head_dim, 0, m.head_dim));
    ATTEND_RETURN_IF_ERROR(CheckRange(layer, "index_head_dim", l->index_head_dim, 0, kMaxHeadDim));
  } else {
    ATTEND_RETURN_IF_ERROR(must_be_zero("kv_lora_rank", l->kv_lora_rank, "latent_attention"));
    ATTEND_RETURN_IF_ERROR(
        must_be_zero("qk_rope_head_dim", l->qk_rope_head_dim, "latent_attention"));
    ATTEND_RETURN_IF_ERROR(must_be_zero("index_head_dim", l->index_head_dim, "latent_attention"));
  }
  if (!HoldsState(l->kind)) {
    constexpr char kRecurrent[] =
        "linear_attention, state_space, lightning_attention and kimi_delta_attention";
    ATTEND_RETURN_IF_ERROR(must_be_zero("conv_state_values", l->conv_state_values, kRecurrent));
    return must_be_zero("recurrent_state_values", l->recurrent_state_values, kRecurrent);
  }
  ATTEND_RETURN_IF_ERROR(
      CheckRange(layer, "conv_state_values", l->conv_state_values, 0, kMaxStateValues));
  ATTEND_RETURN_IF_ERROR(
      CheckRange(layer, "recurrent_state_values", l->recurrent_state_values, 0, kMaxStateValues));
  if (l->conv_state_values + l->recurrent_state_values == 0) {
    return absl::InvalidArgumentError(absl::StrCat(layer, ": a ", LayerKindName(l->kind),
                                                   " layer with no state; give its state values"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::string_view LayerKindName(LayerKind kind) {
  switch (kind) {
    case LayerKind::kAttention:
      return "attention";
    case LayerKind::kChunkedAttention:
      return "chunked_attention";
    case LayerKind::kLatentAttention:
      return "latent_attention";
    case LayerKind::kLinearAttention:
      return "linear_attention";
    case LayerKind::kStateSpace:
      return "state_space";
    case LayerKind::kFeedForward:
      return "feed_forward";
    case LayerKind::kLightningAttention:
      return "lightning_attention";
    case LayerKind::kKimiDeltaAttention:
      return "kimi_delta_attention";
  }
  return "unknown";
}

bool HoldsKv(LayerKind kind) {
  return kind == LayerKind::kAttention || kind == LayerKind::kChunkedAttention ||
         kind == LayerKind::kLatentAttention;
}

bool HoldsState(LayerKind kind) {
  return kind == LayerKind::kLinearAttention || kind == LayerKind::kStateSpace ||
         kind == LayerKind::kLightningAttention || kind == LayerKind::kKimiDeltaAttention;
}

std::optional<int64_t> IndexerRowBytes(int64_t index_head_dim, std::optional<KvDType> dtype) {
  if (index_head_dim < 0) return std::nullopt;
  if (dtype) return StorageBytes(*dtype, index_head_dim);
  // One float32 scale per block of 128 fp8 values (DeepSeek's block_size).
  const int64_t scales = index_head_dim / 128 + (index_head_dim % 128 != 0 ? 1 : 0);
  return CheckedAdd(index_head_dim, scales * 4);
}

absl::string_view DTypeName(KvDType dtype) {
  switch (dtype) {
    case KvDType::kFloat32:
      return "float32";
    case KvDType::kFloat16:
      return "float16";
    case KvDType::kBFloat16:
      return "bfloat16";
    case KvDType::kFp8:
      return "fp8";
    case KvDType::kInt8:
      return "int8";
    case KvDType::kQ8_0:
      return "q8_0";
    case KvDType::kQ4_0:
      return "q4_0";
  }
  return "unknown";
}

absl::StatusOr<KvDType> ParseDType(absl::string_view name, absl::string_view field) {
  const std::string n = absl::AsciiStrToLower(name);
  if (n == "float32" || n == "f32" || n == "fp32") return KvDType::kFloat32;
  if (n == "float16" || n == "f16" || n == "fp16" || n == "half") return KvDType::kFloat16;
  if (n == "bfloat16" || n == "bf16") return KvDType::kBFloat16;
  if (n == "fp8" || n == "float8" || n == "float8_e4m3fn" || n == "float8_e5m2" || n == "f8_e4m3" ||
      n == "f8_e5m2") {
    return KvDType::kFp8;
  }
  if (n == "int8" || n == "i8") return KvDType::kInt8;
  if (n == "q8_0" || n == "q8") return KvDType::kQ8_0;
  if (n == "q4_0" || n == "q4") return KvDType::kQ4_0;
  return absl::InvalidArgumentError(
      absl::StrCat(field, ": ", QuoteForError(name),
                   " is not a known type; use float32, float16, bfloat16, fp8, int8, q8_0 or "
                   "q4_0"));
}

double BytesPerValue(KvDType dtype) {
  switch (dtype) {
    case KvDType::kFloat32:
      return 4.0;
    case KvDType::kFloat16:
    case KvDType::kBFloat16:
      return 2.0;
    case KvDType::kFp8:
    case KvDType::kInt8:
      return 1.0;
    case KvDType::kQ8_0:
      return 34.0 / 32.0;
    case KvDType::kQ4_0:
      return 18.0 / 32.0;
  }
  return 4.0;
}

std::optional<int64_t> StorageBytes(KvDType dtype, int64_t values) {
  if (values < 0) return std::nullopt;
  switch (dtype) {
    case KvDType::kFloat32:
      return CheckedMul(values, 4);
    case KvDType::kFloat16:
    case KvDType::kBFloat16:
      return CheckedMul(values, 2);
    case KvDType::kFp8:
    case KvDType::kInt8:
      return values;
    case KvDType::kQ8_0:
      // Written as a quotient first so that values near INT64_MAX do not overflow the rounding.
      return CheckedMul(values / 32 + (values % 32 != 0 ? 1 : 0), 34);
    case KvDType::kQ4_0:
      return CheckedMul(values / 32 + (values % 32 != 0 ? 1 : 0), 18);
  }
  return std::nullopt;
}

absl::StatusOr<ModelSpec> CanonicalModel(const ModelSpec& model, absl::string_view field_prefix) {
  const absl::string_view p = field_prefix;
  ModelSpec m = model;
  ATTEND_RETURN_IF_ERROR(CheckLength(p, "name", m.name, kMaxNameBytes));
  ATTEND_RETURN_IF_ERROR(CheckLength(p, "display_name", m.display_name, kMaxNameBytes));
  ATTEND_RETURN_IF_ERROR(CheckPrintable(p, "name", m.name));
  ATTEND_RETURN_IF_ERROR(CheckPrintable(p, "display_name", m.display_name));
  ATTEND_RETURN_IF_ERROR(CheckLength(p, "source", m.source, kMaxSourceBytes));
  ATTEND_RETURN_IF_ERROR(CheckLength(p, "architecture", m.architecture, kMaxNameBytes));
  ATTEND_RETURN_IF_ERROR(CheckLength(p, "parameters_source", m.parameters_source, kMaxSourceBytes));
  ATTEND_RETURN_IF_ERROR(CheckRange(p, "layers", m.layers, 1, kMaxLayers));
  // A model without KV layers (Mamba) has no attention heads; when it gives some anyway they are
  // checked as for any model.
  const int64_t min_heads = HasKvLayers(m) || m.n_head > 0 ? 1 : 0;
  ATTEND_RETURN_IF_ERROR(CheckRange(p, "n_head", m.n_head, min_heads, kMaxHeads));
  if (m.n_head_kv == 0) m.n_head_kv = m.n_head;
  ATTEND_RETURN_IF_ERROR(CheckRange(p, "n_head_kv", m.n_head_kv, min_heads, m.n_head));
  if (m.n_head > 0) ATTEND_RETURN_IF_ERROR(CheckDivides(p, "n_head_kv", m.n_head_kv, m.n_head));
  ATTEND_RETURN_IF_ERROR(CheckRange(p, "head_dim", m.head_dim, min_heads, kMaxHeadDim));
  if (m.head_dim_v == 0) m.head_dim_v = m.head_dim;
  ATTEND_RETURN_IF_ERROR(CheckRange(p, "head_dim_v", m.head_dim_v, min_heads, kMaxHeadDim));
  ATTEND_RETURN_IF_ERROR(CheckRange(p, "d_model", m.d_model, 0, kMaxDModel));
  ATTEND_RETURN_IF_ERROR(CheckRange(p, "vocab_size", m.vocab_size, 0, kMaxVocab));
  ATTEND_RETURN_IF_ERROR(
      CheckRange(p, "intermediate_size", m.intermediate_size, 0, kMaxIntermediate));
  ATTEND_RETURN_IF_ERROR(CheckRange(p, "experts", m.experts, 0, kMaxExperts));
  if (m.experts <= 1) {
    ATTEND_RETURN_IF_ERROR(CheckRange(p, "experts_active", m.experts_active, 0, 1));
    m.experts_active = m.experts;
  } else {
    ATTEND_RETURN_IF_ERROR(CheckRange(p, "experts_active", m.experts_active, 1, m.experts));
  }
  ATTEND_RETURN_IF_ERROR(
      CheckRange(p, "parameters", m.parameters, 0, std::numeric_limits<int64_t>::max()));
  ATTEND_RETURN_IF_ERROR(CheckRange(p, "active_parameters", m.active_parameters, 0, m.parameters));
  if (m.active_parameters == 0) {
    if (m.experts > 1 && m.parameters > 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(FieldPath(p, "active_parameters"),
                       ": 0 for a mixture-of-experts model; give the parameters a token uses"));
    }
    m.active_parameters = m.parameters;
  }
  ATTEND_RETURN_IF_ERROR(
      CheckRange(p, "max_context_tokens", m.max_context_tokens, 0, kMaxContextTokens));
  if (!m.weights_dtype.empty()) {
    ATTEND_ASSIGN_OR_RETURN(const KvDType w,
                            ParseDType(m.weights_dtype, FieldPath(p, "weights_dtype")));
    m.weights_dtype = std::string(DTypeName(w));
  }
  if (!m.layer_specs.empty()) {
    if (static_cast<int64_t>(m.layer_specs.size()) != m.layers) {
      return absl::InvalidArgumentError(
          absl::StrCat(FieldPath(p, "layer_specs"), ": ", m.layer_specs.size(), " entries for ",
                       m.layers, " layers; give none or one per layer"));
    }
    for (size_t i = 0; i < m.layer_specs.size(); ++i) {
      ATTEND_RETURN_IF_ERROR(
          CheckLayer(m, FieldPath(p, absl::StrCat("layer_specs[", i, "]")), &m.layer_specs[i]));
    }
    // Budgets and fleets divide by the bytes of a sequence, which such a model does not have.
    if (std::all_of(m.layer_specs.begin(), m.layer_specs.end(),
                    [](const LayerSpec& l) { return l.kind == LayerKind::kFeedForward; })) {
      return absl::InvalidArgumentError(absl::StrCat(
          FieldPath(p, "layer_specs"),
          ": every layer is feed_forward: the model caches nothing per token or per sequence, "
          "so there is no cache to plan"));
    }
  }
  return m;
}

absl::Status ValidateModel(const ModelSpec& model, absl::string_view field_prefix) {
  return CanonicalModel(model, field_prefix).status();
}

int64_t LayerKvHeads(const ModelSpec& model, int64_t layer) {
  if (model.layer_specs.empty()) return model.n_head_kv;
  return model.layer_specs[static_cast<size_t>(layer)].n_head_kv;
}

int64_t LayerWindow(const ModelSpec& model, int64_t layer) {
  if (model.layer_specs.empty()) return 0;
  return model.layer_specs[static_cast<size_t>(layer)].window_tokens;
}

bool HasSlidingWindows(const ModelSpec& model) {
  return std::any_of(model.layer_specs.begin(), model.layer_specs.end(),
                     [](const LayerSpec& l) { return l.window_tokens > 0; });
}

LayerKind LayerKindOf(const ModelSpec& model, int64_t layer) {
  if (model.layer_specs.empty()) return LayerKind::kAttention;
  return model.layer_specs[static_cast<size_t>(layer)].kind;
}

bool HasKvLayers(const ModelSpec& model) {
  return model.layer_specs.empty() ||
         std::any_of(model.layer_specs.begin(), model.layer_specs.end(),
                     [](const LayerSpec& l) { return HoldsKv(l.kind); });
}

bool HasNonAttentionLayers(const ModelSpec& model) {
  return std::any_of(model.layer_specs.begin(), model.layer_specs.end(), [](const LayerSpec& l) {
    return l.kind != LayerKind::kAttention && l.kind != LayerKind::kChunkedAttention;
  });
}

std::string FormatBytes(int64_t bytes) {
  static constexpr const char* kUnits[] = {"KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  if (bytes < 1024 && bytes > -1024) return absl::StrCat(bytes, " bytes");
  double value = static_cast<double>(bytes);
  int unit = -1;
  while ((value >= 1024.0 || value <= -1024.0) && unit < 5) {
    value /= 1024.0;
    ++unit;
  }
  return absl::StrFormat("%.2f %s", value, kUnits[unit]);
}

std::string FormatCount(int64_t value) {
  // Built on the unsigned magnitude so that INT64_MIN formats too.
  const bool negative = value < 0;
  uint64_t magnitude = negative ? 0 - static_cast<uint64_t>(value) : static_cast<uint64_t>(value);
  std::string digits = absl::StrCat(magnitude);
  std::string out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out.push_back(',');
    out.push_back(digits[i]);
  }
  return negative ? absl::StrCat("-", out) : out;
}

std::string FieldPath(absl::string_view prefix, absl::string_view field) {
  return prefix.empty() ? std::string(field) : absl::StrCat(prefix, ".", field);
}

std::string QuoteForError(absl::string_view text, size_t max_bytes) {
  const bool cut = text.size() > max_bytes;
  if (cut) text = text.substr(0, max_bytes);
  return absl::StrCat("'", absl::CHexEscape(text), cut ? "...'" : "'");
}

}  // namespace attend::planner
