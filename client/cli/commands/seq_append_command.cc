// `attend seq append`: one layer's new tokens (random, or from .npy files) into a sequence,
// and the attention of their queries over everything the layer holds.
#include <cstdint>
#include <optional>
#include <random>
#include <string>
#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"
#include "client/cli/commands/input_files.h"
#include "client/cli/commands/seq_commands.h"
#include "client/cli/connect/report_error.h"
#include "client/cli/framework/command.h"
#include "client/cli/render/format.h"
#include "client/cli/render/terminal_notes.h"
#include "client/cli/tensors/tensor_flags.h"
#include "client/kv_cache_client.h"
#include "client/npy.h"

namespace attend::cli {
namespace {

using client::FloatTensor;

struct AppendOptions {
  std::string id;
  int64_t layer = 0;
  Given<int64_t> n{1};
  Given<int64_t> seed{1};
  std::optional<std::string> q;
  std::optional<std::string> k;
  std::optional<std::string> v;
  bool no_q = false;
  bool weights = false;
  std::optional<std::string> out;
  std::string wire = "f32";
  std::string precision;

  void Declare(Flags& f) {
    DeclareSequenceId(f, &id);
    f.Add("layer", &layer, "layer to append to").Range(0, 1 << 16);
    f.Add("n", &n, "random tokens").Range(1, 1 << 20);
    DeclareRandomTokensSeed(f, &seed);
    f.Add("q", &q, ".npy file of the queries [n, n_head, head_dim]");
    f.Add("k", &k, ".npy file of the keys [n, n_head_kv, head_dim]");
    f.Add("v", &v, ".npy file of the values [n, n_head_kv, head_dim_v]");
    f.Add("no_q", &no_q, "send no queries: only cache the keys and values");
    f.Add("weights", &weights, "also print the attention weights per head");
    f.Add("out", &out, "write the output [n, n_head, head_dim_v] to this .npy file");
    DeclareWire(f, &wire);
    DeclarePrecision(f, &precision);
  }
};

// The append flags that choose the tokens, checked together: .npy files (--k and --v, --q
// optional) or random tokens (--n, --seed, --no_q), and --out or --weights only with queries.
absl::Status CheckAppendSource(const AppendOptions& o) {
  const bool no_q = o.no_q;
  const bool from_files = o.q || o.k || o.v;
  if (from_files) {
    if (!o.k || !o.v) {
      return absl::InvalidArgumentError("--k and --v go together (--q optional)");
    }
    if (o.n.given || o.seed.given) {
      return absl::InvalidArgumentError(
          "--n and --seed make random tokens; not with --q/--k/--v files");
    }
    if (no_q && o.q) {
      return absl::InvalidArgumentError("--no_q and --q contradict each other");
    }
  }
  const bool has_q = from_files ? o.q.has_value() : !no_q;
  if (!has_q && (o.weights || o.out)) {
    return absl::InvalidArgumentError(
        "without queries (--no_q, or --k/--v without --q) there is no output for --out or "
        "--weights");
  }
  return absl::OkStatus();
}

// Fills input->q/k/v from the .npy files the flags name, or with random tokens shaped like the
// sequence (which the server is asked for). Returns kExitOk, or prints the problem and returns
// its exit code.
int FillAppendTokens(Context& c, const AppendOptions& o, const client::KvCacheClient& kv,
                     client::AppendInput* input) {
  if (o.q || o.k || o.v) {
    if (o.q) {
      absl::StatusOr<FloatTensor> q = ReadNpyFlag(c, "q", *o.q);
      if (!q.ok()) return LocalError(c, q.status());
      input->q = *std::move(q);
    }
    for (auto [flag, path, target] :
         {std::tuple{"k", &o.k, &input->k}, std::tuple{"v", &o.v, &input->v}}) {
      if (!*path) continue;
      absl::StatusOr<FloatTensor> t = ReadNpyFlag(c, flag, **path);
      if (!t.ok()) return LocalError(c, t.status());
      *target = *std::move(t);
    }
    return kExitOk;
  }
  const int64_t n = o.n.value;
  absl::StatusOr<v1::SequenceInfo> info = kv.GetSequence(input->sequence_id);
  if (!info.ok()) return ReportError(c, info.status());
  const v1::SequenceConfig& config = info->config();
  std::mt19937_64 rng(static_cast<uint64_t>(o.seed.value));
  // The queries are drawn even with --no_q: the keys and values a seed gives do not depend on it.
  FloatTensor q = RandomTensor(rng, {n, config.n_head(), config.head_dim()});
  input->k = RandomTensor(rng, {n, config.n_head_kv(), config.head_dim()});
  input->v = RandomTensor(rng, {n, config.n_head_kv(), config.head_dim_v()});
  if (!o.no_q) input->q = std::move(q);
  return kExitOk;
}

// What an append of `n` tokens did, and with queries their attention output.
void PrintAppended(Context& c, const client::AppendInput& input, int64_t n,
                   const client::AppendOutput& r) {
  const std::string& id = input.sequence_id;
  if (c.json) {
    *c.out << "{\"sequence_id\": " << JsonString(id) << ", \"layer\": " << input.layer
           << ", \"appended\": " << n << ", \"first_position\": " << r.first_position
           << ", \"layer_tokens\": " << r.layer_tokens;
    if (input.q) *c.out << ", \"output\": " << JsonTensor(r.output);
    if (r.weights) *c.out << ", \"weights\": " << JsonTensor(*r.weights);
    if (input.q) *c.out << ", \"stats\": " << ToJson(r.stats);
    *c.out << "}\n";
    return;
  }
  *c.out << "appended " << Plural(n, "token", "tokens")
         << (input.q ? "" : " (keys and values only)") << " to layer " << input.layer << " of "
         << Quoted(id) << " at position"
         << (n == 1 ? absl::StrCat(" ", r.first_position)
                    : absl::StrCat("s ", r.first_position, "-", r.first_position + n - 1))
         << "; the layer holds " << Plural(r.layer_tokens, "token", "tokens") << "\n";
  if (!input.q) return;
  *c.out << "output " << ShapeString(r.output.shape) << " = [n_new, n_head, head_dim_v]:\n";
  PrintHeadRows(*c.out, r.output, "position", r.first_position);
  if (r.weights) {
    PrintWeights(*c.out, *r.weights, "new query position", "cached key", r.first_position);
  }
  PrintStats(*c.out, r.stats);
}

int RunAppend(Context& c, const AppendOptions& o) {
  c.wire = o.wire;
  absl::StatusOr<std::string> id = RequiredId(o.id, "append");
  if (!id.ok()) return UsageError(c, id.status());
  absl::StatusOr<v1::Precision> precision = ParsePrecision(o.precision);
  if (!precision.ok()) return UsageError(c, precision.status());
  absl::StatusOr<client::Wire> wire = client::ParseWire(o.wire);
  if (!wire.ok()) return UsageError(c, wire.status());
  if (absl::Status s = CheckAppendSource(o); !s.ok()) return UsageError(c, s);

  client::KvCacheClient kv(c.Channel(), c.connection);
  client::AppendInput input;
  input.sequence_id = *id;
  input.layer = static_cast<int32_t>(o.layer);
  input.precision = *precision;
  input.wire = *wire;
  input.return_weights = o.weights;
  if (int code = FillAppendTokens(c, o, kv, &input); code != kExitOk) return code;
  const int64_t n = input.k.shape.empty() ? 0 : input.k.shape[0];
  absl::StatusOr<client::AppendOutput> r;
  {
    const WorkingNote note(
        c.err, c.err_is_terminal, c.working_note_after,
        WorkingText(absl::StrCat("Append of ", Plural(n, "token", "tokens")), c.connection.target));
    r = kv.Append(input);
  }
  if (!r.ok()) return ReportError(c, r.status());
  if (o.out) {
    if (absl::Status s = client::WriteNpyFile(*o.out, r->output); !s.ok()) {
      return LocalError(c,
                        absl::Status(s.code(), absl::StrCat(s.message(),
                                                            " (the tokens were "
                                                            "appended: the sequence holds them)")));
    }
  }
  PrintAppended(c, input, n, *r);
  return kExitOk;
}

}  // namespace

Command SeqAppendSubcommand() {
  return {
      "append", "append one layer's new tokens and print the attention of their queries",
      "attend seq append --id ID [--layer L] [--n N [--seed S] | --k k.npy --v v.npy [--q q.npy]] "
      "[--no_q] [--weights] [--out o.npy]",
      "Random tokens (standard normal, shaped like the sequence) unless --k/--v name .npy files\n"
      "([n, n_head_kv, head_dim] and [n, n_head_kv, head_dim_v]; --q is [n, n_head, head_dim]).\n"
      "The output is causal attention of the new queries over every token the layer holds.\n"
      "With --no_q (or --k/--v without --q) the tokens are only cached.\n"
      "Examples:\n  attend seq append --id chat-1 --layer 0 --n 16\n"
      "  attend seq append --id chat-1 --layer 1 --n 16 --no_q\n"
      "  attend seq append --id chat-1 --layer 0 --n 2 --weights\n"
      "  attend seq append --id chat-1 --q q.npy --k k.npy --v v.npy --out o.npy\n",
      Define(RunAppend)};
}

}  // namespace attend::cli
