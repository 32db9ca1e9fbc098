// The Attention service's commands (attend, mha, softmax, scaling). `attend` and
// `mha` take random inputs, .npy files, a JSON request (--input) or, for `attend`, one of the
// lessons' worked examples (--example), and draw the attention weights as an SVG heatmap.
#include <cmath>
#include <fstream>
#include <optional>
#include <random>
#include <string>
#include <tuple>
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

  void Declare(Flags& f) {
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
};

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

// Writes `t` to the file `path` names, if it names one.
absl::Status SaveIfAsked(const std::optional<std::string>& path, const FloatTensor& t) {
  if (!path) return absl::OkStatus();
  return client::WriteNpyFile(*path, t);
}

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
                           const std::vector<std::pair<std::string, bool>>& others) {
  for (const auto& [flag, given] : others) {
    if (given) {
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

struct SoftmaxOptions {
  bool jacobian = false;
  std::optional<double> temperature;

  void Declare(Flags& f) {
    f.Add("jacobian", &jacobian, "also print diag(p) - p p^T");
    f.Add("temperature", &temperature, "divide the scores first").Shown("1");
  }
};

int RunSoftmax(Context& c, const SoftmaxOptions& o) {
  std::vector<double> logits;
  for (const std::string& token : c.positional) {
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
  client::AttentionClient client(c.Channel(), c.connection);
  absl::StatusOr<v1::SoftmaxResponse> r = client.Softmax(logits, o.jacobian, o.temperature);
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
  if (o.jacobian) {
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

struct AttendOptions {
  std::optional<std::string> q;
  std::optional<std::string> k;
  std::optional<std::string> v;
  Given<int64_t> n_q{4};
  std::optional<int64_t> n_kv;  // unset: n_q
  Given<int64_t> n_head{2};
  std::optional<int64_t> n_head_kv;  // unset: n_head
  Given<int64_t> head_dim{8};
  std::optional<int64_t> head_dim_v;  // unset: head_dim
  bool scores = false;
  std::optional<std::string> example;
  CommonAttentionOptions common;

  void Declare(Flags& f) {
    f.Add("q", &q, ".npy file [n_q, n_head, head_dim] (with --k and --v)");
    f.Add("k", &k, ".npy file [n_kv, n_head_kv, head_dim]");
    f.Add("v", &v, ".npy file [n_kv, n_head_kv, head_dim_v]");
    f.Add("n_q", &n_q, "random queries");
    f.Add("n_kv", &n_kv, "random keys and values").Shown("n_q");
    f.Add("n_head", &n_head, "query heads");
    f.Add("n_head_kv", &n_head_kv, "key/value heads (divides n_head)").Shown("n_head");
    f.Add("head_dim", &head_dim, "query/key head size");
    f.Add("head_dim_v", &head_dim_v, "value head size").Shown("head_dim");
    f.Add("scores", &scores, "print each head's score table, raw and masked");
    f.Add("example", &example,
          "a worked example of the lessons: it (\"it\" over animal/tired/street) or causal (\"The "
          "cat sat down\")")
        .Values({"it", "causal"});
    common.Declare(f);
  }
  // The flags of the random inputs, with whether each was given.
  std::vector<std::pair<std::string, bool>> RandomFlags() const {
    return {{"n_q", n_q.given},           {"n_kv", n_kv.has_value()},
            {"n_head", n_head.given},     {"n_head_kv", n_head_kv.has_value()},
            {"head_dim", head_dim.given}, {"head_dim_v", head_dim_v.has_value()},
            {"seed", common.seed.given}};
  }
};

// Standard normal q/k/v of the sizes the flags give, from --seed; INVALID_ARGUMENT for sizes
// out of range.
absl::StatusOr<client::AttendInput> RandomAttendInput(const AttendOptions& o) {
  const int64_t n_q = o.n_q.value, n_kv = o.n_kv.value_or(n_q);
  const int64_t n_head = o.n_head.value, n_head_kv = o.n_head_kv.value_or(n_head);
  const int64_t head_dim = o.head_dim.value, head_dim_v = o.head_dim_v.value_or(head_dim);
  for (int64_t d : {n_q, n_kv, n_head, n_head_kv, head_dim, head_dim_v}) {
    if (d < 1 || d > (int64_t{1} << 24)) {
      return absl::InvalidArgumentError("sizes must be between 1 and 2^24 for random inputs");
    }
  }
  std::mt19937_64 rng(static_cast<uint64_t>(o.common.seed.value));
  client::AttendInput input;
  input.q = RandomTensor(rng, {n_q, n_head, head_dim});
  input.k = RandomTensor(rng, {n_kv, n_head_kv, head_dim});
  input.v = RandomTensor(rng, {n_kv, n_head_kv, head_dim_v});
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
int AttendRequestFromFlags(Context& c, const AttendOptions& o, AttendRequest* request) {
  const bool from_files = o.q || o.k || o.v;
  const std::vector<std::pair<std::string, bool>> random_flags = o.RandomFlags();
  std::vector<std::pair<std::string, bool>> not_with_source = random_flags;
  for (const auto& [flag, path] : {std::pair{"q", &o.q}, {"k", &o.k}, {"v", &o.v}}) {
    not_with_source.emplace_back(flag, path->has_value());
  }
  if (o.example) {
    std::vector<std::pair<std::string, bool>> others = not_with_source;
    others.emplace_back("input", o.common.input.has_value());
    if (absl::Status s = OnlyOneSource("--example", others); !s.ok()) return UsageError(c, s);
    absl::StatusOr<Example> example = FindExample(*o.example);
    if (!example.ok()) return UsageError(c, example.status());
    request->input = std::move(example->input);
    request->key_labels = std::move(example->key_labels);
    request->query_labels = std::move(example->query_labels);
    request->title = absl::StrCat("attention weights: example '", *o.example, "'");
    if (!c.json) *c.out << "example: " << example->description << "\n";
  } else if (o.common.input) {
    if (absl::Status s = OnlyOneSource("--input", not_with_source); !s.ok()) {
      return UsageError(c, s);
    }
    absl::StatusOr<client::AttendInput> parsed =
        ReadJsonRequest(c, *o.common.input, &client::AttendInputFromJson);
    if (!parsed.ok()) return LocalError(c, parsed.status());
    request->input = *std::move(parsed);
    request->title = absl::StrCat("attention weights: ", *o.common.input);
  } else if (from_files) {
    if (!o.q || !o.k || !o.v) {
      return UsageError(c, absl::InvalidArgumentError("--q, --k and --v go together"));
    }
    if (absl::Status s = OnlyOneSource("--q/--k/--v", random_flags); !s.ok()) {
      return UsageError(c, s);
    }
    client::AttendInput& input = request->input;
    for (auto [flag, path, target] :
         {std::tuple{"q", &o.q, &input.q}, std::tuple{"k", &o.k, &input.k},
          std::tuple{"v", &o.v, &input.v}}) {
      absl::StatusOr<FloatTensor> t = ReadNpyFlag(c, flag, **path);
      if (!t.ok()) return LocalError(c, t.status());
      *target = *std::move(t);
    }
  } else {
    absl::StatusOr<client::AttendInput> random = RandomAttendInput(o);
    if (!random.ok()) return UsageError(c, random.status());
    request->input = *std::move(random);
  }
  return kExitOk;
}

int RunAttend(Context& c, const AttendOptions& o) {
  const CommonAttentionOptions& common = o.common;
  AttendRequest request;
  if (int code = AttendRequestFromFlags(c, o, &request); code != kExitOk) return code;
  client::AttendInput& input = request.input;
  if (absl::Status s =
          ApplyCommon(c, common, &input.mask, &input.scale, &input.precision, &input.wire);
      !s.ok()) {
    return UsageError(c, s);
  }
  input.return_weights = common.weights || common.weights_out || common.heatmap.path || o.example;
  input.return_scores = o.scores;
  client::AttentionClient client(c.Channel(), c.connection);
  absl::StatusOr<client::AttendOutput> r;
  {
    const WorkingNote note(c.err, c.err_is_terminal, c.working_note_after,
                           WorkingText("Attend", c.connection.target));
    r = client.Attend(input);
  }
  if (!r.ok()) return ReportError(c, r.status());
  for (auto [path, tensor] :
       {std::pair<const std::optional<std::string>*, const FloatTensor*>{&common.out, &r->output},
        {&common.weights_out, r->weights ? &*r->weights : nullptr}}) {
    if (tensor == nullptr) continue;
    if (absl::Status s = SaveIfAsked(*path, *tensor); !s.ok()) return LocalError(c, s);
  }
  if (c.json) {
    *c.out << "{\"output\": " << JsonTensor(r->output);
    *c.out << TensorMembersJson(
        {{"weights", &r->weights}, {"scores", &r->scores}, {"masked_scores", &r->masked_scores}});
    *c.out << ", \"stats\": " << ToJson(r->stats) << "}\n";
  } else {
    *c.out << "output " << ShapeString(r->output.shape) << " = [n_q, n_head, head_dim_v]:\n";
    PrintHeadRows(*c.out, r->output, "token");
    if (r->weights && (common.weights || o.example)) {
      PrintWeights(*c.out, *r->weights, "query", "key");
    }
    if (r->scores && r->masked_scores) PrintScoreTables(*c.out, *r->scores, *r->masked_scores);
    PrintStats(*c.out, r->stats);
  }
  if (common.heatmap.path && r->weights) {
    AttentionPicture picture;
    picture.title = request.title;
    picture.mask = input.mask;
    picture.n_head_kv = input.k.shape.size() == 3 ? input.k.shape[1] : 0;
    picture.key_labels = std::move(request.key_labels);
    picture.query_labels = std::move(request.query_labels);
    return WriteHeatmap(c, common, *r->weights, std::move(picture));
  }
  return kExitOk;
}

struct MhaOptions {
  Given<int64_t> n{4};
  Given<int64_t> d_model{8};
  Given<int64_t> n_head{2};
  std::optional<int64_t> n_head_kv;  // unset: n_head
  std::optional<int64_t> head_dim;   // unset: d_model / n_head
  std::optional<int64_t> d_out;      // unset: d_model
  bool projections = false;
  bool scores = false;
  LessonFlags lesson;
  CommonAttentionOptions common;

  void Declare(Flags& f) {
    f.Add("n", &n, "tokens");
    f.Add("d_model", &d_model, "model width");
    f.Add("n_head", &n_head, "query heads");
    f.Add("n_head_kv", &n_head_kv, "key/value heads").Shown("n_head");
    f.Add("head_dim", &head_dim, "head size").Shown("d_model / n_head");
    f.Add("d_out", &d_out, "columns of Wo; 0 = no Wo").Shown("d_model");
    f.Add("projections", &projections, "print q, k and v");
    f.Add("scores", &scores, "print each head's score table, raw and masked");
    lesson.Declare(f);
    common.Declare(f);
  }
  LayerSizes Sizes() const {
    return {n.value, d_model.value, n_head.value, n_head_kv, head_dim, d_out};
  }
};

// A random layer of the sizes the flags give, from --seed: standard normal x and weights scaled
// by 1/sqrt(d_model). INVALID_ARGUMENT for sizes that are not numbers or out of range.
absl::StatusOr<client::MultiHeadInput> RandomMultiHeadInput(const MhaOptions& o) {
  const int64_t n = o.n.value, d_model = o.d_model.value, n_head = o.n_head.value;
  const int64_t n_head_kv = o.n_head_kv.value_or(n_head);
  // head_dim defaults to d_model / n_head only where that divides: rounding it down would
  // compute a smaller layer than the one asked for.
  if (!o.head_dim && n_head > 0 && d_model % n_head != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "d_model ", d_model, " is not a multiple of n_head ", n_head,
        "; give --head_dim to choose each head's size (the projections are then d_model x "
        "n_head*head_dim)"));
  }
  const int64_t head_dim = o.head_dim.value_or(n_head > 0 ? d_model / n_head : 1);
  const int64_t d_out = o.d_out.value_or(d_model);
  for (int64_t d : {n, d_model, n_head, n_head_kv, head_dim}) {
    if (d < 1 || d > (int64_t{1} << 20)) {
      return absl::InvalidArgumentError("sizes must be between 1 and 2^20");
    }
  }
  std::mt19937_64 rng(static_cast<uint64_t>(o.common.seed.value));
  const float init = 1.0f / std::sqrt(static_cast<float>(d_model));
  client::MultiHeadInput input;
  input.x = RandomTensor(rng, {n, d_model});
  input.wq = RandomTensor(rng, {d_model, n_head * head_dim}, init);
  input.wk = RandomTensor(rng, {d_model, n_head_kv * head_dim}, init);
  input.wv = RandomTensor(rng, {d_model, n_head_kv * head_dim}, init);
  if (d_out > 0) input.wo = RandomTensor(rng, {n_head * head_dim, d_out}, init);
  input.n_head = static_cast<int32_t>(n_head);
  input.n_head_kv = static_cast<int32_t>(n_head_kv);
  return input;
}

// The layer from one source: --input, --java_seed (drawn on the server) or --seed's random
// sizes. Returns kExitOk, or prints the problem and returns its exit code.
int MultiHeadInputFromFlags(Context& c, const MhaOptions& o, client::MultiHeadInput* input,
                            std::string* title) {
  const std::vector<std::pair<std::string, bool>> random_flags = {
      {"n", o.n.given},
      {"d_model", o.d_model.given},
      {"n_head", o.n_head.given},
      {"n_head_kv", o.n_head_kv.has_value()},
      {"head_dim", o.head_dim.has_value()},
      {"d_out", o.d_out.has_value()},
      {"seed", o.common.seed.given},
      {"java_seed", o.lesson.java_seed.has_value()}};
  if (o.common.input) {
    if (absl::Status s = OnlyOneSource("--input", random_flags); !s.ok()) {
      return UsageError(c, s);
    }
    absl::StatusOr<client::MultiHeadInput> parsed =
        ReadJsonRequest(c, *o.common.input, &client::MultiHeadInputFromJson);
    if (!parsed.ok()) return LocalError(c, parsed.status());
    *input = *std::move(parsed);
    *title = absl::StrCat("attention weights: ", *o.common.input);
  } else if (o.lesson.java_seed) {
    if (absl::Status s = OnlyOneSource("--java_seed", {{"seed", o.common.seed.given}}); !s.ok()) {
      return UsageError(c, s);
    }
    absl::StatusOr<client::MultiHeadInput> drawn = LessonMultiHeadInput(o.lesson, o.Sizes());
    if (!drawn.ok()) return UsageError(c, drawn.status());
    *input = *std::move(drawn);
    *title = absl::StrCat("attention weights: java.util.Random(", input->init->seed(), ")");
  } else {
    if (o.lesson.std) {
      return UsageError(c, absl::InvalidArgumentError("--std goes with --java_seed"));
    }
    absl::StatusOr<client::MultiHeadInput> random = RandomMultiHeadInput(o);
    if (!random.ok()) return UsageError(c, random.status());
    *input = *std::move(random);
  }
  return kExitOk;
}

int RunMultiHead(Context& c, const MhaOptions& o) {
  const CommonAttentionOptions& common = o.common;
  client::MultiHeadInput input;
  std::string title = "attention weights of the layer";
  if (int code = MultiHeadInputFromFlags(c, o, &input, &title); code != kExitOk) return code;
  if (absl::Status s =
          ApplyCommon(c, common, &input.mask, &input.scale, &input.precision, &input.wire);
      !s.ok()) {
    return UsageError(c, s);
  }
  input.return_weights = common.weights || common.weights_out || common.heatmap.path;
  input.return_projections = o.projections;
  input.return_scores = o.scores;
  client::AttentionClient client(c.Channel(), c.connection);
  absl::StatusOr<client::MultiHeadOutput> r;
  {
    const WorkingNote note(c.err, c.err_is_terminal, c.working_note_after,
                           WorkingText("MultiHeadAttend", c.connection.target));
    r = client.MultiHeadAttend(input);
  }
  if (!r.ok()) return ReportError(c, r.status());
  if (absl::Status s = SaveIfAsked(common.out, r->output); !s.ok()) return LocalError(c, s);
  if (r->weights) {
    if (absl::Status s = SaveIfAsked(common.weights_out, *r->weights); !s.ok()) {
      return LocalError(c, s);
    }
  }
  if (c.json) {
    *c.out << MultiHeadJson(*r);
  } else {
    PrintMultiHead(*c.out, *r, common.weights);
  }
  if (common.heatmap.path && r->weights) {
    AttentionPicture picture;
    picture.title = title;
    picture.mask = input.mask;
    picture.n_head_kv = input.n_head_kv;
    return WriteHeatmap(c, common, *r->weights, std::move(picture));
  }
  return kExitOk;
}

// The server's defaults stand for flags left out (empty or 0): those help shows.
struct ScalingOptions {
  std::vector<int64_t> head_dims;
  int64_t pairs = 0;
  int64_t trials = 0;
  int64_t keys = 0;
  std::optional<int64_t> seed;

  void Declare(Flags& f) {
    f.Add("head_dims", &head_dims, "comma-separated head sizes").Shown("4,64,1024");
    f.Add("pairs", &pairs, "random pairs for the spread of q.k").Shown("2000");
    f.Add("trials", &trials, "softmax trials per head size").Shown("500");
    f.Add("keys", &keys, "keys per trial").Shown("8");
    f.Add("seed", &seed, "java.util.Random seed").Shown("5");
  }
};

int RunScaling(Context& c, const ScalingOptions& o) {
  v1::ScalingExperimentRequest request;
  for (int64_t d : o.head_dims) {
    if (d < 1 || d > (int64_t{1} << 30)) {
      return UsageError(c, absl::InvalidArgumentError("--head_dims must be between 1 and 2^30"));
    }
    request.add_head_dims(static_cast<int32_t>(d));
  }
  for (const auto& [flag, value, setter] :
       {std::tuple{"pairs", o.pairs, &v1::ScalingExperimentRequest::set_pairs},
        std::tuple{"trials", o.trials, &v1::ScalingExperimentRequest::set_trials},
        std::tuple{"keys", o.keys, &v1::ScalingExperimentRequest::set_keys}}) {
    if (value < 0 || value > (int64_t{1} << 30)) {
      return UsageError(c, absl::InvalidArgumentError(absl::StrCat("--", flag, " out of range")));
    }
    (request.*setter)(static_cast<int32_t>(value));
  }
  if (o.seed) request.set_seed(static_cast<uint64_t>(*o.seed));
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
  Command attend{
      "attend", "scaled dot-product attention of q over k/v (random, .npy, JSON or an example)",
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
      "  attend attend --input request.json --heatmap w.svg\n"};
  attend.define = Define(RunAttend);
  return attend;
}

Command MultiHeadCommand() {
  Command mha{
      "mha", "a whole attention layer (Wq, Wk, Wv, Wo) on random or JSON inputs",
      "attend mha [--n=N --d_model=D --n_head=H --n_head_kv=G] [--causal] [--weights]",
      "Random inputs from --seed, or --input request.json: {\"x\": T, \"wq\": T, \"wk\": T, "
      "\"wv\": T,\n\"wo\": T, \"n_head\": 2, \"n_head_kv\": 1, \"mask\": {...}, "
      "\"scale\": 0.5} (wo, n_head_kv, mask and\nscale optional; T as in 'attend attend "
      "--help').\n"
      "Examples:\n  attend mha --n 4 --d_model 8 --n_head 2 --causal --weights\n"
      "  attend mha --n 6 --n_head 4 --causal --heatmap mha.svg --labels a,b,c,d,e,f\n"
      "  attend mha --d_model 4096 --n_head 32 --n_head_kv 8 --n 16\n"
      "  attend mha --java_seed 1 --n 4 --d_model 4 --n_head 1 --head_dim 2 --projections\n"};
  mha.define = Define(RunMultiHead);
  return mha;
}

}  // namespace

std::vector<Command> AttentionCommands() {
  Command softmax{"softmax", "softmax of a list of scores, with the Jacobian on request",
                  "attend softmax <score>... [--jacobian] [--temperature=<t>]",
                  "Scores may be negative or -inf (masked: share exactly 0).\n"
                  "Examples:\n  attend softmax 2 1 0.5\n  attend softmax 3 -inf 1 --jacobian\n"};
  softmax.define = Define(RunSoftmax);
  softmax.max_positional = kAnyPositional;
  Command scaling{
      "scaling", "the sqrt(d_head) experiment: why scores are scaled",
      "attend scaling [--head_dims=4,64,1024] [--seed=5]",
      "With the defaults (seed 5) this prints the lesson's table.\n"
      "Examples:\n  attend scaling\n  attend scaling --head_dims 8,128,512 --trials 200\n"};
  scaling.define = Define(RunScaling);
  return {softmax, AttendCommand(), MultiHeadCommand(), scaling};
}

}  // namespace attend::cli
