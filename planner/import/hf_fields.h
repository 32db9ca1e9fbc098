// The fields of a Hugging Face config.json that ImportHfConfig reads, the ones it knowingly
// ignores, and the check that keeps it from guessing: a field in neither list whose name says it
// may change what the attention layers cache (it mentions windows, chunks, heads, layers,
// attention, state, convolutions, latents, patterns, ...) is refused, because importing the
// model as plain attention without it could be wrong by any factor.
//
// Thread-safety: pure functions over constant tables.
#ifndef ATTEND_PLANNER_IMPORT_HF_FIELDS_H_
#define ATTEND_PLANNER_IMPORT_HF_FIELDS_H_

#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "common/json.h"

namespace attend::planner {

// When a known key is ignored: always, or only while its value is off (null, false, 0, "" or
// an empty array or object), because set it would change the layout (add_cross_attention).
enum class IgnoreWhen { kAlways, kOff };

// A key ImportHfConfig knowingly ignores, and why it does not change the cache (the reason is
// documented in docs/planner.md and named in the error when a kOff key is set).
struct IgnoredHfField {
  absl::string_view key;
  IgnoreWhen when;
  absl::string_view reason;
};

// Whether ImportHfConfig reads `key`, and whether it knowingly ignores it (it changes neither
// the cache nor the shape the planner sizes: token ids, norms, RoPE scaling, dropout, MoE
// routing details, kernel switches, multi-token-prediction heads, ...).
bool IsReadHfField(absl::string_view key);
bool IsIgnoredHfField(absl::string_view key);
// Whether `key` is one the importer reads that shapes the cache: every read key but the names,
// types, context and the widths that only weigh the weights (vocab_size, intermediate_size,
// the expert counts). A multimodal config may not give one both at its top level and in
// text_config with different values (ImportHfConfig).
bool ShapesCacheHfField(absl::string_view key);
// Every ignored key, in the order of the table (grouped by reason).
absl::Span<const IgnoredHfField> IgnoredHfFields();

// INVALID_ARGUMENT for the first member of `config` (an object) that is neither read nor
// ignored and looks like it shapes the cache: "'<prefix><key>': not understood; it may change the
// attention layout, and architecture '<model_type>' is not modelled"; and for an IgnoreWhen::kOff
// key that is set ("'text_config.add_cross_attention': bool that is not off; <reason> ...").
// The indexer's keys (index_topk, index_n_heads, ...) count as read or ignored only beside
// index_head_dim. Members that are objects named *_config (other towers' sub-configs) are skipped
// unless their name mentions attention (attn, attention). Other unknown members (new token ids,
// training switches) pass.
absl::Status CheckHfFields(const json::Value& config, absl::string_view prefix,
                           absl::string_view model_type);

}  // namespace attend::planner

#endif  // ATTEND_PLANNER_IMPORT_HF_FIELDS_H_
