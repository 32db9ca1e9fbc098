// attend.v1.Planner through a real channel: the catalog and the lessons' numbers through the
// API (KV-cache plans, cost estimates), every kind of bad input (with the code and the field
// named), concurrent calls, and the background measurement of the "local" profile. ImportModel
// has its own file, planner_service_import_test.cc.
#include "server/planner_service.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_format.h"
#include "attend/v1/planner.grpc.pb.h"
#include "google/protobuf/util/message_differencer.h"
#include "planner/catalog.h"
#include "planner/hardware.h"
#include "server/convert/planner.h"
#include "tests/server/planner_service_fixture.h"
#include "tests/server/server_fixture.h"
#include "tests/test_util.h"

namespace attend {
namespace {

using ::attend::testing::DirectPlanner;
using ::attend::testing::kGiB;
using ::attend::testing::kKiB;
using ::attend::testing::PlannerServiceTest;
using ::google::protobuf::util::MessageDifferencer;

// --- ListModels / GetModel ----------------------------------------------------------------------

TEST_F(PlannerServiceTest, ListModelsReturnsEveryPresetWithItsSource) {
  v1::ListModelsResponse response;
  grpc::ClientContext context;
  ASSERT_TRUE(stub_->ListModels(&context, v1::ListModelsRequest(), &response).ok());
  ASSERT_EQ(response.models_size(), static_cast<int>(planner::Catalog().size()));
  std::vector<std::string> names;
  for (const v1::ModelSpec& m : response.models()) {
    names.push_back(m.name());
    EXPECT_FALSE(m.source().empty()) << m.name();
    EXPECT_FALSE(m.display_name().empty()) << m.name();
  }
  for (const char* expected : {"tiny", "llama-3-8b", "llama-3-70b", "mistral-7b", "qwen2-0.5b"}) {
    EXPECT_NE(std::find(names.begin(), names.end(), expected), names.end()) << expected;
  }
  // Llama 3 8B as its config.json and model page publish it.
  const v1::ModelSpec& m = response.models(
      static_cast<int>(std::find(names.begin(), names.end(), "llama-3-8b") - names.begin()));
  EXPECT_EQ(m.display_name(), "Llama 3 8B");
  EXPECT_EQ(m.layers(), 32);
  EXPECT_EQ(m.n_head(), 32);
  EXPECT_EQ(m.n_head_kv(), 8);
  EXPECT_EQ(m.head_dim(), 128);
  EXPECT_EQ(m.head_dim_v(), 128);
  EXPECT_EQ(m.d_model(), 4096);
  EXPECT_EQ(m.vocab_size(), 128256);
  EXPECT_EQ(m.intermediate_size(), 14336);
  EXPECT_EQ(m.parameters(), 8030261248);
  EXPECT_EQ(m.active_parameters(), 8030261248);
  EXPECT_EQ(m.max_context_tokens(), 8192);
  EXPECT_EQ(m.weights_dtype(), "bfloat16");
  EXPECT_EQ(m.architecture(), "llama");
  EXPECT_EQ(m.layer_specs_size(), 0);
}

// Every field survives proto -> core -> proto: the conversions miss nothing.
TEST_F(PlannerServiceTest, ModelConversionRoundTripsEveryPreset) {
  for (const planner::ModelSpec& preset : planner::Catalog()) {
    v1::ModelSpec proto;
    server::ToProto(preset, &proto);
    absl::StatusOr<planner::ModelSpec> back = server::FromProto(proto);
    ASSERT_OK(back);
    v1::ModelSpec again;
    server::ToProto(*back, &again);
    EXPECT_TRUE(MessageDifferencer::Equals(proto, again)) << preset.name;
    EXPECT_EQ(back->layer_specs.size(), preset.layer_specs.size()) << preset.name;
    EXPECT_EQ(back->parameters_source, preset.parameters_source) << preset.name;
  }
  for (int v = 1; v <= 7; ++v) {
    absl::StatusOr<planner::KvDType> d = server::FromProto(static_cast<v1::KvDType>(v), "kv_dtype");
    ASSERT_OK(d);
    EXPECT_EQ(server::ToProto(*d), v);
  }
  EXPECT_EQ(*server::FromProto(v1::KV_DTYPE_UNSPECIFIED, "kv_dtype"), planner::KvDType::kFloat16);
}

TEST_F(PlannerServiceTest, GetModelIsCaseInsensitiveAndMatchesTheList) {
  const v1::ModelSpec by_name = Model("Llama-3-70B");
  EXPECT_EQ(by_name.name(), "llama-3-70b");
  EXPECT_EQ(by_name.layers(), 80);
  EXPECT_EQ(by_name.n_head(), 64);
  EXPECT_EQ(by_name.n_head_kv(), 8);
  v1::ListModelsResponse list;
  grpc::ClientContext context;
  ASSERT_TRUE(stub_->ListModels(&context, v1::ListModelsRequest(), &list).ok());
  for (const v1::ModelSpec& m : list.models()) {
    if (m.name() == "llama-3-70b") {
      EXPECT_TRUE(MessageDifferencer::Equals(m, by_name));
    }
  }
  // Gemma 2 alternates sliding-window (even) and global (odd) layers.
  const v1::ModelSpec gemma = Model("gemma-2-9b");
  ASSERT_EQ(gemma.layer_specs_size(), gemma.layers());
  EXPECT_EQ(gemma.layer_specs(0).window_tokens(), 4096);
  EXPECT_EQ(gemma.layer_specs(1).window_tokens(), 0);
}

TEST_F(PlannerServiceTest, GetModelRejectsUnknownAndEmptyNames) {
  v1::GetModelRequest request;
  v1::ModelSpec response;
  request.set_name("no-such-model");
  {
    grpc::ClientContext context;
    ExpectError(stub_->GetModel(&context, request, &response), grpc::StatusCode::NOT_FOUND,
                {"name: ", "'no-such-model'", "known models", "tiny", "llama-3-8b"});
  }
  request.set_name("");
  {
    grpc::ClientContext context;
    ExpectError(stub_->GetModel(&context, request, &response), grpc::StatusCode::INVALID_ARGUMENT,
                {"name: empty", "llama-3-8b"});
  }
  // Hostile names are quoted and cut, never echoed raw.
  request.set_name(std::string(5000, 'x') + "\n\x01");
  {
    grpc::ClientContext context;
    const grpc::Status status = stub_->GetModel(&context, request, &response);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::NOT_FOUND);
    EXPECT_LT(status.error_message().size(), 1000u);
    EXPECT_EQ(status.error_message().find('\n'), std::string::npos);
  }
}

// --- PlanKvCache --------------------------------------------------------------------------------

// Lesson 3, Example 10: "tiny model, 4096 tokens: 4,194,304 bytes = 4.00 MiB of KV cache",
// 2 x 4 layers x 2 KV heads x 32 x 2 bytes = 1,024 bytes per token.
TEST_F(PlannerServiceTest, PlanReproducesTheTinyModelOfTheLesson) {
  const v1::PlanKvCacheResponse p = PlanOk(PlanOf("tiny", 4096));
  EXPECT_EQ(p.bytes_per_sequence(), 4194304);
  EXPECT_EQ(p.bytes_per_token(), 1024);
  EXPECT_EQ(p.total_bytes(), 4194304);
  EXPECT_DOUBLE_EQ(p.bytes_per_value(), 2.0);
  EXPECT_EQ(p.kv_dtype(), v1::KV_FLOAT16);
  EXPECT_EQ(p.context_tokens(), 4096);
  EXPECT_EQ(p.batch(), 1);
  EXPECT_EQ(p.model().name(), "tiny");
  EXPECT_FALSE(p.has_paged());
  EXPECT_FALSE(p.has_budget());
}

// Lesson 3, Example 10: Llama 3 8B, 8 KV heads: 131,072 bytes per token, 1.00 GiB at 8,192
// tokens; 32 KV heads (multi-head) would be 524,288 and 4.00 GiB.
TEST_F(PlannerServiceTest, PlanReproducesLlama3EightB) {
  const v1::PlanKvCacheResponse p = PlanOk(PlanOf("llama-3-8b", 8192));
  EXPECT_EQ(p.bytes_per_token(), 131072);
  EXPECT_EQ(p.bytes_per_token(), 2 * 32 * 8 * 128 * 2);
  EXPECT_EQ(p.bytes_per_sequence(), 1 * kGiB);
  EXPECT_EQ(p.full_attention_bytes_per_token(), 131072);
  // Context 0 means the model's maximum (8,192).
  const v1::PlanKvCacheResponse by_default = PlanOk(PlanOf("llama-3-8b", 0));
  EXPECT_EQ(by_default.context_tokens(), 8192);
  EXPECT_EQ(by_default.bytes_per_sequence(), 1 * kGiB);

  // The same shape given inline, with 32 KV heads.
  v1::PlanKvCacheRequest request;
  *request.mutable_model()->mutable_spec() = Model("llama-3-8b");
  request.mutable_model()->mutable_spec()->set_n_head_kv(32);
  request.set_context_tokens(8192);
  const v1::PlanKvCacheResponse mha = PlanOk(request);
  EXPECT_EQ(mha.bytes_per_token(), 524288);
  EXPECT_EQ(mha.bytes_per_sequence(), 4 * kGiB);
}

// Lesson 3, Example 11: 32 layers x 32 heads x 128, f16, 32,768 tokens:
//   MHA 32 KV heads, group 1, 512 KiB/token, 16.00 GiB; GQA 8, 4, 128, 4.00; MQA 1, 32, 16, 0.50.
TEST_F(PlannerServiceTest, PlanGivesTheLessonVariantsTable) {
  const v1::PlanKvCacheResponse p = PlanOk(PlanOf("llama-3-8b", 32768));
  ASSERT_EQ(p.variants_size(), 3);
  const struct {
    const char* variant;
    int kv, group;
    int64_t kib_per_token;
    const char* gib;
    bool is_model;
  } expected[] = {{"MHA", 32, 1, 512, "16.00", false},
                  {"GQA", 8, 4, 128, "4.00", true},
                  {"MQA", 1, 32, 16, "0.50", false}};
  for (int i = 0; i < 3; ++i) {
    const v1::VariantRow& row = p.variants(i);
    SCOPED_TRACE(expected[i].variant);
    EXPECT_EQ(row.variant(), expected[i].variant);
    EXPECT_EQ(row.n_head_kv(), expected[i].kv);
    EXPECT_EQ(row.group_size(), expected[i].group);
    EXPECT_EQ(row.bytes_per_token(), expected[i].kib_per_token * kKiB);
    EXPECT_EQ(absl::StrFormat("%.2f", static_cast<double>(row.bytes_per_sequence()) / kGiB),
              expected[i].gib);
    EXPECT_EQ(row.is_model(), expected[i].is_model);
  }
}

// Lesson 3, Example 10: llama.cpp's "K (f16): 2.00 MiB, V (f16): 2.00 MiB" for the tiny model
// at 4096 tokens. By hand, a half is 4 layers x 2 KV heads x 32 x 2 bytes = 512 bytes per token,
// x 4096 = 2,097,152 bytes; the batch of 2 doubles it.
TEST_F(PlannerServiceTest, PlanSplitsTheTinyModelIntoKeysAndValues) {
  const v1::PlanKvCacheResponse p = PlanOk(PlanOf("tiny", 4096, 2));
  EXPECT_EQ(p.k_bytes_per_token(), 512);
  EXPECT_EQ(p.v_bytes_per_token(), 512);
  EXPECT_EQ(p.k_bytes_per_sequence(), 2097152);
  EXPECT_EQ(p.v_bytes_per_sequence(), 2097152);
  EXPECT_EQ(p.k_total_bytes(), 2 * 2097152);
  EXPECT_EQ(p.v_total_bytes(), 2 * 2097152);
  EXPECT_EQ(p.bytes_per_sequence(), 4194304);
}

// Lesson 3, Example 10: "per layer: Wq 16,777,216  Wk 4,194,304  Wv 4,194,304  Wo 16,777,216
// parameters" (4096 x 32 x 128 and 4096 x 8 x 128).
TEST_F(PlannerServiceTest, PlanGivesTheLessonProjectionsOfLlama3EightB) {
  const v1::PlanKvCacheResponse p = PlanOk(PlanOf("llama-3-8b", 8192));
  ASSERT_EQ(p.projections_size(), 1);
  const v1::ProjectionParameters& w = p.projections(0);
  EXPECT_EQ(w.wq(), 16777216);
  EXPECT_EQ(w.wk(), 4194304);
  EXPECT_EQ(w.wv(), 4194304);
  EXPECT_EQ(w.wo(), 16777216);
  EXPECT_EQ(w.total(), 41943040);
  EXPECT_EQ(w.n_head_kv(), 8);
  EXPECT_EQ(w.layers(), 32);
  EXPECT_EQ(w.first_layer(), 0);
}

// An inline model with value heads smaller than key heads and per-layer KV heads: the halves
// differ, follow the window, and still sum to the total; one projection entry per n_head_kv.
// By hand (f16, 2 layers, n_head 4, head_dim 64, head_dim_v 32, d_model 256):
//   layer 0: 2 KV heads, full; keys 2 x 64 x 2 = 256 bytes per token, values 2 x 32 x 2 = 128.
//   layer 1: 4 KV heads, window 100; keys 512, values 256 per token, at most 100 tokens.
//   at 1000 tokens: keys 256 x 1000 + 512 x 100 = 307,200; values 128,000 + 25,600 = 153,600.
//   Wq = 256 x 4 x 64 = 65,536, Wo = 4 x 32 x 256 = 32,768; Wk = 256 x kv x 64,
//   Wv = 256 x kv x 32.
TEST_F(PlannerServiceTest, PlanSplitsAnInlineModelWithSmallerValueHeads) {
  v1::PlanKvCacheRequest request;
  v1::ModelSpec* spec = request.mutable_model()->mutable_spec();
  spec->set_name("split");
  spec->set_layers(2);
  spec->set_n_head(4);
  spec->set_n_head_kv(2);
  spec->set_head_dim(64);
  spec->set_head_dim_v(32);
  spec->set_d_model(256);
  spec->add_layer_specs()->set_n_head_kv(2);
  v1::LayerSpec* sliding = spec->add_layer_specs();
  sliding->set_n_head_kv(4);
  sliding->set_window_tokens(100);
  request.set_context_tokens(1000);
  const v1::PlanKvCacheResponse p = PlanOk(request);
  EXPECT_EQ(p.k_bytes_per_token(), 256 + 512);
  EXPECT_EQ(p.v_bytes_per_token(), 128 + 256);
  EXPECT_EQ(p.k_bytes_per_sequence(), 307200);
  EXPECT_EQ(p.v_bytes_per_sequence(), 153600);
  EXPECT_EQ(p.bytes_per_sequence(), 307200 + 153600);
  ASSERT_EQ(p.projections_size(), 2);
  EXPECT_EQ(p.projections(0).n_head_kv(), 2);
  EXPECT_EQ(p.projections(0).first_layer(), 0);
  EXPECT_EQ(p.projections(0).wq(), 65536);
  EXPECT_EQ(p.projections(0).wk(), 32768);
  EXPECT_EQ(p.projections(0).wv(), 16384);
  EXPECT_EQ(p.projections(0).wo(), 32768);
  EXPECT_EQ(p.projections(1).n_head_kv(), 4);
  EXPECT_EQ(p.projections(1).first_layer(), 1);
  EXPECT_EQ(p.projections(1).layers(), 1);
  EXPECT_EQ(p.projections(1).wk(), 65536);
  EXPECT_EQ(p.projections(1).wv(), 32768);
}

// Through the API too, for every preset and KV type, the halves sum to the totals.
TEST_F(PlannerServiceTest, PlanHalvesSumToTheTotalsForEveryPresetAndKvType) {
  for (const planner::ModelSpec& m : planner::Catalog()) {
    for (int dtype = v1::KV_FLOAT32; dtype <= v1::KV_Q4_0; ++dtype) {
      SCOPED_TRACE(absl::StrFormat("%s %d", m.name, dtype));
      const v1::PlanKvCacheResponse p =
          PlanOk(PlanOf(m.name, 5000, 3, static_cast<v1::KvDType>(dtype)));
      // The halves split the KV part: the total less the recurrent layers' state.
      EXPECT_EQ(p.k_bytes_per_token() + p.v_bytes_per_token(), p.bytes_per_token());
      EXPECT_EQ(p.k_bytes_per_sequence() + p.v_bytes_per_sequence(),
                p.bytes_per_sequence() - p.state_bytes_per_sequence());
      EXPECT_EQ(p.k_total_bytes() + p.v_total_bytes(), p.total_bytes() - p.state_total_bytes());
    }
  }
}

// Bytes per value: 4, 2, 2, 1, 1, and whole 32-value blocks of 34 (q8_0) and 18 (q4_0) bytes,
// so a 128-value head row is 4 blocks: 136 and 72 bytes.
TEST_F(PlannerServiceTest, PlanSizesEveryKvType) {
  const struct {
    v1::KvDType dtype;
    int64_t row_bytes;  // one 128-value head row
    double bytes_per_value;
  } cases[] = {{v1::KV_FLOAT32, 512, 4.0},  {v1::KV_FLOAT16, 256, 2.0},
               {v1::KV_BFLOAT16, 256, 2.0}, {v1::KV_FP8, 128, 1.0},
               {v1::KV_INT8, 128, 1.0},     {v1::KV_Q8_0, 136, 34.0 / 32},
               {v1::KV_Q4_0, 72, 18.0 / 32}};
  for (const auto& c : cases) {
    SCOPED_TRACE(v1::KvDType_Name(c.dtype));
    const v1::PlanKvCacheResponse p = PlanOk(PlanOf("llama-3-8b", 1000, 3, c.dtype));
    EXPECT_EQ(p.kv_dtype(), c.dtype);
    EXPECT_DOUBLE_EQ(p.bytes_per_value(), c.bytes_per_value);
    // K and V rows x 32 layers x 8 KV heads.
    EXPECT_EQ(p.bytes_per_token(), 2 * 32 * 8 * c.row_bytes);
    EXPECT_EQ(p.total_bytes(), 3 * 1000 * p.bytes_per_token());
  }
}

// Paged allocation rounds each sequence up to whole blocks: 4,001 tokens in 16-token blocks is
// 251 blocks = 4,016 tokens of 1,024 bytes, 15 tokens (15,360 bytes) unused per sequence.
TEST_F(PlannerServiceTest, PlanRoundsPagedBlocks) {
  v1::PlanKvCacheRequest request = PlanOf("tiny", 4001, 2);
  request.set_block_tokens(16);
  const v1::PlanKvCacheResponse p = PlanOk(request);
  ASSERT_TRUE(p.has_paged());
  EXPECT_EQ(p.paged().block_tokens(), 16);
  EXPECT_EQ(p.paged().blocks_per_sequence(), 251);
  EXPECT_EQ(p.paged().allocated_bytes_per_sequence(), 251 * 16 * 1024);
  EXPECT_EQ(p.paged().allocated_bytes(), 2 * 251 * 16 * 1024);
  EXPECT_EQ(p.paged().waste_bytes(), 2 * 15 * 1024);
}

// "Llama 3 70B, 32k context, 16 users, fp8 KV: does it fit in 80 GiB?" 2 x 80 layers x 8 KV
// heads x 128 x 1 byte = 163,840 bytes per token; x 32,768 = 5 GiB per sequence; x 16 = 80 GiB:
// exactly. One sequence could hold 80 GiB / 163,840 = 524,288 tokens.
TEST_F(PlannerServiceTest, PlanAnswersTheBudgetQuestion) {
  v1::PlanKvCacheRequest request = PlanOf("llama-3-70b", 32768, 16, v1::KV_FP8);
  request.set_memory_budget_bytes(80 * kGiB);
  const v1::PlanKvCacheResponse p = PlanOk(request);
  EXPECT_EQ(p.bytes_per_token(), 163840);
  EXPECT_EQ(p.bytes_per_sequence(), 5 * kGiB);
  EXPECT_EQ(p.total_bytes(), 80 * kGiB);
  ASSERT_TRUE(p.has_budget());
  const v1::BudgetPlan& b = p.budget();
  EXPECT_EQ(b.budget_bytes(), 80 * kGiB);
  EXPECT_EQ(b.weights_bytes(), 0);
  EXPECT_EQ(b.available_bytes(), 80 * kGiB);
  EXPECT_TRUE(b.fits());
  EXPECT_EQ(b.max_sequences(), 16);
  EXPECT_EQ(b.max_context_tokens(), 32768);
  EXPECT_EQ(b.max_context_tokens_one_sequence(), 524288);
  EXPECT_FALSE(b.context_unbounded());
  EXPECT_NE(b.explanation().find("16 sequences of 32,768 tokens need 80.00 GiB"), std::string::npos)
      << b.explanation();
  EXPECT_NE(b.explanation().find("it fits"), std::string::npos) << b.explanation();

  // With the bf16 weights (2 bytes x 70,553,706,496 parameters = 141 GB) nothing fits.
  request.set_subtract_weights(true);
  const v1::PlanKvCacheResponse w = PlanOk(request);
  EXPECT_EQ(w.budget().weights_bytes(), 2 * int64_t{70553706496});
  EXPECT_EQ(w.budget().available_bytes(), 80 * kGiB - 2 * int64_t{70553706496});
  EXPECT_FALSE(w.budget().fits());
  EXPECT_EQ(w.budget().max_sequences(), 0);
  EXPECT_NE(w.budget().explanation().find("weights alone exceed the budget"), std::string::npos)
      << w.budget().explanation();

  // Llama 3 8B in 80 GB (decimal) after its bf16 weights (16,060,522,496 bytes): 63,939,477,504
  // bytes left, 59 sequences of 8,192 tokens (1 GiB each).
  v1::PlanKvCacheRequest small = PlanOf("llama-3-8b", 8192);
  small.set_memory_budget_bytes(80'000'000'000);
  small.set_subtract_weights(true);
  const v1::PlanKvCacheResponse s = PlanOk(small);
  EXPECT_EQ(s.budget().weights_bytes(), 16060522496);
  EXPECT_EQ(s.budget().available_bytes(), 63939477504);
  EXPECT_EQ(s.budget().max_sequences(), 59);
  EXPECT_NE(s.budget().explanation().find("1 sequence of 8,192 tokens needs 1.00 GiB"),
            std::string::npos)
      << s.budget().explanation();
  // Explicit weight bytes win over parameters x type.
  small.set_weights_bytes(1'000'000'000);
  EXPECT_EQ(PlanOk(small).budget().available_bytes(), 79'000'000'000);
}

// Sliding windows: Mistral 7B v0.1 keeps 4,096 tokens on every layer, so its cache stops at
// 4,096 x 131,072 bytes = 512 MiB; Gemma 2 9B's 21 windowed layers stop at 4,096 while its 21
// global layers keep growing (8,192 bytes per layer per token).
TEST_F(PlannerServiceTest, PlanFlattensAtSlidingWindows) {
  v1::PlanKvCacheRequest request = PlanOf("mistral-7b", 32768);
  request.set_memory_budget_bytes(1 * kGiB);
  const v1::PlanKvCacheResponse m = PlanOk(request);
  EXPECT_EQ(m.bytes_per_token(), 131072);
  EXPECT_EQ(m.full_attention_bytes_per_token(), 0);
  EXPECT_EQ(m.bytes_per_sequence(), 4096 * int64_t{131072});
  EXPECT_TRUE(m.budget().context_unbounded());
  EXPECT_EQ(m.budget().max_sequences(), 2);

  const v1::PlanKvCacheResponse g = PlanOk(PlanOf("gemma-2-9b", 8192));
  EXPECT_EQ(g.bytes_per_token(), 2 * 42 * 8 * 256 * 2);
  EXPECT_EQ(g.full_attention_bytes_per_token(), 2 * 21 * 8 * 256 * 2);
  EXPECT_EQ(g.bytes_per_sequence(), 21 * 8192 * int64_t{4096 + 8192});
}

TEST_F(PlannerServiceTest, PlanRejectsBadInputNamingTheField) {
  v1::PlanKvCacheResponse response;
  ExpectError(Plan(PlanOf("no-such-model", 10), &response), grpc::StatusCode::NOT_FOUND,
              {"model.name: ", "'no-such-model'", "llama-3-8b"});
  ExpectError(Plan(v1::PlanKvCacheRequest(), &response), grpc::StatusCode::INVALID_ARGUMENT,
              {"model: missing", "model.name", "model.spec"});
  ExpectError(Plan(PlanOf("llama-3-8b", -1), &response), grpc::StatusCode::INVALID_ARGUMENT,
              {"context_tokens: -1"});
  ExpectError(Plan(PlanOf("llama-3-8b", 10, (int64_t{1} << 24) + 1), &response),
              grpc::StatusCode::INVALID_ARGUMENT, {"batch: 16777217", "16777216"});
  ExpectError(Plan(PlanOf("llama-3-8b", 10, 1, static_cast<v1::KvDType>(99)), &response),
              grpc::StatusCode::INVALID_ARGUMENT, {"kv_dtype: 99", "KV_FLOAT16"});
  ExpectError(Plan(PlanOf("llama-3-8b", 10, 1, static_cast<v1::KvDType>(-3)), &response),
              grpc::StatusCode::INVALID_ARGUMENT, {"kv_dtype: -3"});
  v1::PlanKvCacheRequest request = PlanOf("llama-3-8b", 10);
  request.set_block_tokens(-16);
  ExpectError(Plan(request, &response), grpc::StatusCode::INVALID_ARGUMENT, {"block_tokens: -16"});
  request = PlanOf("llama-3-8b", 10);
  request.set_memory_budget_bytes(-1);
  ExpectError(Plan(request, &response), grpc::StatusCode::INVALID_ARGUMENT,
              {"memory_budget_bytes: -1"});
  request.set_memory_budget_bytes(kGiB);
  request.set_subtract_weights(true);
  request.set_weights_dtype("float12");
  ExpectError(Plan(request, &response), grpc::StatusCode::INVALID_ARGUMENT,
              {"weights_dtype: 'float12'"});
  // A context of 0 needs a model that knows its maximum.
  request = PlanOf("llama-3-8b", 0);
  *request.mutable_model()->mutable_spec() = Model("llama-3-8b");
  request.mutable_model()->mutable_spec()->set_max_context_tokens(0);
  ExpectError(Plan(request, &response), grpc::StatusCode::INVALID_ARGUMENT, {"context_tokens: 0"});
  // An answer that overflows int64 is refused, not wrapped.
  request = PlanOf("llama-3.1-405b", int64_t{1} << 40, int64_t{1} << 24, v1::KV_FLOAT32);
  ExpectError(Plan(request, &response), grpc::StatusCode::INVALID_ARGUMENT, {"overflows"});
}

TEST_F(PlannerServiceTest, PlanRejectsBadInlineModelsNamingTheField) {
  v1::PlanKvCacheResponse response;
  const auto with_spec = [&](auto edit) {
    v1::PlanKvCacheRequest request;
    v1::ModelSpec* spec = request.mutable_model()->mutable_spec();
    *spec = Model("llama-3-8b");
    edit(spec);
    request.set_context_tokens(100);
    return request;
  };
  ExpectError(Plan(with_spec([](v1::ModelSpec* m) { m->set_n_head_kv(3); }), &response),
              grpc::StatusCode::INVALID_ARGUMENT,
              {"model.spec.n_head_kv: 3 does not divide n_head 32"});
  ExpectError(Plan(with_spec([](v1::ModelSpec* m) { m->set_layers(0); }), &response),
              grpc::StatusCode::INVALID_ARGUMENT, {"model.spec.layers: 0"});
  ExpectError(Plan(with_spec([](v1::ModelSpec* m) { m->set_head_dim(-5); }), &response),
              grpc::StatusCode::INVALID_ARGUMENT, {"model.spec.head_dim: -5"});
  ExpectError(Plan(with_spec([](v1::ModelSpec* m) { m->add_layer_specs(); }), &response),
              grpc::StatusCode::INVALID_ARGUMENT, {"model.spec.layer_specs: 1 entries for 32"});
  ExpectError(Plan(with_spec([](v1::ModelSpec* m) {
                     for (int i = 0; i < 32; ++i) m->add_layer_specs()->set_window_tokens(-1);
                   }),
                   &response),
              grpc::StatusCode::INVALID_ARGUMENT, {"model.spec.layer_specs[0].window_tokens: -1"});
  ExpectError(Plan(with_spec([](v1::ModelSpec* m) {
                     for (int i = 0; i < 5000; ++i) m->add_layer_specs();
                   }),
                   &response),
              grpc::StatusCode::INVALID_ARGUMENT, {"model.spec.layer_specs: 5000 entries"});
  ExpectError(Plan(with_spec([](v1::ModelSpec* m) { m->set_weights_dtype("fp64"); }), &response),
              grpc::StatusCode::INVALID_ARGUMENT, {"model.spec.weights_dtype: 'fp64'"});
}

// --- EstimateCost -------------------------------------------------------------------------------

// Lesson 3, Example 12 (32 layers x 32 heads x 128, P = 8e9):
//       n   prefill attention   prefill weights   decode attention   decode weights
//    1024            0.3 TFLOP         16.4 TFLOP          0.5 GFLOP        16.0 GFLOP
//    8192           17.6 TFLOP        131.1 TFLOP          4.3 GFLOP        16.0 GFLOP
//   32768          281.5 TFLOP        524.3 TFLOP         17.2 GFLOP        16.0 GFLOP
//  131072         4503.6 TFLOP       2097.2 TFLOP         68.7 GFLOP        16.0 GFLOP
TEST_F(PlannerServiceTest, CostReproducesTheLessonTable) {
  const struct {
    int64_t n;
    const char *prefill_attention, *prefill_weights, *decode_attention;
  } rows[] = {{1024, "0.3", "16.4", "0.5"},
              {8192, "17.6", "131.1", "4.3"},
              {32768, "281.5", "524.3", "17.2"},
              {131072, "4503.6", "2097.2", "68.7"}};
  for (const auto& row : rows) {
    SCOPED_TRACE(row.n);
    v1::EstimateCostResponse e;
    ASSERT_TRUE(Cost(LessonCost(row.n), &e).ok());
    EXPECT_EQ(absl::StrFormat("%.1f", e.prefill().attention_flops() / 1e12), row.prefill_attention);
    EXPECT_EQ(absl::StrFormat("%.1f", e.prefill().weight_flops() / 1e12), row.prefill_weights);
    EXPECT_EQ(absl::StrFormat("%.1f", e.decode().attention_flops() / 1e9), row.decode_attention);
    EXPECT_EQ(absl::StrFormat("%.1f", e.decode().weight_flops() / 1e9), "16.0");
    // 4 x 128 x 32 heads x 32 layers per pair, n(n+1)/2 pairs.
    const double n = static_cast<double>(row.n);
    EXPECT_DOUBLE_EQ(e.prefill().attention_flops(), 4.0 * 128 * 32 * 32 * n * (n + 1) / 2);
    EXPECT_DOUBLE_EQ(e.decode().attention_flops(), 4.0 * 128 * 32 * 32 * n);
  }
}

// The roofline on an H100 SXM (989.5 TFLOP/s bf16 dense, 3.35 TB/s) for an 8,192-token prompt:
// a prefill reads the bf16 weights once (16e9 bytes) and writes 1 GiB of cache; a decode step
// reads both. Attention overtakes the weights where 524,288 x n(n+1)/2 > 2 x 8e9 x n, i.e. from
// n = 61,035; for a decode step where 524,288 x n > 16e9, i.e. from n = 30,518.
TEST_F(PlannerServiceTest, CostGivesTheRooflineAndCrossover) {
  v1::EstimateCostRequest request = LessonCost(8192);
  request.set_price_per_hour_usd(2.5);
  v1::EstimateCostResponse e;
  ASSERT_TRUE(Cost(request, &e).ok());
  EXPECT_EQ(e.hardware().name(), "h100");
  EXPECT_EQ(e.peak_flops(), 989.5e12);
  EXPECT_EQ(e.compute_dtype(), "bfloat16");
  EXPECT_EQ(e.parameters(), 8'000'000'000);
  EXPECT_EQ(e.prompt_tokens(), 8192);
  EXPECT_EQ(e.context_tokens(), 8192);
  EXPECT_EQ(e.batch(), 1);
  EXPECT_EQ(e.model().name(), "llama-3-8b");

  const double prefill_flops = 4.0 * 128 * 32 * 32 * 8192 * 8193 / 2 + 2 * 8e9 * 8192;
  const double bytes = 16e9 + static_cast<double>(kGiB);
  const v1::PhaseCost& p = e.prefill();
  EXPECT_DOUBLE_EQ(p.weight_bytes(), 16e9);
  EXPECT_DOUBLE_EQ(p.kv_bytes(), static_cast<double>(kGiB));
  EXPECT_DOUBLE_EQ(p.bytes_moved(), bytes);
  EXPECT_NEAR(p.arithmetic_intensity(), prefill_flops / bytes, 1e-9 * prefill_flops / bytes);
  EXPECT_NEAR(p.compute_seconds(), prefill_flops / 989.5e12, 1e-12);
  EXPECT_NEAR(p.memory_seconds(), bytes / 3.35e12, 1e-12);
  EXPECT_EQ(p.bound(), "compute");
  EXPECT_DOUBLE_EQ(p.roofline_seconds(), p.compute_seconds());
  EXPECT_NEAR(p.tokens_per_second(), 8192 / p.roofline_seconds(), 1e-6);
  EXPECT_NEAR(p.usd_per_million_tokens(), 2.5 / 3600 * p.roofline_seconds() / 8192 * 1e6, 1e-12);

  const v1::PhaseCost& d = e.decode();
  EXPECT_DOUBLE_EQ(d.bytes_moved(), bytes);
  EXPECT_EQ(d.bound(), "memory");
  EXPECT_NEAR(d.roofline_seconds(), bytes / 3.35e12, 1e-12);
  EXPECT_NEAR(d.tokens_per_second(), 1 / d.roofline_seconds(), 1e-6);

  EXPECT_EQ(e.prefill_crossover_tokens(), 61035);
  EXPECT_EQ(e.decode_crossover_tokens(), 30518);
}

TEST_F(PlannerServiceTest, CostOnCustomHardwareAndOtherDTypes) {
  v1::EstimateCostRequest request = LessonCost(1024);
  v1::HardwareProfile* h = request.mutable_custom();
  h->set_name("my-gpu");
  h->set_peak_flops_f32(1e13);
  h->set_memory_bandwidth_bytes_per_second(1e12);
  request.set_compute_dtype("float32");
  request.set_kv_dtype(v1::KV_FP8);
  request.set_batch(4);
  v1::EstimateCostResponse e;
  ASSERT_TRUE(Cost(request, &e).ok());
  EXPECT_EQ(e.hardware().name(), "my-gpu");
  EXPECT_EQ(e.peak_flops(), 1e13);
  EXPECT_EQ(e.compute_dtype(), "float32");
  EXPECT_EQ(e.batch(), 4);
  // The fp8 cache of 4 sequences of 1,024 tokens: 4 x 1,024 x 65,536 bytes.
  EXPECT_DOUBLE_EQ(e.prefill().kv_bytes(), 4.0 * 1024 * 65536);
  EXPECT_DOUBLE_EQ(e.prefill().weight_flops(), 4 * 2 * 8e9 * 1024);
}

TEST_F(PlannerServiceTest, CostRejectsBadInputNamingTheField) {
  v1::EstimateCostResponse response;
  v1::EstimateCostRequest request = LessonCost(100);
  request.mutable_model()->set_name("no-such-model");
  ExpectError(Cost(request, &response), grpc::StatusCode::NOT_FOUND, {"model.name: ", "tiny"});
  request = LessonCost(100);
  request.set_profile("tpu-v9");
  ExpectError(Cost(request, &response), grpc::StatusCode::NOT_FOUND,
              {"profile: ", "'tpu-v9'", "h100", "cpu-socket", "local"});
  request = LessonCost(100);
  request.clear_profile();
  ExpectError(Cost(request, &response), grpc::StatusCode::INVALID_ARGUMENT,
              {"hardware: missing", "h100", "custom"});
  request.mutable_custom()->set_peak_flops_bf16(1e12);
  request.mutable_custom()->set_memory_bandwidth_bytes_per_second(0);
  ExpectError(Cost(request, &response), grpc::StatusCode::INVALID_ARGUMENT,
              {"custom.memory_bandwidth_bytes_per_second", "> 0"});
  request.mutable_custom()->set_memory_bandwidth_bytes_per_second(1e11);
  request.mutable_custom()->set_peak_flops_bf16(std::numeric_limits<double>::quiet_NaN());
  ExpectError(Cost(request, &response), grpc::StatusCode::INVALID_ARGUMENT,
              {"custom.peak_flops_bf16"});
  request.mutable_custom()->set_peak_flops_bf16(0);
  ExpectError(Cost(request, &response), grpc::StatusCode::INVALID_ARGUMENT,
              {"custom: every peak FLOP/s figure is 0"});
  request = LessonCost(-5);
  ExpectError(Cost(request, &response), grpc::StatusCode::INVALID_ARGUMENT, {"prompt_tokens: -5"});
  request = LessonCost(0);
  ExpectError(Cost(request, &response), grpc::StatusCode::INVALID_ARGUMENT,
              {"prompt_tokens and context_tokens are both 0"});
  request = LessonCost(100);
  request.set_batch((int64_t{1} << 24) + 1);
  ExpectError(Cost(request, &response), grpc::StatusCode::INVALID_ARGUMENT, {"batch: 16777217"});
  request = LessonCost(100);
  request.set_kv_dtype(static_cast<v1::KvDType>(8));
  ExpectError(Cost(request, &response), grpc::StatusCode::INVALID_ARGUMENT, {"kv_dtype: 8"});
  request = LessonCost(100);
  request.set_compute_dtype("q4_0");
  ExpectError(Cost(request, &response), grpc::StatusCode::INVALID_ARGUMENT,
              {"compute_dtype: q4_0", "storage format"});
  request = LessonCost(100);
  request.set_price_per_hour_usd(-1);
  ExpectError(Cost(request, &response), grpc::StatusCode::INVALID_ARGUMENT,
              {"price_per_hour_usd: -1"});
  request = LessonCost(100);
  request.set_parameters(0);
  ExpectError(Cost(request, &response), grpc::StatusCode::INVALID_ARGUMENT, {"parameters: 0"});
  request = LessonCost(100);
  *request.mutable_model()->mutable_spec() = Model("llama-3-8b");
  request.mutable_model()->mutable_spec()->set_n_head(0);
  ExpectError(Cost(request, &response), grpc::StatusCode::INVALID_ARGUMENT,
              {"model.spec.n_head: 0"});
}

// "local" is this machine, measured once per process; every call sees the same figures.
TEST_F(PlannerServiceTest, CostOnTheLocalProfile) {
  v1::EstimateCostRequest request = LessonCost(1024);
  request.set_profile("local");
  request.set_compute_dtype("float32");
  v1::EstimateCostResponse e;
  const grpc::Status status = Cost(request, &e);
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(e.hardware().name(), "local");
  EXPECT_GT(e.hardware().peak_flops_f32(), 1e9);
  EXPECT_GT(e.hardware().memory_bandwidth_bytes_per_second(), 1e8);
  EXPECT_NE(e.hardware().note().find("measured"), std::string::npos) << e.hardware().note();
  EXPECT_EQ(e.hardware().peak_flops_f32(), planner::LocalHardware().peak_flops_f32);
  EXPECT_EQ(e.peak_flops(), e.hardware().peak_flops_f32());
}

// --- Concurrency --------------------------------------------------------------------------------

TEST_F(PlannerServiceTest, ConcurrentCallsAllSucceed) {
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      auto stub = v1::Planner::NewStub(::attend::testing::ChannelTo(*server_));
      for (int i = 0; i < 25; ++i) {
        v1::PlanKvCacheRequest request = PlanOf("llama-3-8b", 1000 + t * 100 + i);
        v1::PlanKvCacheResponse response;
        grpc::ClientContext context;
        if (!stub->PlanKvCache(&context, request, &response).ok() ||
            response.bytes_per_sequence() != (1000 + t * 100 + i) * int64_t{131072}) {
          failures++;
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(failures.load(), 0);
}

// --- The service on its own, with options ---------------------------------------------------

// The service measures the machine on its own, without a request, and the first EstimateCost
// with profile "local" then finds the figures ready.
TEST(PlannerServiceOptions, MeasuresTheLocalProfileInTheBackground) {
  server::PlannerOptions options;
  options.measure_local_after = absl::ZeroDuration();
  DirectPlanner planner(options);
  ASSERT_TRUE(planner.service().WaitForLocalHardware(absl::Seconds(120)));
  EXPECT_TRUE(planner.service().local_hardware_measured());
  v1::EstimateCostRequest request;
  request.mutable_model()->set_name("tiny");
  request.set_prompt_tokens(64);
  request.set_profile("local");
  request.set_compute_dtype("float32");
  v1::EstimateCostResponse response;
  grpc::ClientContext context;
  const grpc::Status status = planner.stub().EstimateCost(&context, request, &response);
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(response.hardware().peak_flops_f32(), planner::LocalHardware().peak_flops_f32);
}

// A service destroyed before its delay ends neither measures nor waits for the delay.
TEST(PlannerServiceOptions, ShortLivedServiceSkipsTheMeasurement) {
  server::PlannerOptions options;
  options.measure_local_after = absl::Seconds(30);
  const auto start = std::chrono::steady_clock::now();
  {
    DirectPlanner planner(options);
    EXPECT_FALSE(planner.service().local_hardware_measured());
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(10));

  options.measure_local_after = absl::InfiniteDuration();
  DirectPlanner never(options);
  EXPECT_FALSE(never.service().WaitForLocalHardware(absl::Milliseconds(200)));
}

}  // namespace
}  // namespace attend
