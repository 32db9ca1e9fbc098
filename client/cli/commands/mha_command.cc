// `attend mha`: a whole attention layer (Wq, Wk, Wv, Wo) on random inputs, a JSON request
// (--input) or the lessons' java.util.Random draws (--java_seed).
#include <cmath>
#include <cstdint>
#include <optional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/attention_client.h"
#include "client/cli/commands/attention_commands.h"
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
  // In this order, so that a default that follows another flag is named by the flag given.
  for (const auto& [flag, d] : {std::pair{"n", n},
                                {"d_model", d_model},
                                {"n_head", n_head},
                                {"n_head_kv", n_head_kv},
                                {"head_dim", head_dim}}) {
    if (absl::Status s = CheckRandomSize(flag, d, 20); !s.ok()) return s;
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

}  // namespace

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

}  // namespace attend::cli
