// Lesson 000 ("Attention"): the "it" example, softmax, the dot product and the spread of dot
// products of +-1 vectors. The lesson shows Python sessions, so the numbers print as Python's
// repr of the rounded values, after "# →" as in the lesson.
#include <cmath>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "client/cli/lessons/example_command.h"
#include "client/cli/render/format.h"

namespace attend::cli::examples {
namespace {

using client::FloatTensor;

// "it" over animal, tired and street: q_it = [1, 1, 1, 1], keys [1, 1, 1, 1], [1, 1, 0, 0],
// [1, 0, 0, 0], values [1, 0], [0, 1], [1, 1], the default scale 1/sqrt(4).
absl::StatusOr<Result> RunIt(const Services& s) {
  client::AttendInput in;
  in.q = {{1, 1, 4}, {1, 1, 1, 1}};
  in.k = {{3, 1, 4}, {1, 1, 1, 1, 1, 1, 0, 0, 1, 0, 0, 0}};
  in.v = {{3, 1, 2}, {1, 0, 0, 1, 1, 1}};
  in.return_weights = true;
  in.return_scores = true;
  absl::StatusOr<client::AttendOutput> r = s.attention.Attend(in);
  if (!r.ok()) return r.status();
  for (absl::Status st : {Returned(r->scores, "scores"), Returned(r->weights, "weights")}) {
    if (!st.ok()) return st;
  }
  const std::vector<double> scores(r->scores->values.begin(), r->scores->values.end());
  const std::vector<double> w(r->weights->values.begin(), r->weights->values.end());
  const std::vector<double> out(r->output.values.begin(), r->output.values.end());
  Result result;
  result.text = absl::StrCat(
      "scores  # → ", PyRounded(scores, 6), "\n", "weights  # → ", PyRounded(w, 2), "\n",
      "blended values  # → ", PyRounded(out, 2), "\n",
      absl::StrFormat("\"it\" is %.0f%% \"animal\", %.0f%% \"tired\" and %.0f%% \"street\"\n",
                      100 * w[0], 100 * w[1], 100 * w[2]));
  result.json.Add("scores", JsonNumbers(r->scores->values))
      .Add("weights", JsonNumbers(r->weights->values))
      .Add("output", JsonNumbers(r->output.values));
  result.weights = Weights{*r->weights, {}, {"animal", "tired", "street"}, {"it"}};
  return result;
}

// softmax of the scores 2.0, 1.0, 0.5. The server returns the shares and log(sum e^z), so
// e^z_i = share_i * sum: the lesson's two steps read backwards.
absl::StatusOr<Result> RunSoftmax(const Services& s) {
  const std::vector<double> z = {2.0, 1.0, 0.5};
  absl::StatusOr<v1::SoftmaxResponse> r = s.attention.Softmax(z, false);
  if (!r.ok()) return r.status();
  const double total = std::exp(r->log_sum_exp());
  std::vector<double> exps, shares;
  for (double p : r->probabilities()) {
    shares.push_back(p);
    exps.push_back(p * total);
  }
  Result result;
  result.text = absl::StrCat(
      "z = [2.0, 1.0, 0.5]  # animal, tired, street\n", "[round(e, 2) for e in exps]  # → ",
      PyRounded(exps, 2), "\n", "round(total, 2)  # → ", JavaDouble(std::round(total * 100) / 100),
      "\n", "[round(e / total, 2) for e in exps]  # → ", PyRounded(shares, 2), "\n");
  result.json.Add("logits", JsonNumbers(z))
      .Add("exps", JsonNumbers(exps))
      .Add("total", JsonExact(total))
      .Add("probabilities", JsonNumbers(shares));
  return result;
}

// q = [1, 2], k = [3, 0.5]: the score at scale 1 is their dot product.
absl::StatusOr<Result> RunDot(const Services& s) {
  client::AttendInput in;
  in.q = {{1, 1, 2}, {1, 2}};
  in.k = {{1, 1, 2}, {3, 0.5f}};
  in.v = {{1, 1, 1}, {1}};
  in.scale = 1.0f;
  in.return_scores = true;
  absl::StatusOr<client::AttendOutput> r = s.attention.Attend(in);
  if (!r.ok()) return r.status();
  if (absl::Status st = Returned(r->scores, "scores"); !st.ok()) return st;
  const float dot = r->scores->values.at(0);
  Result result;
  result.text =
      absl::StrCat("q = [1, 2]\nk = [3, 0.5]\n", "sum(q_m * k_m for q_m, k_m in zip(q, k))  # → ",
                   JavaFloat(dot), "\n");
  result.json.Add("q", "[1, 2]").Add("k", "[3, 0.5]").Add("score", JsonNumber(dot));
  return result;
}

// Population variance, as statistics.pvariance.
double PVariance(const std::vector<float>& xs) {
  double mean = 0, sq = 0;
  for (float x : xs) mean += x;
  mean /= static_cast<double>(xs.size());
  for (float x : xs) sq += (x - mean) * (x - mean);
  return sq / static_cast<double>(xs.size());
}

// d_k = 4, every query/key product pattern of +-1: the query [1, 1, 1, 1] against the 16 keys
// of +-1 gives every sum of four +-1 products. Scored at scale 1 and at 1/sqrt(4); sqrt(128)
// comes from the scaling experiment's sqrt(d_head) column.
absl::StatusOr<Result> RunVariance(const Services& s) {
  client::AttendInput in;
  in.q = {{1, 1, 4}, {1, 1, 1, 1}};
  in.k = {{16, 1, 4}, {}};
  for (int key = 0; key < 16; ++key) {
    // itertools.product([-1, 1], repeat=4) order: the last position changes fastest.
    for (int m = 3; m >= 0; --m) in.k.values.push_back((key >> m) & 1 ? 1.0f : -1.0f);
  }
  in.v = {{16, 1, 1}, std::vector<float>(16, 0.0f)};
  in.return_scores = true;
  std::vector<double> variances;
  for (float scale : {1.0f, 0.5f}) {
    in.scale = scale;
    absl::StatusOr<client::AttendOutput> r = s.attention.Attend(in);
    if (!r.ok()) return r.status();
    if (absl::Status st = Returned(r->scores, "scores"); !st.ok()) return st;
    variances.push_back(PVariance(r->scores->values));
  }
  v1::ScalingExperimentRequest scaling;
  scaling.add_head_dims(128);
  scaling.set_pairs(1);
  scaling.set_trials(1);
  absl::StatusOr<v1::ScalingExperimentResponse> e = s.attention.ScalingExperiment(scaling);
  if (!e.ok()) return e.status();
  const double swing = e->rows(0).sqrt_head_dim();
  Result result;
  // pvariance of integers is an integer in Python; of the scaled floats, a float.
  result.text = absl::StrCat("d_k = 4\n", "statistics.pvariance(scores)  # → ",
                             absl::StrFormat("%.0f", variances[0]), "\n",
                             "statistics.pvariance([s / math.sqrt(d_k) for s in scores])  # → ",
                             JavaDouble(variances[1]), "\n", "round(math.sqrt(128), 1)  # → ",
                             JavaDouble(std::round(swing * 10) / 10), "\n");
  result.json.Add("variance_unscaled", JsonNumber(variances[0]))
      .Add("variance_scaled", JsonNumber(variances[1]))
      .Add("sqrt_128", JsonNumber(swing));
  return result;
}

}  // namespace

std::vector<Example> Lesson000Examples() {
  return {
      {"it", "000 \"it\"", "\"it\" over animal, tired, street: shares 0.63, 0.23, 0.14", RunIt},
      {"softmax", "000 softmax", "softmax of 2, 1, 0.5: e^z 7.39, 2.72, 1.65, total 11.76",
       RunSoftmax},
      {"dot", "000 dot product", "the score of q = [1, 2] and k = [3, 0.5] is 4.0", RunDot},
      {"variance", "000 scaling", "d_k = 4 sums of +-1 products: variance 4, scaled 1.0",
       RunVariance},
  };
}

}  // namespace attend::cli::examples
