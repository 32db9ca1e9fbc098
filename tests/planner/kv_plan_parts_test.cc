// The parts of a KV plan beyond its totals: the key and value halves, the per-layer projection
// parameter counts, and the fleet of replicas behind the consistent-hash proxy.
#include <algorithm>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "planner/catalog.h"
#include "planner/fleet.h"
#include "planner/kv_plan.h"
#include "tests/planner/kv_plan_test_util.h"
#include "tests/planner/planner_test_util.h"
#include "tests/test_util.h"

namespace attend::planner {
namespace {

using ::attend::planner::testing::GiB;
using ::attend::planner::testing::kGiB;
using ::attend::planner::testing::kInvalid;
using ::attend::planner::testing::kKiB;
using ::attend::planner::testing::LayeredModel;
using ::attend::planner::testing::Plan;
using ::attend::planner::testing::Preset;
using ::attend::planner::testing::Request;
using ::attend::testing::StatusIs;

// Lesson 3, Example 10, the llama.cpp log line for the tiny model at 4096 tokens: "K (f16):
// 2.00 MiB, V (f16): 2.00 MiB" of "size = 4.00 MiB". By hand: each half is 4 layers x 2 KV
// heads x 32 values x 2 bytes = 512 bytes per token, x 4096 tokens = 2,097,152 bytes.
TEST(PlanKvCache, LessonTinyModelKeysAndValues) {
  const KvPlan p = Plan(Preset("tiny"), Request(4096));
  EXPECT_EQ(p.k_bytes_per_token, 512);
  EXPECT_EQ(p.v_bytes_per_token, 512);
  EXPECT_EQ(p.k_bytes_per_sequence, 2097152);
  EXPECT_EQ(p.v_bytes_per_sequence, 2097152);
  EXPECT_EQ(FormatBytes(p.k_bytes_per_sequence), "2.00 MiB");
  EXPECT_EQ(FormatBytes(p.v_bytes_per_sequence), "2.00 MiB");
  EXPECT_EQ(p.k_total_bytes, 2097152);
  EXPECT_EQ(p.v_total_bytes, 2097152);
  EXPECT_EQ(FormatBytes(p.total_bytes), "4.00 MiB");
}

// Lesson 3, Example 10: "per layer: Wq 16,777,216  Wk 4,194,304  Wv 4,194,304  Wo 16,777,216
// parameters" for Llama 3 8B. By hand: Wq = Wo = 4096 x 32 heads x 128 = 16,777,216; Wk = Wv =
// 4096 x 8 heads x 128 = 4,194,304. Every layer has 8 KV heads, so there is one kind.
TEST(PlanKvCache, LessonLlama3EightBProjections) {
  const KvPlan p = Plan(Preset("llama-3-8b"), Request(8192));
  ASSERT_EQ(p.projections.size(), 1u);
  const LayerProjectionKind& k = p.projections[0];
  EXPECT_EQ(k.n_head_kv, 8);
  EXPECT_EQ(k.layers, 32);
  EXPECT_EQ(k.first_layer, 0);
  EXPECT_EQ(k.parameters.wq, 16777216);
  EXPECT_EQ(k.parameters.wk, 4194304);
  EXPECT_EQ(k.parameters.wv, 4194304);
  EXPECT_EQ(k.parameters.wo, 16777216);
  EXPECT_EQ(k.parameters.total(), 41943040);
  // "The key and value matrices have a quarter of the parameters of Wq": 32 / 8 heads.
  EXPECT_EQ(k.parameters.wq, 4 * k.parameters.wk);
  // Lesson 3, Example 9: plain multi-head attention with d_model 4096 has 4 x 4096 x 4096
  // (about 67 million) per layer; Llama 2 7B is that shape.
  const KvPlan mha = Plan(Preset("llama-2-7b"), Request(4096));
  ASSERT_EQ(mha.projections.size(), 1u);
  EXPECT_EQ(mha.projections[0].parameters.total(), 4LL * 4096 * 4096);
}

// Projections differ where n_head_kv does (not where windows do): one kind per distinct
// n_head_kv, in the order of its first layer. A 4-head model of d_model 32 and head size 8:
// Wq = Wo = 32 x 4 x 8 = 1,024, Wk = Wv = 32 x kv x 8 = 256 x kv.
TEST(PlanKvCache, ProjectionsPerDistinctLayerKind) {
  ModelSpec m = LayeredModel({{2, 0}, {4, 16}, {2, 16}, {1, 0}, {4, 0}});
  m.d_model = 32;
  const KvPlan p = Plan(m, Request(64));
  ASSERT_EQ(p.projections.size(), 3u);
  const struct {
    int64_t kv, layers, first, wk;
  } expected[] = {{2, 2, 0, 512}, {4, 2, 1, 1024}, {1, 1, 3, 256}};
  for (size_t i = 0; i < 3; ++i) {
    SCOPED_TRACE(i);
    const LayerProjectionKind& k = p.projections[i];
    EXPECT_EQ(k.n_head_kv, expected[i].kv);
    EXPECT_EQ(k.layers, expected[i].layers);
    EXPECT_EQ(k.first_layer, expected[i].first);
    EXPECT_EQ(k.parameters.wq, 1024);
    EXPECT_EQ(k.parameters.wk, expected[i].wk);
    EXPECT_EQ(k.parameters.wv, expected[i].wk);
    EXPECT_EQ(k.parameters.wo, 1024);
  }
  // Without d_model the projections cannot be sized, and none are reported.
  m.d_model = 0;
  EXPECT_TRUE(Plan(m, Request(64)).projections.empty());
}

// Keys and values differ when head_dim_v != head_dim. By hand, 3 layers x 16 heads in f16:
// keys 3 x 16 x 192 x 2 = 18,432 bytes per token, values 3 x 16 x 128 x 2 = 12,288. In q4_0 a
// 192-value row is 6 blocks (108 bytes) and a 128-value row 4 blocks (72 bytes): 5,184 and 3,456.
TEST(PlanKvCache, KeyAndValueHalvesFollowTheirHeadSizes) {
  ModelSpec m;
  m.name = "mla-like";
  m.layers = 3;
  m.n_head = 16;
  m.n_head_kv = 16;
  m.head_dim = 192;
  m.head_dim_v = 128;
  const KvPlan f16 = Plan(m, Request(10, 3));
  EXPECT_EQ(f16.k_bytes_per_token, 18432);
  EXPECT_EQ(f16.v_bytes_per_token, 12288);
  EXPECT_EQ(f16.k_bytes_per_sequence, 184320);
  EXPECT_EQ(f16.v_bytes_per_sequence, 122880);
  EXPECT_EQ(f16.k_total_bytes, 552960);
  EXPECT_EQ(f16.v_total_bytes, 368640);
  const KvPlan q4 = Plan(m, Request(10, 1, KvDType::kQ4_0));
  EXPECT_EQ(q4.k_bytes_per_token, 5184);
  EXPECT_EQ(q4.v_bytes_per_token, 3456);
  EXPECT_EQ(q4.bytes_per_token, 5184 + 3456);
}

// An 80-value head row in q8_0 is padded to 3 blocks (102 bytes) in each half, as in the total:
// 2 layers x 1 KV head x 102 = 204 bytes per token per half, not 80 x 8.5 / 8 = 85 per row.
TEST(PlanKvCache, BlockFormatsPadEachHalfToWholeBlocks) {
  ModelSpec odd;
  odd.name = "odd";
  odd.layers = 2;
  odd.n_head = 4;
  odd.n_head_kv = 1;
  odd.head_dim = 80;
  const KvPlan p = Plan(odd, Request(7, 1, KvDType::kQ8_0));
  EXPECT_EQ(p.k_bytes_per_token, 204);
  EXPECT_EQ(p.v_bytes_per_token, 204);
  EXPECT_EQ(p.k_bytes_per_sequence, 7 * 204);
  EXPECT_EQ(p.bytes_per_sequence, 2 * 7 * 204);
}

// Sliding layers keep at most their window in each half. Gemma 2 9B at 8192 tokens, by hand:
// per layer per token, one half is 8 KV heads x 256 x 2 = 4,096 bytes; 21 global layers keep
// 8,192 tokens and 21 sliding ones 4,096: 21 x 4,096 x (8,192 + 4,096) = 1,056,964,608 per half.
TEST(PlanKvCache, KeyAndValueHalvesStopAtTheWindow) {
  const KvPlan p = Plan(Preset("gemma-2-9b"), Request(8192, 2));
  EXPECT_EQ(p.k_bytes_per_sequence, 1056964608);
  EXPECT_EQ(p.v_bytes_per_sequence, 1056964608);
  EXPECT_EQ(p.k_bytes_per_token, 42 * 4096);
  EXPECT_EQ(p.k_total_bytes, 2 * 1056964608LL);
  // Mistral: every layer slides over 4096, so each half stops at 32 x 8 x 128 x 2 x 4096 bytes.
  const KvPlan mistral = Plan(Preset("mistral-7b"), Request(32768));
  EXPECT_EQ(mistral.k_bytes_per_sequence, 32LL * 8 * 128 * 2 * 4096);
  EXPECT_EQ(mistral.v_bytes_per_sequence, 32LL * 8 * 128 * 2 * 4096);
}

// For every preset and KV type, at contexts inside, at and past the sliding windows and with a
// batch, the halves add up to the total exactly, per token, per sequence and for the batch.
TEST(PlanKvCache, HalvesSumToTheTotalForEveryPresetAndDType) {
  for (const ModelSpec& m : Catalog()) {
    for (KvDType dtype : {KvDType::kFloat32, KvDType::kFloat16, KvDType::kBFloat16, KvDType::kFp8,
                          KvDType::kInt8, KvDType::kQ8_0, KvDType::kQ4_0}) {
      for (int64_t context : {int64_t{1}, int64_t{4095}, int64_t{4096}, int64_t{5000}}) {
        SCOPED_TRACE(absl::StrFormat("%s %s %d", m.name, DTypeName(dtype), context));
        const KvPlan p = Plan(m, Request(context, 3, dtype));
        // The halves split the KV part: the total less the recurrent layers' state.
        EXPECT_EQ(p.k_bytes_per_token + p.v_bytes_per_token, p.bytes_per_token);
        EXPECT_EQ(p.k_bytes_per_sequence + p.v_bytes_per_sequence,
                  p.bytes_per_sequence - p.state_bytes_per_sequence);
        EXPECT_EQ(p.k_total_bytes + p.v_total_bytes, p.total_bytes - p.state_total_bytes);
        if (!HasKvLayers(p.model)) {
          EXPECT_EQ(p.k_bytes_per_sequence, 0);
          EXPECT_EQ(p.v_bytes_per_sequence, 0);
        } else if (std::any_of(m.layer_specs.begin(), m.layer_specs.end(), [](const LayerSpec& l) {
                     return l.kind == LayerKind::kLatentAttention;
                   })) {
          // A latent row (and an indexer's key) is counted in the key half (kv_plan.h); the
          // latent presets' KV layers are all latent.
          EXPECT_GT(p.k_bytes_per_sequence, 0);
          EXPECT_EQ(p.v_bytes_per_sequence, 0);
        } else if (p.model.head_dim_v != p.model.head_dim) {
          // MiMo-V2-Flash: keys of 192, values of 128.
          EXPECT_GT(p.k_bytes_per_sequence, p.v_bytes_per_sequence);
          EXPECT_GT(p.v_bytes_per_sequence, 0);
        } else {
          // Every other preset has head_dim_v == head_dim, so the halves are equal.
          EXPECT_GT(p.k_bytes_per_sequence, 0);
          EXPECT_EQ(p.k_bytes_per_sequence, p.v_bytes_per_sequence);
        }
        // Projections are of the plain (and chunked) attention layers only.
        const bool plain =
            m.layer_specs.empty() ||
            std::any_of(m.layer_specs.begin(), m.layer_specs.end(), [](const LayerSpec& l) {
              return l.kind == LayerKind::kAttention || l.kind == LayerKind::kChunkedAttention;
            });
        EXPECT_EQ(p.projections.empty(), m.d_model == 0 || !plain);
      }
    }
  }
}

// "How many replicas for 500 users?": Llama 3 70B, 32k context, fp8 cache, 64 GiB per replica.
TEST(PlanKvCache, FleetForFiveHundredUsers) {
  const ModelSpec m = Preset("llama-3-70b");
  KvPlanRequest r = Request(32768, 500, KvDType::kFp8);
  r.replica_memory_bytes = 64 * kGiB;
  const KvPlan p = Plan(m, r);
  ASSERT_TRUE(p.fleet.has_value());
  EXPECT_FALSE(p.budget.has_value());
  const FleetPlan& f = *p.fleet;
  // By hand: one sequence is 32,768 x 163,840 bytes = 5 GiB, so 64 GiB holds 12; 500 / 12
  // rounds up to 42 replicas if the proxy spread them evenly.
  EXPECT_EQ(f.available_bytes_per_replica, 64 * kGiB);
  EXPECT_EQ(f.sequences_per_replica, 12);
  EXPECT_EQ(f.even_replicas, 42);
  // Hashing needs more; the count is the fewest whose busiest replica fits (planner/fleet.h).
  const FleetSizing sizing = SizeFleet(500, 12);
  EXPECT_EQ(f.replicas, sizing.replicas);
  EXPECT_GT(f.replicas, 42);
  EXPECT_LE(f.busiest_replica_sequences, 12);
  EXPECT_GT(BusiestReplicaSequences(500, f.replicas - 1), 12);
  EXPECT_DOUBLE_EQ(f.mean_sequences_per_replica, 500.0 / f.replicas);
  EXPECT_TRUE(absl::StrContains(f.explanation, "42 if spread evenly")) << f.explanation;
  EXPECT_TRUE(absl::StrContains(f.explanation, "busiest replica")) << f.explanation;

  // The weights come out of every replica, as out of a budget: fp8 weights of 70,553,706,496
  // bytes leave 80 GiB - that = 15,345,639,424 bytes, two 5 GiB sequences.
  r.replica_memory_bytes = 80 * kGiB;
  r.subtract_weights = true;
  r.weights_dtype = "fp8";
  const KvPlan w = Plan(m, r);
  EXPECT_EQ(w.fleet->weights_bytes, 70553706496);
  EXPECT_EQ(w.fleet->available_bytes_per_replica, 80 * kGiB - 70553706496);
  EXPECT_EQ(w.fleet->sequences_per_replica, 2);
  EXPECT_EQ(w.fleet->even_replicas, 250);

  // A replica too small for one sequence: no count, and why.
  r.replica_memory_bytes = 70553706496 + kGiB;
  const KvPlan none = Plan(m, r);
  EXPECT_EQ(none.fleet->replicas, 0);
  EXPECT_EQ(none.fleet->sequences_per_replica, 0);
  EXPECT_TRUE(absl::StrContains(none.fleet->explanation, "Not even one sequence"))
      << none.fleet->explanation;

  // Weights larger than a replica: a negative remainder, and words that say so.
  r.replica_memory_bytes = 64 * kGiB;
  const KvPlan over = Plan(m, r);
  EXPECT_EQ(over.fleet->available_bytes_per_replica, 64 * kGiB - 70553706496);
  EXPECT_LT(over.fleet->available_bytes_per_replica, 0);
  EXPECT_EQ(over.fleet->replicas, 0);
  EXPECT_TRUE(absl::StrContains(over.fleet->explanation, "alone exceed a replica's memory by"))
      << over.fleet->explanation;

  r = Request(32768, 16, KvDType::kFp8);
  r.replica_memory_bytes = -1;
  EXPECT_THAT(PlanKvCache(m, r), StatusIs(kInvalid, {"replica_memory_bytes: -1"}));
}

}  // namespace
}  // namespace attend::planner
