// attend.v1.Attention through the in-process server: each record of the input (see
// SplitRecords) is one request, its selector byte choosing Attend, MultiHeadAttend, Softmax or
// ScalingExperiment (selector % 4) and its bytes the serialized request.
#include <cstddef>
#include <cstdint>

#include "attend/v1/attention.grpc.pb.h"
#include "tests/fuzz/fuzz_server.h"

namespace attend::fuzz {
namespace {

using Stub = v1::Attention::Stub;

void RunRecord(Stub& stub, const Record& r) {
  switch (r.selector % 4) {
    case 0:
      return CallUnary("Attend", r.bytes, &Stub::Attend, stub);
    case 1:
      return CallUnary("MultiHeadAttend", r.bytes, &Stub::MultiHeadAttend, stub);
    case 2:
      return CallUnary("Softmax", r.bytes, &Stub::Softmax, stub);
    default:
      return CallUnary("ScalingExperiment", r.bytes, &Stub::ScalingExperiment, stub);
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
