// `attend seq decode`: decode steps over sequences of the server's KV cache, one random token
// per layer and sequence a step, sent as a DecodeBatch call per layer or as messages of one
// DecodeStream; it prints each step's latency and the first values of the last layer's output.
#include <algorithm>
#include <chrono>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "client/cli/commands/seq_commands.h"
#include "client/cli/connect/report_error.h"
#include "client/cli/framework/command.h"
#include "client/cli/render/format.h"
#include "client/cli/tensors/tensor_flags.h"
#include "client/kv_cache_client.h"

namespace attend::cli {
namespace {

// The command line of a decode run.
struct DecodeOptions {
  std::vector<std::string> ids;  // distinct, in the order given
  int64_t steps = 1;
  int64_t seed = 1;
  std::optional<int32_t> only_layer;  // --layer
  v1::Precision precision = v1::PRECISION_UNSPECIFIED;
  client::Wire wire = client::Wire::kFloat32;
  bool stream = false;  // one DecodeStream instead of DecodeBatch calls
};

// The flags of `attend seq decode`, with DecodeOptions' defaults.
struct DecodeFlags {
  std::optional<std::string> id;
  std::optional<std::string> ids;
  std::optional<int64_t> layer;  // unset: every layer
  int64_t steps = DecodeOptions().steps;
  bool stream = DecodeOptions().stream;
  Given<int64_t> seed{DecodeOptions().seed};
  std::string wire = "f32";
  std::string precision;

  void Declare(Flags& f) {
    f.Add("id", &id, "the sequence (or --ids)");
    f.Add("ids", &ids, "comma-separated sequences, decoded as one batch");
    f.Add("layer", &layer, "decode only this layer").Range(0, 1 << 16).Shown("every layer");
    f.Add("steps", &steps, "decode steps").Range(1, 1 << 20);
    f.Add("stream", &stream, "use one DecodeStream instead of DecodeBatch calls");
    DeclareRandomTokensSeed(f, &seed);
    DeclareWire(f, &wire);
    DeclarePrecision(f, &precision);
  }
};

// The decode options the flags give; INVALID_ARGUMENT for the first that is missing or wrong.
absl::StatusOr<DecodeOptions> ParseDecodeFlags(const DecodeFlags& f) {
  if (f.id.has_value() == f.ids.has_value()) {
    return absl::InvalidArgumentError("give --id <id> or --ids a,b,c (one of them)");
  }
  DecodeOptions o;
  if (f.id) {
    o.ids.push_back(*f.id);
  } else {
    for (absl::string_view id : absl::StrSplit(*f.ids, ',', absl::SkipEmpty())) {
      o.ids.emplace_back(id);
    }
  }
  if (o.ids.empty() || o.ids[0].empty()) {
    return absl::InvalidArgumentError("--id/--ids: no sequence id given");
  }
  if (std::set<std::string>(o.ids.begin(), o.ids.end()).size() != o.ids.size()) {
    return absl::InvalidArgumentError(
        "--ids: a sequence appears twice (a decode step takes each once)");
  }
  o.steps = f.steps;
  o.seed = f.seed.value;
  if (f.layer) o.only_layer = static_cast<int32_t>(*f.layer);
  absl::StatusOr<v1::Precision> precision = ParsePrecision(f.precision);
  if (!precision.ok()) return precision.status();
  o.precision = *precision;
  absl::StatusOr<client::Wire> wire = client::ParseWire(f.wire);
  if (!wire.ok()) return wire.status();
  o.wire = *wire;
  o.stream = f.stream;
  return o;
}

// One sequence's part of a decode run.
struct DecodeTarget {
  std::string id;
  v1::SequenceConfig config;
};

// What every step sends to: the sequences, with their shapes, and the layers in order.
struct DecodePlan {
  std::vector<DecodeTarget> targets;
  std::vector<int32_t> layers;  // --layer, else 0 to the most layers of a sequence - 1
};

// Asks the server for each sequence's shape.
absl::StatusOr<DecodePlan> PlanDecode(const client::KvCacheClient& kv, const DecodeOptions& o) {
  DecodePlan plan;
  int32_t max_layers = 0;
  for (const std::string& id : o.ids) {
    absl::StatusOr<v1::SequenceInfo> info = kv.GetSequence(id);
    if (!info.ok()) return info.status();
    plan.targets.push_back({id, info->config()});
    max_layers = std::max(max_layers, info->config().layers());
  }
  if (o.only_layer) {
    plan.layers.push_back(*o.only_layer);
  } else {
    for (int32_t l = 0; l < max_layers; ++l) plan.layers.push_back(l);
  }
  return plan;
}

// Every message of a step: one per layer, covering the sequences that have that layer (a layer
// no sequence has goes to the server anyway, which says why it is refused), with a random token
// for each.
std::vector<client::DecodeBatchInput> StepMessages(const DecodePlan& plan, const DecodeOptions& o,
                                                   std::mt19937_64& rng) {
  std::vector<client::DecodeBatchInput> messages;
  for (int32_t layer : plan.layers) {
    client::DecodeBatchInput message;
    message.layer = layer;
    message.precision = o.precision;
    message.wire = o.wire;
    for (const DecodeTarget& t : plan.targets) {
      if (layer >= t.config.layers() && plan.layers.size() > 1) continue;
      client::DecodeStep step;
      step.sequence_id = t.id;
      step.q = RandomTensor(rng, {1, t.config.n_head(), t.config.head_dim()});
      step.k = RandomTensor(rng, {1, t.config.n_head_kv(), t.config.head_dim()});
      step.v = RandomTensor(rng, {1, t.config.n_head_kv(), t.config.head_dim_v()});
      message.steps.push_back(std::move(step));
    }
    messages.push_back(std::move(message));
  }
  return messages;
}

// What a decode step produced for one sequence: its last layer's output and tokens.
struct StepResult {
  int64_t layer_tokens = 0;
  std::vector<float> output_first;  // the first values of the output
};

using StepResults = std::map<std::string, StepResult>;  // by sequence id

// Keeps each sequence's result of `output`; a later layer's replaces an earlier one's.
void Keep(const client::DecodeBatchOutput& output, StepResults* results) {
  for (const client::DecodeResult& r : output.results) {
    StepResult& s = (*results)[r.sequence_id];
    s.layer_tokens = r.layer_tokens;
    s.output_first.assign(r.output.values.begin(),
                          r.output.values.begin() + std::min<size_t>(4, r.output.values.size()));
  }
}

// `status` with "step <step>, layer <layer>: " before its message.
absl::Status AtLayer(const absl::Status& status, int64_t step, int32_t layer) {
  return absl::Status(status.code(),
                      absl::StrCat("step ", step, ", layer ", layer, ": ", status.message()));
}

// Sends step `step`'s messages over `stream`, or as DecodeBatch calls when it is null. The
// server's refusal of a message names the step and layer; a broken stream's status is as the
// stream reports it.
absl::StatusOr<StepResults> SendStep(const client::KvCacheClient& kv, client::DecodeStream* stream,
                                     const std::vector<client::DecodeBatchInput>& messages,
                                     int64_t step) {
  StepResults results;
  if (stream != nullptr) {
    // The layers of one step are independent messages: write them all, then read the answers,
    // so that the server always has the next one at hand.
    for (const client::DecodeBatchInput& message : messages) {
      absl::StatusOr<uint64_t> written = stream->Write(message);
      if (!written.ok()) return written.status();
    }
    for (size_t i = 0; i < messages.size(); ++i) {
      absl::StatusOr<client::DecodeStreamReply> reply = stream->Read();
      if (!reply.ok()) return reply.status();
      if (!reply->result.ok()) return AtLayer(reply->result.status(), step, messages[i].layer);
      Keep(*reply->result, &results);
    }
    return results;
  }
  for (const client::DecodeBatchInput& message : messages) {
    absl::StatusOr<client::DecodeBatchOutput> output = kv.DecodeBatch(message);
    if (!output.ok()) return AtLayer(output.status(), step, message.layer);
    Keep(*output, &results);
  }
  return results;
}

// The steps so far: a table row and a JSON object per step and sequence, and the totals.
struct DecodeReport {
  Table table{{"step", "sequence", "tokens", "latency", "out[0]", "out[1]", "out[2]", "out[3]"}};
  std::string json_steps;  // the elements of "steps", comma-separated
  double total_seconds = 0;
  int64_t calls = 0;  // calls or stream messages

  void AddStep(int64_t step, double seconds, size_t messages,
               const std::vector<DecodeTarget>& targets, const StepResults& results) {
    total_seconds += seconds;
    calls += static_cast<int64_t>(messages);
    std::vector<std::string> json_results;
    for (const DecodeTarget& t : targets) {
      const auto it = results.find(t.id);
      if (it == results.end()) continue;
      const StepResult& r = it->second;
      std::vector<std::string> row = {absl::StrCat(step), t.id, Count(r.layer_tokens),
                                      Duration(seconds)};
      for (size_t j = 0; j < 4; ++j) {
        row.push_back(j < r.output_first.size() ? Fixed(r.output_first[j], 4) : "");
      }
      table.AddRow(row);
      json_results.push_back(absl::StrCat(
          "{\"sequence_id\": ", JsonString(t.id), ", \"layer_tokens\": ", r.layer_tokens,
          ", \"output_first\": ", JsonNumbers(absl::MakeConstSpan(r.output_first)), "}"));
    }
    absl::StrAppend(&json_steps, step ? ", " : "", "{\"step\": ", step,
                    ", \"latency_seconds\": ", JsonNumber(seconds), ", \"results\": [",
                    absl::StrJoin(json_results, ", "), "]}");
  }
};

void PrintDecode(Context& c, const DecodeOptions& o, const DecodePlan& plan,
                 const DecodeReport& report) {
  const std::string mode = o.stream ? "stream" : "batch";
  if (c.json) {
    std::vector<std::string> quoted;
    for (const std::string& id : o.ids) quoted.push_back(JsonString(id));
    *c.out << "{\"mode\": \"" << mode << "\", \"sequences\": [" << absl::StrJoin(quoted, ", ")
           << "], \"layers\": [" << absl::StrJoin(plan.layers, ", ") << "], \"steps\": ["
           << report.json_steps << "], \"calls\": " << report.calls
           << ", \"total_seconds\": " << JsonNumber(report.total_seconds) << "}\n";
    return;
  }
  std::vector<std::string> quoted;
  for (const std::string& id : o.ids) quoted.push_back(Quoted(id));
  *c.out << "decoding " << Plural(o.steps, "step", "steps") << " of "
         << Plural(static_cast<int64_t>(plan.layers.size()), "layer", "layers") << " for "
         << absl::StrJoin(quoted, ", ")
         << (o.stream ? " over one DecodeStream (a message per layer)"
                      : " with DecodeBatch (a call per layer)")
         << "; out[] = first values of the last layer's output\n"
         << report.table.Render() << Plural(o.steps, "step", "steps") << ", "
         << Plural(report.calls, o.stream ? "message" : "call", o.stream ? "messages" : "calls")
         << ", " << Duration(report.total_seconds / static_cast<double>(o.steps)) << " per step\n";
}

int RunDecode(Context& c, const DecodeFlags& flags) {
  c.wire = flags.wire;
  absl::StatusOr<DecodeOptions> options = ParseDecodeFlags(flags);
  if (!options.ok()) return UsageError(c, options.status());
  client::KvCacheClient kv(c.Channel(), c.connection);
  absl::StatusOr<DecodePlan> plan = PlanDecode(kv, *options);
  if (!plan.ok()) return ReportError(c, plan.status());
  std::mt19937_64 rng(static_cast<uint64_t>(options->seed));
  std::unique_ptr<client::DecodeStream> stream;
  if (options->stream) stream = kv.OpenDecodeStream();
  DecodeReport report;
  for (int64_t step = 0; step < options->steps; ++step) {
    const std::vector<client::DecodeBatchInput> messages = StepMessages(*plan, *options, rng);
    const auto start = std::chrono::steady_clock::now();
    absl::StatusOr<StepResults> results = SendStep(kv, stream.get(), messages, step);
    if (!results.ok()) return ReportError(c, results.status());
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    report.AddStep(step, seconds, messages.size(), plan->targets, *results);
  }
  if (stream) {
    if (absl::Status s = stream->Finish(); !s.ok()) return ReportError(c, s);
  }
  PrintDecode(c, *options, *plan, report);
  return kExitOk;
}

}  // namespace

Command SeqDecodeSubcommand() {
  return {
      "decode", "run decode steps: one random token per layer per sequence",
      "attend seq decode --id ID | --ids A,B,C [--steps N] [--layer L] [--stream] [--seed S]",
      "Each step sends every layer 0..L-1 in order (only --layer with --layer), each layer's\n"
      "tokens of all the sequences as one batch: a DecodeBatch call per layer, or with --stream\n"
      "a message per layer over one DecodeStream. Prints each step's latency, the tokens\n"
      "cached and the first values of the last layer's attention output.\n"
      "Examples:\n  attend seq decode --id chat-1 --steps 4\n"
      "  attend seq decode --ids chat-1,chat-2 --steps 8 --stream\n"
      "  attend seq decode --id chat-1 --layer 0 --json\n",
      Define(RunDecode)};
}

}  // namespace attend::cli
