#include "core/lessons/scaling_experiment.h"

#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"
#include "core/base/status_macros.h"
#include "core/base/tensor.h"
#include "core/lessons/java_random.h"

namespace attend {
namespace {

// Largest softmax weight of scores / divisor: 1 / sum(exp(s / divisor - max)).
double LargestWeight(const std::vector<double>& scores, double divisor) {
  double max = -std::numeric_limits<double>::infinity();
  for (double s : scores) max = std::max(max, s / divisor);
  double sum = 0.0;
  for (double s : scores) sum += std::exp(s / divisor - max);
  return 1.0 / sum;
}

double Dot(JavaRandom& random, int64_t head_dim) {
  double dot = 0.0;
  for (int64_t i = 0; i < head_dim; ++i) dot += random.NextGaussian() * random.NextGaussian();
  return dot;
}

}  // namespace

absl::StatusOr<std::vector<ScalingRow>> RunScalingExperiment(const ScalingConfig& config) {
  if (config.head_dims.empty()) {
    return absl::InvalidArgumentError("head_dims: empty; give at least one head size");
  }
  for (const auto& [name, value] : {std::pair<const char*, int64_t>{"pairs", config.pairs},
                                    {"trials", config.trials},
                                    {"keys", config.keys}}) {
    if (value < 1) {
      return absl::InvalidArgumentError(absl::StrCat(name, ": ", value, "; must be >= 1"));
    }
  }
  // Draws per head size: 2 per product, head_dim products per dot, pairs + trials x keys dots.
  std::optional<int64_t> dots_per_dim = CheckedMul(config.trials, config.keys);
  if (dots_per_dim) dots_per_dim = CheckedAdd(*dots_per_dim, config.pairs);
  int64_t draws = 0;
  for (size_t i = 0; i < config.head_dims.size(); ++i) {
    const int64_t d = config.head_dims[i];
    if (d < 1) {
      return absl::InvalidArgumentError(absl::StrCat("head_dims[", i, "]: ", d, "; must be >= 1"));
    }
    std::optional<int64_t> these = dots_per_dim ? CheckedMul(*dots_per_dim, 2 * d) : std::nullopt;
    std::optional<int64_t> total = these ? CheckedAdd(draws, *these) : std::nullopt;
    if (!total || *total > config.max_draws) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "head_dims x 2 x (pairs + trials x keys) exceeds the limit of ", config.max_draws,
          " random draws; use fewer or smaller head_dims, pairs, trials or keys"));
    }
    draws = *total;
  }

  JavaRandom random(config.seed);
  std::vector<ScalingRow> rows;
  std::vector<double> scores(static_cast<size_t>(config.keys));
  for (int64_t d : config.head_dims) {
    double sum_squares = 0.0;
    for (int64_t p = 0; p < config.pairs; ++p) {
      if (p % 256 == 0) {
        ATTEND_RETURN_IF_ERROR(CheckCancelled(config.cancel, "the experiment"));
      }
      const double dot = Dot(random, d);
      sum_squares += dot * dot;
    }
    ScalingRow row;
    row.head_dim = d;
    row.score_std = std::sqrt(sum_squares / static_cast<double>(config.pairs));
    row.sqrt_head_dim = std::sqrt(static_cast<double>(d));
    double unscaled = 0.0, scaled = 0.0;
    for (int64_t t = 0; t < config.trials; ++t) {
      if (t % 64 == 0) {
        ATTEND_RETURN_IF_ERROR(CheckCancelled(config.cancel, "the experiment"));
      }
      for (double& s : scores) s = Dot(random, d);
      unscaled += LargestWeight(scores, 1.0);
      scaled += LargestWeight(scores, row.sqrt_head_dim);
    }
    row.mean_max_weight_unscaled = unscaled / static_cast<double>(config.trials);
    row.mean_max_weight_scaled = scaled / static_cast<double>(config.trials);
    rows.push_back(row);
  }
  return rows;
}

}  // namespace attend
