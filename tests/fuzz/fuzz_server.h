// The in-process attend services the RPC fuzz targets call: the three services wired as
// server/server.cc wires them (call gate, parse-error and metrics interceptors, worker pool,
// one KV cache), with limits small enough that no input can allocate much, on a gRPC server
// without a port (its in-process channel only).
//
// Differences from AttendServer, on purpose: the "local" hardware profile is never measured in
// the background (it saturates every core for a second; the planner target does not name it),
// the KV cache holds 2 MiB, and there is no metrics exposer.
//
// Thread-safety: Get() may be called from any thread; the services are thread-safe.
#ifndef ATTEND_TESTS_FUZZ_FUZZ_SERVER_H_
#define ATTEND_TESTS_FUZZ_FUZZ_SERVER_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/kv_cache/kv_cache.h"
#include "grpcpp/grpcpp.h"
#include "server/service_support.h"

namespace attend::fuzz {

class FuzzServer {
 public:
  // Started on first use and never destroyed: a fuzzer exits without tearing down, and
  // destroying gRPC from a static destructor races its own threads.
  static FuzzServer& Get();

  const std::shared_ptr<grpc::Channel>& channel() const { return channel_; }
  kv::KvCache* cache() const { return cache_; }
  const server::ServiceLimits& limits() const { return limits_; }

 private:
  FuzzServer();
  struct Parts;
  std::unique_ptr<Parts> parts_;
  kv::KvCache* cache_ = nullptr;
  server::ServiceLimits limits_;
  std::shared_ptr<grpc::Channel> channel_;
};

// Aborts with `rpc` and the status when `status` is not a code attend documents for a request:
// OK, INVALID_ARGUMENT, NOT_FOUND, ALREADY_EXISTS, OUT_OF_RANGE, RESOURCE_EXHAUSTED or
// FAILED_PRECONDITION. INTERNAL, UNKNOWN, UNIMPLEMENTED and the rest mean the server did not
// judge the input (a crash in a handler, an exception, a missing method).
void CheckCode(const char* rpc, const grpc::Status& status);

// One call of a record-structured input: the byte that selects the RPC and the request bytes.
struct Record {
  uint8_t selector = 0;
  std::string bytes;
};

// Splits an input into records: [selector byte][u16 little-endian length][length bytes], the
// last record taking what is left when its length runs past the end. At most `max_records`.
std::vector<Record> SplitRecords(const uint8_t* data, size_t size, size_t max_records);

// Parses `bytes` as the request of `method` (a generated stub's blocking unary method) and,
// when they parse, calls it on `stub` and checks its code. Bytes that do not parse make no call:
// gRPC itself would refuse them before attend's code runs.
template <typename Stub, typename Request, typename Response>
void CallUnary(const char* rpc, const std::string& bytes,
               grpc::Status (Stub::*method)(grpc::ClientContext*, const Request&, Response*),
               Stub& stub) {
  Request request;
  if (!request.ParseFromString(bytes)) return;
  Response response;
  grpc::ClientContext context;
  CheckCode(rpc, (stub.*method)(&context, request, &response));
}

}  // namespace attend::fuzz

#endif  // ATTEND_TESTS_FUZZ_FUZZ_SERVER_H_
