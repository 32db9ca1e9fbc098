// Reads a model's shape from the header of a GGUF file (llama.cpp's format; gguf_format.h).
//
// The input is untrusted. The reader checks every length and count against the bytes that remain
// (and against the limits below) before using it, never allocates from a count it has not
// bounded, and stops after the metadata key/values (tensor infos and data are not needed).
// Every error is INVALID_ARGUMENT, starts with "gguf: " and names the key and what is wrong, e.g.
//   "gguf: key 7 'llama.block_count': string length 1099511627776 at offset 300 runs past the
//    end of the 512-byte input".
// The result is checked with CanonicalModel, and its parameter count is computed from the shape
// (ComputeParameters) when the shape allows, with parameters_source saying so.
//
// Thread-safety: pure functions.
#ifndef ATTEND_PLANNER_IMPORT_GGUF_H_
#define ATTEND_PLANNER_IMPORT_GGUF_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "planner/model.h"

namespace attend::planner {

// Limits of the reader: arrays nested deeper, more key/values or longer keys are refused.
inline constexpr int kMaxGgufArrayDepth = 4;
inline constexpr uint64_t kMaxGgufKeyValues = uint64_t{1} << 20;
inline constexpr uint64_t kMaxGgufKeyBytes = 65535;

// GGUF v2/v3 header: magic "GGUF", u32 version, u64 tensor_count, u64 kv_count, then kv_count
// key/values (u64-length key, u32 type, value; all 13 value types, arrays of any of them, nested
// arrays up to kMaxGgufArrayDepth). Reads general.architecture, general.name, general.file_type
// (weights dtype for F32/F16/BF16/Q8_0/Q4_0 files), and for arch = general.architecture:
// <arch>.block_count, .embedding_length, .context_length, .feed_forward_length, .vocab_size (else
// the length of tokenizer.ggml.tokens), .expert_count, .expert_used_count,
// .attention.head_count, .attention.head_count_kv (a scalar or one value per layer),
// .attention.key_length, .attention.value_length (defaults embedding_length / head_count and
// key_length), .attention.sliding_window with .attention.sliding_window_pattern (a period, or one
// boolean per layer; default: period 2 for gemma2 and gpt-oss, 6 for gemma3, 4 for cohere2,
// otherwise every layer). With per-layer KV heads the model-wide n_head_kv is their maximum. GGUF
// does not record tied embeddings: the result says false. Only the key/values named here are kept
// (at most 256 of them, and a duplicate among them is refused); every other value is read past and
// dropped. Latent attention, hybrids and state-space models as gguf_layers.h describes (their keys
// are kept too). `name` names the result; empty: general.name, else the architecture.
absl::StatusOr<ModelSpec> ImportGguf(absl::string_view bytes, absl::string_view name);

}  // namespace attend::planner

#endif  // ATTEND_PLANNER_IMPORT_GGUF_H_
