#include "client/cli/commands/planner_commands.h"

#include <algorithm>
#include <cstdint>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "client/cli/commands/commands.h"
#include "client/cli/connect/report_error.h"
#include "client/cli/render/format.h"
#include "client/input_file.h"

namespace attend::cli {
namespace {

// Reads at most `max_bytes` of `path`, in chunks so that a small file costs little memory;
// *truncated says whether the file holds more.
absl::StatusOr<std::string> ReadFilePrefix(const std::string& path, int64_t max_bytes,
                                           bool* truncated) {
  absl::StatusOr<std::ifstream> opened = OpenForReading(path);
  if (!opened.ok()) return opened.status();
  return client::ReadAtMost(*opened, max_bytes, truncated, absl::StrCat("'", path, "'"));
}

}  // namespace

absl::StatusOr<v1::KvDType> ParseKvDType(const std::string& text, absl::string_view flag) {
  const std::string t = absl::AsciiStrToLower(text);
  if (t.empty() || t == "f16" || t == "fp16" || t == "float16" || t == "half") {
    return v1::KV_FLOAT16;
  }
  if (t == "bf16" || t == "bfloat16") return v1::KV_BFLOAT16;
  if (t == "f32" || t == "fp32" || t == "float32") return v1::KV_FLOAT32;
  if (t == "fp8" || t == "f8" || t == "float8") return v1::KV_FP8;
  if (t == "int8" || t == "i8") return v1::KV_INT8;
  if (t == "q8_0" || t == "q8") return v1::KV_Q8_0;
  if (t == "q4_0" || t == "q4") return v1::KV_Q4_0;
  return absl::InvalidArgumentError(absl::StrCat(
      flag, ": '", text, "' is not a KV type; use f16, bf16, f32, fp8, int8, q8_0 or q4_0"));
}

int ResolveModel(Context& c, const client::PlannerClient& planner, const ModelSource& source,
                 v1::ModelRef* ref) {
  const std::vector<std::string>& positional = c.positional;
  if (positional.size() > 1) {
    return UsageError(c, absl::InvalidArgumentError(absl::StrCat(
                             "one model at a time; got '", absl::StrJoin(positional, "' '"), "'")));
  }
  const bool config = source.config.has_value(), gguf = source.gguf.has_value();
  if (config && gguf) {
    return UsageError(c, absl::InvalidArgumentError("give --config or --gguf, not both"));
  }
  const std::string name = positional.empty() ? "" : positional[0];
  if (!config && !gguf) {
    if (name.empty()) {
      return UsageError(
          c, absl::InvalidArgumentError("give a model: a preset name (see 'attend models'), or "
                                        "--config config.json, or --gguf model.gguf"));
    }
    ref->set_name(name);
    return kExitOk;
  }
  // GGUF metadata (vocabulary included) is at most a few tens of MiB; the tensors after it are
  // not needed, so only the start of the file travels.
  const int64_t max_bytes = std::max<int64_t>(
      1, std::min<int64_t>(int64_t{64} << 20, c.connection.max_message_bytes - (int64_t{4} << 10)));
  const std::string path = config ? *source.config : *source.gguf;
  bool truncated = false;
  absl::StatusOr<std::string> data = ReadFilePrefix(path, max_bytes, &truncated);
  if (!data.ok()) return LocalError(c, data.status());
  absl::StatusOr<v1::ModelSpec> spec =
      config ? planner.ImportHfConfig(*data, name) : planner.ImportGguf(*data, name);
  if (!spec.ok()) {
    if (truncated) {
      *c.err << "note: sent the first " << Count(max_bytes) << " bytes of '" << path
             << "' (--max_message_bytes bounds it)\n";
    }
    return ReportError(c, spec.status());
  }
  *ref->mutable_spec() = *std::move(spec);
  return kExitOk;
}

void ModelSource::Declare(Flags& f) {
  f.Add("config", &config, "a Hugging Face config.json to import (instead of a preset)");
  f.Add("gguf", &gguf, "a GGUF file to import (its header is read; instead of a preset)");
}

std::vector<Command> PlannerCommands() {
  std::vector<Command> commands = {ModelsCommand(), ModelCommand(), PlanCommand(), CostCommand()};
  for (Command& c : commands) c.max_positional = 1;  // the model's name
  return commands;
}

}  // namespace attend::cli
