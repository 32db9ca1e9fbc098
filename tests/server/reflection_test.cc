// Server reflection, v1 and v1alpha, through their generated stubs on a real channel: what
// list_services lists, and that every file set answered builds on its own into a DescriptorPool
// (so each carries its complete dependencies, in order), errors included in the stream.
#include "server/reflection.h"

#include <memory>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/descriptor.pb.h"
#include "grpc/reflection/v1/reflection.grpc.pb.h"
#include "grpc/reflection/v1alpha/reflection.grpc.pb.h"
#include "gtest/gtest.h"
#include "tests/server/server_fixture.h"

namespace attend {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;
using ::testing::UnorderedElementsAre;

struct V1 {
  using Service = grpc::reflection::v1::ServerReflection;
  using Request = grpc::reflection::v1::ServerReflectionRequest;
  using Response = grpc::reflection::v1::ServerReflectionResponse;
};
struct V1Alpha {
  using Service = grpc::reflection::v1alpha::ServerReflection;
  using Request = grpc::reflection::v1alpha::ServerReflectionRequest;
  using Response = grpc::reflection::v1alpha::ServerReflectionResponse;
};

// One reflection stream: each Ask writes a request and reads its response.
template <typename Version>
class Stream {
 public:
  using Request = typename Version::Request;
  using Response = typename Version::Response;

  explicit Stream(const std::shared_ptr<grpc::Channel>& channel)
      : stub_(Version::Service::NewStub(channel)),
        stream_(stub_->ServerReflectionInfo(&context_)) {}

  Response Ask(const Request& request) {
    Response response;
    EXPECT_TRUE(stream_->Write(request));
    EXPECT_TRUE(stream_->Read(&response));
    return response;
  }
  Response Symbol(const std::string& symbol) {
    Request request;
    request.set_file_containing_symbol(symbol);
    return Ask(request);
  }
  Response File(const std::string& name) {
    Request request;
    request.set_file_by_filename(name);
    return Ask(request);
  }
  grpc::Status Finish() {
    EXPECT_TRUE(stream_->WritesDone());
    Response extra;
    EXPECT_FALSE(stream_->Read(&extra));
    return stream_->Finish();
  }

 private:
  std::unique_ptr<typename Version::Service::Stub> stub_;
  grpc::ClientContext context_;
  std::unique_ptr<grpc::ClientReaderWriter<Request, Response>> stream_;
};

// Builds the response's files into `pool` in the order given: each must build from the files
// before it alone. Returns the names of the files, in order.
template <typename Response>
std::vector<std::string> BuildInto(const Response& response,
                                   google::protobuf::DescriptorPool* pool) {
  std::vector<std::string> names;
  EXPECT_FALSE(response.has_error_response()) << response.error_response().error_message();
  for (const std::string& bytes : response.file_descriptor_response().file_descriptor_proto()) {
    google::protobuf::FileDescriptorProto proto;
    EXPECT_TRUE(proto.ParseFromString(bytes));
    EXPECT_NE(pool->BuildFile(proto), nullptr)
        << proto.name() << " does not build after " << ::testing::PrintToString(names);
    names.push_back(proto.name());
  }
  return names;
}

template <typename Version>
class ReflectionTest : public ::attend::testing::ServerSuite {
 protected:
  Stream<Version> Open() { return Stream<Version>(::attend::testing::ChannelTo(*server_)); }
};

using Versions = ::testing::Types<V1, V1Alpha>;
TYPED_TEST_SUITE(ReflectionTest, Versions);

TYPED_TEST(ReflectionTest, ListsExactlyTheServedServices) {
  auto stream = this->Open();
  typename TypeParam::Request request;
  request.set_list_services("*");
  const auto response = stream.Ask(request);
  ASSERT_TRUE(response.has_list_services_response());
  std::vector<std::string> names;
  for (const auto& service : response.list_services_response().service()) {
    names.push_back(service.name());
  }
  EXPECT_THAT(names,
              UnorderedElementsAre("attend.v1.Attention", "attend.v1.KvCache", "attend.v1.Planner",
                                   "grpc.health.v1.Health", server::kReflectionV1Service,
                                   server::kReflectionV1AlphaService));
  // Every listed service is describable, each on the same stream.
  for (const std::string& name : names) {
    google::protobuf::DescriptorPool pool;
    BuildInto(stream.Symbol(name), &pool);
    EXPECT_NE(pool.FindServiceByName(name), nullptr) << name;
  }
  EXPECT_TRUE(stream.Finish().ok());
}

TYPED_TEST(ReflectionTest, SymbolsAnswerCompleteFileSetsDependenciesFirst) {
  auto stream = this->Open();
  struct Case {
    const char* symbol;
    const char* file;
  };
  for (const Case& c :
       {Case{"attend.v1.KvCache", "attend/v1/kv_cache.proto"},
        Case{"attend.v1.KvCache.Append", "attend/v1/kv_cache.proto"},
        Case{"attend.v1.AppendRequest", "attend/v1/kv_cache.proto"},
        Case{"attend.v1.DType", "attend/v1/tensor.proto"},
        Case{"attend.v1.Tensor.shape", "attend/v1/tensor.proto"},
        Case{"attend.v1.Attention.Attend", "attend/v1/attention.proto"},
        Case{"grpc.health.v1.Health", "grpc/health/v1/health.proto"},
        Case{"grpc.health.v1.HealthCheckResponse.ServingStatus", "grpc/health/v1/health.proto"}}) {
    SCOPED_TRACE(c.symbol);
    const auto response = stream.Symbol(c.symbol);
    google::protobuf::DescriptorPool pool;
    const std::vector<std::string> files = BuildInto(response, &pool);
    ASSERT_FALSE(files.empty());
    // The file asked for comes last, after everything it imports.
    EXPECT_EQ(files.back(), c.file);
    const google::protobuf::FileDescriptor* file = pool.FindFileContainingSymbol(c.symbol);
    ASSERT_NE(file, nullptr);
    EXPECT_EQ(file->name(), c.file);
    EXPECT_EQ(response.original_request().file_containing_symbol(), c.symbol);
  }
  // kv_cache.proto imports tensor.proto: both, once each, tensor.proto first.
  google::protobuf::DescriptorPool pool;
  EXPECT_THAT(BuildInto(stream.Symbol("attend.v1.KvCache"), &pool),
              ElementsAre("attend/v1/tensor.proto", "attend/v1/kv_cache.proto"));
  EXPECT_NE(pool.FindMethodByName("attend.v1.KvCache.DecodeStream"), nullptr);
  // The health service is described with its methods, though libgrpc++ serves it.
  google::protobuf::DescriptorPool health_pool;
  BuildInto(stream.Symbol("grpc.health.v1.Health"), &health_pool);
  EXPECT_NE(health_pool.FindMethodByName("grpc.health.v1.Health.Check"), nullptr);
  EXPECT_NE(health_pool.FindMethodByName("grpc.health.v1.Health.Watch"), nullptr);
  EXPECT_TRUE(stream.Finish().ok());
}

TYPED_TEST(ReflectionTest, FileByFilenameAnswersTheFileAfterItsImports) {
  auto stream = this->Open();
  google::protobuf::DescriptorPool pool;
  EXPECT_THAT(BuildInto(stream.File("attend/v1/attention.proto"), &pool),
              ElementsAre("attend/v1/tensor.proto", "attend/v1/attention.proto"));
  google::protobuf::DescriptorPool reflection_pool;
  EXPECT_THAT(BuildInto(stream.File("grpc/reflection/v1/reflection.proto"), &reflection_pool),
              ElementsAre("grpc/reflection/v1/reflection.proto"));
  EXPECT_TRUE(stream.Finish().ok());
}

TYPED_TEST(ReflectionTest, ErrorsAreAnsweredAndTheStreamGoesOn) {
  auto stream = this->Open();
  using Request = typename TypeParam::Request;
  auto response = stream.Symbol("attend.v1.NoSuchService");
  EXPECT_EQ(response.error_response().error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_THAT(response.error_response().error_message(), ::testing::HasSubstr("NoSuchService"));
  EXPECT_FALSE(response.has_file_descriptor_response());

  response = stream.File("attend/v1/missing.proto");
  EXPECT_EQ(response.error_response().error_code(), grpc::StatusCode::NOT_FOUND);

  response = stream.Ask(Request());  // nothing set
  EXPECT_EQ(response.error_response().error_code(), grpc::StatusCode::INVALID_ARGUMENT);

  response = stream.Symbol("");
  EXPECT_EQ(response.error_response().error_code(), grpc::StatusCode::INVALID_ARGUMENT);

  Request request;
  request.mutable_file_containing_extension()->set_containing_type("attend.v1.Tensor");
  request.mutable_file_containing_extension()->set_extension_number(1000);
  response = stream.Ask(request);
  EXPECT_EQ(response.error_response().error_code(), grpc::StatusCode::NOT_FOUND);

  request.mutable_file_containing_extension()->set_containing_type("attend.v1.NoSuchType");
  response = stream.Ask(request);
  EXPECT_EQ(response.error_response().error_code(), grpc::StatusCode::NOT_FOUND);

  request.set_all_extension_numbers_of_type("attend.v1.NoSuchType");
  response = stream.Ask(request);
  EXPECT_EQ(response.error_response().error_code(), grpc::StatusCode::NOT_FOUND);

  // Still usable after all of that.
  google::protobuf::DescriptorPool pool;
  EXPECT_THAT(BuildInto(stream.Symbol("attend.v1.Tensor"), &pool),
              ElementsAre("attend/v1/tensor.proto"));
  EXPECT_TRUE(stream.Finish().ok());
}

// Names longer than any descriptor's are refused before the pool is searched: protobuf's lookup
// of a dotted name costs time quadratic in its length (a 240 KB "a.a.a..." took 8 s of a callback
// thread, stalling health checks), and the answer is echoed in the response.
TYPED_TEST(ReflectionTest, OverlongNamesAreRefusedAtOnce) {
  auto stream = this->Open();
  std::string dotted;
  for (int i = 0; i < 150000; ++i) dotted += "a.";
  typename TypeParam::Request request;
  const absl::Time begin = absl::Now();
  for (int kind = 0; kind < 4; ++kind) {
    request.Clear();
    if (kind == 0) request.set_file_containing_symbol(dotted);
    if (kind == 1) request.set_file_by_filename(dotted);
    if (kind == 2) request.set_all_extension_numbers_of_type(dotted);
    if (kind == 3) request.mutable_file_containing_extension()->set_containing_type(dotted);
    const auto response = stream.Ask(request);
    EXPECT_EQ(response.error_response().error_code(), grpc::StatusCode::INVALID_ARGUMENT) << kind;
    EXPECT_NE(response.error_response().error_message().find("300000 bytes"), std::string::npos)
        << response.error_response().error_message();
    EXPECT_NE(response.error_response().error_message().find("1024"), std::string::npos)
        << response.error_response().error_message();
    // The refused request is not echoed back in full.
    EXPECT_FALSE(response.has_original_request()) << kind;
  }
  EXPECT_LT(absl::Now() - begin, absl::Seconds(1));
  // A name at the limit is still looked up.
  EXPECT_EQ(stream.Symbol(std::string(1024, 'a')).error_response().error_code(),
            grpc::StatusCode::NOT_FOUND);
  EXPECT_TRUE(stream.Finish().ok());
}

TYPED_TEST(ReflectionTest, AllExtensionNumbersOfATypeWithoutExtensions) {
  auto stream = this->Open();
  typename TypeParam::Request request;
  request.set_all_extension_numbers_of_type("attend.v1.Tensor");
  const auto response = stream.Ask(request);
  ASSERT_TRUE(response.has_all_extension_numbers_response())
      << response.error_response().error_message();
  EXPECT_EQ(response.all_extension_numbers_response().base_type_name(), "attend.v1.Tensor");
  EXPECT_THAT(response.all_extension_numbers_response().extension_number(), IsEmpty());
  EXPECT_TRUE(stream.Finish().ok());
}

TYPED_TEST(ReflectionTest, EachResponseEchoesItsRequestAndHost) {
  auto stream = this->Open();
  using Request = typename TypeParam::Request;
  std::vector<Request> requests(4);
  requests[0].set_list_services("");
  requests[1].set_file_containing_symbol("attend.v1.Planner");
  requests[2].set_file_containing_symbol("attend.v1.Missing");
  requests[3].set_file_by_filename("attend/v1/tensor.proto");
  for (size_t i = 0; i < requests.size(); ++i) {
    requests[i].set_host(absl::StrCat("host-", i));
    const auto response = stream.Ask(requests[i]);
    EXPECT_EQ(response.valid_host(), requests[i].host());
    EXPECT_EQ(response.original_request().SerializeAsString(), requests[i].SerializeAsString());
  }
  EXPECT_TRUE(stream.Finish().ok());
}

TYPED_TEST(ReflectionTest, ConcurrentStreamsAreIndependent) {
  auto first = this->Open();
  auto second = this->Open();
  EXPECT_EQ(first.Symbol("attend.v1.Missing").error_response().error_code(),
            grpc::StatusCode::NOT_FOUND);
  EXPECT_FALSE(second.Symbol("attend.v1.Planner").has_error_response());
  EXPECT_FALSE(first.Symbol("attend.v1.Attention").has_error_response());
  EXPECT_TRUE(second.Finish().ok());
  EXPECT_TRUE(first.Finish().ok());
}

}  // namespace
}  // namespace attend
