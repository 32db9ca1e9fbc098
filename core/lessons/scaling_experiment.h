// The sqrt(d_head) experiment: for each head size, the spread of q.k for random unit-variance
// vectors, and the mean largest softmax weight over a few keys with and without dividing the
// scores by sqrt(d_head). Unscaled, the largest weight climbs towards 1 as d_head grows (softmax
// saturates); scaled, it stays flat.
//
// Thread-safety: pure function.
#ifndef ATTEND_CORE_LESSONS_SCALING_EXPERIMENT_H_
#define ATTEND_CORE_LESSONS_SCALING_EXPERIMENT_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "core/base/cancellation.h"

namespace attend {

struct ScalingConfig {
  std::vector<int64_t> head_dims = {4, 64, 1024};
  int64_t pairs = 2000;
  int64_t trials = 500;
  int64_t keys = 8;
  int64_t seed = 5;
  // Bound on Gaussian draws (head_dim x (2 pairs + 2 trials x keys) summed over head_dims), so
  // that one request cannot occupy a worker for minutes.
  int64_t max_draws = int64_t{1} << 30;
  // Optional: when set during the run, it stops and returns CANCELLED.
  const Cancellation* cancel = nullptr;
};

struct ScalingRow {
  int64_t head_dim = 0;
  double score_std = 0.0;
  double sqrt_head_dim = 0.0;
  double mean_max_weight_unscaled = 0.0;
  double mean_max_weight_scaled = 0.0;
};

// Runs the experiment with java.util.Random's generator seeded with config.seed, drawing in the
// same order as the lesson's program, so that seed 5 with the defaults reproduces its table.
// INVALID_ARGUMENT for non-positive sizes; RESOURCE_EXHAUSTED over max_draws.
absl::StatusOr<std::vector<ScalingRow>> RunScalingExperiment(const ScalingConfig& config);

}  // namespace attend

#endif  // ATTEND_CORE_LESSONS_SCALING_EXPERIMENT_H_
