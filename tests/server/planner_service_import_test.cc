// attend.v1.Planner's ImportModel through a real channel: a published config.json and a GGUF
// header built here reproduce the catalog's presets, bad and corrupt input is refused naming the
// field, and the size bounds apply before parsing.
#include <cstdint>
#include <random>
#include <string>

#include "attend/v1/planner.grpc.pb.h"
#include "server/planner_service.h"
#include "tests/planner/model_files.h"
#include "tests/server/planner_service_fixture.h"
#include "tests/test_util.h"

namespace attend {
namespace {

using ::attend::planner::testing::GgufWriter;
using ::attend::planner::testing::kLlama3_8BConfig;
using ::attend::planner::testing::TinyGguf;
using ::attend::testing::DirectPlanner;
using ::attend::testing::ExpectSameShape;
using ::attend::testing::kGiB;
using ::attend::testing::PlannerServiceTest;

TEST_F(PlannerServiceTest, ImportOfTheRealConfigJsonReproducesThePreset) {
  v1::ImportModelRequest request;
  request.set_hf_config_json(kLlama3_8BConfig);
  request.set_name("my-llama");
  v1::ModelSpec spec;
  const grpc::Status status = Import(request, &spec);
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(spec.name(), "my-llama");
  EXPECT_NE(spec.source().find("config.json"), std::string::npos) << spec.source();
  ExpectSameShape(spec, Model("llama-3-8b"));

  // The imported spec plans like the preset.
  v1::PlanKvCacheRequest plan;
  *plan.mutable_model()->mutable_spec() = spec;
  const v1::PlanKvCacheResponse p = PlanOk(plan);
  EXPECT_EQ(p.context_tokens(), 8192);
  EXPECT_EQ(p.bytes_per_token(), 131072);
  EXPECT_EQ(p.bytes_per_sequence(), kGiB);
}

TEST_F(PlannerServiceTest, ImportOfAGgufHeaderReproducesTheTinyModel) {
  v1::ImportModelRequest request;
  // Trailing bytes (tensor infos and data) are not read.
  request.set_gguf(TinyGguf().Build() + std::string(4096, '\x5a'));
  v1::ModelSpec spec;
  const grpc::Status status = Import(request, &spec);
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(spec.name(), "tiny-lesson-model");
  EXPECT_EQ(spec.display_name(), "Tiny Lesson Model");
  ExpectSameShape(spec, Model("tiny"));

  v1::PlanKvCacheRequest plan;
  *plan.mutable_model()->mutable_spec() = spec;
  EXPECT_EQ(PlanOk(plan).bytes_per_sequence(), 4194304);
}

TEST_F(PlannerServiceTest, ImportRejectsBadInputNamingTheField) {
  v1::ModelSpec response;
  v1::ImportModelRequest request;
  ExpectError(Import(request, &response), grpc::StatusCode::INVALID_ARGUMENT,
              {"source: neither hf_config_json", "gguf"});

  request.set_hf_config_json(R"({"num_hidden_layers": 32, "num_attention_heads": )");
  ExpectError(Import(request, &response), grpc::StatusCode::INVALID_ARGUMENT,
              {"hf_config_json: config.json: line 1, column 50: unexpected end of input"});
  request.set_hf_config_json("[1, 2]");
  ExpectError(Import(request, &response), grpc::StatusCode::INVALID_ARGUMENT,
              {"hf_config_json: config.json: the top level is not an object"});
  request.set_hf_config_json(R"({"num_attention_heads": 32, "hidden_size": 4096})");
  ExpectError(Import(request, &response), grpc::StatusCode::INVALID_ARGUMENT,
              {"hf_config_json", "num_hidden_layers"});
  request.set_hf_config_json(std::string(100000, '[') + std::string(100000, ']'));
  ExpectError(Import(request, &response), grpc::StatusCode::INVALID_ARGUMENT,
              {"hf_config_json: config.json: line 1, column 65: nesting deeper than 64 levels"});

  const std::string gguf = TinyGguf().Build();
  request.set_gguf(gguf.substr(0, gguf.size() - 3));  // the last value cut short
  ExpectError(Import(request, &response), grpc::StatusCode::INVALID_ARGUMENT,
              {"gguf: ", "runs past the end"});
  request.set_gguf(gguf.substr(0, 10));
  ExpectError(Import(request, &response), grpc::StatusCode::INVALID_ARGUMENT, {"gguf: "});
  request.set_gguf("");
  ExpectError(Import(request, &response), grpc::StatusCode::INVALID_ARGUMENT, {"gguf: "});
  // A string length of 2^40 in a 200-byte input.
  std::string huge_length;
  GgufWriter::Put(&huge_length, uint32_t{8});
  GgufWriter::Put(&huge_length, uint64_t{1} << 40);
  request.set_gguf(TinyGguf().Raw("general.name", huge_length).Build());
  ExpectError(Import(request, &response), grpc::StatusCode::INVALID_ARGUMENT,
              {"gguf: ", "1099511627776"});

  request.set_gguf(gguf);
  request.set_name(std::string(300, 'n'));
  ExpectError(Import(request, &response), grpc::StatusCode::INVALID_ARGUMENT,
              {"name: 300 bytes; at most 256"});
}

// Random corruption of a valid header never crashes the server and always gets an answer.
TEST_F(PlannerServiceTest, ImportSurvivesCorruptGguf) {
  const std::string gguf = TinyGguf().Build();
  std::mt19937_64 rng(11);
  int refused = 0;
  for (int trial = 0; trial < 200; ++trial) {
    std::string bad = gguf;
    for (int k = 0; k < 4; ++k) {
      bad[rng() % bad.size()] = static_cast<char>(rng());
    }
    v1::ImportModelRequest request;
    request.set_gguf(bad);
    v1::ModelSpec response;
    const grpc::Status status = Import(request, &response);
    ASSERT_TRUE(status.ok() || status.error_code() == grpc::StatusCode::INVALID_ARGUMENT)
        << status.error_code() << ": " << status.error_message();
    refused += status.ok() ? 0 : 1;
  }
  EXPECT_GT(refused, 0);
}

// The server's message limit (1 MiB here) refuses larger imports before any handler runs.
TEST_F(PlannerServiceTest, ImportOverTheMessageLimitIsRefused) {
  v1::ImportModelRequest request;
  request.set_gguf(std::string((1 << 20) + 10, 'G'));
  v1::ModelSpec response;
  EXPECT_EQ(Import(request, &response).error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
}

// --- The service on its own, with options ---------------------------------------------------

TEST(PlannerServiceOptions, BoundsImportSizesBeforeParsing) {
  server::PlannerOptions options;
  options.measure_local_after = absl::InfiniteDuration();
  options.max_hf_config_json_bytes = 1000;
  options.max_gguf_bytes = 2000;
  DirectPlanner planner(options);
  v1::ImportModelRequest request;
  request.set_hf_config_json(std::string(1001, ' '));
  v1::ModelSpec response;
  {
    grpc::ClientContext context;
    const grpc::Status status = planner.stub().ImportModel(&context, request, &response);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
    EXPECT_NE(status.error_message().find("hf_config_json: 1001 bytes, over the limit of 1000"),
              std::string::npos)
        << status.error_message();
  }
  request.set_gguf(TinyGguf().Build() + std::string(2000, '\0'));
  {
    grpc::ClientContext context;
    const grpc::Status status = planner.stub().ImportModel(&context, request, &response);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
    EXPECT_NE(status.error_message().find("gguf: "), std::string::npos) << status.error_message();
    EXPECT_NE(status.error_message().find("over the limit of 2000"), std::string::npos);
  }
  // At the limit it is parsed.
  request.set_gguf(TinyGguf().Build());
  ASSERT_LE(request.gguf().size(), 2000u);
  {
    grpc::ClientContext context;
    EXPECT_TRUE(planner.stub().ImportModel(&context, request, &response).ok());
  }
}

}  // namespace
}  // namespace attend
