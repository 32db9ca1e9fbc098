// `attend attend`: scaled dot-product attention of q over k/v, from random inputs, .npy files,
// a JSON request (--input) or one of the lessons' worked examples (--example).
#include <cstdint>
#include <optional>
#include <random>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/attention_client.h"
#include "client/cli/commands/attention_commands.h"
#include "client/cli/commands/input_files.h"
#include "client/cli/commands/lesson_flags.h"
#include "client/cli/connect/report_error.h"
#include "client/cli/framework/command.h"
#include "client/cli/render/attention_heatmap.h"
#include "client/cli/render/format.h"
#include "client/cli/render/terminal_notes.h"
#include "client/cli/tensors/tensor_flags.h"
#include "client/json_input.h"

namespace attend::cli {
namespace {

using client::FloatTensor;

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
  // In this order, so that a default that follows another flag (--n_kv follows --n_q) is named
  // by the flag given.
  for (const auto& [flag, d] : {std::pair{"n_q", n_q},
                                {"n_kv", n_kv},
                                {"n_head", n_head},
                                {"n_head_kv", n_head_kv},
                                {"head_dim", head_dim},
                                {"head_dim_v", head_dim_v}}) {
    if (absl::Status s = CheckRandomSize(flag, d, 24); !s.ok()) return s;
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

}  // namespace

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

}  // namespace attend::cli
