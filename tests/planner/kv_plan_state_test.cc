// PlanKvCache and EstimateCost with layers that hold a fixed state per sequence (linear
// attention, state space) beside KV layers: the state is reported on its own and counted in every
// per-sequence figure, budgets and paging account for it, and validation refuses fields that do
// not belong to a layer's kind. The figures are computed by hand in the comments.
#include <cstdint>

#include "planner/cost.h"
#include "planner/hardware.h"
#include "planner/kv_plan.h"
#include "planner/model.h"
#include "tests/test_util.h"

namespace attend::planner {
namespace {

using ::attend::testing::StatusIs;

constexpr auto kInvalid = absl::StatusCode::kInvalidArgument;

LayerSpec State(int64_t conv, int64_t recurrent) {
  LayerSpec l;
  l.kind = LayerKind::kStateSpace;
  l.conv_state_values = conv;
  l.recurrent_state_values = recurrent;
  return l;
}

// Two attention layers (2 KV heads of 8) and two state-space layers of 10 + 90 values. In
// float16: 2 x 2 x (8 + 8) x 2 = 128 bytes per token, and 2 x 100 x 2 = 400 bytes of state.
ModelSpec Hybrid() {
  ModelSpec m;
  m.name = "hybrid";
  m.layers = 4;
  m.n_head = 4;
  m.n_head_kv = 2;
  m.head_dim = 8;
  m.layer_specs = {LayerSpec{2, 0}, State(10, 90), LayerSpec{2, 0}, State(10, 90)};
  return m;
}

KvPlan Plan(const ModelSpec& m, KvPlanRequest r) {
  absl::StatusOr<KvPlan> p = PlanKvCache(m, r);
  EXPECT_TRUE(p.ok()) << p.status();
  return p.ok() ? *p : KvPlan{};
}

// 100 tokens: 128 x 100 + 400 = 13,200 bytes a sequence, 39,600 for 3; the halves are 6,400
// each, the KV part.
TEST(KvPlanState, StateIsPartOfEverySequenceAndReportedApart) {
  KvPlanRequest r;
  r.context_tokens = 100;
  r.batch = 3;
  const KvPlan p = Plan(Hybrid(), r);
  EXPECT_EQ(p.bytes_per_token, 128);
  EXPECT_EQ(p.state_bytes_per_sequence, 400);
  EXPECT_EQ(p.state_total_bytes, 1200);
  EXPECT_EQ(p.bytes_per_sequence, 13200);
  EXPECT_EQ(p.total_bytes, 39600);
  EXPECT_EQ(p.k_bytes_per_sequence + p.v_bytes_per_sequence, 12800);
  EXPECT_EQ(p.state_dtype, KvDType::kFloat16);
  // A float32 state doubles only the state: 2 x 100 x 4 = 800.
  r.state_dtype = KvDType::kFloat32;
  EXPECT_EQ(Plan(Hybrid(), r).state_bytes_per_sequence, 800);
}

// 40,000 bytes for 3 sequences of 100 tokens: they need 39,600 and fit; 40,000 / 13,200 = 3
// sequences; the longest context for 3 is 101 (3 x (400 + 128 x 101) = 39,984; 102 needs
// 40,368). With 10,000 bytes one sequence reaches (10,000 - 400) / 128 = 75 tokens. With 300
// bytes not even the state of one sequence fits.
TEST(KvPlanState, BudgetsLeaveRoomForTheState) {
  KvPlanRequest r;
  r.context_tokens = 100;
  r.batch = 3;
  r.memory_budget_bytes = 40000;
  const KvPlan fits = Plan(Hybrid(), r);
  ASSERT_TRUE(fits.budget.has_value());
  EXPECT_TRUE(fits.budget->fits);
  EXPECT_EQ(fits.budget->max_sequences, 3);
  EXPECT_EQ(fits.budget->max_context_tokens, 101);
  r.batch = 1;
  r.memory_budget_bytes = 10000;
  const KvPlan one = Plan(Hybrid(), r);
  EXPECT_FALSE(one.budget->fits);
  EXPECT_EQ(one.budget->max_sequences, 0);
  EXPECT_EQ(one.budget->max_context_tokens_one_sequence, 75);
  r.memory_budget_bytes = 300;
  const KvPlan none = Plan(Hybrid(), r);
  EXPECT_EQ(none.budget->max_context_tokens, 0);
  EXPECT_EQ(none.budget->max_context_tokens_one_sequence, 0);
}

// 16-token blocks at 100 tokens: the attention layers hold ceil(100 / 16) = 7 blocks, 112 slots x
// 128 = 14,336 bytes, and the state's 400 is allocated as it is (not paged): 14,736 a sequence,
// 1,536 of it unused.
TEST(KvPlanState, PagingAppliesToKvLayersOnly) {
  KvPlanRequest r;
  r.context_tokens = 100;
  r.block_tokens = 16;
  const KvPlan p = Plan(Hybrid(), r);
  ASSERT_TRUE(p.paged.has_value());
  EXPECT_EQ(p.paged->blocks_per_sequence, 7);
  EXPECT_EQ(p.paged->allocated_bytes_per_sequence, 14736);
  EXPECT_EQ(p.paged->waste_bytes, 1536);
}

// Without KV layers the cache is the state at any length, and memory never limits the context.
TEST(KvPlanState, StateOnlyModelIsUnboundedInContext) {
  ModelSpec m;
  m.name = "mamba";
  m.layers = 2;
  m.layer_specs = {State(10, 90), State(10, 90)};
  KvPlanRequest r;
  r.context_tokens = 1000000;
  r.memory_budget_bytes = 4000;
  r.batch = 2;
  const KvPlan p = Plan(m, r);
  EXPECT_EQ(p.bytes_per_token, 0);
  EXPECT_EQ(p.bytes_per_sequence, 400);
  EXPECT_TRUE(p.budget->context_unbounded);
  EXPECT_EQ(p.budget->max_sequences, 10);
  EXPECT_TRUE(p.variants.empty());
}

// A model that caches nothing (every layer feed-forward) has no cache to plan: refused, with or
// without a budget, rather than dividing a budget by zero bytes per sequence.
TEST(KvPlanState, ModelThatCachesNothingIsRefused) {
  ModelSpec m;
  m.name = "mlp-only";
  m.layers = 4;
  m.n_head = 8;
  m.n_head_kv = 2;
  m.head_dim = 64;
  LayerSpec ff;
  ff.kind = LayerKind::kFeedForward;
  m.layer_specs = {ff, ff, ff, ff};
  EXPECT_THAT(ValidateModel(m), StatusIs(kInvalid, {"layer_specs: every layer is feed_forward"}));
  KvPlanRequest r;
  r.context_tokens = 100;
  r.memory_budget_bytes = int64_t{1} << 30;
  EXPECT_THAT(PlanKvCache(m, r).status(), StatusIs(kInvalid, {"every layer is feed_forward"}));
  r.memory_budget_bytes = 0;
  r.replica_memory_bytes = int64_t{1} << 30;
  EXPECT_THAT(PlanKvCache(m, r).status(), StatusIs(kInvalid, {"every layer is feed_forward"}));
}

// A decode step of 2 sequences at 100 tokens reads their 2 x 13,200 bytes of cache and writes
// back their 2 x 400 of state: kv_bytes 27,200, of which state 1,600 (read and written).
TEST(KvPlanState, DecodeReadsAndWritesTheState) {
  ModelSpec m = Hybrid();
  m.parameters = 1000;
  m.weights_dtype = "float16";
  CostRequest r;
  r.context_tokens = 100;
  r.batch = 2;
  HardwareProfile hw;
  hw.name = "test";
  hw.peak_flops_bf16 = 1e12;
  hw.memory_bandwidth_bytes_per_second = 1e9;
  absl::StatusOr<CostEstimate> e = EstimateCost(m, r, hw);
  ASSERT_OK(e);
  EXPECT_DOUBLE_EQ(e->decode.kv_bytes, 27200.0);
  EXPECT_DOUBLE_EQ(e->decode.state_bytes, 1600.0);
  EXPECT_DOUBLE_EQ(e->kv_cache_bytes, 26400.0);
  EXPECT_DOUBLE_EQ(e->state_bytes, 800.0);
}

TEST(KvPlanState, ValidationRefusesFieldsOfOtherKinds) {
  ModelSpec m = Hybrid();
  m.layer_specs[1].n_head_kv = 2;
  EXPECT_THAT(ValidateModel(m),
              StatusIs(kInvalid, {"layer_specs[1].n_head_kv: 2 on a state_space layer"}));
  m = Hybrid();
  m.layer_specs[1] = State(0, 0);
  EXPECT_THAT(ValidateModel(m), StatusIs(kInvalid, {"layer_specs[1]: a state_space layer with "
                                                    "no state"}));
  m = Hybrid();
  m.layer_specs[0].kind = LayerKind::kLatentAttention;
  EXPECT_THAT(ValidateModel(m), StatusIs(kInvalid, {"layer_specs[0].kv_lora_rank: 0; must be in "
                                                    "[1, 65536]"}));
  m.layer_specs[0].kv_lora_rank = 16;
  m.layer_specs[0].qk_rope_head_dim = 9;
  EXPECT_THAT(ValidateModel(m), StatusIs(kInvalid, {"layer_specs[0].qk_rope_head_dim: 9; must be "
                                                    "in [0, 8]"}));
  m = Hybrid();
  m.layer_specs[0].kind = LayerKind::kChunkedAttention;
  EXPECT_THAT(ValidateModel(m), StatusIs(kInvalid, {"layer_specs[0].window_tokens: 0; must be in "
                                                    "[1,"}));
  m = Hybrid();
  m.layer_specs[1].recurrent_state_values = kMaxStateValues + 1;
  EXPECT_THAT(ValidateModel(m),
              StatusIs(kInvalid, {"layer_specs[1].recurrent_state_values: 68719476737"}));
  m = Hybrid();
  m.n_head = 0;
  EXPECT_THAT(ValidateModel(m), StatusIs(kInvalid, {"n_head: 0; must be in [1,"}));
}

}  // namespace
}  // namespace attend::planner
