// Flags of `attend mha` and `attend attend` for the lessons: --java_seed draws a layer on the
// server as the lessons' Java programs do (attend.v1.LessonInit), and --scores / --projections
// print the score tables and the projected q, k and v; and `attend mha`'s printout.
//
// Thread-safety: pure functions.
#ifndef ATTEND_CLIENT_CLI_COMMANDS_LESSON_FLAGS_H_
#define ATTEND_CLIENT_CLI_COMMANDS_LESSON_FLAGS_H_

#include <cstdint>
#include <optional>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "attend/v1/attention.pb.h"
#include "client/attention_client.h"
#include "client/cli/framework/args.h"
#include "client/tensor.h"

namespace attend::cli {

// `attend mha`'s sizes: --n, --d_model, --n_head, and those whose defaults follow others.
struct LayerSizes {
  int64_t n = 0;
  int64_t d_model = 0;
  int64_t n_head = 0;
  std::optional<int64_t> n_head_kv;  // unset: n_head
  std::optional<int64_t> head_dim;   // unset: d_model / n_head
  std::optional<int64_t> d_out;      // unset: d_model; 0 = no Wo
};

// --java_seed and --std: the flags of the lessons' layer that are not also the random layer's.
struct LessonFlags {
  std::optional<int64_t> java_seed;
  std::optional<double> std;

  void Declare(Flags& f);
};

// --java_seed, --std and `sizes` (n_head aside) as a LessonInit. INVALID_ARGUMENT for values
// out of range. REQUIRES: lesson.java_seed is set.
absl::StatusOr<v1::LessonInit> LessonInitFromFlags(const LessonFlags& lesson,
                                                   const LayerSizes& sizes);

// The layer LessonInitFromFlags draws, with `sizes`' n_head and n_head_kv.
absl::StatusOr<client::MultiHeadInput> LessonMultiHeadInput(const LessonFlags& lesson,
                                                            const LayerSizes& sizes);

// Each head's raw and masked score table ([heads, n_q, n_kv] each), three decimals, masked
// entries "-inf", under "scores, head h (scale * q.k):" and "masked scores, head h:".
void PrintScoreTables(std::ostream& out, const client::FloatTensor& scores,
                      const client::FloatTensor& masked);

// `attend mha`'s printout: the output, q/k/v and the score tables when returned, the weights
// when `weights`, the parameter counts and the compute stats.
void PrintMultiHead(std::ostream& out, const client::MultiHeadOutput& r, bool weights);
// ", \"<name>\": <tensor>" for each tensor present.
std::string TensorMembersJson(
    const std::vector<std::pair<const char*, const std::optional<client::FloatTensor>*>>& tensors);
// `attend mha --json`: every tensor returned, the parameter counts and the stats.
std::string MultiHeadJson(const client::MultiHeadOutput& r);

}  // namespace attend::cli

#endif  // ATTEND_CLIENT_CLI_COMMANDS_LESSON_FLAGS_H_
