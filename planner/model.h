// The planner's description of a model: the attention shape that sizes the KV cache and the
// counts that size the weights, mapped 1:1 onto attend.v1.ModelSpec, plus the storage types of
// cached values and weights.
//
// Every planner entry point takes a ModelSpec from an untrusted source (an RPC, a config.json, a
// GGUF header), so CanonicalModel() bounds every field before anything is sized from it: with the
// limits below, a layer's bytes per token fit easily in int64 and per-layer vectors stay small.
//
// Thread-safety: value types and pure functions.
#ifndef ATTEND_PLANNER_MODEL_H_
#define ATTEND_PLANNER_MODEL_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace attend::planner {

// Bounds on model fields. Published models are far inside them (Llama 3.1 405B: 126 layers, 128
// heads, d_model 16384); they exist so that hostile input cannot overflow or over-allocate.
inline constexpr int64_t kMaxLayers = 4096;
inline constexpr int64_t kMaxHeads = 65536;
inline constexpr int64_t kMaxHeadDim = 65536;
inline constexpr int64_t kMaxDModel = int64_t{1} << 20;
inline constexpr int64_t kMaxVocab = int64_t{1} << 24;
inline constexpr int64_t kMaxIntermediate = int64_t{1} << 24;
inline constexpr int64_t kMaxExperts = 4096;
// Contexts, windows and search ranges: 2^40 tokens (about 10^12).
inline constexpr int64_t kMaxContextTokens = int64_t{1} << 40;
inline constexpr size_t kMaxNameBytes = 256;
inline constexpr size_t kMaxSourceBytes = 1024;

// Storage type of cached keys/values, also used for weights. q8_0 and q4_0 are llama.cpp's block
// formats: 32 values share one f16 scale, 34 and 18 bytes per block.
enum class KvDType { kFloat32, kFloat16, kBFloat16, kFp8, kInt8, kQ8_0, kQ4_0 };

// "float32", "float16", "bfloat16", "fp8", "int8", "q8_0", "q4_0".
absl::string_view DTypeName(KvDType dtype);
// Accepts the names above and common aliases ("f32", "fp32", "f16", "fp16", "half", "bf16",
// "float8", "float8_e4m3fn", "float8_e5m2", "q8", "q4"), case-insensitively. INVALID_ARGUMENT
// naming `field` and the accepted names otherwise.
absl::StatusOr<KvDType> ParseDType(absl::string_view name, absl::string_view field);
// Average bytes per value: 4, 2, 2, 1, 1, 34/32 = 1.0625, 18/32 = 0.5625.
double BytesPerValue(KvDType dtype);
// Bytes to store `values` values (>= 0). Block formats round up to whole blocks of 32: a head row
// of 80 values takes ceil(80 / 32) = 3 blocks. nullopt on int64 overflow.
std::optional<int64_t> StorageBytes(KvDType dtype, int64_t values);

// Values of one layer's state for one sequence, per part (convolution or recurrent): Mamba-2 7B
// holds 2^20; the bound keeps 4096 layers x 2 parts x 4 bytes far inside int64.
inline constexpr int64_t kMaxStateValues = int64_t{1} << 36;

// What a layer keeps for each sequence. Attention kinds cache rows per token (KV layers); the
// recurrent kinds hold a fixed state whatever the context; feed-forward layers hold nothing.
enum class LayerKind {
  kAttention,         // keys and values of every token, or of the last window_tokens
  kChunkedAttention,  // keys and values of the current chunk of window_tokens tokens (Llama 4)
  kLatentAttention,   // one row of kv_lora_rank + qk_rope_head_dim values per token (MLA)
  kLinearAttention,   // a convolution and a recurrent state per sequence (gated delta-net)
  kStateSpace,        // the same for Mamba / Mamba-2 mixers
  kFeedForward,       // an MLP or MoE block without a mixer (Nemotron-H's '-' and 'E')
  // Added after the kinds above, so that their numbers (and the proto's) stay as they were.
  kLightningAttention,  // a recurrent state per sequence, no convolution (MiniMax-M1)
  kKimiDeltaAttention,  // a convolution and a recurrent state per sequence (Kimi Linear's KDA)
};

// "attention", "chunked_attention", "latent_attention", "linear_attention", "state_space",
// "feed_forward", "lightning_attention", "kimi_delta_attention".
absl::string_view LayerKindName(LayerKind kind);
// Whether layers of `kind` cache rows per token (and take part in paging and attention FLOPs).
bool HoldsKv(LayerKind kind);
// Whether layers of `kind` hold a fixed state per sequence.
bool HoldsState(LayerKind kind);

// One layer where it differs from the model-wide values. The two fields before `kind` keep the
// meaning they had before kinds existed, so {n_head_kv, window_tokens} still describes an
// attention layer.
struct LayerSpec {
  int64_t n_head_kv = 0;      // KV kinds: 0 = the model's n_head_kv; recurrent kinds: 0
  int64_t window_tokens = 0;  // attention: 0 = full, else a sliding window; chunked: chunk size
  LayerKind kind = LayerKind::kAttention;
  // Latent attention only: the compressed key/value rank and the decoupled RoPE key size, cached
  // per token instead of n_head_kv expanded heads of head_dim / head_dim_v.
  int64_t kv_lora_rank = 0;
  int64_t qk_rope_head_dim = 0;
  // Linear attention and state-space only: values of the convolution state and of the
  // recurrent (SSM or delta-rule) state of one sequence, computed by the importer from the
  // model's definition (planner/import/hf_layers.h says which formula for which family).
  int64_t conv_state_values = 0;
  int64_t recurrent_state_values = 0;
  // Latent attention only: the key size of a DeepSeek sparse-attention ("lightning") indexer
  // beside the latent (DeepSeek-V3.2, GLM-5), cached per token; 0 without one. Its bytes per
  // token follow IndexerRowBytes.
  int64_t index_head_dim = 0;
};

// Bytes one token adds to a layer's indexer cache of `index_head_dim` keys. nullopt `dtype`:
// as DeepSeek-V3.2's reference (inference/model.py, Indexer: k_cache in float8_e4m3fn plus
// k_scale_cache of one float32 per 128 values) and vLLM store it, index_head_dim fp8 bytes plus
// 4 bytes per started 128 values (128 -> 132); otherwise StorageBytes(*dtype, index_head_dim).
// nullopt on overflow.
std::optional<int64_t> IndexerRowBytes(int64_t index_head_dim, std::optional<KvDType> dtype);

// Mirrors attend.v1.ModelSpec. Zero means "not given" for the optional counts.
struct ModelSpec {
  std::string name;          // catalog key, e.g. "llama-3-8b"
  std::string display_name;  // e.g. "Llama 3 8B"
  std::string source;        // where the numbers come from
  std::string architecture;  // e.g. "llama", "gemma2", "qwen2" (HF model_type / GGUF arch)
  int64_t layers = 0;
  int64_t n_head = 0;
  int64_t n_head_kv = 0;   // 0: n_head (multi-head attention)
  int64_t head_dim = 0;    // key and query head size
  int64_t head_dim_v = 0;  // value head size; 0: head_dim
  int64_t d_model = 0;
  int64_t vocab_size = 0;
  int64_t intermediate_size = 0;  // per expert for MoE models
  int64_t experts = 0;            // 0 or 1: dense
  int64_t experts_active = 0;     // experts used per token
  int64_t parameters = 0;         // total
  int64_t active_parameters = 0;  // used per token; 0: parameters (dense)
  // Whether `parameters` was published or computed from the shape, and by what rule.
  std::string parameters_source;
  // Empty, or exactly `layers` entries.
  std::vector<LayerSpec> layer_specs;
  int64_t max_context_tokens = 0;
  std::string weights_dtype;  // one of DTypeName()'s names, or empty when unknown
  bool tied_embeddings = false;
};

// Returns `model` with defaults filled in (n_head_kv, head_dim_v, experts_active for dense
// models, active_parameters for dense models, per-layer n_head_kv 0 -> model's on KV layers,
// weights_dtype canonical name) after checking every field against the bounds above: layers,
// heads and head sizes >= 1 (heads and head sizes may be 0 when no layer holds KV, as in
// Mamba); n_head_kv divides n_head (per layer too); layer_specs empty or one per layer;
// windows >= 0, chunks >= 1; latent layers with kv_lora_rank in [1, kMaxHeadDim],
// qk_rope_head_dim in [0, head_dim] and index_head_dim in [0, kMaxHeadDim]; recurrent layers with
// no heads or window, state parts in [0, kMaxStateValues] and some state; fields of other kinds 0;
// counts >= 0; active parameters
// <= parameters; name/source lengths.
// INVALID_ARGUMENT names the field by its path under `field_prefix` (FieldPath), e.g.
// "n_head_kv: 3 does not divide n_head 32", or with field_prefix "model.spec",
// "model.spec.n_head_kv: 3 does not divide n_head 32".
absl::StatusOr<ModelSpec> CanonicalModel(const ModelSpec& model,
                                         absl::string_view field_prefix = "");
absl::Status ValidateModel(const ModelSpec& model, absl::string_view field_prefix = "");

// Key/value heads and window of layer `layer`. REQUIRES: `model` is canonical and
// 0 <= layer < model.layers.
int64_t LayerKvHeads(const ModelSpec& model, int64_t layer);
int64_t LayerWindow(const ModelSpec& model, int64_t layer);
// True when some layer has a sliding window or a chunk.
bool HasSlidingWindows(const ModelSpec& model);
// The kind of layer `layer` (kAttention when layer_specs is empty). REQUIRES: as above.
LayerKind LayerKindOf(const ModelSpec& model, int64_t layer);
// Whether some layer caches rows per token (true when layer_specs is empty), and whether some
// layer is not plain attention (latent, recurrent or feed-forward): the shape-based parameter
// count and projection table describe plain attention layers only.
bool HasKvLayers(const ModelSpec& model);
bool HasNonAttentionLayers(const ModelSpec& model);

// "1.00 GiB", "512.00 KiB", "100 bytes": binary units, two decimals.
std::string FormatBytes(int64_t bytes);
// "4,194,304".
std::string FormatCount(int64_t value);
// The path of `field` inside the struct or message at `prefix`, for error messages:
// "prefix.field", or `field` alone when `prefix` is empty ("model.spec" and "layer_specs[2]" give
// "model.spec.layer_specs[2]").
std::string FieldPath(absl::string_view prefix, absl::string_view field);
// Quotes untrusted text for an error message: escapes non-printable bytes and cuts it at
// `max_bytes` (with "...").
std::string QuoteForError(absl::string_view text, size_t max_bytes = 64);

}  // namespace attend::planner

#endif  // ATTEND_PLANNER_MODEL_H_
