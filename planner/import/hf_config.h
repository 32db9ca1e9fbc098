// Reads a model's shape from the text of a Hugging Face config.json.
//
// The input is untrusted: the JSON parser is strict and bounded (common/json.h, with
// HfConfigJsonLimits()). Errors are INVALID_ARGUMENT naming the key and what is wrong, e.g.
// "num_key_value_heads: 5 does not divide num_attention_heads 32" (keys read from a
// "text_config" are named "text_config.<key>"); JSON syntax errors and exceeded limits read
// "config.json: line 3, column 17: ...". The result is checked with CanonicalModel, and its
// parameter count is computed from the shape (ComputeParameters) when the shape allows, with
// parameters_source saying so.
//
// Thread-safety: pure functions.
#ifndef ATTEND_PLANNER_IMPORT_HF_CONFIG_H_
#define ATTEND_PLANNER_IMPORT_HF_CONFIG_H_

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/json.h"
#include "planner/model.h"

namespace attend::planner {

// Hugging Face config.json. Reads num_hidden_layers, num_attention_heads, num_key_value_heads
// (default: the head count), head_dim (default hidden_size / num_attention_heads, which must
// divide), hidden_size, vocab_size, intermediate_size, max_position_embeddings, torch_dtype (or
// dtype), tie_word_embeddings (default false, true for Gemma), num_local_experts / num_experts and
// num_experts_per_tok, model_type. A multimodal config without num_hidden_layers at the top
// level is read from its "text_config"; a cache-shaping key at its top level that text_config
// does not repeat with the same value is refused (it would be ignored), and a config with its own
// num_hidden_layers whose text_config disagrees on such a key is refused naming both.
//
// Falcon (model_type "falcon", or "RefinedWebModel" / "RefinedWeb" in the first releases; the
// result's architecture is "falcon" for all three) also accepts n_layer and n_head, and takes its
// key/value heads from flags, as Transformers does: with new_decoder_architecture (implied by
// RefinedWeb) num_kv_heads or n_head_kv (default: the head count); otherwise one when multi_query
// (default true), else the head count. Its MLP width is ffn_hidden_size, default 4 x hidden_size;
// its embeddings default to tied.
//
// Layers that are not plain attention (latent attention, Jamba, Nemotron-H, Qwen3-Next / 3.5,
// Mamba, Mamba-2, Llama 4's chunks) and their state sizes follow planner/import/hf_layers.h; a
// model without attention (Mamba) needs no head counts. Fail closed: a field that is neither read
// nor knowingly ignored and that may shape the cache is refused (planner/import/hf_fields.h).
//
// Sliding windows, in order of precedence (when no rule of hf_layers.h applies):
//   - layer_types: one "sliding_attention" or "full_attention" per layer; sliding layers use
//     sliding_window;
//   - use_sliding_window false (Qwen2): no window, whatever sliding_window says; true: layers
//     from max_window_layers on slide, as Transformers' Qwen2 does;
//   - sliding_window_pattern p (Gemma 3): layer i is global when (i + 1) % p == 0;
//   - model_type gemma2: even layers slide, odd layers are global; gemma3 / gemma3_text: every
//     sixth layer is global (Gemma3TextConfig's default pattern);
//   - otherwise a non-null sliding_window applies to every layer (Mistral v0.1).
// `name` names the result; empty: from _name_or_path (last path part), else model_type.
absl::StatusOr<ModelSpec> ImportHfConfig(absl::string_view json, absl::string_view name);

// The bounds ImportHfConfig parses with. config.json files are a few KiB of hand-written keys, so
// these are far tighter than json::Limits' defaults (made for arrays of millions of numbers):
// 1 MiB of text, nesting 64 deep, strings up to 64 KiB, numbers up to 256 characters, arrays of
// 2^16 elements, objects of 2^14 members, 2^16 values in all; Python's NaN and Infinity are
// accepted (transformers writes them).
json::Limits HfConfigJsonLimits();

}  // namespace attend::planner

#endif  // ATTEND_PLANNER_IMPORT_HF_CONFIG_H_
