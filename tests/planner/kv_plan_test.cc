#include "planner/kv_plan.h"

#include <algorithm>
#include <limits>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_format.h"
#include "planner/catalog.h"
#include "planner/fleet.h"
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

// Blocks of `block` tokens, aligned at position 0, that hold the tokens a layer with `window`
// (0: full attention) keeps at `context`: positions [context - min(context, window), context).
// Counted by listing the blocks, independently of the planner's formula.
int64_t TouchedBlocks(int64_t context, int64_t window, int64_t block) {
  const int64_t first = window > 0 && context > window ? context - window : 0;
  int64_t blocks = 0;
  for (int64_t position = first; position < context; ++position) {
    if (position == first || position / block != (position - 1) / block) ++blocks;
  }
  return blocks;
}

int64_t RowBytes(const LayerSpec& layer) { return layer.n_head_kv * (8 + 8) * 2; }

// Bytes the layers of LayeredModel(layers) are allocated at `context` in blocks of `block`,
// from the listed blocks.
int64_t BruteForceAllocated(const std::vector<LayerSpec>& layers, int64_t context, int64_t block) {
  int64_t bytes = 0;
  for (const LayerSpec& l : layers) {
    bytes += TouchedBlocks(context, l.window_tokens, block) * block * RowBytes(l);
  }
  return bytes;
}

// Lesson 3, Example 10: "tiny model, 4096 tokens: 4,194,304 bytes = 4.00 MiB of KV cache".
TEST(PlanKvCache, LessonTinyModel) {
  const KvPlan p = Plan(Preset("tiny"), Request(4096));
  EXPECT_EQ(p.bytes_per_sequence, 4194304);
  EXPECT_EQ(p.bytes_per_sequence, 2LL * 4 * 2 * 32 * 2 * 4096);
  EXPECT_EQ(FormatBytes(p.bytes_per_sequence), "4.00 MiB");
  EXPECT_EQ(p.bytes_per_token, 1024);
  EXPECT_DOUBLE_EQ(p.bytes_per_value, 2.0);
}

// Lesson 3, Example 10: 32 vs 8 KV heads, 524,288 vs 131,072 bytes per token, 4.00 vs 1.00 GiB
// at 8192 tokens.
TEST(PlanKvCache, LessonLlama3EightBAgainstMultiHead) {
  const KvPlan gqa = Plan(Preset("llama-3-8b"), Request(8192));
  EXPECT_EQ(gqa.bytes_per_token, 131072);
  EXPECT_EQ(gqa.bytes_per_token / 1024, 128);
  EXPECT_EQ(gqa.bytes_per_sequence, 1 * kGiB);
  EXPECT_EQ(GiB(gqa.bytes_per_sequence), "1.00");

  ModelSpec mha = Preset("llama-3-8b");
  mha.n_head_kv = 32;
  const KvPlan full = Plan(mha, Request(8192));
  EXPECT_EQ(full.bytes_per_token, 524288);
  EXPECT_EQ(full.bytes_per_token / 1024, 512);
  EXPECT_EQ(full.bytes_per_sequence, 4 * kGiB);
  EXPECT_EQ(GiB(full.bytes_per_sequence), "4.00");
  // Llama 2 7B is that multi-head shape.
  EXPECT_EQ(Plan(Preset("llama-2-7b"), Request(8192)).bytes_per_token, 524288);
}

// Lesson 3, Example 11: the variants table for 32 layers x 32 heads x 128, f16, 32768 tokens.
TEST(PlanKvCache, LessonVariantsTable) {
  const KvPlan p = Plan(Preset("llama-3-8b"), Request(32768));
  ASSERT_EQ(p.variants.size(), 3u);
  const struct {
    const char* variant;
    int64_t kv, group, kib_per_token;
    const char* gib;
    bool is_model;
  } expected[] = {{"MHA", 32, 1, 512, "16.00", false},
                  {"GQA", 8, 4, 128, "4.00", true},
                  {"MQA", 1, 32, 16, "0.50", false}};
  for (size_t i = 0; i < 3; ++i) {
    const VariantRow& row = p.variants[i];
    SCOPED_TRACE(row.variant);
    EXPECT_EQ(row.variant, expected[i].variant);
    EXPECT_EQ(row.n_head_kv, expected[i].kv);
    EXPECT_EQ(row.group_size, expected[i].group);
    EXPECT_EQ(row.bytes_per_token, expected[i].kib_per_token * kKiB);
    EXPECT_EQ(GiB(row.bytes_per_sequence), expected[i].gib);
    EXPECT_EQ(row.bytes_per_sequence, row.bytes_per_token * 32768);
    EXPECT_EQ(row.is_model, expected[i].is_model);
  }
}

TEST(PlanKvCache, VariantsForMultiHeadAndOddHeadCounts) {
  // A multi-head model gets a GQA row of n_head / 4 KV heads.
  const KvPlan llama2 = Plan(Preset("llama-2-7b"), Request(4096));
  ASSERT_EQ(llama2.variants.size(), 3u);
  EXPECT_TRUE(llama2.variants[0].is_model);
  EXPECT_EQ(llama2.variants[1].n_head_kv, 8);
  // 6 heads: no group size >= 4 divides 6 (other than 6), so groups of 2 (3 KV heads).
  ModelSpec six;
  six.name = "six";
  six.layers = 1;
  six.n_head = 6;
  six.head_dim = 8;
  const KvPlan p6 = Plan(six, Request(10));
  ASSERT_EQ(p6.variants.size(), 3u);
  EXPECT_EQ(p6.variants[1].n_head_kv, 3);
  // 7 heads: prime, so no GQA row.
  six.n_head = 7;
  const KvPlan p7 = Plan(six, Request(10));
  ASSERT_EQ(p7.variants.size(), 2u);
  EXPECT_EQ(p7.variants[0].variant, "MHA");
  EXPECT_EQ(p7.variants[1].variant, "MQA");
}

TEST(PlanKvCache, DTypesScaleTheCache) {
  const ModelSpec m = Preset("llama-3-8b");
  // 32 layers x 8 heads x 2 (K and V) rows of 128 values.
  EXPECT_EQ(Plan(m, Request(1, 1, KvDType::kFloat32)).bytes_per_token, 32 * 8 * 2 * 512);
  EXPECT_EQ(Plan(m, Request(1, 1, KvDType::kBFloat16)).bytes_per_token, 32 * 8 * 2 * 256);
  EXPECT_EQ(Plan(m, Request(1, 1, KvDType::kFp8)).bytes_per_token, 32 * 8 * 2 * 128);
  EXPECT_EQ(Plan(m, Request(1, 1, KvDType::kInt8)).bytes_per_token, 32 * 8 * 2 * 128);
  // q8_0: 4 blocks of 34 bytes per row (8.5 bits per value); q4_0: 4 blocks of 18 bytes.
  EXPECT_EQ(Plan(m, Request(1, 1, KvDType::kQ8_0)).bytes_per_token, 32 * 8 * 2 * 136);
  EXPECT_EQ(Plan(m, Request(1, 1, KvDType::kQ4_0)).bytes_per_token, 32 * 8 * 2 * 72);
  EXPECT_DOUBLE_EQ(Plan(m, Request(1, 1, KvDType::kQ8_0)).bytes_per_value, 1.0625);

  // A head row of 80 values needs 3 whole q8_0 blocks, not 80 x 8.5 / 8 = 85 bytes.
  ModelSpec odd;
  odd.name = "odd";
  odd.layers = 2;
  odd.n_head = 4;
  odd.n_head_kv = 1;
  odd.head_dim = 80;
  EXPECT_EQ(Plan(odd, Request(1, 1, KvDType::kQ8_0)).bytes_per_token, 2 * 1 * 2 * 102);
}

TEST(PlanKvCache, KeyAndValueHeadSizesMayDiffer) {
  ModelSpec m;
  m.name = "mla-like";
  m.layers = 3;
  m.n_head = 16;
  m.n_head_kv = 16;
  m.head_dim = 192;
  m.head_dim_v = 128;
  EXPECT_EQ(Plan(m, Request(1)).bytes_per_token, 3 * 16 * (192 + 128) * 2);
}

// Gemma 2 9B: 21 global layers hold every token, 21 sliding layers at most 4096.
// Per layer per token in f16: 8 KV heads x (256 + 256) values x 2 bytes = 8192 bytes.
TEST(PlanKvCache, Gemma2SlidingWindowByHand) {
  const ModelSpec m = Preset("gemma-2-9b");
  const int64_t per_layer = 8 * (256 + 256) * 2;
  ASSERT_EQ(per_layer, 8192);

  const KvPlan at8k = Plan(m, Request(8192));
  EXPECT_EQ(at8k.bytes_per_sequence, 21 * 8192 * per_layer + 21 * 4096 * per_layer);
  EXPECT_EQ(at8k.bytes_per_sequence, 2113929216);
  EXPECT_EQ(at8k.bytes_per_token, 42 * per_layer);
  EXPECT_EQ(at8k.full_attention_bytes_per_token, 21 * per_layer);
  // Within the window every layer grows.
  EXPECT_EQ(Plan(m, Request(4096)).bytes_per_sequence, 42LL * 4096 * per_layer);
  EXPECT_EQ(Plan(m, Request(100)).bytes_per_sequence, 42LL * 100 * per_layer);
  // Without the windows the cache would be a third larger.
  ModelSpec no_window = m;
  no_window.layer_specs.clear();
  EXPECT_EQ(Plan(no_window, Request(8192)).bytes_per_sequence, 42LL * 8192 * per_layer);
}

TEST(PlanKvCache, MistralCacheStopsGrowingAtTheWindow) {
  const ModelSpec m = Preset("mistral-7b");
  const int64_t at_window = 32LL * 8 * 2 * 128 * 2 * 4096;  // 512 MiB
  EXPECT_EQ(Plan(m, Request(4096)).bytes_per_sequence, at_window);
  EXPECT_EQ(Plan(m, Request(32768)).bytes_per_sequence, at_window);
  EXPECT_EQ(Plan(m, Request(32768)).full_attention_bytes_per_token, 0);
}

TEST(PlanKvCache, PagedRoundingAndWaste) {
  KvPlanRequest r = Request(4097, 3);
  r.block_tokens = 16;
  const KvPlan p = Plan(Preset("tiny"), r);
  ASSERT_TRUE(p.paged.has_value());
  // ceil(4097 / 16) = 257 blocks of 16 tokens x 1024 bytes.
  EXPECT_EQ(p.paged->blocks_per_sequence, 257);
  EXPECT_EQ(p.paged->allocated_bytes_per_sequence, 257 * 16 * 1024);
  EXPECT_EQ(p.paged->allocated_bytes, 3 * 257 * 16 * 1024);
  EXPECT_EQ(p.total_bytes, 3 * 4097 * 1024);
  EXPECT_EQ(p.paged->waste_bytes, 3 * 15 * 1024);
  // A whole number of blocks wastes nothing.
  r.context_tokens = 4096;
  EXPECT_EQ(Plan(Preset("tiny"), r).paged->waste_bytes, 0);
}

TEST(PlanKvCache, PagedSlidingLayersRoundTheirWindow) {
  KvPlanRequest r = Request(8192);
  r.block_tokens = 1000;
  const KvPlan p = Plan(Preset("gemma-2-9b"), r);
  // Global layers: ceil(8192 / 1000) = 9 blocks; sliding layers keep positions 4096..8191,
  // blocks 4..8 = 5 blocks.
  EXPECT_EQ(p.paged->blocks_per_sequence, 9);
  EXPECT_EQ(p.paged->allocated_bytes_per_sequence, 21LL * 9000 * 8192 + 21LL * 5000 * 8192);
  EXPECT_EQ(p.paged->waste_bytes, p.paged->allocated_bytes - p.total_bytes);
}

// Mistral 7B slides a 4096-token window over every layer. At 10,001 tokens a layer keeps
// positions 5905..10000, which lie in 16-token blocks 369 (5905 / 16) to 625 (10000 / 16): 257
// blocks, one more than 4096 / 16 because 5905 is not on a block boundary, and far fewer than
// ceil(10001 / 16) = 626. One layer's block is 16 tokens x 8 KV heads x (128 + 128) values x 2
// bytes = 65,536 bytes; the window itself is 4096 x 4096 bytes per layer.
TEST(PlanKvCache, PagedWindowHoldsEveryBlockItsTokensTouch) {
  KvPlanRequest r = Request(10001, 2);
  r.block_tokens = 16;
  const KvPlan p = Plan(Preset("mistral-7b"), r);
  ASSERT_TRUE(p.paged.has_value());
  EXPECT_EQ(p.paged->blocks_per_sequence, 257);
  EXPECT_EQ(p.paged->allocated_bytes_per_sequence, 32LL * 257 * 65536);
  EXPECT_EQ(p.paged->allocated_bytes, 2 * 32LL * 257 * 65536);
  EXPECT_EQ(p.bytes_per_sequence, 32LL * 4096 * 4096);
  // One block per layer and sequence is partly outside the window.
  EXPECT_EQ(p.paged->waste_bytes, 2 * 32 * 65536);
  EXPECT_EQ(*KvBytesPerSequence(Preset("mistral-7b"), KvDType::kFloat16, 10001, 16),
            32LL * 257 * 65536);

  // At 4,112 tokens the window starts on a block boundary: positions 16..4111 are blocks 1..256.
  r.context_tokens = 4112;
  const KvPlan aligned = Plan(Preset("mistral-7b"), r);
  EXPECT_EQ(aligned.paged->blocks_per_sequence, 256);
  EXPECT_EQ(aligned.paged->waste_bytes, 0);
}

// Generated cases: for layers of several windows and key/value head counts, every context up to
// 200 and several block sizes, the blocks and allocated bytes are those of the listed blocks,
// the bytes are blocks x block bytes, and the waste is allocated minus held.
TEST(PlanKvCache, PagedBlocksMatchTheListedBlocks) {
  for (int64_t window : {1, 5, 16, 17, 31, 32, 33, 100}) {
    const std::vector<LayerSpec> layers = {{4, 0}, {2, window}, {1, window}, {1, 2 * window + 3}};
    const std::vector<LayerSpec> uniform(3, LayerSpec{2, window});
    for (int64_t block : {1, 2, 3, 7, 16, 32, 64}) {
      for (int64_t context = 1; context <= 200; ++context) {
        SCOPED_TRACE(absl::StrFormat("window %d, block %d, context %d", window, block, context));
        KvPlanRequest r = Request(context, 3);
        r.block_tokens = block;
        const KvPlan p = Plan(LayeredModel(layers), r);
        ASSERT_TRUE(p.paged.has_value());
        int64_t most = 0;
        int64_t held = 0;
        for (const LayerSpec& l : layers) {
          most = std::max(most, TouchedBlocks(context, l.window_tokens, block));
          held +=
              (l.window_tokens > 0 ? std::min(context, l.window_tokens) : context) * RowBytes(l);
        }
        const int64_t allocated = BruteForceAllocated(layers, context, block);
        EXPECT_EQ(p.paged->blocks_per_sequence, most);
        EXPECT_EQ(p.paged->allocated_bytes_per_sequence, allocated);
        EXPECT_EQ(p.paged->allocated_bytes, 3 * allocated);
        EXPECT_EQ(p.bytes_per_sequence, held);
        EXPECT_EQ(p.paged->waste_bytes, 3 * (allocated - held));
        EXPECT_EQ(*KvBytesPerSequence(LayeredModel(layers), KvDType::kFloat16, context, block),
                  allocated);

        // Layers alike: blocks x layers x block bytes.
        const KvPlan u = Plan(LayeredModel(uniform), r);
        EXPECT_EQ(u.paged->blocks_per_sequence, TouchedBlocks(context, window, block));
        EXPECT_EQ(u.paged->allocated_bytes_per_sequence,
                  u.paged->blocks_per_sequence * 3 * block * RowBytes(uniform[0]));
      }
    }
  }
}

// A sequence grows through every shorter context, and past the window its allocation goes up
// and down by a block as the window's first token crosses block boundaries. The budget answers
// hold at every length on the way: Mistral's 256 blocks per layer (what the window holds
// unpaged) do not hold 4,097 tokens, which touch blocks 0..256, nor 10,001 (blocks 369..625),
// nor even 4,112 (blocks 1..256), since 4,097..4,111 needed 257 on the way.
TEST(PlanKvCache, BudgetPagedHoldsTheStraddlingWindow) {
  const ModelSpec m = Preset("mistral-7b");
  const int64_t block_bytes = 65536;  // 16 tokens x 4096 bytes, one layer
  for (int64_t context : {10001, 4112}) {
    SCOPED_TRACE(context);
    KvPlanRequest r = Request(context);
    r.block_tokens = 16;
    r.memory_budget_bytes = 32 * 256 * block_bytes;
    KvPlan p = Plan(m, r);
    ASSERT_TRUE(p.budget.has_value());
    EXPECT_FALSE(p.budget->fits);
    EXPECT_EQ(p.budget->max_sequences, 0);
    EXPECT_EQ(p.budget->max_context_tokens, 4096);
    EXPECT_EQ(p.budget->max_context_tokens_one_sequence, 4096);
    EXPECT_FALSE(p.budget->context_unbounded);
    // At 4,112 tokens the allocation itself would fit; the explanation says why it does not.
    EXPECT_EQ(absl::StrContains(p.budget->explanation,
                                "allocated 512.00 MiB (536,870,912 bytes) "
                                "at 4,112 tokens but up to 514.00 MiB"),
              context == 4112)
        << p.budget->explanation;

    // 257 blocks per layer hold any context: the window never touches more.
    r.memory_budget_bytes = 32 * 257 * block_bytes;
    p = Plan(m, r);
    EXPECT_TRUE(p.budget->fits);
    EXPECT_EQ(p.budget->max_sequences, 1);
    EXPECT_TRUE(p.budget->context_unbounded);
    EXPECT_EQ(p.budget->max_context_tokens, kMaxContextTokens);
  }
}

// Generated budgets: the longest context is the last one before some length on the way needs
// more than the budget, and the sequences that fit are sized by the most they need on the way
// to the requested context, both from the listed blocks.
TEST(PlanKvCache, BudgetPagedMatchesTheListedBlocks) {
  for (int64_t window : {5, 16, 17, 40}) {
    const std::vector<LayerSpec> bounded = {{1, 0}, {2, window}, {4, window + 7}};
    const std::vector<LayerSpec> windowed = {{2, window}, {4, window + 7}};
    for (const std::vector<LayerSpec>& layers : {bounded, windowed}) {
      for (int64_t block : {1, 3, 8, 16}) {
        // The most a sequence is allocated at any length up to c, for c in [0, kLimit]: far
        // enough for the budgets below to run out with a full-attention layer.
        constexpr int64_t kLimit = 1500;
        std::vector<int64_t> peak(kLimit + 1, 0);
        for (int64_t c = 1; c <= kLimit; ++c) {
          peak[c] = std::max(peak[c - 1], BruteForceAllocated(layers, c, block));
        }
        for (int64_t batch : {1, 2}) {
          for (int64_t budget = 64; budget <= 2 * peak[60] + 500; budget += 96) {
            int64_t longest = 0;
            while (longest < kLimit && batch * peak[longest + 1] <= budget) ++longest;
            for (int64_t context : {1, 17, 60, 101}) {
              SCOPED_TRACE(
                  absl::StrFormat("layers %d, window %d, block %d, batch %d, budget %d, context %d",
                                  layers.size(), window, block, batch, budget, context));
              KvPlanRequest r = Request(context, batch);
              r.block_tokens = block;
              r.memory_budget_bytes = budget;
              const KvPlan p = Plan(LayeredModel(layers), r);
              ASSERT_TRUE(p.budget.has_value());
              EXPECT_EQ(p.budget->fits, batch * peak[context] <= budget);
              EXPECT_EQ(p.budget->max_sequences, budget / peak[context]);
              if (longest < kLimit) {
                EXPECT_EQ(p.budget->max_context_tokens, longest);
                EXPECT_FALSE(p.budget->context_unbounded);
              } else {
                // Only windows: past kLimit tokens the allocation repeats what it was before.
                EXPECT_TRUE(std::all_of(layers.begin(), layers.end(),
                                        [](const LayerSpec& l) { return l.window_tokens > 0; }));
                EXPECT_TRUE(p.budget->context_unbounded);
                EXPECT_EQ(p.budget->max_context_tokens, kMaxContextTokens);
              }
            }
          }
        }
      }
    }
  }
}

// The budget holds exactly the request: it fits, to the byte; one byte less and one token
// fewer is the answer.
TEST(PlanKvCache, BudgetFitsToTheByte) {
  const ModelSpec m = Preset("llama-3-8b");
  KvPlanRequest r = Request(8192, 4);
  r.memory_budget_bytes = 4 * kGiB;
  KvPlan p = Plan(m, r);
  ASSERT_TRUE(p.budget.has_value());
  EXPECT_TRUE(p.budget->fits);
  EXPECT_EQ(p.budget->available_bytes, 4 * kGiB);
  EXPECT_EQ(p.budget->max_context_tokens, 8192);  // 8193 would need 4 x 131072 more bytes
  EXPECT_EQ(p.budget->max_sequences, 4);
  EXPECT_EQ(p.budget->max_context_tokens_one_sequence, 4 * 8192);
  EXPECT_FALSE(p.budget->context_unbounded);
  EXPECT_TRUE(absl::StrContains(p.budget->explanation, "it fits, with 0 bytes to spare"))
      << p.budget->explanation;

  r.memory_budget_bytes = 4 * kGiB - 1;
  p = Plan(m, r);
  EXPECT_FALSE(p.budget->fits);
  EXPECT_EQ(p.budget->max_context_tokens, 8191);
  EXPECT_EQ(p.budget->max_sequences, 3);
  EXPECT_TRUE(absl::StrContains(p.budget->explanation, "it does not fit"));
  EXPECT_TRUE(absl::StrContains(p.budget->explanation, "3 sequences of 8,192 tokens fit"));
  EXPECT_TRUE(absl::StrContains(p.budget->explanation, "4 sequences of up to 8,191 tokens"));
}

// With sliding windows the bytes per sequence are piecewise linear: a budget for 4096 tokens
// plus one more token's worth of the 21 global layers holds 4097 tokens, where dividing by the
// all-layer bytes per token would say 4096.
TEST(PlanKvCache, BudgetSearchesTheSlidingWindowKink) {
  const ModelSpec m = Preset("gemma-2-9b");
  const int64_t per_layer = 8192;
  const int64_t at_window = 42LL * 4096 * per_layer;
  KvPlanRequest r = Request(4097);
  r.memory_budget_bytes = at_window + 21 * per_layer;
  KvPlan p = Plan(m, r);
  EXPECT_EQ(p.budget->max_context_tokens, 4097);
  EXPECT_TRUE(p.budget->fits);
  EXPECT_EQ(r.memory_budget_bytes / p.bytes_per_token, 4096);  // the naive answer

  r.context_tokens = 8192;
  r.memory_budget_bytes = 2113929216;
  p = Plan(m, r);
  EXPECT_EQ(p.budget->max_context_tokens, 8192);
  r.memory_budget_bytes -= 1;
  EXPECT_EQ(Plan(m, r).budget->max_context_tokens, 8191);
  // Far past the window only the global layers grow: 10 GiB holds
  // 4096 + (10 GiB - 42 x 4096 x 8192) / (21 x 8192) tokens.
  r.memory_budget_bytes = 10 * kGiB;
  EXPECT_EQ(Plan(m, r).budget->max_context_tokens,
            4096 + (10 * kGiB - at_window) / (21 * per_layer));
  // The model accepts only 8192 tokens; the explanation says so.
  EXPECT_TRUE(absl::StrContains(Plan(m, r).budget->explanation, "at most 8,192 tokens"));
}

TEST(PlanKvCache, BudgetWhenEveryLayerSlides) {
  KvPlanRequest r = Request(32768, 2);
  r.memory_budget_bytes = 2 * 512 * (int64_t{1} << 20);  // two full windows
  const KvPlan p = Plan(Preset("mistral-7b"), r);
  EXPECT_TRUE(p.budget->fits);
  EXPECT_TRUE(p.budget->context_unbounded);
  EXPECT_EQ(p.budget->max_context_tokens, kMaxContextTokens);
  EXPECT_TRUE(absl::StrContains(p.budget->explanation, "memory does not limit the context"));
}

TEST(PlanKvCache, BudgetPagedUsesAllocatedBytes) {
  KvPlanRequest r = Request(4097);
  r.block_tokens = 16;
  r.memory_budget_bytes = 4097 * 1024;  // enough unpaged, not for 257 blocks
  KvPlan p = Plan(Preset("tiny"), r);
  EXPECT_FALSE(p.budget->fits);
  EXPECT_EQ(p.budget->max_context_tokens, 4096);
  r.memory_budget_bytes = 257 * 16 * 1024;
  p = Plan(Preset("tiny"), r);
  EXPECT_TRUE(p.budget->fits);
  EXPECT_EQ(p.budget->max_context_tokens, 257 * 16);
}

// Lesson 3's planning question: Llama 3 70B, 32k context, 16 users, 80 GiB.
TEST(PlanKvCache, Llama3SeventyBSixteenUsersIn80GiB) {
  const ModelSpec m = Preset("llama-3-70b");
  // By hand: 2 (K, V) x 80 layers x 8 KV heads x 128 x bytes per value per token.
  const int64_t fp8_per_token = 2 * 80 * 8 * 128 * 1;   // 163,840
  const int64_t f16_per_token = 2 * 80 * 8 * 128 * 2;   // 327,680
  const int64_t fp8_need = 16 * 32768 * fp8_per_token;  // 80 GiB
  const int64_t f16_need = 16 * 32768 * f16_per_token;  // 160 GiB
  ASSERT_EQ(fp8_need, 80 * kGiB);
  ASSERT_EQ(f16_need, 160 * kGiB);

  KvPlanRequest r = Request(32768, 16, KvDType::kFp8);
  r.memory_budget_bytes = 80 * kGiB;
  KvPlan fp8 = Plan(m, r);
  EXPECT_EQ(fp8.bytes_per_token, fp8_per_token);
  EXPECT_EQ(fp8.total_bytes, fp8_need);
  EXPECT_TRUE(fp8.budget->fits);  // exactly: the cache alone fills 80 GiB
  EXPECT_EQ(fp8.budget->max_sequences, 16);
  EXPECT_EQ(fp8.budget->max_context_tokens, 32768);

  r.kv_dtype = KvDType::kFloat16;
  KvPlan f16 = Plan(m, r);
  EXPECT_EQ(f16.total_bytes, f16_need);
  EXPECT_FALSE(f16.budget->fits);
  EXPECT_EQ(f16.budget->max_sequences, 80 * kGiB / (32768 * f16_per_token));  // 8
  EXPECT_EQ(f16.budget->max_sequences, 8);
  EXPECT_EQ(f16.budget->max_context_tokens, 80 * kGiB / (16 * f16_per_token));  // 16384
  EXPECT_EQ(f16.budget->max_context_tokens, 16384);

  // With the weights in the same 80 GiB: bf16 weights (2 bytes x 70,553,706,496) alone exceed
  // it; fp8 weights leave 85,899,345,920 - 70,553,706,496 bytes for the cache.
  r.subtract_weights = true;
  r.kv_dtype = KvDType::kFp8;
  KvPlan with_bf16 = Plan(m, r);
  EXPECT_EQ(with_bf16.budget->weights_bytes, 2 * 70553706496);
  EXPECT_LT(with_bf16.budget->available_bytes, 0);
  EXPECT_FALSE(with_bf16.budget->fits);
  EXPECT_EQ(with_bf16.budget->max_sequences, 0);
  EXPECT_EQ(with_bf16.budget->max_context_tokens, 0);
  EXPECT_TRUE(absl::StrContains(with_bf16.budget->explanation, "weights alone exceed"));

  r.weights_dtype = "fp8";
  KvPlan with_fp8 = Plan(m, r);
  const int64_t left = 80 * kGiB - 70553706496;
  EXPECT_EQ(with_fp8.budget->available_bytes, left);
  EXPECT_FALSE(with_fp8.budget->fits);
  EXPECT_EQ(with_fp8.budget->max_sequences, left / (32768 * fp8_per_token));  // 2
  EXPECT_EQ(with_fp8.budget->max_sequences, 2);
  EXPECT_EQ(with_fp8.budget->max_context_tokens, left / (16 * fp8_per_token));  // 5853
  EXPECT_EQ(with_fp8.budget->max_context_tokens, 5853);

  // Given weight bytes replace the computed ones.
  r.weights_bytes = 0;
  EXPECT_TRUE(Plan(m, r).budget->fits);
}

TEST(PlanKvCache, NotEvenOneSequenceFits) {
  KvPlanRequest r = Request(32768, 16);
  r.memory_budget_bytes = 5 * kGiB;
  const KvPlan p = Plan(Preset("llama-3-70b"), r);
  EXPECT_FALSE(p.budget->fits);
  EXPECT_EQ(p.budget->max_sequences, 0);
  // One sequence of 327,680 bytes per token: 5 GiB / 327,680 = 16,384 tokens.
  EXPECT_EQ(p.budget->max_context_tokens_one_sequence, 5 * kGiB / 327680);
  EXPECT_EQ(p.budget->max_context_tokens, 5 * kGiB / (16 * 327680));
  EXPECT_TRUE(
      absl::StrContains(p.budget->explanation, "Not even one sequence of 32,768 tokens fits"))
      << p.budget->explanation;
  EXPECT_TRUE(absl::StrContains(p.budget->explanation, "one sequence can hold is 16,384 tokens"));

  r.memory_budget_bytes = 100;
  const KvPlan none = Plan(Preset("llama-3-70b"), r);
  EXPECT_EQ(none.budget->max_context_tokens_one_sequence, 0);
  EXPECT_TRUE(absl::StrContains(none.budget->explanation, "Not even one token fits"));
}

TEST(PlanKvCache, ContextDefaultsToTheModelsMaximum) {
  KvPlanRequest r;
  r.batch = 0;
  const KvPlan p = Plan(Preset("llama-3-8b"), r);
  EXPECT_EQ(p.context_tokens, 8192);
  EXPECT_EQ(p.batch, 1);
  EXPECT_EQ(p.kv_dtype, KvDType::kFloat16);
}

TEST(PlanKvCache, RejectsBadRequests) {
  const ModelSpec m = Preset("llama-3-8b");
  EXPECT_THAT(PlanKvCache(m, Request(-1)), StatusIs(kInvalid, {"context_tokens: -1"}));
  EXPECT_THAT(PlanKvCache(m, Request(kMaxContextTokens + 1)),
              StatusIs(kInvalid, {"context_tokens"}));
  EXPECT_THAT(PlanKvCache(m, Request(10, -2)), StatusIs(kInvalid, {"batch: -2"}));
  EXPECT_THAT(PlanKvCache(m, Request(10, kMaxBatch + 1)), StatusIs(kInvalid, {"batch"}));
  KvPlanRequest r = Request(10);
  r.block_tokens = -16;
  EXPECT_THAT(PlanKvCache(m, r), StatusIs(kInvalid, {"block_tokens: -16"}));
  r = Request(10);
  r.memory_budget_bytes = -1;
  EXPECT_THAT(PlanKvCache(m, r), StatusIs(kInvalid, {"memory_budget_bytes: -1"}));
  r = Request(10);
  r.memory_budget_bytes = kGiB;
  r.subtract_weights = true;
  r.weights_bytes = -5;
  EXPECT_THAT(PlanKvCache(m, r), StatusIs(kInvalid, {"weights_bytes: -5"}));
  r.weights_bytes.reset();
  r.weights_dtype = "float64";
  EXPECT_THAT(PlanKvCache(m, r), StatusIs(kInvalid, {"weights_dtype: 'float64'"}));

  ModelSpec bare;
  bare.name = "bare";
  bare.layers = 2;
  bare.n_head = 4;
  bare.head_dim = 16;
  EXPECT_THAT(PlanKvCache(bare, KvPlanRequest{}),
              StatusIs(kInvalid, {"context_tokens: 0 and model 'bare' has no max_context_tokens"}));
  r = Request(10);
  r.memory_budget_bytes = kGiB;
  r.subtract_weights = true;
  EXPECT_THAT(PlanKvCache(bare, r), StatusIs(kInvalid, {"weights_dtype: unknown for model"}));
  bare.weights_dtype = "bfloat16";
  EXPECT_THAT(PlanKvCache(bare, r), StatusIs(kInvalid, {"parameters: unknown for model"}));
  bare.n_head_kv = 3;
  EXPECT_THAT(PlanKvCache(bare, r), StatusIs(kInvalid, {"n_head_kv: 3 does not divide"}));
}

TEST(PlanKvCache, OverflowIsAnErrorNotAWrap) {
  ModelSpec huge;
  huge.name = "huge";
  huge.layers = kMaxLayers;
  huge.n_head = kMaxHeads;
  huge.head_dim = kMaxHeadDim;
  // 2^12 layers x 2^16 heads x 2 x 2^16 x 4 bytes = 2^47 bytes per token; 2^17 tokens overflow.
  EXPECT_THAT(PlanKvCache(huge, Request(int64_t{1} << 17, 1, KvDType::kFloat32)),
              StatusIs(kInvalid, {"overflows int64"}));
  EXPECT_OK(PlanKvCache(huge, Request(1, 1, KvDType::kFloat32)));
  EXPECT_THAT(PlanKvCache(Preset("llama-3-8b"), Request(kMaxContextTokens, kMaxBatch)),
              StatusIs(kInvalid, {"overflows int64"}));
  // A budget near INT64_MAX is searched without overflow.
  KvPlanRequest r = Request(1000);
  r.memory_budget_bytes = std::numeric_limits<int64_t>::max();
  const KvPlan p = Plan(Preset("llama-3-8b"), r);
  EXPECT_EQ(p.budget->max_context_tokens,
            std::min(kMaxContextTokens, std::numeric_limits<int64_t>::max() / 131072));
}

TEST(WeightsBytes, ParametersTimesBytesPerWeight) {
  EXPECT_EQ(*WeightsBytes(8030261248, "bfloat16"), 16060522496);
  EXPECT_EQ(*WeightsBytes(8030261248, "f32"), 4 * 8030261248);
  EXPECT_EQ(*WeightsBytes(64, "q4_0"), 36);
  EXPECT_EQ(*WeightsBytes(65, "q8_0"), 3 * 34);
  EXPECT_THAT(WeightsBytes(-1, "fp8"), StatusIs(kInvalid, {"parameters: -1"}));
  EXPECT_THAT(WeightsBytes(std::numeric_limits<int64_t>::max(), "float32"),
              StatusIs(kInvalid, {"overflow"}));
}

}  // namespace
}  // namespace attend::planner
