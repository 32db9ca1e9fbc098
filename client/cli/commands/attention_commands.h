// The parts of the Attention service's commands (attend, mha, softmax, scaling) that their files
// share: the flags `attend` and `mha` share and what they do with them (attention_commands.cc),
// and each command's table entry: attend_command.cc, mha_command.cc, and
// attention_lesson_commands.cc (softmax, scaling, and the lessons' worked examples that
// `attend --example` sends). AttentionCommands itself is declared in commands.h.
//
// Thread-safety: as for every command (command.h), a call uses its Context alone.
#ifndef ATTEND_CLIENT_CLI_COMMANDS_ATTENTION_COMMANDS_H_
#define ATTEND_CLIENT_CLI_COMMANDS_ATTENTION_COMMANDS_H_

#include <cstdint>
#include <fstream>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "attend/v1/attention.pb.h"
#include "client/attention_client.h"
#include "client/cli/commands/input_files.h"
#include "client/cli/framework/args.h"
#include "client/cli/framework/command.h"
#include "client/cli/render/attention_heatmap.h"
#include "client/cli/render/format.h"
#include "client/input_file.h"
#include "client/tensor.h"

namespace attend::cli {

// The commands' table entries, in the order `attend --help` lists them.
Command SoftmaxCommand();    // attention_lesson_commands.cc
Command AttendCommand();     // attend_command.cc
Command MultiHeadCommand();  // mha_command.cc
Command ScalingCommand();    // attention_lesson_commands.cc

// The flags `attend attend` and `attend mha` share: the mask, scale, precision and wire, the
// random inputs' seed, and what to do with the answer.
struct CommonAttentionOptions {
  std::optional<bool> causal;
  std::optional<int64_t> window;
  std::optional<double> scale;
  std::string precision;
  std::string wire = "f32";
  Given<int64_t> seed{1};
  std::optional<std::string> input;
  bool weights = false;
  std::optional<std::string> out;
  std::optional<std::string> weights_out;
  HeatmapFlags heatmap;
  std::optional<std::string> labels;

  void Declare(Flags& f);
};

// Mask, scale, precision and wire from the command line. The mask and scale change only when
// their flags are given, so that they can override a JSON request's or an example's.
absl::Status ApplyCommon(Context& c, const CommonAttentionOptions& o, client::MaskSettings* mask,
                         std::optional<float>* scale, v1::Precision* precision, client::Wire* wire);

// OK when a size flag of random inputs is within [1, 2^log2]; else "--<flag> must be between 1
// and 2^<log2> (<2^log2>) for random inputs, got <value>".
absl::Status CheckRandomSize(absl::string_view flag, int64_t value, int log2);

// Writes `t` to the file `path` names, if it names one.
absl::Status SaveIfAsked(const std::optional<std::string>& path, const client::FloatTensor& t);

// The request in the JSON file --input, read by `parse` (AttendInputFromJson or
// MultiHeadInputFromJson); errors start with "--input <path>: ".
//
// The file may hold at most --max_message_bytes, read as it arrives (client::ReadAtMost), so that
// /dev/zero or an endless FIFO stops there. A larger request could not be sent anyway: JSON
// spends at least 2 bytes a value ("0,"), as many as the narrowest wire (bf16), and usually
// several times the 4 of f32 ("-0.1234567, ").
template <typename Input>
absl::StatusOr<Input> ReadJsonRequest(const Context& c, const std::string& path,
                                      absl::StatusOr<Input> (*parse)(absl::string_view)) {
  const std::string name = absl::StrCat("--input ", path);
  absl::StatusOr<std::ifstream> opened = OpenForReading(path);
  if (!opened.ok()) return opened.status();
  const int64_t max_bytes = c.connection.max_message_bytes;
  bool more = false;
  absl::StatusOr<std::string> text =
      client::ReadAtMost(*opened, max_bytes, &more, absl::StrCat("'", path, "'"));
  if (!text.ok()) return text.status();
  if (more) {
    return absl::InvalidArgumentError(absl::StrCat(
        name, ": more than ", max_bytes, " bytes; a JSON request is limited to ",
        BinaryBytes(max_bytes),
        ", the largest request this client sends (--max_message_bytes), since JSON spends at "
        "least 2 bytes a value"));
  }
  absl::StatusOr<Input> parsed = parse(*text);
  if (!parsed.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(name, ": ", parsed.status().message()));
  }
  return parsed;
}

// "--input x.json goes alone": the flags that choose other inputs cannot come with it.
// `others` are the flags with whether each was given.
absl::Status OnlyOneSource(const std::string& source,
                           const std::vector<std::pair<std::string, bool>>& others);

// Writes `weights` [heads, n_q, n_kv] to --heatmap. Key labels come from --labels (or
// `key_labels`); the queries take the labels of their positions unless `query_labels` names
// them (--labels renames the tokens, so it drops `query_labels`).
int WriteHeatmap(Context& c, const CommonAttentionOptions& o, const client::FloatTensor& weights,
                 AttentionPicture picture);

// A worked example of the lessons: the inputs, the token names, and what it shows.
struct Example {
  client::AttendInput input;
  std::vector<std::string> key_labels;
  std::vector<std::string> query_labels;
  std::string description;
};

// The worked example `name` (it, causal) of --example; INVALID_ARGUMENT for other names.
absl::StatusOr<Example> FindExample(const std::string& name);

}  // namespace attend::cli

#endif  // ATTEND_CLIENT_CLI_COMMANDS_ATTENTION_COMMANDS_H_
