// The server's version travels as initial metadata on every response: unary and streaming calls
// of attend's services, their errors, and libgrpc++'s health service.
#include <map>
#include <memory>
#include <string>

#include "attend/v1/attention.grpc.pb.h"
#include "attend/v1/kv_cache.grpc.pb.h"
#include "common/version/version.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "gtest/gtest.h"
#include "tests/server/server_fixture.h"

namespace attend {
namespace {

class VersionMetadataTest : public ::attend::testing::ServerSuite {};

// The values of kServerVersionMetadata in the initial metadata `context` received.
std::multimap<std::string, std::string> VersionEntries(const grpc::ClientContext& context) {
  std::multimap<std::string, std::string> entries;
  const auto& metadata = context.GetServerInitialMetadata();
  const auto [begin, end] = metadata.equal_range(kServerVersionMetadata);
  for (auto it = begin; it != end; ++it) {
    entries.emplace(std::string(it->first.data(), it->first.size()),
                    std::string(it->second.data(), it->second.size()));
  }
  return entries;
}

const std::multimap<std::string, std::string> kExpected = {
    {kServerVersionMetadata, VersionLine("attend-server")}};

TEST_F(VersionMetadataTest, OnAHealthCheck) {
  auto stub = grpc::health::v1::Health::NewStub(testing::ChannelTo(*server_));
  grpc::ClientContext context;
  grpc::health::v1::HealthCheckResponse response;
  ASSERT_TRUE(stub->Check(&context, {}, &response).ok());
  EXPECT_EQ(VersionEntries(context), kExpected);
}

TEST_F(VersionMetadataTest, OnAnAttentionCallAndItsError) {
  auto stub = v1::Attention::NewStub(testing::ChannelTo(*server_));
  v1::SoftmaxRequest request;
  request.add_logits(1);
  request.add_logits(2);
  v1::SoftmaxResponse response;
  grpc::ClientContext ok;
  ASSERT_TRUE(stub->Softmax(&ok, request, &response).ok());
  EXPECT_EQ(VersionEntries(ok), kExpected);
  request.set_temperature(-1);
  grpc::ClientContext refused;
  ASSERT_EQ(stub->Softmax(&refused, request, &response).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(VersionEntries(refused), kExpected);
}

TEST_F(VersionMetadataTest, OnKvCacheCallsUnaryAndStreaming) {
  auto stub = v1::KvCache::NewStub(testing::ChannelTo(*server_));
  grpc::ClientContext stats_context;
  v1::CacheStats stats;
  ASSERT_TRUE(stub->Stats(&stats_context, {}, &stats).ok());
  EXPECT_EQ(VersionEntries(stats_context), kExpected);

  grpc::ClientContext stream_context;
  auto stream = stub->DecodeStream(&stream_context);
  ASSERT_TRUE(stream->WritesDone());
  v1::DecodeBatchResponse response;
  EXPECT_FALSE(stream->Read(&response));
  EXPECT_TRUE(stream->Finish().ok());
  EXPECT_EQ(VersionEntries(stream_context), kExpected);
}

}  // namespace
}  // namespace attend
