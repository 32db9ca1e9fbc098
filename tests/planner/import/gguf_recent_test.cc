// ImportGguf on the sparse-attention indexer that llama.cpp's GGUF metadata carries
// (<arch>.attention.indexer.*, src/llama-arch.cpp's LLM_KV_ATTENTION_INDEXER_*, written for its
// glm-dsa architecture, GLM-5), planned in bfloat16 against bytes computed by hand. The values
// are GLM-5's as GlmMoeDsaConfig gives them (tests/planner/recent_model_files.h), in the layout
// llama.cpp's DeepSeek-style converters write: MQA over the latent, expanded sizes under *_mla.
#include <cstdint>

#include "planner/import/gguf.h"
#include "planner/import/gguf_format.h"
#include "planner/kv_plan.h"
#include "tests/planner/model_files.h"
#include "tests/test_util.h"

namespace attend::planner {
namespace {

using ::attend::planner::testing::GgufWriter;
using ::attend::testing::StatusIs;

GgufWriter GlmDsa(bool indexer) {
  GgufWriter w;
  w.Str("general.architecture", "glm-dsa")
      .U32("glm-dsa.block_count", 78)
      .U32("glm-dsa.embedding_length", 6144)
      .U32("glm-dsa.attention.head_count", 64)
      .U32("glm-dsa.attention.head_count_kv", 1)
      .U32("glm-dsa.attention.kv_lora_rank", 512)
      .U32("glm-dsa.rope.dimension_count", 64)
      .U32("glm-dsa.attention.key_length", 576)
      .U32("glm-dsa.attention.value_length", 512)
      .U32("glm-dsa.attention.key_length_mla", 256)
      .U32("glm-dsa.attention.value_length_mla", 256);
  if (indexer) {
    w.U32("glm-dsa.attention.indexer.head_count", 32)
        .U32("glm-dsa.attention.indexer.key_length", 128)
        .U32("glm-dsa.attention.indexer.top_k", 2048);
  }
  return w;
}

// 78 latent layers x ((512 + 64) x 2 + 132) = 78 x 1,284 = 100,152 bytes per token, as the
// config.json import of GLM-5 (hf_recent_test.cc); 78 x 132 = 10,296 of them the indexer's.
TEST(ImportGgufRecent, GlmDsaCarriesTheIndexer) {
  absl::StatusOr<ModelSpec> m = ImportGguf(GlmDsa(true).Build(), "");
  ASSERT_TRUE(m.ok()) << m.status();
  KvPlanRequest r;
  r.kv_dtype = KvDType::kBFloat16;
  r.context_tokens = 4096;
  absl::StatusOr<KvPlan> p = PlanKvCache(*m, r);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->bytes_per_token, 100152);
  EXPECT_EQ(p->indexer_bytes_per_token, 10296);
  ASSERT_EQ(p->layer_groups.size(), 1u);
  EXPECT_EQ(p->layer_groups[0].layer.index_head_dim, 128);
  // Without the indexer's key size a glm-dsa header would be planned short: refused.
  EXPECT_THAT(
      ImportGguf(GlmDsa(false).Build(), "").status(),
      StatusIs(absl::StatusCode::kInvalidArgument, {"glm-dsa.attention.indexer.key_length"}));
}

}  // namespace
}  // namespace attend::planner
