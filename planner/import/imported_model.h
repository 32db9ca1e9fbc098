// What the config.json and GGUF importers share: text taken from untrusted input made safe to
// print, the catalog-style key an imported model is named by, and the last step of every import
// (canonical shape, parameter count from the shape).
//
// Thread-safety: pure functions.
#ifndef ATTEND_PLANNER_IMPORT_IMPORTED_MODEL_H_
#define ATTEND_PLANNER_IMPORT_IMPORTED_MODEL_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "planner/model.h"

namespace attend::planner {

// Printable ASCII survives; every other byte becomes '?', so that names taken from untrusted
// input are safe to log and print. Cut at kMaxNameBytes.
std::string SanitizeText(absl::string_view text);

// A catalog-style key for free text: lower case, runs of characters other than [a-z0-9.] become
// one '-', at most 64 bytes ("Meta Llama 3 8B" -> "meta-llama-3-8b"). Empty when nothing is left.
std::string ModelKey(absl::string_view text);

// Names an imported model. A non-empty `name` (the caller's) becomes both name and display_name.
// Otherwise the name is ModelKey(label), or `fallback_key` when that is empty, and the display
// name is SanitizeText(label), or the name when `label` is empty.
void NameImportedModel(absl::string_view name, absl::string_view label,
                       absl::string_view fallback_key, ModelSpec* model);

// The last step of both importers: uniform layers (no window, the model-wide key/value heads)
// need no layer_specs, the shape is checked with CanonicalModel (whose error is returned as is),
// and the parameter count is computed with ComputeParameters when the shape allows it;
// parameters_source says which rule counted them, or why they are unknown (then 0).
absl::StatusOr<ModelSpec> FinishImportedModel(ModelSpec model);

}  // namespace attend::planner

#endif  // ATTEND_PLANNER_IMPORT_IMPORTED_MODEL_H_
