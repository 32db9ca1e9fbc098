// A real attend server on a loopback port for tests, with small limits so that limit errors are
// cheap to provoke, and helpers to build tensors and scrape /metrics.
#ifndef ATTEND_TESTS_SERVER_SERVER_FIXTURE_H_
#define ATTEND_TESTS_SERVER_SERVER_FIXTURE_H_

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "attend/v1/attention.grpc.pb.h"
#include "gtest/gtest.h"
#include "server/server.h"

namespace attend::testing {

inline server::ServerOptions SmallServerOptions() {
  server::ServerOptions options;
  options.address = "127.0.0.1:0";
  // No exposer by default: stopping its HTTP server takes about a second, and most tests run
  // in their own process. Tests of metrics turn it on.
  options.metrics_address = "";
  options.worker_threads = 2;
  options.limits.max_message_bytes = 1 << 20;
  options.limits.attention.max_tensor_elements = 1 << 16;
  options.limits.attention.max_score_elements = 1 << 22;
  options.limits.max_scaling_draws = 1 << 24;
  return options;
}

inline std::shared_ptr<grpc::Channel> ChannelTo(const server::AttendServer& s,
                                                int max_message = 4 << 20) {
  grpc::ChannelArguments args;
  args.SetMaxSendMessageSize(max_message);
  args.SetMaxReceiveMessageSize(max_message);
  return grpc::CreateCustomChannel(absl::StrCat("127.0.0.1:", s.port()),
                                   grpc::InsecureChannelCredentials(), args);
}

inline v1::Tensor Values(std::vector<int64_t> shape, std::vector<float> values) {
  v1::Tensor t;
  t.mutable_shape()->Add(shape.begin(), shape.end());
  t.mutable_values()->Add(values.begin(), values.end());
  return t;
}

inline v1::Tensor Filled(std::vector<int64_t> shape, float value = 0.5f) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return Values(std::move(shape), std::vector<float>(static_cast<size_t>(n), value));
}

inline v1::Tensor F32Data(std::vector<int64_t> shape, const std::vector<float>& values) {
  v1::Tensor t;
  t.set_dtype(v1::FLOAT32);
  t.mutable_shape()->Add(shape.begin(), shape.end());
  t.set_data(std::string(reinterpret_cast<const char*>(values.data()), values.size() * 4));
  return t;
}

// A server with one worker, `max_queued` queue slots, metrics on, and room for the large calls of
// SlowAttendRequest: for tests of the queue.
inline server::ServerOptions OneWorkerServerOptions(int64_t max_queued) {
  server::ServerOptions options = SmallServerOptions();
  options.metrics_address = "127.0.0.1:0";
  options.worker_threads = 1;
  options.max_queued_requests = max_queued;
  options.limits.attention.max_tensor_elements = 1 << 22;
  options.limits.attention.max_score_elements = int64_t{1} << 32;
  options.limits.max_message_bytes = 64 << 20;
  return options;
}

// An Attend of n x n pairs over 16 heads of 64 dims: about 100 ms at n = 1024 on one core here.
inline v1::AttendRequest SlowAttendRequest(int64_t n) {
  const std::vector<float> data(static_cast<size_t>(n * 16 * 64), 0.01f);
  v1::AttendRequest request;
  *request.mutable_q() = F32Data({n, 16, 64}, data);
  *request.mutable_k() = F32Data({n, 16, 64}, data);
  *request.mutable_v() = F32Data({n, 16, 64}, data);
  return request;
}

// `calls` Attend calls of `request` started at once on `stub` (asynchronously), for tests that
// fill the server's queue. The stub and request must outlive it; destroy it only after Wait().
class ConcurrentAttends {
 public:
  ConcurrentAttends(v1::Attention::Stub* stub, const v1::AttendRequest& request, int calls)
      : contexts_(calls), responses_(calls), statuses_(calls) {
    for (int i = 0; i < calls; ++i) {
      stub->async()->Attend(&contexts_[i], &request, &responses_[i], [this, i](grpc::Status s) {
        statuses_[i] = std::move(s);
        done_++;
      });
    }
  }
  bool Done() const { return done_.load() == static_cast<int>(statuses_.size()); }
  // The statuses, in the order the calls were started, once all have ended.
  const std::vector<grpc::Status>& Wait() {
    while (!Done()) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    return statuses_;
  }
  const std::vector<v1::AttendResponse>& responses() const { return responses_; }

 private:
  std::vector<grpc::ClientContext> contexts_;
  std::vector<v1::AttendResponse> responses_;
  std::vector<grpc::Status> statuses_;
  std::atomic<int> done_{0};
};

// A test suite sharing one small server (started before its first test, stopped after its last).
class ServerSuite : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    auto started = server::AttendServer::Start(SmallServerOptions());
    ASSERT_TRUE(started.ok()) << started.status();
    server_ = started->release();
  }
  static void TearDownTestSuite() {
    delete server_;
    server_ = nullptr;
  }
  inline static server::AttendServer* server_ = nullptr;
};

// The whole HTTP/1.0 response to `method` `path` on 127.0.0.1:<port>; empty on failure.
inline std::string HttpRequest(int port, const std::string& method, const std::string& path) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return "";
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  std::string response;
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) {
    const std::string request =
        absl::StrCat(method, " ", path, " HTTP/1.0\r\nHost: localhost\r\n\r\n");
    if (write(fd, request.data(), request.size()) == static_cast<ssize_t>(request.size())) {
      char buffer[65536];
      ssize_t n;
      while ((n = read(fd, buffer, sizeof(buffer))) > 0)
        response.append(buffer, static_cast<size_t>(n));
    }
  }
  close(fd);
  return response;
}

// GET http://127.0.0.1:<port>/metrics; empty on failure.
inline std::string ScrapeMetrics(int port) { return HttpRequest(port, "GET", "/metrics"); }

// The body of an HTTP response (after the blank line ending the headers); "" without one.
inline std::string MetricsBody(const std::string& response) {
  const size_t end = response.find("\r\n\r\n");
  return end == std::string::npos ? "" : response.substr(end + 4);
}

// Sum of the samples of metric `name` whose label set contains every one of `labels`
// (e.g. {"grpc_method=\"Attend\"", "grpc_code=\"OK\""}); -1 when no line matches.
inline double MetricValue(const std::string& text, const std::string& name,
                          const std::vector<std::string>& labels = {}) {
  double sum = -1;
  size_t start = 0;
  while (start < text.size()) {
    size_t end = text.find('\n', start);
    if (end == std::string::npos) end = text.size();
    const std::string line = text.substr(start, end - start);
    start = end + 1;
    if (line.rfind(name, 0) != 0) continue;
    const char next = line.size() > name.size() ? line[name.size()] : '\0';
    if (next != '{' && next != ' ') continue;
    bool all = true;
    for (const std::string& l : labels) all = all && line.find(l) != std::string::npos;
    if (!all) continue;
    const size_t space = line.rfind(' ');
    sum = (sum < 0 ? 0 : sum) + std::stod(line.substr(space + 1));
  }
  return sum;
}

}  // namespace attend::testing

#endif  // ATTEND_TESTS_SERVER_SERVER_FIXTURE_H_
