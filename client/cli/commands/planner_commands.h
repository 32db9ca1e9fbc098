// What the Planner service's commands share: the model a command is about, the --kv_dtype
// flag, and each command's entry in the command table. planner_commands.cc defines the shared
// parts and PlannerCommands (commands.h); model_commands.cc, plan_command.cc and
// cost_command.cc define one command each.
//
// Every number the commands print comes from the server (the planner's source of truth); the
// CLI only formats it, and for --plot asks the server for the points of each curve.
//
// Thread-safety: as for every command (command.h), a call uses its Context alone.
#ifndef ATTEND_CLIENT_CLI_COMMANDS_PLANNER_COMMANDS_H_
#define ATTEND_CLIENT_CLI_COMMANDS_PLANNER_COMMANDS_H_

#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "attend/v1/planner.pb.h"
#include "client/cli/framework/args.h"
#include "client/cli/framework/command.h"
#include "client/planner_client.h"

namespace attend::cli {

// A --kv_dtype value, case-insensitive: a short name (f16, bf16, f32, fp8, int8, q8_0, q4_0,
// with aliases such as fp16 or q4) or the planner's long one (float16, bfloat16, ...); empty is
// float16. INVALID_ARGUMENT naming `flag` and the short names otherwise.
absl::StatusOr<v1::KvDType> ParseKvDType(const std::string& text,
                                         absl::string_view flag = "--kv_dtype");

// --config and --gguf: a model to import through the server instead of a preset.
struct ModelSource {
  std::optional<std::string> config;
  std::optional<std::string> gguf;

  void Declare(Flags& f);
  bool given() const { return config || gguf; }
};

// The model a planner command is about: a catalog name (the positional argument), or a model
// imported through the server from `source` (the positional argument then names it).
// Returns kExitOk and fills *ref, or prints the error and returns the exit code.
int ResolveModel(Context& c, const client::PlannerClient& planner, const ModelSource& source,
                 v1::ModelRef* ref);

// The commands' table entries, in the order `attend --help` lists them.
Command ModelsCommand();  // model_commands.cc
Command ModelCommand();   // model_commands.cc
Command PlanCommand();    // plan_command.cc
Command CostCommand();    // cost_command.cc

}  // namespace attend::cli

#endif  // ATTEND_CLIENT_CLI_COMMANDS_PLANNER_COMMANDS_H_
