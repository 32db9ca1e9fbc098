// Presets of published model configurations, so that planning questions can name a model
// ("llama-3-70b") instead of spelling out its shape.
//
// Each preset records its source (the Hugging Face config.json it was read from, or the lesson)
// and whether its parameter count is published or computed from the shape (parameters_source).
//
// Thread-safety: the catalog is built once, on first use, and never changes; every function may
// be called concurrently.
#ifndef ATTEND_PLANNER_CATALOG_H_
#define ATTEND_PLANNER_CATALOG_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "planner/model.h"

namespace attend::planner {

// Every preset, in a fixed order (small to large within a family). Each one is canonical
// (CanonicalModel returns it unchanged).
const std::vector<ModelSpec>& Catalog();

// Catalog keys in Catalog() order: "tiny", "llama-2-7b", "llama-3-8b", ...
std::vector<std::string> CatalogNames();

// The preset called `name` (case-insensitive). NOT_FOUND lists the known names. `field` names
// where `name` came from (e.g. a request field); when it is not empty, the message starts with
// "<field>: ".
absl::StatusOr<ModelSpec> FindModel(absl::string_view name, absl::string_view field = "");

}  // namespace attend::planner

#endif  // ATTEND_PLANNER_CATALOG_H_
