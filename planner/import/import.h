// Reads a model's shape from the two formats people already have: a Hugging Face config.json
// text and the header of a GGUF file.
//
// Both inputs are untrusted. The JSON parser is strict and bounded (common/json.h, with
// HfConfigJsonLimits()); the GGUF reader checks every length and count against the bytes that
// remain (and against sane limits) before using it, never allocates from a count it has not
// bounded, and stops after the metadata key/values (tensor infos and data are not needed).
// Errors are INVALID_ARGUMENT naming the field or key and what is wrong, e.g.
//   "gguf: key 7 'llama.block_count': string length 1099511627776 at offset 300 runs past the
//    end of the 512-byte input".
// The result is checked with CanonicalModel, and its parameter count is computed from the shape
// (ComputeParameters) when the shape allows, with parameters_source saying so.
//
// Thread-safety: pure functions.
#ifndef ATTEND_PLANNER_IMPORT_IMPORT_H_
#define ATTEND_PLANNER_IMPORT_IMPORT_H_

#include <cstddef>
#include <cstdint>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/json.h"
#include "planner/model.h"
#include "planner/parameter_counts.h"

namespace attend::planner {

// Hugging Face config.json. Reads num_hidden_layers, num_attention_heads, num_key_value_heads
// (default: the head count), head_dim (default hidden_size / num_attention_heads, which must
// divide), hidden_size, vocab_size, intermediate_size, max_position_embeddings, torch_dtype (or
// dtype), tie_word_embeddings (default false, true for Gemma), num_local_experts / num_experts and
// num_experts_per_tok, model_type. A multimodal config without num_hidden_layers at the top
// level is read from its "text_config".
//
// Falcon (model_type "falcon", or "RefinedWebModel" / "RefinedWeb" in the first releases; the
// result's architecture is "falcon" for all three) also accepts n_layer and n_head, and takes its
// key/value heads from flags, as Transformers does: with new_decoder_architecture (implied by
// RefinedWeb) num_kv_heads or n_head_kv (default: the head count); otherwise one when multi_query
// (default true), else the head count. Its MLP width is ffn_hidden_size, default 4 x hidden_size;
// its embeddings default to tied.
//
// Sliding windows, in order of precedence:
//   - layer_types: one "sliding_attention" or "full_attention" per layer; sliding layers use
//     sliding_window;
//   - use_sliding_window false (Qwen2): no window, whatever sliding_window says; true: layers
//     from max_window_layers on slide, as Transformers' Qwen2 does;
//   - sliding_window_pattern p (Gemma 3): layer i is global when (i + 1) % p == 0;
//   - model_type gemma2: even layers slide, odd layers are global;
//   - otherwise a non-null sliding_window applies to every layer (Mistral v0.1).
// `name` names the result; empty: from _name_or_path (last path part), else model_type.
// JSON syntax errors and exceeded limits read "config.json: line 3, column 17: ...".
absl::StatusOr<ModelSpec> ImportHfConfig(absl::string_view json, absl::string_view name);

// The bounds ImportHfConfig parses with. config.json files are a few KiB of hand-written keys, so
// these are far tighter than json::Limits' defaults (which suit requests of tensors): 1 MiB of
// text, nesting 64 deep, strings up to 64 KiB, numbers up to 256 characters, arrays of 2^16
// elements, objects of 2^14 members, 2^16 values in all.
json::Limits HfConfigJsonLimits();

// GGUF v2/v3 header: magic "GGUF", u32 version, u64 tensor_count, u64 kv_count, then kv_count
// key/values (u64-length key, u32 type, value; all 13 value types, arrays of any of them, nested
// arrays up to kMaxGgufArrayDepth). Reads general.architecture, general.name, general.file_type
// (weights dtype for F32/F16/BF16/Q8_0/Q4_0 files), and for arch = general.architecture:
// <arch>.block_count, .embedding_length, .context_length, .feed_forward_length, .vocab_size (else
// the length of tokenizer.ggml.tokens), .expert_count, .expert_used_count,
// .attention.head_count, .attention.head_count_kv (a scalar or one value per layer),
// .attention.key_length, .attention.value_length (defaults embedding_length / head_count and
// key_length), .attention.sliding_window with .attention.sliding_window_pattern (a period, or one
// boolean per layer; default: period 2 for gemma2, 6 for gemma3, 4 for cohere2, otherwise every
// layer). With per-layer KV heads the model-wide n_head_kv is their maximum. GGUF does not record
// tied embeddings: the result says false. Only the key/values named here are kept (at most 256
// of them, and a duplicate among them is refused); every other value is read past and dropped.
// `name` names the result; empty: general.name, else the architecture.
inline constexpr int kMaxGgufArrayDepth = 4;
inline constexpr uint64_t kMaxGgufKeyValues = uint64_t{1} << 20;
inline constexpr uint64_t kMaxGgufKeyBytes = 65535;
absl::StatusOr<ModelSpec> ImportGguf(absl::string_view bytes, absl::string_view name);

// A catalog-style key for free text: lower case, runs of characters other than [a-z0-9.] become
// one '-', at most 64 bytes ("Meta Llama 3 8B" -> "meta-llama-3-8b"). Empty when nothing is left.
std::string ModelKey(absl::string_view text);

}  // namespace attend::planner

#endif  // ATTEND_PLANNER_IMPORT_IMPORT_H_
