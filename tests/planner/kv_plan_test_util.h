// Helpers of the KV-plan tests: a plan that must succeed, a request, sizes in GiB, and a small
// model of given layers.
#ifndef ATTEND_TESTS_PLANNER_KV_PLAN_TEST_UTIL_H_
#define ATTEND_TESTS_PLANNER_KV_PLAN_TEST_UTIL_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "planner/kv_plan.h"
#include "tests/test_util.h"

namespace attend::planner::testing {

inline constexpr auto kInvalid = absl::StatusCode::kInvalidArgument;
inline constexpr int64_t kGiB = int64_t{1} << 30;
inline constexpr int64_t kKiB = 1024;

inline KvPlan Plan(const ModelSpec& m, const KvPlanRequest& r) {
  absl::StatusOr<KvPlan> plan = PlanKvCache(m, r);
  EXPECT_OK(plan);
  return plan.ok() ? *plan : KvPlan{};
}

inline KvPlanRequest Request(int64_t context, int64_t batch = 1,
                             KvDType dtype = KvDType::kFloat16) {
  KvPlanRequest r;
  r.context_tokens = context;
  r.batch = batch;
  r.kv_dtype = dtype;
  return r;
}

inline std::string GiB(int64_t bytes) {
  return absl::StrFormat("%.2f", static_cast<double>(bytes) / static_cast<double>(kGiB));
}

// A small model with one layer per entry of `layers` ({n_head_kv, window}): 4 query heads of 8
// values, so a layer caches n_head_kv x (8 + 8) x 2 bytes per token in f16.
inline ModelSpec LayeredModel(const std::vector<LayerSpec>& layers) {
  ModelSpec m;
  m.name = "layered";
  m.layers = static_cast<int64_t>(layers.size());
  m.n_head = 4;
  m.n_head_kv = 4;
  m.head_dim = 8;
  m.layer_specs = layers;
  return m;
}

}  // namespace attend::planner::testing

#endif  // ATTEND_TESTS_PLANNER_KV_PLAN_TEST_UTIL_H_
