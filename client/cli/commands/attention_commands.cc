// The Attention service's commands (attend, mha, softmax, scaling). `attend` and
// `mha` take random inputs, .npy files, a JSON request (--input) or, for `attend`, one of the
// lessons' worked examples (--example), and draw the attention weights as an SVG heatmap.
//
// This file holds what `attend` and `mha` share and the service's table entry; see
// attention_commands.h for the others.
#include "client/cli/commands/attention_commands.h"

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "client/cli/commands/commands.h"
#include "client/cli/framework/command.h"
#include "client/cli/render/attention_heatmap.h"
#include "client/cli/tensors/tensor_flags.h"
#include "client/npy.h"

namespace attend::cli {
namespace {

using client::FloatTensor;

// Comma-separated names; exactly `n` of them.
absl::StatusOr<std::vector<std::string>> ParseLabels(const std::string& text,
                                                     const std::string& flag, int64_t n,
                                                     const std::string& what) {
  std::vector<std::string> labels = absl::StrSplit(text, ',');
  if (static_cast<int64_t>(labels.size()) != n) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", flag, " names ", labels.size(), " tokens but there are ", n, " ", what));
  }
  return labels;
}

}  // namespace

void CommonAttentionOptions::Declare(Flags& f) {
  f.Add("causal", &causal, "hide keys after each query's position");
  f.Add("window", &window, "sliding window in tokens (0 = unlimited)").Shown("0");
  f.Add("scale", &scale, "multiplies q.k before softmax").Shown("1/sqrt(head_dim)");
  DeclarePrecision(f, &precision);
  DeclareWire(f, &wire);
  f.Add("seed", &seed, "seed of the random inputs");
  f.Add("input", &input, "read the request from this JSON file (see --help)");
  f.Add("weights", &weights, "print the attention weights per head");
  f.Add("out", &out, "write the output to this .npy file");
  f.Add("weights_out", &weights_out, "write the weights to this .npy file");
  f.Add("heatmap", &heatmap.path,
        "write the weights as an SVG heatmap, one panel per head, to this file");
  f.Add("labels", &labels, "comma-separated names of the tokens (keys), for the heatmap");
  heatmap.DeclareScale(f);
}

// Mask, scale, precision and wire from the command line. The mask and scale change only when
// their flags are given, so that they can override a JSON request's or an example's.
absl::Status ApplyCommon(Context& c, const CommonAttentionOptions& o, client::MaskSettings* mask,
                         std::optional<float>* scale, v1::Precision* precision,
                         client::Wire* wire) {
  if (o.causal) mask->causal = *o.causal;
  if (o.window) mask->window_tokens = *o.window;
  if (o.scale) *scale = static_cast<float>(*o.scale);
  absl::StatusOr<v1::Precision> p = ParsePrecision(o.precision);
  if (!p.ok()) return p.status();
  *precision = *p;
  c.wire = o.wire;
  absl::StatusOr<client::Wire> w = client::ParseWire(o.wire);
  if (!w.ok()) return w.status();
  *wire = *w;
  // Checked before the call, which --heatmap_scale only draws.
  return o.heatmap.Check();
}

absl::Status CheckRandomSize(absl::string_view flag, int64_t value, int log2) {
  const int64_t max = int64_t{1} << log2;
  if (value >= 1 && value <= max) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("--", flag, " must be between 1 and 2^", log2,
                                                 " (", max, ") for random inputs, got ", value));
}

// Writes `t` to the file `path` names, if it names one.
absl::Status SaveIfAsked(const std::optional<std::string>& path, const FloatTensor& t) {
  if (!path) return absl::OkStatus();
  return client::WriteNpyFile(*path, t);
}

// "--input x.json goes alone": the flags that choose other inputs cannot come with it.
// `others` are the flags with whether each was given.
absl::Status OnlyOneSource(const std::string& source,
                           const std::vector<std::pair<std::string, bool>>& others) {
  for (const auto& [flag, given] : others) {
    if (given) {
      return absl::InvalidArgumentError(
          absl::StrCat(source, " and --", flag, " both choose the inputs; give one of them"));
    }
  }
  return absl::OkStatus();
}

// Writes `weights` [heads, n_q, n_kv] to --heatmap. Key labels come from --labels (or
// `key_labels`); the queries take the labels of their positions unless `query_labels` names
// them (--labels renames the tokens, so it drops `query_labels`).
int WriteHeatmap(Context& c, const CommonAttentionOptions& o, const FloatTensor& weights,
                 AttentionPicture picture) {
  if (o.labels) {
    absl::StatusOr<std::vector<std::string>> labels =
        ParseLabels(*o.labels, "labels", weights.shape[2], "keys");
    if (!labels.ok()) return UsageError(c, labels.status());
    picture.key_labels = *std::move(labels);
    picture.query_labels.clear();
  }
  return WriteAttentionHeatmap(c, o.heatmap, weights, std::move(picture));
}

std::vector<Command> AttentionCommands() {
  return {SoftmaxCommand(), AttendCommand(), MultiHeadCommand(), ScalingCommand()};
}

}  // namespace attend::cli
