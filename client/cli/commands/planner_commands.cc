#include "client/cli/commands/planner_commands.h"

#include <algorithm>
#include <cstdint>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "client/cli/commands/commands.h"
#include "client/cli/commands/input_files.h"
#include "client/cli/connect/report_error.h"
#include "client/cli/render/format.h"
#include "client/input_file.h"
#include "common/utf8.h"

namespace attend::cli {
namespace {

// What the server's Planner takes (docs/planner.md: imports are bounded): a config.json of at
// most 1 MiB and the start of a GGUF file, up to 64 MiB; 4 KiB of a request are left for the
// rest of it (the name, the framing).
constexpr int64_t kMaxConfigBytes = int64_t{1} << 20;
constexpr int64_t kMaxGgufBytes = int64_t{64} << 20;
constexpr int64_t kRequestOverhead = int64_t{4} << 10;
constexpr absl::string_view kGgufMagic = "GGUF";

// The file of --config or --gguf, checked before anything is sent: a config.json whole (at most
// the server's limit, and UTF-8, which a proto string must be: protobuf would log about other
// bytes and the server refuse them), a GGUF file's magic and then its start (GGUF metadata,
// vocabulary included, is at most a few tens of MiB; the tensors after it are not needed).
// `flag` names it in errors ("--config <path>: ..."); *truncated says whether a GGUF file held
// more than was read.
absl::StatusOr<std::string> ReadModelFile(const Context& c, absl::string_view flag,
                                          const std::string& path, bool* truncated) {
  const bool gguf = flag == "gguf";
  const std::string name = absl::StrCat("--", flag, " ", path);
  const int64_t server_limit = gguf ? kMaxGgufBytes : kMaxConfigBytes;
  const int64_t max_bytes = std::max<int64_t>(
      1, std::min(server_limit, c.connection.max_message_bytes - kRequestOverhead));
  absl::StatusOr<std::ifstream> opened = OpenForReading(path);
  if (!opened.ok()) return opened.status();
  std::string data;
  if (gguf) {
    bool more = false;
    absl::StatusOr<std::string> magic =
        client::ReadAtMost(*opened, static_cast<int64_t>(kGgufMagic.size()), &more, name);
    if (!magic.ok()) return magic.status();
    if (*magic != kGgufMagic) {
      return absl::InvalidArgumentError(absl::StrCat(name, ": not a GGUF file: it starts with \"",
                                                     absl::CHexEscape(*magic), "\", not \"",
                                                     kGgufMagic, "\""));
    }
    data = *std::move(magic);
  }
  absl::StatusOr<std::string> rest =
      client::ReadAtMost(*opened, max_bytes - static_cast<int64_t>(data.size()), truncated, name);
  if (!rest.ok()) return rest.status();
  data += *rest;
  if (gguf) return data;
  if (*truncated) {
    return absl::InvalidArgumentError(absl::StrCat(
        name, ": more than ", max_bytes, " bytes; ",
        max_bytes == server_limit
            ? "the server takes a config.json of at most 1 MiB"
            : absl::StrCat("a request of --max_message_bytes ", c.connection.max_message_bytes,
                           " carries no more, less 4 KiB for the rest of it")));
  }
  for (size_t i = 0; i < data.size();) {
    const size_t length = utf8::SequenceAt(data, i);
    if (length == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(name, ": not UTF-8 text (byte ", i, " is 0x",
                       absl::Hex(static_cast<unsigned char>(data[i]), absl::kZeroPad2),
                       "), so not a config.json"));
    }
    i += length;
  }
  return data;
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
  const std::string path = config ? *source.config : *source.gguf;
  bool truncated = false;
  absl::StatusOr<std::string> data = ReadModelFile(c, config ? "config" : "gguf", path, &truncated);
  if (!data.ok()) return LocalError(c, data.status());
  absl::StatusOr<v1::ModelSpec> spec =
      config ? planner.ImportHfConfig(*data, name) : planner.ImportGguf(*data, name);
  if (!spec.ok()) {
    if (truncated) {
      *c.err << "note: sent the first " << Count(static_cast<int64_t>(data->size()))
             << " bytes of '" << path << "' (--max_message_bytes bounds it)\n";
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
