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

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "client/cli/command.h"
#include "client/cli/format.h"
#include "client/cli/seq_commands.h"
#include "client/kv_cache_client.h"

namespace attend::cli {
namespace {

// One sequence's part of a decode run.
struct DecodeTarget {
  std::string id;
  v1::SequenceConfig config;
};

// What a decode step produced for one sequence: its last layer's output and tokens.
struct StepResult {
  int64_t layer_tokens = 0;
  std::vector<float> output_first;  // the first values of the output
};

int RunDecode(Context& c) {
  if (c.args.Has("id") == c.args.Has("ids")) {
    return UsageError(c, absl::InvalidArgumentError("give --id <id> or --ids a,b,c (one of them)"));
  }
  std::vector<std::string> ids;
  if (c.args.Has("id")) {
    ids.push_back(c.args.GetString("id"));
  } else {
    for (absl::string_view id : absl::StrSplit(c.args.GetString("ids"), ',', absl::SkipEmpty())) {
      ids.emplace_back(id);
    }
  }
  if (ids.empty() || ids[0].empty()) {
    return UsageError(c, absl::InvalidArgumentError("--id/--ids: no sequence id given"));
  }
  if (std::set<std::string>(ids.begin(), ids.end()).size() != ids.size()) {
    return UsageError(c, absl::InvalidArgumentError(
                             "--ids: a sequence appears twice (a decode step takes each once)"));
  }
  absl::StatusOr<int64_t> steps = IntFlag(c.args, "steps", 1, 1, 1 << 20);
  absl::StatusOr<int64_t> seed = IntFlag(c.args, "seed", 1, 0, INT64_MAX);
  if (!steps.ok()) return UsageError(c, steps.status());
  if (!seed.ok()) return UsageError(c, seed.status());
  std::optional<int32_t> only_layer;
  if (c.args.Has("layer")) {
    absl::StatusOr<int64_t> layer = IntFlag(c.args, "layer", 0, 0, 1 << 16);
    if (!layer.ok()) return UsageError(c, layer.status());
    only_layer = static_cast<int32_t>(*layer);
  }
  absl::StatusOr<v1::Precision> precision = ParsePrecision(c.args);
  if (!precision.ok()) return UsageError(c, precision.status());
  absl::StatusOr<client::Wire> wire = client::ParseWire(c.args.GetString("wire", "f32"));
  if (!wire.ok()) return UsageError(c, wire.status());
  const bool stream_mode = c.args.GetBool("stream");

  client::KvCacheClient kv(c.Channel(), c.connection);
  std::vector<DecodeTarget> targets;
  int32_t max_layers = 0;
  for (const std::string& id : ids) {
    absl::StatusOr<v1::SequenceInfo> info = kv.GetSequence(id);
    if (!info.ok()) return ReportError(c, info.status());
    targets.push_back({id, info->config()});
    max_layers = std::max(max_layers, info->config().layers());
  }
  std::vector<int32_t> layers;
  if (only_layer) {
    layers.push_back(*only_layer);
  } else {
    for (int32_t l = 0; l < max_layers; ++l) layers.push_back(l);
  }

  // Every message of a step: one per layer, covering the sequences that have that layer (a
  // layer no sequence has goes to the server anyway, which says why it is refused).
  std::mt19937_64 rng(static_cast<uint64_t>(*seed));
  auto make_messages = [&]() {
    std::vector<client::DecodeBatchInput> messages;
    for (int32_t layer : layers) {
      client::DecodeBatchInput message;
      message.layer = layer;
      message.precision = *precision;
      message.wire = *wire;
      for (const DecodeTarget& t : targets) {
        if (layer >= t.config.layers() && layers.size() > 1) continue;
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
  };

  std::unique_ptr<client::DecodeStream> stream;
  if (stream_mode) stream = kv.OpenDecodeStream();
  Table table({"step", "sequence", "tokens", "latency", "out[0]", "out[1]", "out[2]", "out[3]"});
  std::string json_steps;
  double total_seconds = 0;
  int64_t calls = 0;
  for (int64_t step = 0; step < *steps; ++step) {
    const std::vector<client::DecodeBatchInput> messages = make_messages();
    std::map<std::string, StepResult> results;
    const auto keep = [&](const client::DecodeBatchOutput& output) {
      for (const client::DecodeResult& r : output.results) {
        StepResult& s = results[r.sequence_id];
        s.layer_tokens = r.layer_tokens;
        s.output_first.assign(
            r.output.values.begin(),
            r.output.values.begin() + std::min<size_t>(4, r.output.values.size()));
      }
    };
    const auto start = std::chrono::steady_clock::now();
    if (stream_mode) {
      // The layers of one step are independent messages: write them all, then read the
      // answers, so that the server always has the next one at hand.
      for (const client::DecodeBatchInput& message : messages) {
        absl::StatusOr<uint64_t> written = stream->Write(message);
        if (!written.ok()) return ReportError(c, written.status());
      }
      for (size_t i = 0; i < messages.size(); ++i) {
        absl::StatusOr<client::DecodeStreamReply> reply = stream->Read();
        if (!reply.ok()) return ReportError(c, reply.status());
        if (!reply->result.ok()) {
          return ReportError(
              c, absl::Status(reply->result.status().code(),
                              absl::StrCat("step ", step, ", layer ", messages[i].layer, ": ",
                                           reply->result.status().message())));
        }
        keep(*reply->result);
      }
    } else {
      for (const client::DecodeBatchInput& message : messages) {
        absl::StatusOr<client::DecodeBatchOutput> output = kv.DecodeBatch(message);
        if (!output.ok()) {
          return ReportError(c, absl::Status(output.status().code(),
                                             absl::StrCat("step ", step, ", layer ", message.layer,
                                                          ": ", output.status().message())));
        }
        keep(*output);
      }
    }
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    total_seconds += seconds;
    calls += static_cast<int64_t>(messages.size());
    std::vector<std::string> json_results;
    for (const DecodeTarget& t : targets) {
      const auto it = results.find(t.id);
      if (it == results.end()) continue;
      std::vector<std::string> row = {absl::StrCat(step), t.id, Count(it->second.layer_tokens),
                                      Duration(seconds)};
      for (size_t j = 0; j < 4; ++j) {
        row.push_back(j < it->second.output_first.size() ? Fixed(it->second.output_first[j], 4)
                                                         : "");
      }
      table.AddRow(row);
      json_results.push_back(absl::StrCat(
          "{\"sequence_id\": ", JsonString(t.id), ", \"layer_tokens\": ", it->second.layer_tokens,
          ", \"output_first\": ", JsonNumbers(absl::MakeConstSpan(it->second.output_first)), "}"));
    }
    absl::StrAppend(&json_steps, step ? ", " : "", "{\"step\": ", step,
                    ", \"latency_seconds\": ", JsonNumber(seconds), ", \"results\": [",
                    absl::StrJoin(json_results, ", "), "]}");
  }
  if (stream) {
    if (absl::Status s = stream->Finish(); !s.ok()) return ReportError(c, s);
  }
  const std::string mode = stream_mode ? "stream" : "batch";
  if (c.json) {
    std::vector<std::string> quoted;
    for (const std::string& id : ids) quoted.push_back(JsonString(id));
    *c.out << "{\"mode\": \"" << mode << "\", \"sequences\": [" << absl::StrJoin(quoted, ", ")
           << "], \"layers\": [" << absl::StrJoin(layers, ", ") << "], \"steps\": [" << json_steps
           << "], \"calls\": " << calls << ", \"total_seconds\": " << JsonNumber(total_seconds)
           << "}\n";
    return kExitOk;
  }
  std::vector<std::string> quoted;
  for (const std::string& id : ids) quoted.push_back(Quoted(id));
  *c.out << "decoding " << Plural(*steps, "step", "steps") << " of "
         << Plural(static_cast<int64_t>(layers.size()), "layer", "layers") << " for "
         << absl::StrJoin(quoted, ", ")
         << (stream_mode ? " over one DecodeStream (a message per layer)"
                         : " with DecodeBatch (a call per layer)")
         << "; out[] = first values of the last layer's output\n"
         << table.Render() << Plural(*steps, "step", "steps") << ", "
         << Plural(calls, stream_mode ? "message" : "call", stream_mode ? "messages" : "calls")
         << ", " << Duration(total_seconds / static_cast<double>(*steps)) << " per step\n";
  return kExitOk;
}

}  // namespace

Command SeqDecodeSubcommand() {
  return {
      "decode",
      "run decode steps: one random token per layer per sequence",
      "attend seq decode --id ID | --ids A,B,C [--steps N] [--layer L] [--stream] [--seed S]",
      "Each step sends every layer 0..L-1 in order (only --layer with --layer), each layer's\n"
      "tokens of all the sequences as one batch: a DecodeBatch call per layer, or with --stream\n"
      "a message per layer over one DecodeStream. Prints each step's latency, the tokens\n"
      "cached and the first values of the last layer's attention output.\n"
      "Examples:\n  attend seq decode --id chat-1 --steps 4\n"
      "  attend seq decode --ids chat-1,chat-2 --steps 8 --stream\n"
      "  attend seq decode --id chat-1 --layer 0 --json\n",
      {{"id", "the sequence (or --ids)"},
       {"ids", "comma-separated sequences, decoded as one batch"},
       {"layer", "decode only this layer", false, "every layer"},
       {"steps", "decode steps", false, "1"},
       {"stream", "use one DecodeStream instead of DecodeBatch calls", true},
       RandomTokensSeedFlag(),
       WireFlag(),
       PrecisionFlag()},
      RunDecode};
}

}  // namespace attend::cli
