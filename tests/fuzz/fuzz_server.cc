#include "tests/fuzz/fuzz_server.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "absl/time/time.h"
#include "core/attention/attention_engine.h"
#include "google/protobuf/stubs/logging.h"
#include "server/attention_service.h"
#include "server/call_gate.h"
#include "server/kv_cache_service.h"
#include "server/metrics.h"
#include "server/parse_errors.h"
#include "server/planner_service.h"
#include "server/worker_pool.h"

namespace attend::fuzz {

// Declared in the order server/server.cc destroys its parts (not that this one is destroyed).
struct FuzzServer::Parts {
  std::unique_ptr<server::Metrics> metrics;
  std::unique_ptr<server::CallGate> gate;
  std::unique_ptr<kv::KvCache> cache;
  std::unique_ptr<AttentionEngine> engine;
  std::unique_ptr<server::AttentionService> attention;
  std::unique_ptr<server::KvCacheService> kv_cache;
  std::unique_ptr<server::PlannerService> planner;
  std::unique_ptr<server::WorkerPool> pool;
  std::unique_ptr<grpc::Server> server;
};

FuzzServer& FuzzServer::Get() {
  static FuzzServer* const server = new FuzzServer();
  return *server;
}

FuzzServer::FuzzServer() : parts_(std::make_unique<Parts>()) {
  // Most mutated requests carry invalid UTF-8 in a string field, which protobuf logs on every
  // parse; the fuzzer's own parse is the only one that matters here.
  google::protobuf::SetLogHandler(nullptr);
  // Small limits: the largest tensor is 64 KiB of float32, one call scores at most 2^18 pairs.
  limits_.max_message_bytes = 1 << 20;
  limits_.attention.max_tensor_elements = 1 << 14;
  limits_.attention.max_score_elements = 1 << 18;
  limits_.max_scaling_draws = 1 << 18;

  kv::KvCacheOptions cache_options;
  cache_options.capacity_bytes = 2 << 20;
  cache_options.block_bytes = 16 << 10;
  cache_options.huge_pages = false;
  cache_options.max_sequences = 64;
  cache_options.compute_threads = 1;
  cache_options.limits = limits_.attention;

  Parts& p = *parts_;
  p.metrics = std::make_unique<server::Metrics>();
  p.gate = std::make_unique<server::CallGate>();
  p.cache = std::make_unique<kv::KvCache>(cache_options);
  cache_ = p.cache.get();
  p.pool = std::make_unique<server::WorkerPool>(1, 16);
  p.engine = std::make_unique<AttentionEngine>(EngineOptions{1});
  p.attention = std::make_unique<server::AttentionService>(limits_, p.engine.get(), p.pool.get(),
                                                           p.metrics.get(), p.gate.get());
  p.kv_cache = std::make_unique<server::KvCacheService>(limits_, p.cache.get(), p.pool.get(),
                                                        p.metrics.get(), p.gate.get(), 4);
  server::PlannerOptions planner_options;
  planner_options.measure_local_after = absl::InfiniteDuration();
  planner_options.max_hf_config_json_bytes = 64 << 10;
  planner_options.max_gguf_bytes = 256 << 10;
  p.planner = std::make_unique<server::PlannerService>(p.pool.get(), p.metrics.get(), p.gate.get(),
                                                       planner_options);

  std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>> creators;
  creators.push_back(p.gate->NewInterceptorFactory());
  creators.push_back(server::NewParseErrorInterceptorFactory());
  creators.push_back(p.metrics->NewInterceptorFactory());
  grpc::ServerBuilder builder;
  builder.SetMaxReceiveMessageSize(limits_.max_message_bytes);
  builder.SetMaxSendMessageSize(limits_.max_message_bytes);
  builder.RegisterService(p.attention.get());
  builder.RegisterService(p.kv_cache.get());
  builder.RegisterService(p.planner.get());
  builder.experimental().SetInterceptorCreators(std::move(creators));
  p.server = builder.BuildAndStart();
  if (!p.server) {
    std::fprintf(stderr, "fuzz: the in-process server did not start\n");
    std::abort();
  }
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(-1);
  args.SetMaxSendMessageSize(-1);
  channel_ = p.server->InProcessChannel(args);
}

void CheckCode(const char* rpc, const grpc::Status& status) {
  // ATTEND_FUZZ_VERBOSE=1 prints every answer, to see how deep a seed gets.
  static const bool verbose = std::getenv("ATTEND_FUZZ_VERBOSE") != nullptr;
  if (verbose) {
    std::fprintf(stderr, "fuzz: %s -> %d %s\n", rpc, static_cast<int>(status.error_code()),
                 status.error_message().substr(0, 160).c_str());
  }
  switch (status.error_code()) {
    case grpc::StatusCode::OK:
    case grpc::StatusCode::INVALID_ARGUMENT:
    case grpc::StatusCode::NOT_FOUND:
    case grpc::StatusCode::ALREADY_EXISTS:
    case grpc::StatusCode::OUT_OF_RANGE:
    case grpc::StatusCode::RESOURCE_EXHAUSTED:
    case grpc::StatusCode::FAILED_PRECONDITION:
      return;
    default:
      std::fprintf(stderr, "fuzz: %s answered code %d: %s\n", rpc,
                   static_cast<int>(status.error_code()), status.error_message().c_str());
      std::abort();
  }
}

std::vector<Record> SplitRecords(const uint8_t* data, size_t size, size_t max_records) {
  std::vector<Record> records;
  size_t at = 0;
  while (at < size && records.size() < max_records) {
    Record r;
    r.selector = data[at++];
    size_t length = size - at;
    if (size - at >= 2) {
      length = std::min<size_t>(data[at] | (size_t{data[at + 1]} << 8), size - at - 2);
      at += 2;
    }
    r.bytes.assign(reinterpret_cast<const char*>(data + at), length);
    at += length;
    records.push_back(std::move(r));
  }
  return records;
}

}  // namespace attend::fuzz
