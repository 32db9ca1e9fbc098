#include "planner/catalog.h"

#include <set>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "planner/kv_plan.h"
#include "planner/parameter_counts.h"
#include "tests/planner/planner_test_util.h"
#include "tests/test_util.h"

namespace attend::planner {
namespace {

using ::attend::planner::testing::ExpectSameShape;
using ::attend::planner::testing::Preset;
using ::attend::testing::StatusIs;

TEST(ModelCatalog, HasTheRequiredPresets) {
  for (const char* name : {"tiny", "llama-2-7b", "llama-3-8b", "llama-3-70b", "llama-3.1-405b",
                           "mistral-7b", "mixtral-8x7b", "qwen2-0.5b", "qwen2-7b", "gemma-2-9b"}) {
    EXPECT_OK(FindModel(name)) << name;
  }
}

TEST(ModelCatalog, EveryPresetIsCanonicalAndDocumented) {
  std::set<std::string> names;
  for (const ModelSpec& m : Catalog()) {
    SCOPED_TRACE(m.name);
    EXPECT_TRUE(names.insert(m.name).second) << "duplicate name";
    EXPECT_EQ(m.name, absl::AsciiStrToLower(m.name));
    EXPECT_FALSE(m.display_name.empty());
    EXPECT_FALSE(m.source.empty());
    EXPECT_TRUE(absl::StartsWith(m.parameters_source, "published") ||
                absl::StartsWith(m.parameters_source, "computed") ||
                absl::StartsWith(m.parameters_source, "total published"))
        << m.parameters_source;
    EXPECT_GT(m.max_context_tokens, 0);
    // gpt-oss publishes mxfp4 weights, a type the planner does not size; its source says so.
    EXPECT_TRUE(!m.weights_dtype.empty() || absl::StrContains(m.source, "does not size"));
    absl::StatusOr<ModelSpec> canonical = CanonicalModel(m);
    ASSERT_OK(canonical);
    ExpectSameShape(*canonical, m);
  }
  EXPECT_EQ(CatalogNames().size(), Catalog().size());
}

// Published parameter counts are an independent check of ComputeParameters (and of the shapes
// in the catalog): every preset's count is reproduced exactly from its shape.
TEST(ModelCatalog, ParameterCountsMatchTheShapes) {
  for (const ModelSpec& m : Catalog()) {
    SCOPED_TRACE(m.name);
    // The model-card counts of the newer families are rounded, and ComputeParameters does not
    // describe latent, recurrent or MoE-routed blocks of their shapes (catalog_hybrid.h).
    if (!absl::StrContains(m.parameters_source, "safetensors") &&
        !absl::StartsWith(m.parameters_source, "computed")) {
      continue;
    }
    absl::StatusOr<ParameterCount> computed = ComputeParameters(m);
    ASSERT_OK(computed);
    EXPECT_EQ(computed->total, m.parameters);
    EXPECT_EQ(computed->active, m.active_parameters);
  }
  // The published figures themselves, as the model pages print them.
  EXPECT_EQ(Preset("llama-3-8b").parameters, 8030261248);
  EXPECT_EQ(Preset("llama-3-70b").parameters, 70553706496);
  EXPECT_EQ(Preset("mistral-7b").parameters, 7241732096);
  EXPECT_EQ(Preset("mixtral-8x7b").parameters, 46702792704);
  EXPECT_EQ(Preset("qwen2-0.5b").parameters, 494032768);
  EXPECT_EQ(Preset("gemma-2-9b").parameters, 9241705984);
  EXPECT_EQ(Preset("llama-2-7b").parameters, 6738415616);
}

TEST(ModelCatalog, MixtralActiveParametersUseTwoOfEightExperts) {
  const ModelSpec m = Preset("mixtral-8x7b");
  EXPECT_EQ(m.experts, 8);
  EXPECT_EQ(m.experts_active, 2);
  // Six unused experts per layer: 6 x 32 layers x 3 x 4096 x 14336.
  EXPECT_EQ(m.parameters - m.active_parameters, 6LL * 32 * 3 * 4096 * 14336);
}

TEST(ModelCatalog, Gemma2AlternatesSlidingAndGlobalLayers) {
  const ModelSpec m = Preset("gemma-2-9b");
  EXPECT_EQ(m.layers, 42);
  EXPECT_EQ(m.n_head, 16);
  EXPECT_EQ(m.n_head_kv, 8);
  EXPECT_EQ(m.head_dim, 256);
  ASSERT_EQ(m.layer_specs.size(), 42u);
  int sliding = 0;
  for (int64_t i = 0; i < 42; ++i) {
    EXPECT_EQ(LayerWindow(m, i), i % 2 == 0 ? 4096 : 0) << i;
    sliding += LayerWindow(m, i) > 0;
  }
  EXPECT_EQ(sliding, 21);
}

TEST(ModelCatalog, MistralV01WindowsEveryLayer) {
  const ModelSpec m = Preset("mistral-7b");
  ASSERT_EQ(m.layer_specs.size(), 32u);
  for (int64_t i = 0; i < 32; ++i) EXPECT_EQ(LayerWindow(m, i), 4096);
}

TEST(ModelCatalog, LessonShapes) {
  const ModelSpec tiny = Preset("tiny");
  EXPECT_EQ(tiny.layers, 4);
  EXPECT_EQ(tiny.n_head, 8);
  EXPECT_EQ(tiny.n_head_kv, 2);
  EXPECT_EQ(tiny.head_dim, 32);
  EXPECT_EQ(tiny.d_model, 256);
  const ModelSpec llama2 = Preset("llama-2-7b");
  EXPECT_EQ(llama2.n_head_kv, 32);
  EXPECT_EQ(llama2.n_head, 32);
}

TEST(FindModel, IsCaseInsensitiveAndListsNamesWhenMissing) {
  absl::StatusOr<ModelSpec> m = FindModel("Llama-3-8B");
  ASSERT_OK(m);
  EXPECT_EQ(m->name, "llama-3-8b");
  EXPECT_THAT(FindModel("gpt-5"), StatusIs(absl::StatusCode::kNotFound,
                                           {"'gpt-5'", "tiny", "llama-3-70b", "gemma-2-9b"}));
  // Hostile names are quoted, escaped and cut.
  EXPECT_THAT(FindModel(std::string(1000, '\x01')),
              StatusIs(absl::StatusCode::kNotFound, {"\\x01", "...'"}));
}

}  // namespace

// The newer families' presets plan to what their caches hold (bfloat16, bytes per token and
// per-sequence state, as derived in tests/planner/import/hf_hybrid_test.cc): each preset agrees
// with the import of its published config.json.
TEST(ModelCatalog, HybridPresetsMatchTheirConfigs) {
  struct Row {
    const char* preset;
    int64_t bytes_per_token;
    int64_t state_bytes;
  };
  const Row rows[] = {
      {"deepseek-v3", 70272, 0},            // 61 x 576 x 2
      {"qwen3-next-80b", 24576, 39518208},  // 12 x 2 x 256 x 4; 36 x 1,097,728
      {"jamba-v0.1", 16384, 8716288},       // 4 x 8 x 128 x 4; 28 x 311,296
      {"gpt-oss-120b", 73728, 0},           // 36 x 8 x 64 x 4 within the windows
      {"llama-4-scout", 196608, 0},         // 48 x 8 x 128 x 4 within a chunk
      {"mamba2-7b", 0, 138149888},          // 64 x 1,079,296 x 2
  };
  for (const Row& row : rows) {
    SCOPED_TRACE(row.preset);
    KvPlanRequest r;
    r.kv_dtype = KvDType::kBFloat16;
    r.context_tokens = 1024;
    absl::StatusOr<KvPlan> p = PlanKvCache(Preset(row.preset), r);
    ASSERT_OK(p);
    EXPECT_EQ(p->bytes_per_token, row.bytes_per_token);
    EXPECT_EQ(p->state_bytes_per_sequence, row.state_bytes);
  }
}

}  // namespace attend::planner
