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
#include "common/json.h"

namespace attend::planner {

// Whether ImportHfConfig reads `key`, and whether it knowingly ignores it (it changes neither
// the cache nor the shape the planner sizes: token ids, norms, RoPE scaling, dropout, MoE
// routing details, kernel switches, ...).
bool IsReadHfField(absl::string_view key);
bool IsIgnoredHfField(absl::string_view key);

// INVALID_ARGUMENT for the first member of `config` (an object) that is neither read nor
// ignored and looks like it shapes the cache: "'<prefix><key>': not understood; it may change the
// attention layout, and architecture '<model_type>' is not modelled". Members that are objects
// named *_config (other towers' sub-configs) are skipped. Other unknown members
// (new token ids, training switches) pass.
absl::Status CheckHfFields(const json::Value& config, absl::string_view prefix,
                           absl::string_view model_type);

}  // namespace attend::planner

#endif  // ATTEND_PLANNER_IMPORT_HF_FIELDS_H_
