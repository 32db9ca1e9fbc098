// The Attention service's commands of the lessons: `attend softmax` (a list of scores, with the
// Jacobian on request) and `attend scaling` (the sqrt(d_head) experiment), and the lessons'
// worked examples that `attend attend --example` sends.
#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "client/attention_client.h"
#include "client/cli/commands/attention_commands.h"
#include "client/cli/connect/report_error.h"
#include "client/cli/framework/args.h"
#include "client/cli/framework/command.h"
#include "client/cli/render/format.h"

namespace attend::cli {
namespace {

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

struct SoftmaxOptions {
  bool jacobian = false;
  std::optional<double> temperature;

  void Declare(Flags& f) {
    f.Add("jacobian", &jacobian, "also print diag(p) - p p^T");
    f.Add("temperature", &temperature, "divide the scores first").Shown("1");
  }
};

int RunSoftmax(Context& c, const SoftmaxOptions& o) {
  // The server's rule (core/lessons/softmax.cc), checked here so that a typo is a usage error
  // naming the flag rather than the server's refusal.
  if (o.temperature && (!(*o.temperature > 0.0) || !std::isfinite(*o.temperature))) {
    return UsageError(c, absl::InvalidArgumentError(absl::StrCat(
                             "--temperature must be positive and finite: greater than 0 and at "
                             "most 1.8e308 (a double's largest), got ",
                             *o.temperature)));
  }
  std::vector<double> logits;
  for (const std::string& token : c.positional) {
    double value;
    if (!ParseDecimal(token, &value)) {
      return UsageError(c, absl::InvalidArgumentError(absl::StrCat(
                               "'", token, "' is not a decimal number (use -inf to mask)")));
    }
    // Checked here, as the server would check it, so that the error names the argument as
    // given: a number past a double's range reads as an infinity, which it is not meant as.
    const std::string which = absl::StrCat("logit ", logits.size() + 1, ", '", token, "'");
    const std::string rule = "scores are finite, or -inf to mask";
    if (std::isinf(value) && !absl::StrContains(absl::AsciiStrToLower(token), "inf")) {
      return UsageError(c, absl::InvalidArgumentError(
                               absl::StrCat(which, ", is beyond the range of a double; ", rule)));
    }
    if (std::isnan(value) || value == std::numeric_limits<double>::infinity()) {
      return UsageError(c, absl::InvalidArgumentError(absl::StrCat(which, ": ", rule)));
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

}  // namespace

absl::StatusOr<Example> FindExample(const std::string& name) {
  if (name == "it") return ItExample();
  if (name == "causal") return CausalExample();
  // A close name is suggested, as `attend example` and mistyped commands do; else the choices.
  const std::string guess = DidYouMeanSuffix(name, {"it", "causal"});
  return absl::InvalidArgumentError(absl::StrCat("--example: '", name, "' is not an example",
                                                 guess.empty() ? "; use it or causal" : guess));
}

Command SoftmaxCommand() {
  Command softmax{"softmax", "softmax of a list of scores, with the Jacobian on request",
                  "attend softmax <score>... [--jacobian] [--temperature=<t>]",
                  "Scores may be negative or -inf (masked: share exactly 0).\n"
                  "Examples:\n  attend softmax 2 1 0.5\n  attend softmax 3 -inf 1 --jacobian\n"};
  softmax.define = Define(RunSoftmax);
  softmax.max_positional = kAnyPositional;
  return softmax;
}

Command ScalingCommand() {
  Command scaling{
      "scaling", "the sqrt(d_head) experiment: why scores are scaled",
      "attend scaling [--head_dims=4,64,1024] [--seed=5]",
      "With the defaults (seed 5) this prints the lesson's table.\n"
      "Examples:\n  attend scaling\n  attend scaling --head_dims 8,128,512 --trials 200\n"};
  scaling.define = Define(RunScaling);
  return scaling;
}

}  // namespace attend::cli
