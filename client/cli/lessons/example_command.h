// `attend example`: the worked examples of the attention lessons (000 "Attention" and 003
// "Self-Attention Step by Step"), each run through the server's RPCs and printed in the layout
// of the lesson's own printout (the same rounding and columns), so that a learner can compare
// the two line by line. `--json` prints the computed numbers instead; `--heatmap` draws the
// attention weights of the examples that have them.
//
// Every number printed comes from a server response; the client formats it, and derives from it
// only what the lesson's program derives (a cosine of returned vectors, a difference of two
// returned outputs, bytes in MiB).
//
// Thread-safety: the examples keep no state; each run uses its own clients.
#ifndef ATTEND_CLIENT_CLI_LESSONS_EXAMPLE_COMMAND_H_
#define ATTEND_CLIENT_CLI_LESSONS_EXAMPLE_COMMAND_H_

#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "client/attention_client.h"
#include "client/cli/framework/command.h"
#include "client/planner_client.h"
#include "client/tensor.h"

namespace attend::cli {

// The `example` command.
std::vector<Command> ExampleCommands();

namespace examples {

// The clients an example calls.
struct Services {
  const client::AttentionClient& attention;
  const client::PlannerClient& planner;
};

// Attention weights an example can draw with --heatmap.
struct Weights {
  client::FloatTensor weights;  // [heads, n_q, n_kv]
  client::MaskSettings mask;
  std::vector<std::string> key_labels;    // empty: indices
  std::vector<std::string> query_labels;  // empty: the last n_q key labels
};

// The members of a JSON object, in order, each value already JSON.
class JsonObject {
 public:
  JsonObject& Add(const std::string& key, std::string json_value) {
    members_.emplace_back(key, std::move(json_value));
    return *this;
  }
  // Adds the members of `other` after these.
  JsonObject& Append(const JsonObject& other) {
    members_.insert(members_.end(), other.members_.begin(), other.members_.end());
    return *this;
  }
  std::string Render() const;

 private:
  std::vector<std::pair<std::string, std::string>> members_;
};

// What one run of an example produced.
struct Result {
  std::string text;  // the lesson's printout, lines ending in "\n"
  JsonObject json;   // the computed numbers
  std::optional<Weights> weights;
};

struct Example {
  std::string name;
  std::string lesson;  // e.g. "003 Example 4"
  std::string summary;
  std::function<absl::StatusOr<Result>(const Services&)> run;
};

std::vector<Example> Lesson000Examples();
// 003 Examples 1 to 8: from averages to attention in matrix form.
std::vector<Example> Lesson003Examples();
// 003 Examples 9 to 13: heads, shared key/value heads, cost and a hand-built head.
std::vector<Example> Lesson003LayerExamples();

// --- formatting as the lessons' programs print ---

// Java's Float.toString / Double.toString for ordinary magnitudes: the shortest decimal that
// reads back as the same value, with at least one digit after the point ("1.0", "0.6666667").
std::string JavaFloat(float value);
std::string JavaDouble(double value);
// Arrays.toString of float[] / double[]: "[1.0, 0.5]".
std::string JavaFloats(absl::Span<const float> values);
std::string JavaDoubles(absl::Span<const double> values);
// Python's repr of [round(v, decimals) for v in values]: "[0.63, 0.23, 0.14]".
std::string PyRounded(absl::Span<const double> values, int decimals);
// Row `row` of a [rows, ...] tensor, as its trailing elements.
std::vector<float> Row(const client::FloatTensor& t, int64_t row);
// OK when the server returned `tensor`; otherwise INTERNAL naming `what`, since every example
// asks for what it prints.
absl::Status Returned(const std::optional<client::FloatTensor>& tensor, const char* what);
// A double as JSON with every digit (17 significant), for the planner's counts; null if not
// finite.
std::string JsonExact(double value);
// The tensor as JSON ({"shape": ..., "values": ...}), "null" when absent.
std::string JsonOptionalTensor(const std::optional<client::FloatTensor>& t);

}  // namespace examples
}  // namespace attend::cli

#endif  // ATTEND_CLIENT_CLI_LESSONS_EXAMPLE_COMMAND_H_
