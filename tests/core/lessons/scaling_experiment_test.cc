#include "core/lessons/scaling_experiment.h"

#include "core/lessons/java_random.h"
#include "tests/test_util.h"

namespace attend {
namespace {

using ::attend::testing::StatusIs;

// java.util.Random's documented behaviour for seed 42.
TEST(JavaRandom, MatchesJavaUtilRandom) {
  JavaRandom ints(42);
  EXPECT_EQ(ints.Next(32), -1170105035);
  JavaRandom gaussians(42);
  EXPECT_DOUBLE_EQ(gaussians.NextGaussian(), 1.1419053154730547);
  EXPECT_DOUBLE_EQ(gaussians.NextGaussian(), 0.9194079489827879);
}

// Lesson 3, Example 5, with its seed 5: the spread of q.k follows sqrt(d_head), and only the
// scaled softmax keeps its largest weight flat.
TEST(ScalingExperiment, ReproducesTheLessonTable) {
  auto rows = RunScalingExperiment({});
  ASSERT_TRUE(rows.ok()) << rows.status();
  ASSERT_EQ(rows->size(), 3u);
  const double std_dev[] = {2.00, 8.23, 31.67};
  const double sqrt_d[] = {2.00, 8.00, 32.00};
  const double unscaled[] = {0.576, 0.875, 0.965};
  const double scaled[] = {0.369, 0.359, 0.358};
  for (int i = 0; i < 3; ++i) {
    EXPECT_NEAR((*rows)[i].score_std, std_dev[i], 0.005);
    EXPECT_NEAR((*rows)[i].sqrt_head_dim, sqrt_d[i], 1e-12);
    EXPECT_NEAR((*rows)[i].mean_max_weight_unscaled, unscaled[i], 0.0005);
    EXPECT_NEAR((*rows)[i].mean_max_weight_scaled, scaled[i], 0.0005);
  }
}

TEST(ScalingExperiment, UnscaledSaturatesWhileScaledStaysFlat) {
  ScalingConfig config;
  config.head_dims = {2, 16, 128, 512};
  config.seed = 12345;
  auto rows = RunScalingExperiment(config);
  ASSERT_TRUE(rows.ok());
  for (size_t i = 1; i < rows->size(); ++i) {
    EXPECT_GT((*rows)[i].mean_max_weight_unscaled, (*rows)[i - 1].mean_max_weight_unscaled);
    EXPECT_NEAR((*rows)[i].mean_max_weight_scaled, (*rows)[0].mean_max_weight_scaled, 0.05);
  }
}

TEST(ScalingExperiment, SameSeedSameNumbers) {
  ScalingConfig config;
  config.head_dims = {8};
  config.seed = 99;
  auto a = RunScalingExperiment(config);
  auto b = RunScalingExperiment(config);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ((*a)[0].score_std, (*b)[0].score_std);
}

TEST(ScalingExperiment, RejectsBadSizes) {
  ScalingConfig config;
  config.head_dims = {4, 0};
  EXPECT_THAT(RunScalingExperiment(config),
              StatusIs(absl::StatusCode::kInvalidArgument, {"head_dims[1]"}));
  config = {};
  config.keys = 0;
  EXPECT_THAT(RunScalingExperiment(config), StatusIs(absl::StatusCode::kInvalidArgument, {"keys"}));
  config = {};
  config.head_dims = {};
  EXPECT_THAT(RunScalingExperiment(config),
              StatusIs(absl::StatusCode::kInvalidArgument, {"head_dims"}));
}

TEST(ScalingExperiment, BoundsTheWork) {
  ScalingConfig config;
  config.head_dims = {int64_t{1} << 40};
  EXPECT_THAT(RunScalingExperiment(config),
              StatusIs(absl::StatusCode::kResourceExhausted, {"random draws"}));
}

}  // namespace
}  // namespace attend
