// attend.v1.Attention through the in-process server: each record of the input (see
// SplitRecords) is one request, its selector byte choosing Attend, MultiHeadAttend, Softmax or
// ScalingExperiment (selector % 4) and its bytes the serialized request.
#include <cstddef>
#include <cstdint>

#include "attend/v1/attention.grpc.pb.h"
#include "tests/fuzz/fuzz_server.h"

namespace attend::fuzz {
namespace {

void RunRecord(v1::Attention::Stub& stub, const Record& r) {
  switch (r.selector % 4) {
    case 0: {
      v1::AttendResponse response;
      CallIfParses<v1::AttendRequest>(
          "Attend", r.bytes,
          [&](grpc::ClientContext* c, const v1::AttendRequest& q, v1::AttendResponse* a) {
            return stub.Attend(c, q, a);
          },
          &response);
      break;
    }
    case 1: {
      v1::MultiHeadAttendResponse response;
      CallIfParses<v1::MultiHeadAttendRequest>(
          "MultiHeadAttend", r.bytes,
          [&](grpc::ClientContext* c, const v1::MultiHeadAttendRequest& q,
              v1::MultiHeadAttendResponse* a) { return stub.MultiHeadAttend(c, q, a); },
          &response);
      break;
    }
    case 2: {
      v1::SoftmaxResponse response;
      CallIfParses<v1::SoftmaxRequest>(
          "Softmax", r.bytes,
          [&](grpc::ClientContext* c, const v1::SoftmaxRequest& q, v1::SoftmaxResponse* a) {
            return stub.Softmax(c, q, a);
          },
          &response);
      break;
    }
    default: {
      v1::ScalingExperimentResponse response;
      CallIfParses<v1::ScalingExperimentRequest>(
          "ScalingExperiment", r.bytes,
          [&](grpc::ClientContext* c, const v1::ScalingExperimentRequest& q,
              v1::ScalingExperimentResponse* a) { return stub.ScalingExperiment(c, q, a); },
          &response);
      break;
    }
  }
}

}  // namespace
}  // namespace attend::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  namespace fuzz = attend::fuzz;
  static attend::v1::Attention::Stub* const stub =
      new attend::v1::Attention::Stub(fuzz::FuzzServer::Get().channel());
  for (const fuzz::Record& r : fuzz::SplitRecords(data, size, 4)) fuzz::RunRecord(*stub, r);
  return 0;
}
