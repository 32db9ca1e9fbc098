// Helpers shared by the planner tests.
#ifndef ATTEND_TESTS_PLANNER_PLANNER_TEST_UTIL_H_
#define ATTEND_TESTS_PLANNER_PLANNER_TEST_UTIL_H_

#include <string>

#include "gtest/gtest.h"
#include "planner/catalog.h"
#include "planner/model.h"

namespace attend::planner::testing {

// Expects every shape-bearing field of `actual` to equal `expected` (names, sources and the
// parameter-count wording may differ).
inline void ExpectSameShape(const ModelSpec& actual, const ModelSpec& expected) {
  SCOPED_TRACE(expected.name);
  EXPECT_EQ(actual.architecture, expected.architecture);
  EXPECT_EQ(actual.layers, expected.layers);
  EXPECT_EQ(actual.n_head, expected.n_head);
  EXPECT_EQ(actual.n_head_kv, expected.n_head_kv);
  EXPECT_EQ(actual.head_dim, expected.head_dim);
  EXPECT_EQ(actual.head_dim_v, expected.head_dim_v);
  EXPECT_EQ(actual.d_model, expected.d_model);
  EXPECT_EQ(actual.vocab_size, expected.vocab_size);
  EXPECT_EQ(actual.intermediate_size, expected.intermediate_size);
  EXPECT_EQ(actual.experts, expected.experts);
  EXPECT_EQ(actual.experts_active, expected.experts_active);
  EXPECT_EQ(actual.parameters, expected.parameters);
  EXPECT_EQ(actual.active_parameters, expected.active_parameters);
  EXPECT_EQ(actual.max_context_tokens, expected.max_context_tokens);
  EXPECT_EQ(actual.weights_dtype, expected.weights_dtype);
  EXPECT_EQ(actual.tied_embeddings, expected.tied_embeddings);
  ASSERT_EQ(actual.layer_specs.size(), expected.layer_specs.size());
  for (size_t i = 0; i < actual.layer_specs.size(); ++i) {
    EXPECT_EQ(actual.layer_specs[i].n_head_kv, expected.layer_specs[i].n_head_kv) << "layer " << i;
    EXPECT_EQ(actual.layer_specs[i].window_tokens, expected.layer_specs[i].window_tokens)
        << "layer " << i;
    EXPECT_EQ(actual.layer_specs[i].kind, expected.layer_specs[i].kind) << "layer " << i;
    EXPECT_EQ(actual.layer_specs[i].kv_lora_rank, expected.layer_specs[i].kv_lora_rank)
        << "layer " << i;
    EXPECT_EQ(actual.layer_specs[i].qk_rope_head_dim, expected.layer_specs[i].qk_rope_head_dim)
        << "layer " << i;
    EXPECT_EQ(actual.layer_specs[i].conv_state_values, expected.layer_specs[i].conv_state_values)
        << "layer " << i;
    EXPECT_EQ(actual.layer_specs[i].recurrent_state_values,
              expected.layer_specs[i].recurrent_state_values)
        << "layer " << i;
  }
}

// The catalog preset `name`; fails the test when it is missing.
inline ModelSpec Preset(const std::string& name) {
  absl::StatusOr<ModelSpec> m = FindModel(name);
  EXPECT_TRUE(m.ok()) << m.status();
  return m.ok() ? *m : ModelSpec{};
}

}  // namespace attend::planner::testing

#endif  // ATTEND_TESTS_PLANNER_PLANNER_TEST_UTIL_H_
