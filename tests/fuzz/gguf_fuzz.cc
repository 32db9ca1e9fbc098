// planner/import/gguf: ImportGguf on the input as a GGUF header. Errors must be
// INVALID_ARGUMENT starting "gguf: "; a model it returns must pass ValidateModel (the planner sizes
// from it).
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include "absl/strings/string_view.h"
#include "planner/import/gguf.h"
#include "planner/model.h"
#include "tests/fuzz/parse_check.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  namespace planner = attend::planner;
  const absl::string_view bytes(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<planner::ModelSpec> model = planner::ImportGguf(bytes, "");
  attend::fuzz::CheckParseStatus("ImportGguf", model.status(), "gguf: ");
  if (!model.ok()) return 0;
  const absl::Status valid = planner::ValidateModel(*model);
  if (!valid.ok()) {
    std::fprintf(stderr, "fuzz: ImportGguf returned an invalid model: %s\n",
                 valid.ToString().c_str());
    std::abort();
  }
  return 0;
}
