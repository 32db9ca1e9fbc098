// Bytes that are not the request a method takes, through a real channel: every unary method of
// every attend.v1 service answers INVALID_ARGUMENT "could not parse" (not gRPC's bare
// UNIMPLEMENTED), a DecodeStream answers an unparseable message with an error response and goes
// on serving the next, and the server keeps serving.
#include <future>
#include <string>
#include <vector>

#include "attend/v1/attention.grpc.pb.h"
#include "attend/v1/kv_cache.grpc.pb.h"
#include "attend/v1/planner.grpc.pb.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/message.h"
#include "grpcpp/generic/generic_stub.h"
#include "tests/server/server_fixture.h"

namespace attend {
namespace {

grpc::ByteBuffer BytesOf(const std::string& bytes) {
  grpc::Slice slice(bytes);
  return grpc::ByteBuffer(&slice, 1);
}

std::string StringOf(const grpc::ByteBuffer& buffer) {
  std::vector<grpc::Slice> slices;
  (void)buffer.Dump(&slices);
  std::string out;
  for (const grpc::Slice& s : slices)
    out.append(reinterpret_cast<const char*>(s.begin()), s.size());
  return out;
}

// Whether `bytes` parse as the request message of `method` ("/package.Service/Method").
bool ParsesAsRequest(const std::string& method, const std::string& bytes) {
  std::string dotted = method.substr(1);
  dotted[dotted.find('/')] = '.';
  const google::protobuf::MethodDescriptor* m =
      google::protobuf::DescriptorPool::generated_pool()->FindMethodByName(dotted);
  std::unique_ptr<google::protobuf::Message> message(
      google::protobuf::MessageFactory::generated_factory()->GetPrototype(m->input_type())->New());
  return message->ParseFromString(bytes);
}

// The unary methods of attend.v1's services, as "/attend.v1.Service/Method".
std::vector<std::string> UnaryMethods() {
  std::vector<std::string> methods;
  const auto* pool = google::protobuf::DescriptorPool::generated_pool();
  for (const char* name : {"attend.v1.Attention", "attend.v1.KvCache", "attend.v1.Planner"}) {
    const google::protobuf::ServiceDescriptor* service = pool->FindServiceByName(name);
    EXPECT_NE(service, nullptr) << name;
    if (service == nullptr) continue;
    for (int i = 0; i < service->method_count(); ++i) {
      const google::protobuf::MethodDescriptor* m = service->method(i);
      if (m->client_streaming() || m->server_streaming()) continue;
      methods.push_back("/" + std::string(name) + "/" + m->name());
    }
  }
  return methods;
}

class ProtocolTest : public ::attend::testing::ServerSuite {
 protected:
  grpc::Status CallRaw(const std::string& method, const std::string& bytes) {
    grpc::GenericStub stub(::attend::testing::ChannelTo(*server_));
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    const grpc::ByteBuffer request = BytesOf(bytes);
    grpc::ByteBuffer response;
    std::promise<grpc::Status> done;
    stub.UnaryCall(&context, method, grpc::StubOptions(), &request, &response,
                   [&done](grpc::Status status) { done.set_value(std::move(status)); });
    return done.get_future().get();
  }
};

TEST_F(ProtocolTest, UnparseableBytesAreInvalidArgumentOnEveryUnaryMethod) {
  const std::vector<std::string> methods = UnaryMethods();
  ASSERT_EQ(methods.size(), 22u);  // 4 + 13 (HandOff among them) + 5
  // Not protobuf at all; a length-delimited field that runs past the end; a string field (1 of
  // most requests) that is not UTF-8.
  const std::vector<std::string> garbage = {std::string("\xff\xff\xff", 3),
                                            std::string("\x0a\x7f\x01", 3),
                                            std::string("\x0a\x02\xc3\x28", 4)};
  for (const std::string& method : methods) {
    for (const std::string& bytes : garbage) {
      if (ParsesAsRequest(method, bytes)) continue;  // a valid message of this method after all
      const grpc::Status status = CallRaw(method, bytes);
      EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT)
          << method << ": " << status.error_message();
      EXPECT_NE(status.error_message().find("could not parse"), std::string::npos)
          << method << ": " << status.error_message();
    }
    EXPECT_FALSE(ParsesAsRequest(method, garbage[0])) << method;
  }
  // An ImportModel whose config text is not UTF-8 (field 1, hf_config_json).
  const grpc::Status import =
      CallRaw("/attend.v1.Planner/ImportModel", std::string("\x0a\x03{\xfe}", 5));
  EXPECT_EQ(import.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << import.error_message();
  EXPECT_NE(import.error_message().find("attend.v1.ImportModelRequest"), std::string::npos)
      << import.error_message();
  // Still serving.
  v1::SoftmaxRequest softmax;
  softmax.add_logits(1);
  std::string bytes;
  ASSERT_TRUE(softmax.SerializeToString(&bytes));
  EXPECT_TRUE(CallRaw("/attend.v1.Attention/Softmax", bytes).ok());
}

// Ids of any length and bytes come back in NOT_FOUND bounded and escaped: a 20,000-character id
// once made the status too large for the client's metadata limit (RESOURCE_EXHAUSTED instead).
TEST_F(ProtocolTest, UnknownIdsComeBackBoundedInNotFound) {
  auto kv = v1::KvCache::NewStub(::attend::testing::ChannelTo(*server_));
  for (const std::string& id : {std::string(20000, 'x'), std::string("a\r\nb\x1b[2J", 8)}) {
    grpc::ClientContext context;
    v1::GetSequenceRequest request;
    request.set_sequence_id(id);
    v1::SequenceInfo info;
    const grpc::Status status = kv->GetSequence(&context, request, &info);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::NOT_FOUND) << status.error_message();
    EXPECT_LT(status.error_message().size(), 300u);
    EXPECT_EQ(status.error_message().find_first_of("\r\n\x1b"), std::string::npos)
        << status.error_message();
  }
}

// [valid, garbage, valid] on one DecodeStream: three responses in order (the middle one an
// error naming the problem), and the stream ends OK when the client closes it.
TEST_F(ProtocolTest, UnparseableStreamMessageGetsAnErrorAndTheStreamGoesOn) {
  auto kv = v1::KvCache::NewStub(::attend::testing::ChannelTo(*server_));
  {
    v1::CreateSequenceRequest create;
    create.set_sequence_id("protocol-stream");
    v1::SequenceConfig* c = create.mutable_config();
    c->set_layers(1);
    c->set_n_head(2);
    c->set_n_head_kv(1);
    c->set_head_dim(4);
    c->set_kv_dtype(v1::FLOAT32);
    grpc::ClientContext context;
    v1::SequenceInfo info;
    ASSERT_TRUE(kv->CreateSequence(&context, create, &info).ok());
  }
  auto step = [](uint64_t id) {
    v1::DecodeBatchRequest request;
    request.set_request_id(id);
    v1::DecodeStep* s = request.add_steps();
    s->set_sequence_id("protocol-stream");
    *s->mutable_q() = ::attend::testing::Filled({1, 2, 4});
    *s->mutable_k() = ::attend::testing::Filled({1, 1, 4});
    *s->mutable_v() = ::attend::testing::Filled({1, 1, 4});
    std::string bytes;
    request.SerializeToString(&bytes);
    return bytes;
  };

  grpc::GenericStub stub(::attend::testing::ChannelTo(*server_));
  grpc::ClientContext context;
  grpc::CompletionQueue cq;
  std::unique_ptr<grpc::GenericClientAsyncReaderWriter> stream =
      stub.PrepareCall(&context, "/attend.v1.KvCache/DecodeStream", &cq);
  void* tag;
  bool ok;
  auto wait = [&](intptr_t expected) {
    ASSERT_TRUE(cq.Next(&tag, &ok));
    ASSERT_EQ(reinterpret_cast<intptr_t>(tag), expected);
  };
  stream->StartCall(reinterpret_cast<void*>(1));
  wait(1);
  ASSERT_TRUE(ok);
  const std::vector<std::string> messages = {step(1), std::string("\xff\xff\xff\xff", 4), step(3)};
  std::vector<v1::DecodeBatchResponse> responses;
  for (const std::string& message : messages) {
    stream->Write(BytesOf(message), reinterpret_cast<void*>(2));
    wait(2);
    ASSERT_TRUE(ok);
    grpc::ByteBuffer reply;
    stream->Read(&reply, reinterpret_cast<void*>(3));
    wait(3);
    ASSERT_TRUE(ok) << "no response to message " << responses.size();
    v1::DecodeBatchResponse response;
    ASSERT_TRUE(response.ParseFromString(StringOf(reply)));
    responses.push_back(response);
  }
  stream->WritesDone(reinterpret_cast<void*>(4));
  wait(4);
  grpc::Status status;
  stream->Finish(&status, reinterpret_cast<void*>(5));
  wait(5);
  EXPECT_TRUE(status.ok()) << status.error_message();

  ASSERT_EQ(responses.size(), 3u);
  EXPECT_FALSE(responses[0].has_error());
  EXPECT_EQ(responses[0].results(0).layer_tokens(), 1);
  ASSERT_TRUE(responses[1].has_error());
  EXPECT_EQ(responses[1].error().code(), static_cast<int>(grpc::StatusCode::INVALID_ARGUMENT));
  EXPECT_NE(responses[1].error().message().find("could not parse"), std::string::npos)
      << responses[1].error().message();
  EXPECT_FALSE(responses[2].has_error()) << responses[2].error().message();
  EXPECT_EQ(responses[2].request_id(), 3u);
  EXPECT_EQ(responses[2].results(0).layer_tokens(), 2);
  cq.Shutdown();
  while (cq.Next(&tag, &ok)) {
  }
}

}  // namespace
}  // namespace attend
