// ImportGguf on the sparse-attention indexer that llama.cpp's GGUF metadata carries
// (<arch>.attention.indexer.*, src/llama-arch.cpp's LLM_KV_ATTENTION_INDEXER_*, written for its
// glm-dsa architecture, GLM-5), planned in bfloat16 against bytes computed by hand. The values
// are GLM-5's as GlmMoeDsaConfig gives them (tests/planner/recent_model_files.h), in the layout
// llama.cpp's DeepSeek-style converters write: MQA over the latent, expanded sizes under *_mla.
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

GgufWriter GlmDsa(bool indexer, const std::string& arch = "glm-dsa") {
  const std::string a = arch + ".";
  GgufWriter w;
  w.Str("general.architecture", arch)
      .U32(a + "block_count", 78)
      .U32(a + "embedding_length", 6144)
      .U32(a + "attention.head_count", 64)
      .U32(a + "attention.head_count_kv", 1)
      .U32(a + "attention.kv_lora_rank", 512)
      .U32(a + "rope.dimension_count", 64)
      .U32(a + "attention.key_length", 576)
      .U32(a + "attention.value_length", 512)
      .U32(a + "attention.key_length_mla", 256)
      .U32(a + "attention.value_length_mla", 256);
  if (indexer) {
    w.U32(a + "attention.indexer.head_count", 32)
        .U32(a + "attention.indexer.key_length", 128)
        .U32(a + "attention.indexer.top_k", 2048);
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

// Breaker finding 8: the indexer's head count without its key size is refused (as config.json
// refuses index_n_heads without index_head_dim), naming the missing key.
TEST(ImportGgufRecent, IndexerHeadCountWithoutKeyLengthIsRefused) {
  GgufWriter w = GlmDsa(false, "deepseek2");
  w.U32("deepseek2.attention.indexer.head_count", 64);
  EXPECT_THAT(ImportGguf(w.Build(), "").status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       {"deepseek2.attention.indexer.key_length", "indexer.head_count"}));
  EXPECT_TRUE(ImportGguf(GlmDsa(false, "deepseek2").Build(), "").ok());
}

// Breaker finding 8: attention.key_length_swa / value_length_swa (llama.cpp's head sizes of the
// sliding layers, MiMo-V2-Flash's mimo2) differing from the model's are refused, not ignored;
// equal ones are accepted.
TEST(ImportGgufRecent, SlidingLayersOwnHeadSizesAreRefused) {
  const auto header = [](int64_t swa_key, int64_t swa_value) {
    GgufWriter w;
    w.Str("general.architecture", "mimo2")
        .U32("mimo2.block_count", 4)
        .U32("mimo2.embedding_length", 1024)
        .U32("mimo2.attention.head_count", 8)
        .U32("mimo2.attention.head_count_kv", 4)
        .U32("mimo2.attention.key_length", 192)
        .U32("mimo2.attention.value_length", 128)
        .U32("mimo2.attention.sliding_window", 128)
        .U32("mimo2.attention.key_length_swa", static_cast<uint32_t>(swa_key))
        .U32("mimo2.attention.value_length_swa", static_cast<uint32_t>(swa_value));
    return ImportGguf(w.Build(), "");
  };
  EXPECT_THAT(header(128, 128).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, {"mimo2.attention.key_length_swa"}));
  EXPECT_THAT(header(192, 192).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, {"mimo2.attention.value_length_swa"}));
  EXPECT_TRUE(header(192, 128).ok()) << header(192, 128).status();
}

// Breaker finding 14: type errors read "is an array", not "is a array".
TEST(ImportGgufRecent, TypeErrorsReadWell) {
  GgufWriter w = GlmDsa(false);
  w.Array("glm-dsa.attention.indexer.key_length", gguf::kU32, std::vector<uint32_t>{128, 128});
  const absl::Status s = ImportGguf(w.Build(), "").status();
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kInvalidArgument, {"is an array"}));
}

}  // namespace
}  // namespace attend::planner
