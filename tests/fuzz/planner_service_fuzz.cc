// attend.v1.Planner through the in-process server: each record of the input (see SplitRecords)
// is one request, its selector byte choosing ListModels, GetModel, ImportModel, PlanKvCache or
// EstimateCost (selector % 5).
//
// EstimateCost's "local" profile is swapped for "h100": it measures this machine (a second of
// every core and a 256 MiB buffer, once per process), which is no input handling and would
// stall the first input that names it.
#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/strings/ascii.h"
#include "attend/v1/planner.grpc.pb.h"
#include "tests/fuzz/fuzz_server.h"

namespace attend::fuzz {
namespace {

using Stub = v1::Planner::Stub;

void EstimateCost(const std::string& bytes, Stub& stub) {
  v1::EstimateCostRequest request;
  if (!request.ParseFromString(bytes)) return;
  if (request.has_profile() &&
      absl::AsciiStrToLower(request.profile()).find("local") != std::string::npos) {
    request.set_profile("h100");
  }
  v1::EstimateCostResponse response;
  grpc::ClientContext context;
  CheckCode("EstimateCost", stub.EstimateCost(&context, request, &response));
}

void RunRecord(Stub& stub, const Record& r) {
  switch (r.selector % 5) {
    case 0:
      return CallUnary("ListModels", r.bytes, &Stub::ListModels, stub);
    case 1:
      return CallUnary("GetModel", r.bytes, &Stub::GetModel, stub);
    case 2:
      return CallUnary("ImportModel", r.bytes, &Stub::ImportModel, stub);
    case 3:
      return CallUnary("PlanKvCache", r.bytes, &Stub::PlanKvCache, stub);
    default:
      return EstimateCost(r.bytes, stub);
  }
}

}  // namespace
}  // namespace attend::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  namespace fuzz = attend::fuzz;
  static fuzz::Stub* const stub = new fuzz::Stub(fuzz::FuzzServer::Get().channel());
  for (const fuzz::Record& r : fuzz::SplitRecords(data, size, 4)) fuzz::RunRecord(*stub, r);
  return 0;
}
