// Lesson 003 ("Self-Attention Step by Step"), Examples 1 to 8: from a fixed average to attention
// in matrix form. The lesson's programs are Java, so numbers print as Java's Arrays.toString
// and String.format print them, in the programs' columns.
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "client/cli/lessons/example_command.h"
#include "client/cli/render/format.h"

namespace attend::cli::examples {
namespace {

using client::FloatTensor;

// Four vectors of two numbers, used by Examples 2, 3 and 13.
const std::vector<float> kFour = {1, 0, 0, 1, 1, 1, 2, 0};

// The lesson's cosine, in float as its program computes it.
float Cosine(const std::vector<float>& a, const std::vector<float>& b) {
  float d = 0, na = 0, nb = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    d += a[i] * b[i];
    na += a[i] * a[i];
    nb += b[i] * b[i];
  }
  return d / static_cast<float>(std::sqrt(na * nb));
}

// Example 1: "bank" mixed half-and-half with its neighbour. Scale 0 gives every key the same
// score, so attention over [bank, neighbour] is exactly the lesson's 50-50 average.
absl::StatusOr<Result> RunContextMixing(const Services& s) {
  const std::vector<float> river = {0.9f, 0.0f, 0.3f}, money = {0.0f, 0.9f, 0.1f},
                           bank = {0.3f, 0.3f, 0.9f};
  std::vector<std::vector<float>> mixed;
  for (const std::vector<float>* neighbour : {&river, &money}) {
    client::AttendInput in;
    in.q = {{1, 1, 3}, bank};
    in.k = {{2, 1, 3}, bank};
    in.k.values.insert(in.k.values.end(), neighbour->begin(), neighbour->end());
    in.v = in.k;
    in.scale = 0.0f;
    absl::StatusOr<client::AttendOutput> r = s.attention.Attend(in);
    if (!r.ok()) return r.status();
    mixed.push_back(r->output.values);
  }
  Result result;
  result.text = absl::StrCat(
      "bank in 'river bank' : ", JavaFloats(bank), "\n",
      "bank in 'money bank' : ", JavaFloats(bank), "\n",
      "after mixing with river: ", JavaFloats(mixed[0]), "\n",
      "after mixing with money: ", JavaFloats(mixed[1]), "\n",
      absl::StrFormat("cosine(river-bank, river) = %.2f, cosine(river-bank, money) = %.2f\n",
                      Cosine(mixed[0], river), Cosine(mixed[0], money)),
      absl::StrFormat("cosine(money-bank, river) = %.2f, cosine(money-bank, money) = %.2f\n",
                      Cosine(mixed[1], river), Cosine(mixed[1], money)));
  result.json.Add("with_river", JsonNumbers(mixed[0]))
      .Add("with_money", JsonNumbers(mixed[1]))
      .Add("cosines",
           JsonNumbers(std::vector<double>{Cosine(mixed[0], river), Cosine(mixed[0], money),
                                           Cosine(mixed[1], river), Cosine(mixed[1], money)}));
  return result;
}

// Example 2: the running average. Scale 0 makes every visible score equal, and the causal mask
// limits position i to keys 0..i, so the weights are 1 / (i + 1).
absl::StatusOr<Result> RunUniformAverage(const Services& s) {
  client::AttendInput in;
  in.q = in.k = in.v = {{4, 1, 2}, kFour};
  in.scale = 0.0f;
  in.mask.causal = true;
  in.return_weights = true;
  absl::StatusOr<client::AttendOutput> r = s.attention.Attend(in);
  if (!r.ok()) return r.status();
  if (absl::Status st = Returned(r->weights, "weights"); !st.ok()) return st;
  Result result;
  for (int i = 0; i < 4; ++i) {
    absl::StrAppend(&result.text, "position ", i, ": average of ", i + 1,
                    " vector(s) = ", JavaFloats(Row(r->output, i)), "\n");
  }
  result.json.Add("averages", JsonTensor(r->output)).Add("weights", JsonTensor(*r->weights));
  result.weights = Weights{*r->weights, in.mask, {}, {}};
  return result;
}

// Example 3: the last vector's dot-product scores (scale 1) and weights; the uniform average it
// is compared with is the same call at scale 0.
absl::StatusOr<Result> RunWeightedAverage(const Services& s) {
  client::AttendInput in;
  in.q = {{1, 1, 2}, {kFour[6], kFour[7]}};
  in.k = in.v = {{4, 1, 2}, kFour};
  in.scale = 1.0f;
  in.return_weights = true;
  in.return_scores = true;
  absl::StatusOr<client::AttendOutput> r = s.attention.Attend(in);
  if (!r.ok()) return r.status();
  for (absl::Status st : {Returned(r->scores, "scores"), Returned(r->weights, "weights")}) {
    if (!st.ok()) return st;
  }
  in.scale = 0.0f;
  absl::StatusOr<client::AttendOutput> uniform = s.attention.Attend(in);
  if (!uniform.ok()) return uniform.status();
  const std::vector<double> scores(r->scores->values.begin(), r->scores->values.end());
  std::vector<std::string> w;
  for (float v : r->weights->values) w.push_back(absl::StrFormat("%.3f", v));
  Result result;
  result.text =
      absl::StrCat("scores  = ", JavaDoubles(scores), "\n", "weights = ", absl::StrJoin(w, " "),
                   "\n", "mixed   = ", JavaFloats(r->output.values), "   (uniform average was ",
                   JavaFloats(uniform->output.values), ")\n");
  result.json.Add("scores", JsonNumbers(r->scores->values))
      .Add("weights", JsonNumbers(r->weights->values))
      .Add("mixed", JsonNumbers(r->output.values))
      .Add("uniform", JsonNumbers(uniform->output.values));
  result.weights = Weights{*r->weights, {}, {}, {"3"}};
  return result;
}

// The layer of Examples 4, 7 and 8: java.util.Random(1) draws x (4 x 4), then Wq, Wk, Wv
// (4 x 2 each), one head of size 2.
client::MultiHeadInput SeedOneLayer() {
  client::MultiHeadInput in;
  v1::LessonInit init;
  init.set_seed(1);
  init.set_n(4);
  init.set_d_model(4);
  init.set_head_dim(2);
  in.init = init;
  in.n_head = 1;
  return in;
}

std::string PrintRows(const std::string& name, const FloatTensor& t) {
  std::string out;
  for (int64_t i = 0; i < t.shape[0]; ++i) {
    absl::StrAppend(&out, name, i, " =");
    for (float v : Row(t, i)) absl::StrAppend(&out, absl::StrFormat(" %6.2f", v));
    absl::StrAppend(&out, "\n");
  }
  return out;
}

// Example 4: the projections, and two scores at scale 1 read from the raw score table.
absl::StatusOr<Result> RunQkv(const Services& s) {
  client::MultiHeadInput in = SeedOneLayer();
  in.return_projections = true;
  in.return_scores = true;
  in.scale = 1.0f;
  absl::StatusOr<client::MultiHeadOutput> r = s.attention.MultiHeadAttend(in);
  if (!r.ok()) return r.status();
  for (absl::Status st : {Returned(r->q, "q"), Returned(r->k, "k"), Returned(r->v, "v"),
                          Returned(r->scores, "scores")}) {
    if (!st.ok()) return st;
  }
  const int64_t n = r->scores->shape[2];
  const float s21 = r->scores->values[2 * n + 1], s12 = r->scores->values[1 * n + 2];
  Result result;
  result.text = absl::StrCat(
      PrintRows("q", *r->q), PrintRows("k", *r->k), PrintRows("v", *r->v),
      absl::StrFormat("score(2 asks 1) = q2.k1 = %.3f, score(1 asks 2) = q1.k2 = %.3f\n", s21,
                      s12));
  result.json.Add("q", JsonTensor(*r->q))
      .Add("k", JsonTensor(*r->k))
      .Add("v", JsonTensor(*r->v))
      .Add("scores", JsonTensor(*r->scores))
      .Add("q2_k1", JsonNumber(s21))
      .Add("q1_k2", JsonNumber(s12));
  return result;
}

// Example 5: the server's sqrt(d_head) experiment with the lesson's defaults (seed 5).
absl::StatusOr<Result> RunScaling(const Services& s) {
  absl::StatusOr<v1::ScalingExperimentResponse> r =
      s.attention.ScalingExperiment(v1::ScalingExperimentRequest());
  if (!r.ok()) return r.status();
  Result result;
  result.text =
      "d_head   std of q.k   sqrt(d_head)   largest weight, unscaled   largest weight, scaled\n";
  for (const v1::ScalingRow& row : r->rows()) {
    absl::StrAppend(&result.text,
                    absl::StrFormat("%6d   %10.2f   %12.2f   %24.3f   %22.3f\n", row.head_dim(),
                                    row.score_std(), row.sqrt_head_dim(),
                                    row.mean_max_weight_unscaled(), row.mean_max_weight_scaled()));
  }
  result.json.Add("experiment", ToJson(*r));
  return result;
}

// Rows of the first head of a [heads, n_q, n_kv] tensor as Java's "%<width>.3f" each.
std::string PrintMatrix(const FloatTensor& t, int width) {
  std::string out;
  for (int64_t i = 0; i < t.shape[1]; ++i) {
    for (int64_t j = 0; j < t.shape[2]; ++j) {
      const float v = t.values[static_cast<size_t>(i * t.shape[2] + j)];
      // Java's %f prints infinities as "Infinity", padded to the width like a number.
      absl::StrAppend(&out, std::isinf(v) ? absl::StrFormat("%*s", width, JavaFloat(v))
                                          : absl::StrFormat("%*.3f", width, v));
    }
    absl::StrAppend(&out, "\n");
  }
  return out;
}

// Example 6: the score table 1 + 0.5 * ((3i + 5j) mod 4) made by one-hot queries (q_i = e_i)
// and keys whose column j is the table's column, at scale 1, under the causal mask.
absl::StatusOr<Result> RunCausal(const Services& s) {
  constexpr int64_t n = 4;
  client::AttendInput in;
  in.q = {{n, 1, n}, std::vector<float>(n * n, 0.0f)};
  in.k = in.q;
  for (int64_t i = 0; i < n; ++i) {
    in.q.values[static_cast<size_t>(i * n + i)] = 1.0f;
    for (int64_t j = 0; j < n; ++j) {
      in.k.values[static_cast<size_t>(j * n + i)] =
          1.0f + 0.5f * static_cast<float>((3 * i + 5 * j) % 4);
    }
  }
  in.v = in.q;
  in.scale = 1.0f;
  in.mask.causal = true;
  in.return_weights = true;
  in.return_scores = true;
  absl::StatusOr<client::AttendOutput> r = s.attention.Attend(in);
  if (!r.ok()) return r.status();
  for (absl::Status st :
       {Returned(r->scores, "scores"), Returned(r->masked_scores, "masked scores"),
        Returned(r->weights, "weights")}) {
    if (!st.ok()) return st;
  }
  Result result;
  result.text = absl::StrCat("raw scores:\n", PrintMatrix(*r->scores, 9), "after the mask:\n",
                             PrintMatrix(*r->masked_scores, 9), "weights (softmax per row):\n",
                             PrintMatrix(*r->weights, 9));
  result.json.Add("scores", JsonTensor(*r->scores))
      .Add("masked_scores", JsonTensor(*r->masked_scores))
      .Add("weights", JsonTensor(*r->weights));
  result.weights = Weights{*r->weights, in.mask, {"The", "cat", "sat", "down"}, {}};
  return result;
}

std::string PrintPositions(const FloatTensor& out) {
  std::string text;
  for (int64_t i = 0; i < out.shape[0]; ++i) {
    const std::vector<float> row = Row(out, i);
    absl::StrAppend(&text, absl::StrFormat("position %d: %7.3f %7.3f\n", i, row[0], row[1]));
  }
  return text;
}

// Example 7: the seeded layer of Example 4 with the scale 1/sqrt(2) and the causal mask.
absl::StatusOr<Result> RunFullAttention(const Services& s) {
  client::MultiHeadInput in = SeedOneLayer();
  in.mask.causal = true;
  in.return_weights = true;
  absl::StatusOr<client::MultiHeadOutput> r = s.attention.MultiHeadAttend(in);
  if (!r.ok()) return r.status();
  if (absl::Status st = Returned(r->weights, "weights"); !st.ok()) return st;
  Result result;
  result.text =
      absl::StrCat("attention weights (row = asking position, column = position looked at):\n",
                   PrintMatrix(*r->weights, 8), "outputs:\n", PrintPositions(r->output));
  result.json.Add("weights", JsonTensor(*r->weights)).Add("output", JsonTensor(r->output));
  result.weights = Weights{*r->weights, in.mask, {}, {}};
  return result;
}

// Example 8: the "matrix" is the one MultiHeadAttend call of Example 7; the "loop" attends each
// position's query alone over keys 0..i (one Attend call per position, no mask), from the
// projections that call returned. The lesson prints whether they differ by less than 1e-6.
absl::StatusOr<Result> RunMatrixForm(const Services& s) {
  client::MultiHeadInput in = SeedOneLayer();
  in.mask.causal = true;
  in.return_projections = true;
  in.return_weights = true;
  absl::StatusOr<client::MultiHeadOutput> m = s.attention.MultiHeadAttend(in);
  if (!m.ok()) return m.status();
  for (absl::Status st : {Returned(m->q, "q"), Returned(m->k, "k"), Returned(m->v, "v"),
                          Returned(m->weights, "weights")}) {
    if (!st.ok()) return st;
  }
  const int64_t n = m->output.shape[0];
  double max_diff = 0;
  std::vector<float> loop;
  for (int64_t i = 0; i < n; ++i) {
    client::AttendInput one;
    one.q = {{1, 1, 2}, Row(*m->q, i)};
    one.k = {{i + 1, 1, 2}, {m->k->values.begin(), m->k->values.begin() + (i + 1) * 2}};
    one.v = {{i + 1, 1, 2}, {m->v->values.begin(), m->v->values.begin() + (i + 1) * 2}};
    absl::StatusOr<client::AttendOutput> r = s.attention.Attend(one);
    if (!r.ok()) return r.status();
    const std::vector<float> matrix_row = Row(m->output, i);
    for (size_t d = 0; d < matrix_row.size(); ++d) {
      loop.push_back(r->output.values[d]);
      max_diff = std::max(max_diff, std::abs(static_cast<double>(r->output.values[d]) -
                                             static_cast<double>(matrix_row[d])));
    }
  }
  Result result;
  result.text = absl::StrCat(
      PrintPositions(m->output),
      "largest difference to the loop version below 1e-6: ", max_diff < 1e-6 ? "true" : "false",
      "\n", absl::StrFormat("(largest difference: %g)\n", max_diff));
  result.json.Add("output", JsonTensor(m->output))
      .Add("loop_output", JsonNumbers(loop))
      .Add("max_difference", JsonNumber(max_diff));
  result.weights = Weights{*m->weights, in.mask, {}, {}};
  return result;
}

}  // namespace

std::vector<Example> Lesson003Examples() {
  return {
      {"context-mixing", "003 Example 1", "bank mixed 50-50 with river or money, and cosines",
       RunContextMixing},
      {"uniform-average", "003 Example 2", "running average of four vectors (causal, equal scores)",
       RunUniformAverage},
      {"weighted-average", "003 Example 3", "the last vector's dot-product weights and mix",
       RunWeightedAverage},
      {"qkv", "003 Example 4", "q/k/v of seed 1; q2.k1 = 0.407, q1.k2 = -0.417", RunQkv},
      {"scaling", "003 Example 5", "why scores are divided by sqrt(d_head) (seed 5)", RunScaling},
      {"causal", "003 Example 6", "raw and masked score tables and the causal weights", RunCausal},
      {"full-attention", "003 Example 7", "causal single-head attention of seed 1",
       RunFullAttention},
      {"matrix-form", "003 Example 8", "one matrix call against per-position calls", RunMatrixForm},
  };
}

}  // namespace attend::cli::examples
