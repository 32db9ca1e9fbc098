// /metrics of an in-process server after real traffic: the families of /work/spec/metrics.md
// that count KV-cache work (tokens, decode steps, DecodeStream's own label), the worker pool's
// queue and the process, and the whole scrape checked by `promtool check metrics`.
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "attend/v1/attention.grpc.pb.h"
#include "attend/v1/kv_cache.grpc.pb.h"
#include "core/kernels/simd.h"
#include "tests/server/server_fixture.h"
#include "tests/test_util.h"

namespace attend {
namespace {

using ::attend::testing::F32Data;
using ::attend::testing::Filled;
using ::attend::testing::MetricValue;
using ::attend::testing::ScrapeMetrics;

constexpr int kHeads = 4, kKvHeads = 2, kDim = 8;

// The value of `name` with {grpc_method=`method`}, 0 when the series does not exist yet.
double ByMethod(const std::string& text, const std::string& name, const std::string& method) {
  return std::max(0.0, MetricValue(text, name, {"grpc_method=\"" + method + "\""}));
}

// The path of executable `name` found on $PATH; "" when there is none.
std::string FindProgram(const std::string& name) {
  const char* path = std::getenv("PATH");
  std::string dirs = path != nullptr ? path : "";
  size_t start = 0;
  while (start <= dirs.size()) {
    size_t end = dirs.find(':', start);
    if (end == std::string::npos) end = dirs.size();
    const std::string dir = dirs.substr(start, end - start);
    const std::string candidate = (dir.empty() ? "." : dir) + "/" + name;
    if (access(candidate.c_str(), X_OK) == 0) return candidate;
    start = end + 1;
  }
  return "";
}

// One server with an exposer for the whole suite: stopping an HTTP server takes about a second.
class MetricsTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    server::ServerOptions options = ::attend::testing::SmallServerOptions();
    options.metrics_address = "127.0.0.1:0";
    auto started = server::AttendServer::Start(options);
    ASSERT_TRUE(started.ok()) << started.status();
    server_ = started->release();
  }
  static void TearDownTestSuite() {
    delete server_;
    server_ = nullptr;
  }
  void SetUp() override { stub_ = v1::KvCache::NewStub(::attend::testing::ChannelTo(*server_)); }

  std::string Scrape() const { return ScrapeMetrics(server_->metrics_port()); }

  void Create(const std::string& id, int layers) {
    v1::CreateSequenceRequest request;
    request.set_sequence_id(id);
    v1::SequenceConfig* c = request.mutable_config();
    c->set_layers(layers);
    c->set_n_head(kHeads);
    c->set_n_head_kv(kKvHeads);
    c->set_head_dim(kDim);
    c->set_kv_dtype(v1::FLOAT32);
    v1::SequenceInfo info;
    grpc::ClientContext context;
    ASSERT_TRUE(stub_->CreateSequence(&context, request, &info).ok());
  }
  // `n` tokens (k and v, and q unless `without_q`) appended to `layer` of `id`.
  void Append(const std::string& id, int layer, int64_t n, bool without_q = false) {
    v1::AppendRequest request;
    request.set_sequence_id(id);
    request.set_layer(layer);
    if (!without_q) *request.mutable_q() = Filled({n, kHeads, kDim}, 0.1f);
    *request.mutable_k() = Filled({n, kKvHeads, kDim}, 0.2f);
    *request.mutable_v() = Filled({n, kKvHeads, kDim}, 0.3f);
    v1::AppendResponse response;
    grpc::ClientContext context;
    ASSERT_TRUE(stub_->Append(&context, request, &response).ok());
  }
  // One decode step (a token at `layer`) for each of `ids`.
  static v1::DecodeBatchRequest Step(const std::vector<std::string>& ids, int layer) {
    v1::DecodeBatchRequest request;
    request.set_layer(layer);
    for (const std::string& id : ids) {
      v1::DecodeStep* step = request.add_steps();
      step->set_sequence_id(id);
      *step->mutable_q() = Filled({1, kHeads, kDim}, 0.1f);
      *step->mutable_k() = Filled({1, kKvHeads, kDim}, 0.2f);
      *step->mutable_v() = Filled({1, kKvHeads, kDim}, 0.3f);
    }
    return request;
  }

  inline static server::AttendServer* server_ = nullptr;
  std::unique_ptr<v1::KvCache::Stub> stub_;
};

TEST_F(MetricsTest, AppendCountsTokensPerLayer) {
  Create("append", 2);
  const std::string before = Scrape();
  Append("append", 0, 5);
  Append("append", 1, 5);
  Append("append", 1, 2, /*without_q=*/true);  // cached without attention: still appended
  const std::string after = Scrape();
  EXPECT_EQ(ByMethod(after, "attend_tokens_appended_total", "Append"),
            ByMethod(before, "attend_tokens_appended_total", "Append") + 12);
  EXPECT_EQ(ByMethod(after, "attend_queue_seconds_count", "Append"),
            ByMethod(before, "attend_queue_seconds_count", "Append") + 3);
  EXPECT_EQ(ByMethod(after, "attend_tokens_decoded_total", "Append"), 0);
  EXPECT_NE(after.find("# TYPE attend_tokens_appended_total counter"), std::string::npos);
}

TEST_F(MetricsTest, DecodeBatchCountsStepsAndTheirTime) {
  Create("batch_a", 1);
  Create("batch_b", 1);
  Append("batch_a", 0, 3);
  Append("batch_b", 0, 4);
  const std::string before = Scrape();
  for (int i = 0; i < 2; ++i) {
    v1::DecodeBatchResponse response;
    grpc::ClientContext context;
    ASSERT_TRUE(stub_->DecodeBatch(&context, Step({"batch_a", "batch_b"}, 0), &response).ok());
  }
  {  // a failed step counts nothing but its queueing
    v1::DecodeBatchResponse response;
    grpc::ClientContext context;
    ASSERT_FALSE(stub_->DecodeBatch(&context, Step({"nobody"}, 0), &response).ok());
  }
  const std::string after = Scrape();
  auto delta = [&](const std::string& name) {
    return ByMethod(after, name, "DecodeBatch") - ByMethod(before, name, "DecodeBatch");
  };
  EXPECT_EQ(delta("attend_tokens_decoded_total"), 4);
  EXPECT_EQ(delta("attend_tokens_appended_total"), 4);
  EXPECT_EQ(delta("attend_decode_step_seconds_count"), 2);
  EXPECT_GT(delta("attend_decode_step_seconds_sum"), 0);
  EXPECT_EQ(MetricValue(after, "attend_decode_step_seconds_bucket",
                        {"grpc_method=\"DecodeBatch\"", "le=\"+Inf\""}),
            ByMethod(after, "attend_decode_step_seconds_count", "DecodeBatch"));
  EXPECT_EQ(delta("attend_queue_seconds_count"), 3);
  // Over 4 heads, the first step attends to 4 and 5 cached tokens, the second to 5 and 6.
  EXPECT_EQ(delta("attend_attention_pairs_total"), kHeads * ((4 + 5) + (5 + 6)));
}

TEST_F(MetricsTest, DecodeStreamWorkIsCountedUnderDecodeStream) {
  Create("stream", 1);
  Append("stream", 0, 2);
  const std::string before = Scrape();
  {
    grpc::ClientContext context;
    auto stream = stub_->DecodeStream(&context);
    ASSERT_TRUE(stream->Write(Step({"stream"}, 0)));
    ASSERT_TRUE(stream->Write(Step({"nobody"}, 0)));  // answered with an error, counts nothing
    ASSERT_TRUE(stream->Write(Step({"stream"}, 0)));
    ASSERT_TRUE(stream->Write(Step({"stream"}, 0)));
    stream->WritesDone();
    v1::DecodeBatchResponse response;
    int responses = 0;
    while (stream->Read(&response)) ++responses;
    ASSERT_TRUE(stream->Finish().ok());
    ASSERT_EQ(responses, 4);
  }
  const std::string after = Scrape();
  auto delta = [&](const std::string& name, const std::string& method) {
    return ByMethod(after, name, method) - ByMethod(before, name, method);
  };
  EXPECT_EQ(delta("attend_tokens_decoded_total", "DecodeStream"), 3);
  EXPECT_EQ(delta("attend_tokens_appended_total", "DecodeStream"), 3);
  EXPECT_EQ(delta("attend_decode_step_seconds_count", "DecodeStream"), 3);
  EXPECT_EQ(delta("attend_queue_seconds_count", "DecodeStream"), 4);
  // Keys attended: 3, 4 and 5 over 4 heads.
  EXPECT_EQ(delta("attend_attention_pairs_total", "DecodeStream"), kHeads * (3 + 4 + 5));
  EXPECT_GT(delta("attend_attention_flops_total", "DecodeStream"), 0);
  EXPECT_GT(delta("attend_attention_compute_seconds_count", "DecodeStream"), 0);
  // None of it is DecodeBatch's.
  for (const char* name : {"attend_attention_pairs_total", "attend_attention_flops_total",
                           "attend_tokens_decoded_total", "attend_decode_step_seconds_count"}) {
    EXPECT_EQ(delta(name, "DecodeBatch"), 0) << name;
  }
}

TEST_F(MetricsTest, TokenAndStepSeriesExistBeforeTraffic) {
  // A fresh server: rate() over these works from the first scrape.
  server::ServerOptions options = ::attend::testing::SmallServerOptions();
  options.metrics_address = "127.0.0.1:0";
  auto fresh = server::AttendServer::Start(options);
  ASSERT_TRUE(fresh.ok()) << fresh.status();
  const std::string text = ScrapeMetrics((*fresh)->metrics_port());
  for (const char* method : {"Append", "DecodeBatch", "DecodeStream"}) {
    EXPECT_EQ(ByMethod(text, "attend_tokens_appended_total", method), 0) << method;
  }
  for (const char* method : {"DecodeBatch", "DecodeStream"}) {
    EXPECT_EQ(MetricValue(text, "attend_tokens_decoded_total",
                          {std::string("grpc_method=\"") + method + "\""}),
              0)
        << method;
    EXPECT_EQ(MetricValue(text, "attend_decode_step_seconds_count",
                          {std::string("grpc_method=\"") + method + "\""}),
              0)
        << method;
  }
  EXPECT_EQ(MetricValue(text, "attend_requests_queued"), 0);
}

TEST_F(MetricsTest, ServesTextWithoutExposerSelfMetrics) {
  const std::string response = Scrape();
  ASSERT_EQ(response.rfind("HTTP/1.1 200 OK\r\n", 0), 0u) << response.substr(0, 200);
  EXPECT_NE(response.find("Content-Type: text/plain; charset=utf-8\r\n"), std::string::npos);
  EXPECT_NE(response.find("Content-Length: " +
                          std::to_string(::attend::testing::MetricsBody(response).size())),
            std::string::npos);
  EXPECT_EQ(response.find("exposer_"), std::string::npos);
  EXPECT_EQ(response.find("NaN"), std::string::npos);
  EXPECT_NE(response.find("attend_build_info{"), std::string::npos);
  // The decode kernel set the process chose, as a label.
  EXPECT_NE(response.find(absl::StrCat("kernels=\"", simd::KernelName(), "\"")), std::string::npos);
}

// HEAD answers the headers without the body; only the exact path serves metrics.
TEST_F(MetricsTest, HeadAndOtherPaths) {
  const int port = server_->metrics_port();
  const std::string head = ::attend::testing::HttpRequest(port, "HEAD", "/metrics");
  ASSERT_EQ(head.rfind("HTTP/1.1 200 OK\r\n", 0), 0u) << head.substr(0, 200);
  EXPECT_NE(head.find("Content-Length: "), std::string::npos) << head;
  EXPECT_EQ(::attend::testing::MetricsBody(head), "") << head.substr(0, 400);
  for (const char* path : {"/METRICS", "/metricsx", "/metrics/x", "/", "/other"}) {
    const std::string response = ::attend::testing::HttpRequest(port, "GET", path);
    // civetweb answers paths without a handler itself, in the request's HTTP version.
    EXPECT_EQ(response.substr(0, response.find("\r\n")).substr(8), " 404 Not Found")
        << path << ": " << response.substr(0, 200);
  }
  // A query string is still the metrics path.
  EXPECT_EQ(::attend::testing::HttpRequest(port, "GET", "/metrics?x=1").rfind("HTTP/1.1 200", 0),
            0u);
}

TEST_F(MetricsTest, ProcessMetricsArePlausible) {
  // The server runs in this process: its CPU counter is this process's CPU time, which an
  // idle test may not have spent a whole clock tick of.
  const double before = ::attend::testing::SpendProcessCpuSeconds(0.1);
  const std::string text = Scrape();
  const double after = ::attend::testing::CpuSeconds();
  EXPECT_NE(text.find("# TYPE process_cpu_seconds_total counter"), std::string::npos);
  // Within a tick or two of the kernel's own clock for the process.
  EXPECT_GE(MetricValue(text, "process_cpu_seconds_total"), before - 0.03);
  EXPECT_LE(MetricValue(text, "process_cpu_seconds_total"), after + 0.03);
  EXPECT_GT(MetricValue(text, "process_resident_memory_bytes"), 1 << 20);
  EXPECT_GE(MetricValue(text, "process_virtual_memory_bytes"),
            MetricValue(text, "process_resident_memory_bytes"));
  // The server's listening sockets at least, within the limit.
  EXPECT_GE(MetricValue(text, "process_open_fds"), 5);
  EXPECT_LE(MetricValue(text, "process_open_fds"), MetricValue(text, "process_max_fds"));
  const double now =
      std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  EXPECT_LE(MetricValue(text, "process_start_time_seconds"), now + 1);
  EXPECT_GT(MetricValue(text, "process_start_time_seconds"), now - 3600);
}

// `promtool check metrics` on a scrape after traffic of every kind: parses, and lint-clean.
// Skipped without promtool, unless ATTEND_REQUIRE_PROMTOOL=1 (then missing it fails).
TEST_F(MetricsTest, ScrapeAfterTrafficPassesPromtool) {
  const char* require = std::getenv("ATTEND_REQUIRE_PROMTOOL");
  const bool required = require != nullptr && std::string(require) == "1";
  const std::string promtool = FindProgram("promtool");
  if (promtool.empty()) {
    if (required) FAIL() << "promtool is not on PATH and ATTEND_REQUIRE_PROMTOOL=1";
    GTEST_SKIP() << "promtool is not on PATH (ATTEND_REQUIRE_PROMTOOL=1 makes this fail)";
  }
  Create("promtool", 1);
  Append("promtool", 0, 3);
  {
    v1::DecodeBatchResponse response;
    grpc::ClientContext context;
    ASSERT_TRUE(stub_->DecodeBatch(&context, Step({"promtool"}, 0), &response).ok());
  }
  {
    grpc::ClientContext context;
    auto stream = stub_->DecodeStream(&context);
    ASSERT_TRUE(stream->Write(Step({"promtool"}, 0)));
    stream->WritesDone();
    v1::DecodeBatchResponse response;
    while (stream->Read(&response)) {
    }
    ASSERT_TRUE(stream->Finish().ok());
  }
  {
    auto attention = v1::Attention::NewStub(::attend::testing::ChannelTo(*server_));
    v1::AttendRequest request;
    *request.mutable_q() = Filled({3, 4, 2});
    *request.mutable_k() = Filled({5, 2, 2});
    *request.mutable_v() = Filled({5, 2, 2});
    v1::AttendResponse response;
    grpc::ClientContext context;
    ASSERT_TRUE(attention->Attend(&context, request, &response).ok());
  }
  const std::string body = ::attend::testing::MetricsBody(Scrape());
  ASSERT_NE(body.find("attend_decode_step_seconds_bucket"), std::string::npos);
  const std::string path = ::testing::TempDir() + "/attend_metrics_" + std::to_string(getpid());
  std::ofstream(path) << body;
  const std::string command = promtool + " check metrics < " + path + " 2>&1";
  FILE* pipe = popen(command.c_str(), "r");
  ASSERT_NE(pipe, nullptr);
  std::string output;
  char buffer[4096];
  size_t n;
  while ((n = fread(buffer, 1, sizeof(buffer), pipe)) > 0) output.append(buffer, n);
  const int status = pclose(pipe);
  std::remove(path.c_str());
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
      << "promtool exit status " << status << ":\n"
      << output;
  EXPECT_EQ(output, "") << output;
}

// One worker and slow calls: the queue fills, the gauge shows it, and every wait is observed.
TEST(MetricsQueueTest, QueuedGaugeAndQueueSeconds) {
  auto server = server::AttendServer::Start(::attend::testing::OneWorkerServerOptions(8));
  ASSERT_TRUE(server.ok()) << server.status();
  auto stub = v1::Attention::NewStub(::attend::testing::ChannelTo(**server, 64 << 20));
  // 512 x 512 pairs over 16 heads of 64 dims: tens of milliseconds each.
  const v1::AttendRequest slow = ::attend::testing::SlowAttendRequest(512);
  const int kCalls = 4;
  ::attend::testing::ConcurrentAttends calls(stub.get(), slow, kCalls);
  double most_queued = 0;
  while (!calls.Done()) {
    most_queued = std::max(most_queued, MetricValue(ScrapeMetrics((*server)->metrics_port()),
                                                    "attend_requests_queued"));
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  const std::vector<grpc::Status>& statuses = calls.Wait();
  const std::vector<v1::AttendResponse>& responses = calls.responses();
  for (const grpc::Status& s : statuses) EXPECT_TRUE(s.ok()) << s.error_message();
  EXPECT_GE(most_queued, 1);
  EXPECT_LE(most_queued, kCalls);
  const std::string after = ScrapeMetrics((*server)->metrics_port());
  EXPECT_EQ(MetricValue(after, "attend_requests_queued"), 0);
  EXPECT_EQ(ByMethod(after, "attend_queue_seconds_count", "Attend"), kCalls);
  // The last call waited for the three before it.
  EXPECT_GT(ByMethod(after, "attend_queue_seconds_sum", "Attend"),
            responses[0].stats().compute_seconds());
}

}  // namespace
}  // namespace attend
