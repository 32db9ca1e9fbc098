// attend.v1.KvCache through the in-process server. Each record of the input (see SplitRecords)
// is one request, its selector byte choosing the RPC (selector % 10: CreateSequence, Append,
// DecodeBatch, DecodeStream (the bytes are one stream message), Fork, Truncate, Release,
// GetSequence, ListSequences, Stats), so that one input can create a sequence and then use it.
//
// After every call the cache must be consistent (KvCache::CheckConsistency); after the input
// every sequence is released, and the cache must then hold nothing, so that inputs do not
// depend on each other.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "attend/v1/kv_cache.grpc.pb.h"
#include "tests/fuzz/fuzz_server.h"

namespace attend::fuzz {
namespace {

using Stub = v1::KvCache::Stub;

// One DecodeStream carrying the bytes as its only message. A bad message fails the message (its
// `error`), not the stream.
void Stream(const std::string& bytes, Stub& stub) {
  v1::DecodeBatchRequest request;
  if (!request.ParseFromString(bytes)) return;
  grpc::ClientContext context;
  auto stream = stub.DecodeStream(&context);
  stream->Write(request);
  stream->WritesDone();
  v1::DecodeBatchResponse response;
  while (stream->Read(&response)) {
    if (response.has_error()) {
      CheckCode("DecodeStream message",
                grpc::Status(static_cast<grpc::StatusCode>(response.error().code()),
                             response.error().message()));
    }
  }
  CheckCode("DecodeStream", stream->Finish());
}

void RunRecord(Stub& stub, const Record& r) {
  switch (r.selector % 10) {
    case 0:
      return CallUnary("CreateSequence", r.bytes, &Stub::CreateSequence, stub);
    case 1:
      return CallUnary("Append", r.bytes, &Stub::Append, stub);
    case 2:
      return CallUnary("DecodeBatch", r.bytes, &Stub::DecodeBatch, stub);
    case 3:
      return Stream(r.bytes, stub);
    case 4:
      return CallUnary("Fork", r.bytes, &Stub::Fork, stub);
    case 5:
      return CallUnary("Truncate", r.bytes, &Stub::Truncate, stub);
    case 6:
      return CallUnary("Release", r.bytes, &Stub::Release, stub);
    case 7:
      return CallUnary("GetSequence", r.bytes, &Stub::GetSequence, stub);
    case 8:
      return CallUnary("ListSequences", r.bytes, &Stub::ListSequences, stub);
    default:
      return CallUnary("Stats", r.bytes, &Stub::Stats, stub);
  }
}

void CheckCache(const char* when) {
  const absl::Status consistent = FuzzServer::Get().cache()->CheckConsistency();
  if (!consistent.ok()) {
    std::fprintf(stderr, "fuzz: cache inconsistent %s: %s\n", when, consistent.ToString().c_str());
    std::abort();
  }
}

// Releases every sequence through the service and checks that the cache is then empty.
void ReleaseAll(Stub& stub) {
  v1::ListSequencesRequest list;
  list.set_page_size(1000);
  v1::ListSequencesResponse page;
  grpc::ClientContext list_context;
  CheckCode("ListSequences", stub.ListSequences(&list_context, list, &page));
  for (const v1::SequenceInfo& s : page.sequences()) {
    v1::ReleaseRequest release;
    release.set_sequence_id(s.sequence_id());
    v1::ReleaseResponse released;
    grpc::ClientContext context;
    const grpc::Status status = stub.Release(&context, release, &released);
    if (!status.ok()) {
      std::fprintf(stderr, "fuzz: releasing a listed sequence failed: %s\n",
                   status.error_message().c_str());
      std::abort();
    }
  }
  const kv::CacheStats stats = FuzzServer::Get().cache()->Stats();
  if (stats.used_bytes != 0 || stats.sequences != 0 || stats.tokens != 0) {
    std::fprintf(stderr, "fuzz: after releasing all, %lld bytes, %lld sequences, %lld tokens\n",
                 static_cast<long long>(stats.used_bytes), static_cast<long long>(stats.sequences),
                 static_cast<long long>(stats.tokens));
    std::abort();
  }
}

}  // namespace
}  // namespace attend::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  namespace fuzz = attend::fuzz;
  static fuzz::Stub* const stub = new fuzz::Stub(fuzz::FuzzServer::Get().channel());
  for (const fuzz::Record& r : fuzz::SplitRecords(data, size, 16)) {
    fuzz::RunRecord(*stub, r);
    fuzz::CheckCache("after a call");
  }
  fuzz::ReleaseAll(*stub);
  fuzz::CheckCache("after releasing every sequence");
  return 0;
}
