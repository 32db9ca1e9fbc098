// The Attention service's commands (attend, mha, softmax, scaling). `attend` and
// `mha` take random inputs, .npy files, a JSON request (--input) or, for `attend`, one of the
// lessons' worked examples (--example), and draw the attention weights as an SVG heatmap.
#include <cmath>
#include <fstream>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "client/attention_client.h"
#include "client/cli/attention_heatmap.h"
#include "client/cli/command.h"
#include "client/cli/format.h"
#include "client/cli/lesson_flags.h"
#include "client/cli/terminal_notes.h"
#include "client/input_file.h"
#include "client/json_input.h"
#include "client/npy.h"

namespace attend::cli {
namespace {

using client::FloatTensor;

std::vector<FlagSpec> CommonAttentionFlags() {
  return {
      {"causal", "hide keys after each query's position", true},
      {"window", "sliding window in tokens (0 = unlimited)", false, "0"},
      {"scale", "multiplies q.k before softmax", false, "1/sqrt(head_dim)"},
      PrecisionFlag(),
      WireFlag(),
      {"seed", "seed of the random inputs", false, "1"},
      {"input", "read the request from this JSON file (see --help)"},
      {"weights", "print the attention weights per head", true},
      {"out", "write the output to this .npy file", false},
      {"weights_out", "write the weights to this .npy file", false},
      {"heatmap", "write the weights as an SVG heatmap, one panel per head, to this file"},
      {"labels", "comma-separated names of the tokens (keys), for the heatmap"},
      HeatmapScaleFlag(),
  };
}

// Mask, scale, precision and wire from the command line. The mask and scale change only when
// their flags are given, so that they can override a JSON request's or an example's.
absl::Status ApplyCommon(const Args& args, client::MaskSettings* mask, std::optional<float>* scale,
                         v1::Precision* precision, client::Wire* wire) {
  if (args.Has("causal")) mask->causal = args.GetBool("causal");
  if (args.Has("window")) {
    absl::StatusOr<int64_t> window = args.GetInt("window", 0);
    if (!window.ok()) return window.status();
    mask->window_tokens = *window;
  }
  if (args.Has("scale")) {
    absl::StatusOr<double> s = args.GetDouble("scale", 0.0);
    if (!s.ok()) return s.status();
    *scale = static_cast<float>(*s);
  }
  absl::StatusOr<v1::Precision> p = ParsePrecision(args);
  if (!p.ok()) return p.status();
  *precision = *p;
  absl::StatusOr<client::Wire> w = client::ParseWire(args.GetString("wire", "f32"));
  if (!w.ok()) return w.status();
  *wire = *w;
  // Checked before the call, which --heatmap_scale only draws.
  return ParseHeatmapScale(args).status();
}

// Writes the tensor of --<flag> when the flag is given.
absl::Status SaveIfAsked(const Args& args, const std::string& flag, const FloatTensor& t) {
  if (!args.Has(flag)) return absl::OkStatus();
  return client::WriteNpyFile(args.GetString(flag), t);
}

// The request in the JSON file --input, read by `parse` (AttendInputFromJson or
// MultiHeadInputFromJson); errors start with "--input <path>: ".
//
// The file may hold at most --max_message_bytes, read as it arrives (client::ReadAtMost), so that
// /dev/zero or an endless FIFO stops there. A larger request could not be sent anyway: JSON
// spends at least 2 bytes a value ("0,"), as many as the narrowest wire (bf16), and usually
// several times the 4 of f32 ("-0.1234567, ").
template <typename Input>
absl::StatusOr<Input> ReadJsonRequest(const Context& c,
                                      absl::StatusOr<Input> (*parse)(absl::string_view)) {
  const std::string path = c.args.GetString("input");
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
absl::Status OnlyOneSource(const Args& args, const std::string& source,
                           const std::vector<std::string>& others) {
  for (const std::string& flag : others) {
    if (args.Has(flag)) {
      return absl::InvalidArgumentError(
          absl::StrCat(source, " and --", flag, " both choose the inputs; give one of them"));
    }
  }
  return absl::OkStatus();
}

// --- the lessons' examples -------------------------------------------------------------------

// A worked example of the lessons: the inputs, the token names, and what it shows.
struct Example {
  client::AttendInput input;
  std::vector<std::string> key_labels;
  std::vector<std::string> query_labels;
  std::string description;
};

// "it": which earlier word does "it" attend to? One query [1, 1, 1, 1] over the keys of
// "animal" [1, 1, 1, 1], "tired" [1, 1, 0, 0] and "street" [1, 0, 0, 0]; values [1, 0], [0, 1],
// [1, 1]; default scale 1/sqrt(4). Scores 2, 1, 0.5 give the shares 0.63, 0.23, 0.14.
Example ItExample() {
  Example e;
  e.input.q = {{1, 1, 4}, {1, 1, 1, 1}};
  e.input.k = {{3, 1, 4}, {1, 1, 1, 1, 1, 1, 0, 0, 1, 0, 0, 0}};
  e.input.v = {{3, 1, 2}, {1, 0, 0, 1, 1, 1}};
  e.key_labels = {"animal", "tired", "street"};
  e.query_labels = {"it"};
  e.description =
      "the lesson's \"it\" example: query \"it\" [1, 1, 1, 1] over animal [1, 1, 1, 1], tired "
      "[1, 1, 0, 0], street [1, 0, 0, 0]; scale 1/sqrt(4)";
  return e;
}

// "causal": four tokens "The cat sat down" under the causal mask, with the lesson's score table
// S[i][j] = 1 + 0.5 * ((3i + 5j) mod 4). One-hot queries q_i = e_i and keys k_j = column j of S
// give q_i . k_j = S[i][j] at scale 1; one-hot values make each output row its weight row.
Example CausalExample() {
  constexpr int64_t n = 4;
  Example e;
  e.input.q = {{n, 1, n}, std::vector<float>(n * n, 0.0f)};
  e.input.k = {{n, 1, n}, std::vector<float>(n * n, 0.0f)};
  e.input.v = {{n, 1, n}, std::vector<float>(n * n, 0.0f)};
  for (int64_t i = 0; i < n; ++i) {
    e.input.q.values[static_cast<size_t>(i * n + i)] = 1.0f;
    e.input.v.values[static_cast<size_t>(i * n + i)] = 1.0f;
    for (int64_t j = 0; j < n; ++j) {
      // Key j's component i is the score of query i for key j.
      e.input.k.values[static_cast<size_t>(j * n + i)] =
          1.0f + 0.5f * static_cast<float>((3 * i + 5 * j) % 4);
    }
  }
  e.input.mask.causal = true;
  e.input.scale = 1.0f;
  e.key_labels = {"The", "cat", "sat", "down"};
  e.query_labels = e.key_labels;
  e.description =
      "the lesson's causal example: \"The cat sat down\", scores 1 + 0.5 * ((3i + 5j) mod 4) "
      "from one-hot queries, scale 1, causal";
  return e;
}

absl::StatusOr<Example> FindExample(const std::string& name) {
  if (name == "it") return ItExample();
  if (name == "causal") return CausalExample();
  return absl::InvalidArgumentError(
      absl::StrCat("--example: '", name, "' is not an example; use it or causal"));
}

// --- heatmaps ----------------------------------------------------------------------------------

// Comma-separated names; exactly `n` of them.
absl::StatusOr<std::vector<std::string>> ParseLabels(const Args& args, const std::string& flag,
                                                     int64_t n, const std::string& what) {
  std::vector<std::string> labels = absl::StrSplit(args.GetString(flag), ',');
  if (static_cast<int64_t>(labels.size()) != n) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", flag, " names ", labels.size(), " tokens but there are ", n, " ", what));
  }
  return labels;
}

// Writes `weights` [heads, n_q, n_kv] to --heatmap. Key labels come from --labels (or
// `key_labels`); the queries take the labels of their positions unless `query_labels` names
// them (--labels renames the tokens, so it drops `query_labels`).
int WriteHeatmap(Context& c, const FloatTensor& weights, AttentionPicture picture) {
  if (c.args.Has("labels")) {
    absl::StatusOr<std::vector<std::string>> labels =
        ParseLabels(c.args, "labels", weights.shape[2], "keys");
    if (!labels.ok()) return UsageError(c, labels.status());
    picture.key_labels = *std::move(labels);
    picture.query_labels.clear();
  }
  return WriteAttentionHeatmap(c, weights, std::move(picture));
}

int RunSoftmax(Context& c) {
  std::vector<double> logits;
  for (const std::string& token : c.args.positional()) {
    double value;
    if (!ParseDecimal(token, &value)) {
      return UsageError(c, absl::InvalidArgumentError(absl::StrCat(
                               "'", token, "' is not a decimal number (use -inf to mask)")));
    }
    logits.push_back(value);
  }
  if (logits.empty()) {
    return UsageError(c,
                      absl::InvalidArgumentError("give the scores, e.g. attend softmax 2 1 0.5"));
  }
  std::optional<double> temperature;
  if (c.args.Has("temperature")) {
    absl::StatusOr<double> t = c.args.GetDouble("temperature", 1.0);
    if (!t.ok()) return UsageError(c, t.status());
    temperature = *t;
  }
  client::AttentionClient client(c.Channel(), c.connection);
  absl::StatusOr<v1::SoftmaxResponse> r =
      client.Softmax(logits, c.args.GetBool("jacobian"), temperature);
  if (!r.ok()) return ReportError(c, r.status());
  if (c.json) {
    *c.out << ToJson(*r);
    return kExitOk;
  }
  // exp(logit) is shown for learning (it may overflow); the shares come from the server's
  // stable computation, which subtracts the largest score first.
  Table table({"i", "logit", "exp(logit)", "probability", "share"});
  for (size_t i = 0; i < logits.size(); ++i) {
    table.AddRow({absl::StrCat(i), absl::StrFormat("%g", logits[i]),
                  absl::StrFormat("%.4g", std::exp(logits[i])), Fixed(r->probabilities(i), 6),
                  absl::StrCat(Fixed(100 * r->probabilities(i), 1), "%")});
  }
  *c.out << table.Render();
  *c.out << "sum of exp(logit) = " << absl::StrFormat("%.6g", std::exp(r->log_sum_exp()))
         << " (log " << Fixed(r->log_sum_exp(), 6) << "), entropy " << Fixed(r->entropy_nats(), 4)
         << " nats\n";
  if (c.args.GetBool("jacobian")) {
    const size_t n = logits.size();
    *c.out << "jacobian diag(p) - p p^T (each row sums to 0):\n";
    std::vector<std::string> header = {""};
    for (size_t j = 0; j < n; ++j) header.push_back(absl::StrCat(j));
    Table jt(header);
    for (size_t i = 0; i < n; ++i) {
      std::vector<std::string> row = {absl::StrCat(i)};
      for (size_t j = 0; j < n; ++j) row.push_back(Fixed(r->jacobian(i * n + j), 4));
      jt.AddRow(row);
    }
    *c.out << jt.Render();
  }
  return kExitOk;
}

// Standard normal q/k/v of the sizes the flags give, from --seed; INVALID_ARGUMENT for sizes
// that are not numbers or out of range.
absl::StatusOr<client::AttendInput> RandomAttendInput(const Args& args) {
  absl::StatusOr<int64_t> n_q = args.GetInt("n_q", 4);
  absl::StatusOr<int64_t> n_kv = args.GetInt("n_kv", n_q.ok() ? *n_q : 4);
  absl::StatusOr<int64_t> n_head = args.GetInt("n_head", 2);
  absl::StatusOr<int64_t> n_head_kv = args.GetInt("n_head_kv", n_head.ok() ? *n_head : 2);
  absl::StatusOr<int64_t> head_dim = args.GetInt("head_dim", 8);
  absl::StatusOr<int64_t> head_dim_v = args.GetInt("head_dim_v", head_dim.ok() ? *head_dim : 8);
  absl::StatusOr<int64_t> seed = args.GetInt("seed", 1);
  for (const auto* s : {&n_q, &n_kv, &n_head, &n_head_kv, &head_dim, &head_dim_v, &seed}) {
    if (!s->ok()) return s->status();
  }
  for (int64_t d : {*n_q, *n_kv, *n_head, *n_head_kv, *head_dim, *head_dim_v}) {
    if (d < 1 || d > (int64_t{1} << 24)) {
      return absl::InvalidArgumentError("sizes must be between 1 and 2^24 for random inputs");
    }
  }
  std::mt19937_64 rng(static_cast<uint64_t>(*seed));
  client::AttendInput input;
  input.q = RandomTensor(rng, {*n_q, *n_head, *head_dim});
  input.k = RandomTensor(rng, {*n_kv, *n_head_kv, *head_dim});
  input.v = RandomTensor(rng, {*n_kv, *n_head_kv, *head_dim_v});
  return input;
}

// What `attend attend` sends, with the names and title its heatmap takes.
struct AttendRequest {
  client::AttendInput input;
  std::vector<std::string> key_labels, query_labels;
  std::string title = "attention weights";
};

// The inputs from one source: --example, --input, --q/--k/--v, or random sizes. The mask,
// scale, precision and wire flags are applied afterwards. Returns kExitOk, or prints the problem
// and returns its exit code.
int AttendRequestFromFlags(Context& c, AttendRequest* request) {
  const bool from_files = c.args.Has("q") || c.args.Has("k") || c.args.Has("v");
  const std::vector<std::string> random_flags = {"n_q",      "n_kv",       "n_head", "n_head_kv",
                                                 "head_dim", "head_dim_v", "seed"};
  std::vector<std::string> not_with_source = random_flags;
  for (const char* f : {"q", "k", "v"}) not_with_source.emplace_back(f);
  if (c.args.Has("example")) {
    std::vector<std::string> others = not_with_source;
    others.emplace_back("input");
    if (absl::Status s = OnlyOneSource(c.args, "--example", others); !s.ok()) {
      return UsageError(c, s);
    }
    absl::StatusOr<Example> example = FindExample(c.args.GetString("example"));
    if (!example.ok()) return UsageError(c, example.status());
    request->input = std::move(example->input);
    request->key_labels = std::move(example->key_labels);
    request->query_labels = std::move(example->query_labels);
    request->title = absl::StrCat("attention weights: example '", c.args.GetString("example"), "'");
    if (!c.json) *c.out << "example: " << example->description << "\n";
  } else if (c.args.Has("input")) {
    if (absl::Status s = OnlyOneSource(c.args, "--input", not_with_source); !s.ok()) {
      return UsageError(c, s);
    }
    absl::StatusOr<client::AttendInput> parsed = ReadJsonRequest(c, &client::AttendInputFromJson);
    if (!parsed.ok()) return LocalError(c, parsed.status());
    request->input = *std::move(parsed);
    request->title = absl::StrCat("attention weights: ", c.args.GetString("input"));
  } else if (from_files) {
    if (!c.args.Has("q") || !c.args.Has("k") || !c.args.Has("v")) {
      return UsageError(c, absl::InvalidArgumentError("--q, --k and --v go together"));
    }
    if (absl::Status s = OnlyOneSource(c.args, "--q/--k/--v", random_flags); !s.ok()) {
      return UsageError(c, s);
    }
    client::AttendInput& input = request->input;
    for (auto [flag, target] : {std::pair{"q", &input.q}, {"k", &input.k}, {"v", &input.v}}) {
      absl::StatusOr<FloatTensor> t = ReadNpyFlag(c, flag);
      if (!t.ok()) return LocalError(c, t.status());
      *target = *std::move(t);
    }
  } else {
    absl::StatusOr<client::AttendInput> random = RandomAttendInput(c.args);
    if (!random.ok()) return UsageError(c, random.status());
    request->input = *std::move(random);
  }
  return kExitOk;
}

int RunAttend(Context& c) {
  AttendRequest request;
  if (int code = AttendRequestFromFlags(c, &request); code != kExitOk) return code;
  client::AttendInput& input = request.input;
  if (absl::Status s =
          ApplyCommon(c.args, &input.mask, &input.scale, &input.precision, &input.wire);
      !s.ok()) {
    return UsageError(c, s);
  }
  input.return_weights = c.args.GetBool("weights") || c.args.Has("weights_out") ||
                         c.args.Has("heatmap") || c.args.Has("example");
  input.return_scores = c.args.GetBool("scores");
  client::AttentionClient client(c.Channel(), c.connection);
  absl::StatusOr<client::AttendOutput> r;
  {
    const WorkingNote note(c.err, c.err_is_terminal, c.working_note_after,
                           WorkingText("Attend", c.connection.target));
    r = client.Attend(input);
  }
  if (!r.ok()) return ReportError(c, r.status());
  for (auto [flag, tensor] : {std::pair<const char*, const FloatTensor*>{"out", &r->output},
                              {"weights_out", r->weights ? &*r->weights : nullptr}}) {
    if (tensor == nullptr) continue;
    if (absl::Status s = SaveIfAsked(c.args, flag, *tensor); !s.ok()) return LocalError(c, s);
  }
  if (c.json) {
    *c.out << "{\"output\": " << JsonTensor(r->output);
    *c.out << TensorMembersJson(
        {{"weights", &r->weights}, {"scores", &r->scores}, {"masked_scores", &r->masked_scores}});
    *c.out << ", \"stats\": " << ToJson(r->stats) << "}\n";
  } else {
    *c.out << "output " << ShapeString(r->output.shape) << " = [n_q, n_head, head_dim_v]:\n";
    PrintHeadRows(*c.out, r->output, "token");
    if (r->weights && (c.args.GetBool("weights") || c.args.Has("example"))) {
      PrintWeights(*c.out, *r->weights, "query", "key");
    }
    if (r->scores && r->masked_scores) PrintScoreTables(*c.out, *r->scores, *r->masked_scores);
    PrintStats(*c.out, r->stats);
  }
  if (c.args.Has("heatmap") && r->weights) {
    AttentionPicture picture;
    picture.title = request.title;
    picture.mask = input.mask;
    picture.n_head_kv = input.k.shape.size() == 3 ? input.k.shape[1] : 0;
    picture.key_labels = std::move(request.key_labels);
    picture.query_labels = std::move(request.query_labels);
    return WriteHeatmap(c, *r->weights, std::move(picture));
  }
  return kExitOk;
}

// A random layer of the sizes the flags give, from --seed: standard normal x and weights scaled
// by 1/sqrt(d_model). INVALID_ARGUMENT for sizes that are not numbers or out of range.
absl::StatusOr<client::MultiHeadInput> RandomMultiHeadInput(const Args& args) {
  absl::StatusOr<int64_t> n = args.GetInt("n", 4);
  absl::StatusOr<int64_t> d_model = args.GetInt("d_model", 8);
  absl::StatusOr<int64_t> n_head = args.GetInt("n_head", 2);
  absl::StatusOr<int64_t> n_head_kv = args.GetInt("n_head_kv", n_head.ok() ? *n_head : 2);
  absl::StatusOr<int64_t> seed = args.GetInt("seed", 1);
  for (const auto* s : {&n, &d_model, &n_head, &n_head_kv, &seed}) {
    if (!s->ok()) return s->status();
  }
  // head_dim defaults to d_model / n_head only where that divides: rounding it down would
  // compute a smaller layer than the one asked for.
  if (!args.Has("head_dim") && *n_head > 0 && *d_model % *n_head != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "d_model ", *d_model, " is not a multiple of n_head ", *n_head,
        "; give --head_dim to choose each head's size (the projections are then d_model x "
        "n_head*head_dim)"));
  }
  absl::StatusOr<int64_t> head_dim = args.GetInt("head_dim", *n_head > 0 ? *d_model / *n_head : 1);
  absl::StatusOr<int64_t> d_out = args.GetInt("d_out", *d_model);
  if (!head_dim.ok()) return head_dim.status();
  if (!d_out.ok()) return d_out.status();
  for (int64_t d : {*n, *d_model, *n_head, *n_head_kv, *head_dim}) {
    if (d < 1 || d > (int64_t{1} << 20)) {
      return absl::InvalidArgumentError("sizes must be between 1 and 2^20");
    }
  }
  std::mt19937_64 rng(static_cast<uint64_t>(*seed));
  const float init = 1.0f / std::sqrt(static_cast<float>(*d_model));
  client::MultiHeadInput input;
  input.x = RandomTensor(rng, {*n, *d_model});
  input.wq = RandomTensor(rng, {*d_model, *n_head * *head_dim}, init);
  input.wk = RandomTensor(rng, {*d_model, *n_head_kv * *head_dim}, init);
  input.wv = RandomTensor(rng, {*d_model, *n_head_kv * *head_dim}, init);
  if (*d_out > 0) input.wo = RandomTensor(rng, {*n_head * *head_dim, *d_out}, init);
  input.n_head = static_cast<int32_t>(*n_head);
  input.n_head_kv = static_cast<int32_t>(*n_head_kv);
  return input;
}

// The layer from one source: --input, --java_seed (drawn on the server) or --seed's random
// sizes. Returns kExitOk, or prints the problem and returns its exit code.
int MultiHeadInputFromFlags(Context& c, client::MultiHeadInput* input, std::string* title) {
  const std::vector<std::string> random_flags = {"n",        "d_model", "n_head", "n_head_kv",
                                                 "head_dim", "d_out",   "seed",   "java_seed"};
  if (c.args.Has("input")) {
    if (absl::Status s = OnlyOneSource(c.args, "--input", random_flags); !s.ok()) {
      return UsageError(c, s);
    }
    absl::StatusOr<client::MultiHeadInput> parsed =
        ReadJsonRequest(c, &client::MultiHeadInputFromJson);
    if (!parsed.ok()) return LocalError(c, parsed.status());
    *input = *std::move(parsed);
    *title = absl::StrCat("attention weights: ", c.args.GetString("input"));
  } else if (c.args.Has("java_seed")) {
    if (absl::Status s = OnlyOneSource(c.args, "--java_seed", {"seed"}); !s.ok()) {
      return UsageError(c, s);
    }
    absl::StatusOr<client::MultiHeadInput> drawn = LessonMultiHeadInput(c.args);
    if (!drawn.ok()) return UsageError(c, drawn.status());
    *input = *std::move(drawn);
    *title = absl::StrCat("attention weights: java.util.Random(", input->init->seed(), ")");
  } else {
    if (c.args.Has("std")) {
      return UsageError(c, absl::InvalidArgumentError("--std goes with --java_seed"));
    }
    absl::StatusOr<client::MultiHeadInput> random = RandomMultiHeadInput(c.args);
    if (!random.ok()) return UsageError(c, random.status());
    *input = *std::move(random);
  }
  return kExitOk;
}

int RunMultiHead(Context& c) {
  client::MultiHeadInput input;
  std::string title = "attention weights of the layer";
  if (int code = MultiHeadInputFromFlags(c, &input, &title); code != kExitOk) return code;
  if (absl::Status s =
          ApplyCommon(c.args, &input.mask, &input.scale, &input.precision, &input.wire);
      !s.ok()) {
    return UsageError(c, s);
  }
  input.return_weights =
      c.args.GetBool("weights") || c.args.Has("weights_out") || c.args.Has("heatmap");
  input.return_projections = c.args.GetBool("projections");
  input.return_scores = c.args.GetBool("scores");
  client::AttentionClient client(c.Channel(), c.connection);
  absl::StatusOr<client::MultiHeadOutput> r;
  {
    const WorkingNote note(c.err, c.err_is_terminal, c.working_note_after,
                           WorkingText("MultiHeadAttend", c.connection.target));
    r = client.MultiHeadAttend(input);
  }
  if (!r.ok()) return ReportError(c, r.status());
  if (absl::Status s = SaveIfAsked(c.args, "out", r->output); !s.ok()) return LocalError(c, s);
  if (r->weights) {
    if (absl::Status s = SaveIfAsked(c.args, "weights_out", *r->weights); !s.ok()) {
      return LocalError(c, s);
    }
  }
  if (c.json) {
    *c.out << MultiHeadJson(*r);
  } else {
    PrintMultiHead(*c.out, *r, c.args.GetBool("weights"));
  }
  if (c.args.Has("heatmap") && r->weights) {
    AttentionPicture picture;
    picture.title = title;
    picture.mask = input.mask;
    picture.n_head_kv = input.n_head_kv;
    return WriteHeatmap(c, *r->weights, std::move(picture));
  }
  return kExitOk;
}

int RunScaling(Context& c) {
  v1::ScalingExperimentRequest request;
  absl::StatusOr<std::vector<int64_t>> dims = c.args.GetIntList("head_dims");
  if (!dims.ok()) return UsageError(c, dims.status());
  for (int64_t d : *dims) {
    if (d < 1 || d > (int64_t{1} << 30)) {
      return UsageError(c, absl::InvalidArgumentError("--head_dims must be between 1 and 2^30"));
    }
    request.add_head_dims(static_cast<int32_t>(d));
  }
  for (const char* flag : {"pairs", "trials", "keys"}) {
    absl::StatusOr<int64_t> v = c.args.GetInt(flag, 0);
    if (!v.ok()) return UsageError(c, v.status());
    if (*v < 0 || *v > (int64_t{1} << 30)) {
      return UsageError(c, absl::InvalidArgumentError(absl::StrCat("--", flag, " out of range")));
    }
    const int32_t value = static_cast<int32_t>(*v);
    if (std::string(flag) == "pairs") request.set_pairs(value);
    if (std::string(flag) == "trials") request.set_trials(value);
    if (std::string(flag) == "keys") request.set_keys(value);
  }
  if (c.args.Has("seed")) {
    absl::StatusOr<int64_t> seed = c.args.GetInt("seed", 5);
    if (!seed.ok()) return UsageError(c, seed.status());
    request.set_seed(static_cast<uint64_t>(*seed));
  }
  client::AttentionClient client(c.Channel(), c.connection);
  absl::StatusOr<v1::ScalingExperimentResponse> r = client.ScalingExperiment(request);
  if (!r.ok()) return ReportError(c, r.status());
  if (c.json) {
    *c.out << ToJson(*r);
    return kExitOk;
  }
  Table table({"d_head", "std of q.k", "sqrt(d_head)", "largest weight, unscaled",
               "largest weight, scaled"});
  for (const v1::ScalingRow& row : r->rows()) {
    table.AddRow({absl::StrCat(row.head_dim()), Fixed(row.score_std(), 2),
                  Fixed(row.sqrt_head_dim(), 2), Fixed(row.mean_max_weight_unscaled(), 3),
                  Fixed(row.mean_max_weight_scaled(), 3)});
  }
  *c.out << table.Render() << "seed " << r->seed() << "\n";
  return kExitOk;
}

Command AttendCommand() {
  std::vector<FlagSpec> attend_flags = {
      {"q", ".npy file [n_q, n_head, head_dim] (with --k and --v)"},
      {"k", ".npy file [n_kv, n_head_kv, head_dim]"},
      {"v", ".npy file [n_kv, n_head_kv, head_dim_v]"},
      {"n_q", "random queries", false, "4"},
      {"n_kv", "random keys and values", false, "n_q"},
      {"n_head", "query heads", false, "2"},
      {"n_head_kv", "key/value heads (divides n_head)", false, "n_head"},
      {"head_dim", "query/key head size", false, "8"},
      {"head_dim_v", "value head size", false, "head_dim"},
      {"scores", "print each head's score table, raw and masked", true},
  };
  attend_flags.push_back(
      {"example",
       "a worked example of the lessons: it (\"it\" over animal/tired/street) or "
       "causal (\"The cat sat down\")",
       false,
       "",
       {"it", "causal"}});
  for (FlagSpec& f : CommonAttentionFlags()) attend_flags.push_back(f);
  return {
      "attend",
      "scaled dot-product attention of q over k/v (random, .npy, JSON or an example)",
      "attend attend [--q=q.npy --k=k.npy --v=v.npy | --input=request.json | --example=it|causal "
      "| --n_q=N --n_kv=N --n_head=H ...] [--causal] [--weights] [--heatmap=w.svg]",
      "Without files, q/k/v are standard normal from --seed.\n"
      "--input reads {\"q\": T, \"k\": T, \"v\": T, \"mask\": {\"causal\": true, "
      "\"window_tokens\": 0}, \"scale\": 0.5}\n"
      "where each T is {\"shape\": [..], \"values\": [..]} as --json prints tensors; "
      "mask and scale\nare optional, and --causal, --window and --scale override them.\n"
      "--heatmap draws the weights, one panel per head in a grid (rows are queries, numbered by\n"
      "position; columns keys; masked cells hatched grey; each value in its cell's tooltip, and\n"
      "inside cells large enough to hold it). At most 16 heads of 48 x 48 cells, 6,144 cells in\n"
      "all, are drawn (the first ones), and the picture says so when that leaves some out.\n"
      "--heatmap_scale fixed colours weights from 0 to 1 in every picture, for comparing them.\n"
      "Examples:\n  attend attend --n_q 4 --causal --weights\n"
      "  attend attend --example it --heatmap it.svg\n"
      "  attend attend --example causal --heatmap causal.svg --labels The,cat,sat,down\n"
      "  attend attend --n_q 1 --n_kv 4096 --n_head 32 --n_head_kv 8 --head_dim 128\n"
      "  attend attend --q q.npy --k k.npy --v v.npy --out o.npy\n"
      "  attend attend --input request.json --heatmap w.svg\n",
      attend_flags,
      RunAttend};
}

Command MultiHeadCommand() {
  std::vector<FlagSpec> mha_flags = {
      {"n", "tokens", false, "4"},
      {"d_model", "model width", false, "8"},
      {"n_head", "query heads", false, "2"},
      {"n_head_kv", "key/value heads", false, "n_head"},
      {"head_dim", "head size", false, "d_model / n_head"},
      {"d_out", "columns of Wo; 0 = no Wo", false, "d_model"},
      {"projections", "print q, k and v", true},
      {"scores", "print each head's score table, raw and masked", true},
  };
  for (FlagSpec& f : LessonInitFlags()) mha_flags.push_back(f);
  for (FlagSpec& f : CommonAttentionFlags()) mha_flags.push_back(f);
  return {"mha",
          "a whole attention layer (Wq, Wk, Wv, Wo) on random or JSON inputs",
          "attend mha [--n=N --d_model=D --n_head=H --n_head_kv=G] [--causal] [--weights]",
          "Random inputs from --seed, or --input request.json: {\"x\": T, \"wq\": T, \"wk\": T, "
          "\"wv\": T,\n\"wo\": T, \"n_head\": 2, \"n_head_kv\": 1, \"mask\": {...}, "
          "\"scale\": 0.5} (wo, n_head_kv, mask and\nscale optional; T as in 'attend attend "
          "--help').\n"
          "Examples:\n  attend mha --n 4 --d_model 8 --n_head 2 --causal --weights\n"
          "  attend mha --n 6 --n_head 4 --causal --heatmap mha.svg --labels a,b,c,d,e,f\n"
          "  attend mha --d_model 4096 --n_head 32 --n_head_kv 8 --n 16\n"
          "  attend mha --java_seed 1 --n 4 --d_model 4 --n_head 1 --head_dim 2 --projections\n",
          mha_flags,
          RunMultiHead};
}

}  // namespace

std::vector<Command> AttentionCommands() {
  std::vector<Command> commands;
  commands.push_back({"softmax",
                      "softmax of a list of scores, with the Jacobian on request",
                      "attend softmax <score>... [--jacobian] [--temperature=<t>]",
                      "Scores may be negative or -inf (masked: share exactly 0).\n"
                      "Examples:\n  attend softmax 2 1 0.5\n  attend softmax 3 -inf 1 --jacobian\n",
                      {{"jacobian", "also print diag(p) - p p^T", true},
                       {"temperature", "divide the scores first", false, "1"}},
                      RunSoftmax,
                      {},
                      kAnyPositional});
  commands.push_back(AttendCommand());
  commands.push_back(MultiHeadCommand());
  commands.push_back(
      {"scaling",
       "the sqrt(d_head) experiment: why scores are scaled",
       "attend scaling [--head_dims=4,64,1024] [--seed=5]",
       "With the defaults (seed 5) this prints the lesson's table.\n"
       "Examples:\n  attend scaling\n  attend scaling --head_dims 8,128,512 --trials 200\n",
       {{"head_dims", "comma-separated head sizes", false, "4,64,1024"},
        {"pairs", "random pairs for the spread of q.k", false, "2000"},
        {"trials", "softmax trials per head size", false, "500"},
        {"keys", "keys per trial", false, "8"},
        {"seed", "java.util.Random seed", false, "5"}},
       RunScaling});
  return commands;
}

}  // namespace attend::cli
