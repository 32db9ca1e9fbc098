// What the tests of attend.v1.Planner share: a suite with a real server and a stub on a
// loopback channel, helpers to call each RPC and to check an error's code and message, and a
// server holding only a PlannerService built with given options. Test-only; header-only.
#ifndef ATTEND_TESTS_SERVER_PLANNER_SERVICE_FIXTURE_H_
#define ATTEND_TESTS_SERVER_PLANNER_SERVICE_FIXTURE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "attend/v1/planner.grpc.pb.h"
#include "google/protobuf/util/message_differencer.h"
#include "gtest/gtest.h"
#include "server/call_gate.h"
#include "server/metrics.h"
#include "server/planner_service.h"
#include "server/worker_pool.h"
#include "tests/server/server_fixture.h"

namespace attend::testing {

inline constexpr int64_t kKiB = 1024;
inline constexpr int64_t kGiB = int64_t{1} << 30;

// Expects the shape-bearing fields of two specs to agree (names and sources may differ).
inline void ExpectSameShape(const v1::ModelSpec& actual, const v1::ModelSpec& expected) {
  v1::ModelSpec a = actual, e = expected;
  for (v1::ModelSpec* m : {&a, &e}) {
    m->clear_name();
    m->clear_display_name();
    m->clear_source();
    m->clear_parameters_source();
  }
  EXPECT_TRUE(::google::protobuf::util::MessageDifferencer::Equals(a, e))
      << "actual:\n"
      << a.DebugString() << "expected:\n"
      << e.DebugString();
}

class PlannerServiceTest : public ServerSuite {
 protected:
  void SetUp() override { stub_ = v1::Planner::NewStub(ChannelTo(*server_)); }
  // Every test ends by proving the server still answers.
  void TearDown() override {
    v1::ListModelsResponse response;
    grpc::ClientContext context;
    EXPECT_TRUE(stub_->ListModels(&context, v1::ListModelsRequest(), &response).ok())
        << "server stopped serving";
  }

  v1::ModelSpec Model(const std::string& name) {
    v1::GetModelRequest request;
    request.set_name(name);
    v1::ModelSpec spec;
    grpc::ClientContext context;
    const grpc::Status status = stub_->GetModel(&context, request, &spec);
    EXPECT_TRUE(status.ok()) << status.error_message();
    return spec;
  }
  grpc::Status Plan(const v1::PlanKvCacheRequest& request, v1::PlanKvCacheResponse* response) {
    grpc::ClientContext context;
    return stub_->PlanKvCache(&context, request, response);
  }
  v1::PlanKvCacheResponse PlanOk(const v1::PlanKvCacheRequest& request) {
    v1::PlanKvCacheResponse response;
    const grpc::Status status = Plan(request, &response);
    EXPECT_TRUE(status.ok()) << status.error_message();
    return response;
  }
  grpc::Status Cost(const v1::EstimateCostRequest& request, v1::EstimateCostResponse* response) {
    grpc::ClientContext context;
    return stub_->EstimateCost(&context, request, response);
  }
  grpc::Status Import(const v1::ImportModelRequest& request, v1::ModelSpec* response) {
    grpc::ClientContext context;
    return stub_->ImportModel(&context, request, response);
  }

  static v1::PlanKvCacheRequest PlanOf(const std::string& model, int64_t context, int64_t batch = 0,
                                       v1::KvDType dtype = v1::KV_FLOAT16) {
    v1::PlanKvCacheRequest request;
    request.mutable_model()->set_name(model);
    request.set_context_tokens(context);
    request.set_batch(batch);
    request.set_kv_dtype(dtype);
    return request;
  }
  // The lessons' Example 12 shape: Llama 3 8B's layers and heads with P = 8e9, on an H100.
  static v1::EstimateCostRequest LessonCost(int64_t prompt) {
    v1::EstimateCostRequest request;
    request.mutable_model()->set_name("llama-3-8b");
    request.set_prompt_tokens(prompt);
    request.set_parameters(8'000'000'000);
    request.set_profile("h100");
    return request;
  }

  template <typename Status>
  static void ExpectError(const Status& status, grpc::StatusCode code,
                          const std::vector<std::string>& substrings) {
    EXPECT_EQ(status.error_code(), code) << status.error_message();
    for (const std::string& s : substrings) {
      EXPECT_NE(status.error_message().find(s), std::string::npos)
          << "\"" << status.error_message() << "\" lacks \"" << s << "\"";
    }
  }

  std::unique_ptr<v1::Planner::Stub> stub_;
};

// A gRPC server holding only a PlannerService built with `options`.
class DirectPlanner {
 public:
  explicit DirectPlanner(server::PlannerOptions options) : pool_(2, 16) {
    service_ = std::make_unique<server::PlannerService>(&pool_, &metrics_, &gate_, options);
    grpc::ServerBuilder builder;
    builder.RegisterService(service_.get());
    std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>> gates;
    gates.push_back(gate_.NewInterceptorFactory());
    builder.experimental().SetInterceptorCreators(std::move(gates));
    server_ = builder.BuildAndStart();
    grpc::ChannelArguments args;
    args.SetMaxSendMessageSize(-1);
    stub_ = v1::Planner::NewStub(server_->InProcessChannel(args));
  }
  ~DirectPlanner() {
    server_->Shutdown();
    server_.reset();
  }

  server::PlannerService& service() { return *service_; }
  v1::Planner::Stub& stub() { return *stub_; }

 private:
  server::Metrics metrics_;
  server::WorkerPool pool_;
  server::CallGate gate_;
  std::unique_ptr<server::PlannerService> service_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<v1::Planner::Stub> stub_;
};

}  // namespace attend::testing

#endif  // ATTEND_TESTS_SERVER_PLANNER_SERVICE_FIXTURE_H_
