// The attention weights of `attend attend`, `attend mha` and `attend example` as a heatmap
// (svg_heatmap.h): which cells the mask hid, which key/value head each query head shares, the
// queries' positions, the tokens' names and the colour scale, and the file it is written to.
//
// Queries are the last n_q of the n_kv positions (client::KeyVisible). When n_q < n_kv and the
// queries are not named on their own, rows are numbered by position, so that a row does not
// read as if query 0 saw later keys.
//
// Thread-safety: as for every command (command.h), a call uses its Context alone.
#ifndef ATTEND_CLIENT_CLI_RENDER_ATTENTION_HEATMAP_H_
#define ATTEND_CLIENT_CLI_RENDER_ATTENTION_HEATMAP_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "client/attention_client.h"
#include "client/cli/framework/args.h"
#include "client/cli/framework/command.h"
#include "client/cli/render/svg_heatmap.h"
#include "client/tensor.h"

namespace attend::cli {

// What a picture of attention weights shows besides the weights.
struct AttentionPicture {
  std::string title;
  client::MaskSettings mask;
  // Key/value heads; query head h shares head h / (n_head / n_head_kv). 0 (or the number of
  // query heads): none is shared.
  int64_t n_head_kv = 0;
  // Names of the n_kv keys and of the n_q queries; empty: numbers. Queries without names take
  // the names of their positions' keys.
  std::vector<std::string> key_labels;
  std::vector<std::string> query_labels;
  bool fixed_scale = false;  // colours over [0, 1] instead of this picture's range
};

// --heatmap (the file to draw the weights to) and --heatmap_scale: "auto" (unset, each picture
// its own range) or "fixed" (0 to 1; CLI11 refuses other values).
struct HeatmapFlags {
  std::optional<std::string> path;
  std::optional<std::string> scale;

  // Declares --heatmap_scale; each command declares --heatmap, with its own help.
  void DeclareScale(Flags& f);
  // INVALID_ARGUMENT when --heatmap_scale comes without --heatmap.
  absl::Status Check() const;
};

// The heatmap of `weights` [n_head, n_q, n_kv] with the masked cells, the panel titles ("head
// 5 (KV head 1)" when heads share), the rows' positions and a subtitle of the sizes and mask.
// REQUIRES: weights has rank 3; label lists are empty or of the sizes above.
Heatmap AttentionHeatmap(const client::FloatTensor& weights, AttentionPicture picture);

// Draws `weights` to the file of --heatmap and, unless --json, prints "wrote <path>: ..." with
// what the picture leaves out. Returns kExitOk, or prints the problem and returns its code.
// REQUIRES: heatmap.path is set.
int WriteAttentionHeatmap(Context& c, const HeatmapFlags& heatmap,
                          const client::FloatTensor& weights, AttentionPicture picture);

}  // namespace attend::cli

#endif  // ATTEND_CLIENT_CLI_RENDER_ATTENTION_HEATMAP_H_
