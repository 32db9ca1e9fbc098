// ImportGguf on the metadata llama.cpp writes for latent attention (deepseek2), hybrids (jamba,
// nemotron_h, qwen3next) and state-space models (mamba2), planned in bfloat16 against bytes
// computed by hand (the same models as tests/planner/import/hf_hybrid_test.cc, whose comments
// derive the figures). The keys are those of llama.cpp's src/llama-arch.cpp and
// convert_hf_to_gguf.py.
#include <cstdint>
#include <string>
#include <vector>

#include "planner/import/gguf.h"
#include "planner/import/gguf_format.h"
#include "planner/kv_plan.h"
#include "tests/planner/model_files.h"
#include "tests/test_util.h"

namespace attend::planner {
namespace {

using ::attend::planner::testing::GgufWriter;
using ::attend::testing::StatusIs;

constexpr auto kInvalid = absl::StatusCode::kInvalidArgument;

KvPlan PlanBf16(const GgufWriter& w) {
  absl::StatusOr<ModelSpec> m = ImportGguf(w.Build(), "");
  EXPECT_TRUE(m.ok()) << m.status();
  if (!m.ok()) return KvPlan{};
  KvPlanRequest r;
  r.kv_dtype = KvDType::kBFloat16;
  r.context_tokens = 4096;
  absl::StatusOr<KvPlan> plan = PlanKvCache(*m, r);
  EXPECT_TRUE(plan.ok()) << plan.status();
  return plan.ok() ? *plan : KvPlan{};
}

// DeepSeek-V3 as today's converter writes it: MQA over the latent (head_count_kv 1, key_length
// 512 + 64, value_length 512) with the expanded sizes under *_mla.
GgufWriter DeepSeekV3(bool mla_keys) {
  GgufWriter w;
  w.Str("general.architecture", "deepseek2")
      .U32("deepseek2.block_count", 61)
      .U32("deepseek2.embedding_length", 7168)
      .U32("deepseek2.attention.head_count", 128)
      .U32("deepseek2.attention.kv_lora_rank", 512)
      .U32("deepseek2.rope.dimension_count", 64);
  if (mla_keys) {
    w.U32("deepseek2.attention.head_count_kv", 1)
        .U32("deepseek2.attention.key_length", 576)
        .U32("deepseek2.attention.value_length", 512)
        .U32("deepseek2.attention.key_length_mla", 192)
        .U32("deepseek2.attention.value_length_mla", 128);
  } else {
    // The converter before llama.cpp's MLA rewrite: the expanded heads under the plain keys.
    w.U32("deepseek2.attention.head_count_kv", 128)
        .U32("deepseek2.attention.key_length", 192)
        .U32("deepseek2.attention.value_length", 128);
  }
  return w;
}

// 61 x (512 + 64) x 2 = 70,272 bytes per token either way; expanded 61 x 128 x (192 + 128) x 2
// = 4,997,120.
TEST(ImportGgufHybrid, DeepSeekLatentFromBothConverters) {
  for (bool mla_keys : {true, false}) {
    SCOPED_TRACE(mla_keys);
    const KvPlan p = PlanBf16(DeepSeekV3(mla_keys));
    EXPECT_EQ(p.bytes_per_token, 70272);
    EXPECT_EQ(p.expanded_bytes_per_token, 4997120);
    EXPECT_EQ(p.model.head_dim, 192);
    EXPECT_EQ(p.model.n_head_kv, 128);
  }
}

// Jamba: head_count_kv 8 on layers i % 8 == 4, 0 on the Mamba layers; ssm.inner_size 8192,
// state_size 16, conv_kernel 4: 16,384 bytes per token and 28 x (3 x 8192 + 8192 x 16) x 2 =
// 8,716,288 bytes of state.
TEST(ImportGgufHybrid, JambaZeroHeadLayersAreMamba) {
  std::vector<uint32_t> kv(32, 0);
  for (int i = 4; i < 32; i += 8) kv[i] = 8;
  GgufWriter w;
  w.Str("general.architecture", "jamba")
      .U32("jamba.block_count", 32)
      .U32("jamba.embedding_length", 4096)
      .U32("jamba.attention.head_count", 32)
      .Array("jamba.attention.head_count_kv", gguf::kU32, kv)
      .U32("jamba.ssm.conv_kernel", 4)
      .U32("jamba.ssm.inner_size", 8192)
      .U32("jamba.ssm.state_size", 16)
      .U32("jamba.ssm.time_step_rank", 256);
  const KvPlan p = PlanBf16(w);
  EXPECT_EQ(p.bytes_per_token, 16384);
  EXPECT_EQ(p.state_bytes_per_sequence, 8716288);
}

// Mamba-Codestral (mamba2): 64 x (3 x (8192 + 2 x 8 x 128) + 128 x 8192) x 2 = 138,149,888.
// Qwen3-Next: ssm.state_size 128 (head_k_dim), inner_size 4096 (32 x 128), group_count 16:
// 36 x (3 x (4096 + 2 x 16 x 128) + 128 x 4096) x 2 = 39,518,208, and 12 full layers x 2 x 256 x
// 2 x 2 = 24,576 bytes per token.
TEST(ImportGgufHybrid, MambaTwoAndQwenNextStates) {
  GgufWriter m2;
  m2.Str("general.architecture", "mamba2")
      .U32("mamba2.block_count", 64)
      .U32("mamba2.embedding_length", 4096)
      .U32("mamba2.ssm.conv_kernel", 4)
      .U32("mamba2.ssm.inner_size", 8192)
      .U32("mamba2.ssm.state_size", 128)
      .U32("mamba2.ssm.group_count", 8);
  const KvPlan mamba = PlanBf16(m2);
  EXPECT_EQ(mamba.bytes_per_token, 0);
  EXPECT_EQ(mamba.state_bytes_per_sequence, 138149888);
  GgufWriter qn;
  qn.Str("general.architecture", "qwen3next")
      .U32("qwen3next.block_count", 48)
      .U32("qwen3next.embedding_length", 2048)
      .U32("qwen3next.attention.head_count", 16)
      .U32("qwen3next.attention.head_count_kv", 2)
      .U32("qwen3next.attention.key_length", 256)
      .U32("qwen3next.attention.value_length", 256)
      .U32("qwen3next.ssm.conv_kernel", 4)
      .U32("qwen3next.ssm.inner_size", 4096)
      .U32("qwen3next.ssm.state_size", 128)
      .U32("qwen3next.ssm.group_count", 16)
      .U32("qwen3next.ssm.time_step_rank", 32);
  const KvPlan next = PlanBf16(qn);
  EXPECT_EQ(next.bytes_per_token, 24576);
  EXPECT_EQ(next.state_bytes_per_sequence, 39518208);
}

// Nemotron-H: a layer with no KV heads is an MLP when it has a feed-forward width, else Mamba-2.
TEST(ImportGgufHybrid, NemotronHTellsMlpFromMamba) {
  const std::string pattern = "M-M*";
  std::vector<uint32_t> kv, ffn;
  for (char c : pattern) {
    kv.push_back(c == '*' ? 8 : 0);
    ffn.push_back(c == '-' ? 21504 : 0);
  }
  GgufWriter w;
  w.Str("general.architecture", "nemotron_h")
      .U32("nemotron_h.block_count", 4)
      .U32("nemotron_h.embedding_length", 4096)
      .Array("nemotron_h.attention.head_count", gguf::kU32, std::vector<uint32_t>{0, 0, 0, 32})
      .Array("nemotron_h.attention.head_count_kv", gguf::kU32, kv)
      .Array("nemotron_h.feed_forward_length", gguf::kU32, ffn)
      .U32("nemotron_h.attention.key_length", 128)
      .U32("nemotron_h.ssm.conv_kernel", 4)
      .U32("nemotron_h.ssm.inner_size", 8192)
      .U32("nemotron_h.ssm.state_size", 128)
      .U32("nemotron_h.ssm.group_count", 8);
  const KvPlan p = PlanBf16(w);
  ASSERT_EQ(p.model.layer_specs.size(), 4u);
  EXPECT_EQ(p.model.layer_specs[1].kind, LayerKind::kFeedForward);
  EXPECT_EQ(p.model.layer_specs[2].kind, LayerKind::kStateSpace);
  // 1 attention layer x 8 x 128 x 2 x 2 = 4,096; 2 Mamba-2 layers x 2,158,592 = 4,317,184.
  EXPECT_EQ(p.bytes_per_token, 4096);
  EXPECT_EQ(p.state_bytes_per_sequence, 4317184);
}

// What would otherwise be planned as something else: deepseek2 without its latent rank (full
// multi-head attention, 71x the cache), Mamba-2 without groups (a smaller state), a count stored
// as a bool.
TEST(ImportGgufHybrid, RefusesLayoutsMissingTheirDefiningKeys) {
  GgufWriter no_rank;
  no_rank.Str("general.architecture", "deepseek2")
      .U32("deepseek2.block_count", 61)
      .U32("deepseek2.embedding_length", 7168)
      .U32("deepseek2.attention.head_count", 128)
      .U32("deepseek2.attention.head_count_kv", 128)
      .U32("deepseek2.attention.key_length", 192)
      .U32("deepseek2.attention.value_length", 128);
  EXPECT_THAT(ImportGguf(no_rank.Build(), ""),
              StatusIs(kInvalid, {"deepseek2.attention.kv_lora_rank", "missing"}));
  for (const uint32_t groups : {0u, 1u}) {
    GgufWriter m2;
    m2.Str("general.architecture", "mamba2")
        .U32("mamba2.block_count", 64)
        .U32("mamba2.embedding_length", 4096)
        .U32("mamba2.ssm.conv_kernel", 4)
        .U32("mamba2.ssm.inner_size", 8192)
        .U32("mamba2.ssm.state_size", 128);
    if (groups == 0) m2.U32("mamba2.ssm.group_count", 0);
    EXPECT_THAT(ImportGguf(m2.Build(), ""), StatusIs(kInvalid, {"mamba2.ssm.group_count"}))
        << groups;  // 0, and absent
  }
  GgufWriter bool_layers;
  bool_layers.Str("general.architecture", "llama")
      .Scalar("llama.block_count", gguf::kBool, uint8_t{1})
      .U32("llama.embedding_length", 1024)
      .U32("llama.attention.head_count", 8);
  EXPECT_THAT(ImportGguf(bool_layers.Build(), ""),
              StatusIs(kInvalid, {"llama.block_count", "expected an integer"}));
}

TEST(ImportGgufHybrid, RefusesWhatItDoesNotModel) {
  GgufWriter rank0 = DeepSeekV3(true);
  rank0.U32("deepseek2.attention.kv_lora_rank", 0);  // a duplicate key, refused first
  EXPECT_THAT(ImportGguf(rank0.Build(), ""), StatusIs(kInvalid, {"duplicate key"}));
  GgufWriter no_rope;
  no_rope.Str("general.architecture", "deepseek2")
      .U32("deepseek2.block_count", 2)
      .U32("deepseek2.embedding_length", 1024)
      .U32("deepseek2.attention.head_count", 8)
      .U32("deepseek2.attention.kv_lora_rank", 0);
  EXPECT_THAT(ImportGguf(no_rope.Build(), ""),
              StatusIs(kInvalid, {"'deepseek2.attention.kv_lora_rank': 0; must be in [1, 65536]"}));
  GgufWriter llama;
  llama.Str("general.architecture", "llama")
      .U32("llama.block_count", 2)
      .U32("llama.embedding_length", 1024)
      .U32("llama.attention.head_count", 8)
      .U32("llama.ssm.state_size", 16);
  EXPECT_THAT(ImportGguf(llama.Build(), ""),
              StatusIs(kInvalid, {"'llama.ssm.state_size': recurrent layers of architecture "
                                  "'llama' are not modelled"}));
  GgufWriter zero_heads;
  zero_heads.Str("general.architecture", "llama")
      .U32("llama.block_count", 2)
      .U32("llama.embedding_length", 1024)
      .U32("llama.attention.head_count", 8)
      .Array("llama.attention.head_count_kv", gguf::kU32, std::vector<uint32_t>{8, 0});
  EXPECT_THAT(ImportGguf(zero_heads.Build(), ""),
              StatusIs(kInvalid, {"llama.attention.head_count_kv[1]", "0; must be in [1, 8]"}));
  GgufWriter mamba;
  mamba.Str("general.architecture", "mamba")
      .U32("mamba.block_count", 2)
      .U32("mamba.embedding_length", 1024)
      .U32("mamba.ssm.conv_kernel", 4)
      .U32("mamba.ssm.state_size", 16);
  EXPECT_THAT(ImportGguf(mamba.Build(), ""),
              StatusIs(kInvalid, {"'mamba.ssm.inner_size' is missing"}));
}

}  // namespace
}  // namespace attend::planner
