// The fleet's routing rule at the server (common/sequence_key.h, server/routing.h): every call
// that names a sequence is checked against its x-attend-sequence-key, and against the proxy's
// mark. Generated over every RPC that names a sequence and every kind of metadata a client may
// send; a refused call changes nothing.
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "attend/v1/kv_cache.grpc.pb.h"
#include "common/sequence_key.h"
#include "tests/server/server_fixture.h"

namespace attend {
namespace {

using ::attend::testing::Filled;

// What a call carries: a key (or none) and the proxy's mark (or not).
struct Meta {
  std::optional<std::string> key;
  bool proxied = false;
  std::string Name() const {
    return absl::StrCat(key ? absl::StrCat("key '", *key, "'") : "no key",
                        proxied ? ", proxied" : "");
  }
};

class RoutingTest : public ::attend::testing::ServerSuite {
 protected:
  void SetUp() override {
    channel_ = ::attend::testing::ChannelTo(*server_);
    stub_ = v1::KvCache::NewStub(channel_);
  }

  static void Apply(const Meta& meta, grpc::ClientContext* context) {
    if (meta.key) context->AddMetadata(kSequenceKeyMetadata, *meta.key);
    if (meta.proxied) context->AddMetadata(kProxyMetadata, "test");
  }

  static v1::SequenceConfig Config() {
    v1::SequenceConfig c;
    c.set_layers(1);
    c.set_n_head(2);
    c.set_n_head_kv(1);
    c.set_head_dim(4);
    c.set_kv_dtype(v1::FLOAT32);
    return c;
  }

  grpc::Status Create(const std::string& id, const Meta& meta, v1::SequenceInfo* info = nullptr) {
    v1::CreateSequenceRequest request;
    request.set_sequence_id(id);
    *request.mutable_config() = Config();
    v1::SequenceInfo ignored;
    grpc::ClientContext context;
    Apply(meta, &context);
    return stub_->CreateSequence(&context, request, info != nullptr ? info : &ignored);
  }

  grpc::Status Append(const std::string& id, const Meta& meta) {
    v1::AppendRequest request;
    request.set_sequence_id(id);
    *request.mutable_q() = Filled({1, 2, 4});
    *request.mutable_k() = Filled({1, 1, 4});
    *request.mutable_v() = Filled({1, 1, 4});
    v1::AppendResponse response;
    grpc::ClientContext context;
    Apply(meta, &context);
    return stub_->Append(&context, request, &response);
  }

  grpc::Status Decode(const std::vector<std::string>& ids, const Meta& meta) {
    v1::DecodeBatchRequest request;
    for (const std::string& id : ids) {
      v1::DecodeStep* step = request.add_steps();
      step->set_sequence_id(id);
      *step->mutable_q() = Filled({1, 2, 4});
      *step->mutable_k() = Filled({1, 1, 4});
      *step->mutable_v() = Filled({1, 1, 4});
    }
    v1::DecodeBatchResponse response;
    grpc::ClientContext context;
    Apply(meta, &context);
    return stub_->DecodeBatch(&context, request, &response);
  }

  grpc::Status Fork(const std::string& source, const std::string& new_id, const Meta& meta,
                    v1::SequenceInfo* info = nullptr) {
    v1::ForkRequest request;
    request.set_source_id(source);
    request.set_new_id(new_id);
    v1::SequenceInfo ignored;
    grpc::ClientContext context;
    Apply(meta, &context);
    return stub_->Fork(&context, request, info != nullptr ? info : &ignored);
  }

  grpc::Status Truncate(const std::string& id, const Meta& meta) {
    v1::TruncateRequest request;
    request.set_sequence_id(id);
    request.set_tokens(0);
    v1::SequenceInfo info;
    grpc::ClientContext context;
    Apply(meta, &context);
    return stub_->Truncate(&context, request, &info);
  }

  grpc::Status Release(const std::string& id, const Meta& meta) {
    v1::ReleaseRequest request;
    request.set_sequence_id(id);
    v1::ReleaseResponse response;
    grpc::ClientContext context;
    Apply(meta, &context);
    return stub_->Release(&context, request, &response);
  }

  grpc::Status Get(const std::string& id, const Meta& meta, v1::SequenceInfo* info = nullptr) {
    v1::GetSequenceRequest request;
    request.set_sequence_id(id);
    v1::SequenceInfo ignored;
    grpc::ClientContext context;
    Apply(meta, &context);
    return stub_->GetSequence(&context, request, info != nullptr ? info : &ignored);
  }

  // Tokens of `id`, asked without metadata (a direct call, which any key may make).
  int64_t Tokens(const std::string& id) {
    v1::SequenceInfo info;
    const grpc::Status status = Get(id, {});
    if (!status.ok()) return -1;
    EXPECT_TRUE(Get(id, {}, &info).ok());
    return info.tokens();
  }

  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::KvCache::Stub> stub_;
};

// Every call that names sequence `id` (its routing key `root`), under every kind of metadata:
// refused with INVALID_ARGUMENT exactly when the key contradicts the id, or when the call was
// proxied without a key; refused calls change nothing.
TEST_F(RoutingTest, EveryCallIsCheckedAgainstItsKey) {
  int round = 0;
  for (const std::string& shape : {std::string("plain"), std::string("family/member")}) {
    const std::string root = shape == "plain" ? "plain" : "family";
    const std::vector<Meta> metas = {
        {std::nullopt, false}, {root, false},   {"other", false},     {std::nullopt, true},
        {root, true},          {"other", true}, {shape + "x", false}, {"family/member", false}};
    for (const Meta& meta : metas) {
      const std::string id = absl::StrCat(shape, "-", round++);
      const std::string key = std::string(RoutingKey(id));
      Meta m = meta;
      // Keys given as the root stand for this id's root; "other" and the rest stay as they are.
      if (m.key && *m.key == root) m.key = key;
      const bool ok = m.key ? *m.key == key : !m.proxied;
      SCOPED_TRACE(absl::StrCat("sequence '", id, "', ", m.Name()));
      const auto expect = [&](const grpc::Status& status, const char* call) {
        if (ok) {
          EXPECT_TRUE(status.ok()) << call << ": " << status.error_message();
        } else {
          EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT)
              << call << ": " << status.error_message();
          EXPECT_TRUE(absl::StrContains(status.error_message(), kSequenceKeyMetadata))
              << status.error_message();
        }
      };
      expect(Create(id, m), "CreateSequence");
      if (!ok) {
        EXPECT_EQ(Tokens(id), -1) << "a refused create created it";
        ASSERT_TRUE(Create(id, {}).ok());
      }
      expect(Append(id, m), "Append");
      EXPECT_EQ(Tokens(id), ok ? 1 : 0);
      expect(Decode({id}, m), "DecodeBatch");
      EXPECT_EQ(Tokens(id), ok ? 2 : 0);
      expect(Get(id, m), "GetSequence");
      expect(Fork(id, "", m), "Fork");
      expect(Truncate(id, m), "Truncate");
      EXPECT_EQ(Tokens(id), 0);
      expect(Release(id, m), "Release");
      EXPECT_EQ(Tokens(id), ok ? -1 : 0);
      if (!ok) {
        ASSERT_TRUE(Release(id, {}).ok());
      }
    }
  }
}

// A fork lives on its source's replica, so a routed call must name it under the source's key,
// and a generated fork id routes by it too.
TEST_F(RoutingTest, ForksRouteByTheirSourcesKey) {
  const Meta keyed{"tree", false};
  ASSERT_TRUE(Create("tree", keyed).ok());
  ASSERT_TRUE(Append("tree", keyed).ok());
  // Another root: refused, saying how to name it; nothing was created.
  grpc::Status refused = Fork("tree", "leaf", keyed);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_TRUE(absl::StrContains(refused.error_message(), "new_id")) << refused.error_message();
  EXPECT_TRUE(absl::StrContains(refused.error_message(), "'tree/...'")) << refused.error_message();
  EXPECT_EQ(Tokens("leaf"), -1);
  refused = Fork("tree", "leaf", {std::nullopt, true});
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  // Under the source's key: accepted, and reachable by its own key.
  ASSERT_TRUE(Fork("tree", "tree/leaf", keyed).ok());
  EXPECT_TRUE(Get("tree/leaf", {"tree", true}).ok());
  // A fork of a fork keeps the key.
  ASSERT_TRUE(Fork("tree/leaf", "tree/leaf/twig", keyed).ok());
  // Generated: "<key>/<16 hex digits>", whatever the metadata.
  for (const Meta& meta : {keyed, Meta{std::nullopt, false}, Meta{"tree", true}}) {
    v1::SequenceInfo info;
    ASSERT_TRUE(Fork("tree/leaf", "", meta, &info).ok());
    EXPECT_EQ(RoutingKey(info.sequence_id()), "tree") << info.sequence_id();
    EXPECT_EQ(info.sequence_id().size(), std::string("tree/").size() + 16) << info.sequence_id();
    EXPECT_TRUE(Get(info.sequence_id(), keyed).ok());
  }
  // A direct call with no metadata is not routed: any new id, as before.
  EXPECT_TRUE(Fork("tree", "unrouted-fork", {}).ok());
}

// CreateSequence without an id: a key makes the generated id route by it; the proxy's mark
// without a key is refused (the generated id would route elsewhere); neither gives "seq-...".
TEST_F(RoutingTest, GeneratedIdsRouteByTheCallsKey) {
  v1::SequenceInfo info;
  ASSERT_TRUE(Create("", {"user-7", true}, &info).ok());
  EXPECT_EQ(RoutingKey(info.sequence_id()), "user-7") << info.sequence_id();
  EXPECT_TRUE(Get(info.sequence_id(), {"user-7", true}).ok());
  const grpc::Status refused = Create("", {std::nullopt, true});
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_TRUE(absl::StrContains(refused.error_message(), "sequence_id")) << refused.error_message();
  ASSERT_TRUE(Create("", {}, &info).ok());
  EXPECT_TRUE(absl::StartsWith(info.sequence_id(), "seq-")) << info.sequence_id();
  // A key that cannot start an id: refused, naming it.
  for (const std::string& bad :
       {std::string("a/b"), std::string(112, 'k'), std::string("sp ace")}) {
    const grpc::Status status = Create("", {bad, false});
    EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << bad;
  }
  EXPECT_TRUE(Create("", {std::string(111, 'k'), false}, &info).ok());
  EXPECT_EQ(info.sequence_id().size(), 128u);
}

// A batch's steps must all route by the call's key: one step of another key refuses the whole
// batch, naming that step, and no sequence advances.
TEST_F(RoutingTest, ABatchIsRefusedWholeForOneStepOfAnotherKey) {
  ASSERT_TRUE(Create("batch", {}).ok());
  ASSERT_TRUE(Create("batch/b", {}).ok());
  ASSERT_TRUE(Create("elsewhere", {}).ok());
  ASSERT_TRUE(Decode({"batch", "batch/b"}, {"batch", true}).ok());
  const grpc::Status refused = Decode({"batch", "batch/b", "elsewhere"}, {"batch", true});
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_TRUE(absl::StrContains(refused.error_message(), "steps[2].sequence_id"))
      << refused.error_message();
  EXPECT_EQ(Tokens("batch"), 1);
  EXPECT_EQ(Tokens("batch/b"), 1);
  EXPECT_EQ(Tokens("elsewhere"), 0);
}

// A DecodeStream the proxy routed: its messages are checked against the stream's key, each on
// its own; a message of another key gets its error, and the stream goes on.
TEST_F(RoutingTest, StreamMessagesAreCheckedAgainstTheStreamsKey) {
  ASSERT_TRUE(Create("stream", {}).ok());
  ASSERT_TRUE(Create("stranger", {}).ok());
  grpc::ClientContext context;
  Apply({"stream", true}, &context);
  auto stream = stub_->DecodeStream(&context);
  const auto step = [](const std::string& id) {
    v1::DecodeBatchRequest request;
    v1::DecodeStep* s = request.add_steps();
    s->set_sequence_id(id);
    *s->mutable_q() = Filled({1, 2, 4});
    *s->mutable_k() = Filled({1, 1, 4});
    *s->mutable_v() = Filled({1, 1, 4});
    return request;
  };
  v1::DecodeBatchResponse response;
  ASSERT_TRUE(stream->Write(step("stranger")));
  ASSERT_TRUE(stream->Read(&response));
  EXPECT_EQ(response.error().code(), static_cast<int>(grpc::StatusCode::INVALID_ARGUMENT));
  EXPECT_TRUE(absl::StrContains(response.error().message(), "'stranger'"))
      << response.error().message();
  ASSERT_TRUE(stream->Write(step("stream")));
  ASSERT_TRUE(stream->Read(&response));
  EXPECT_FALSE(response.has_error()) << response.error().message();
  ASSERT_EQ(response.results_size(), 1);
  EXPECT_EQ(response.results(0).layer_tokens(), 1);
  stream->WritesDone();
  EXPECT_TRUE(stream->Finish().ok());
  EXPECT_EQ(Tokens("stranger"), 0);

  // Direct, the same with a key (a key that contradicts a body is refused everywhere); a stream
  // opened without a key may mix sequences of any keys, off the proxy.
  for (const bool keyed : {true, false}) {
    grpc::ClientContext direct;
    if (keyed) Apply({"stream", false}, &direct);
    auto open = stub_->DecodeStream(&direct);
    ASSERT_TRUE(open->Write(step("stream")));
    ASSERT_TRUE(open->Read(&response));
    EXPECT_FALSE(response.has_error()) << response.error().message();
    ASSERT_TRUE(open->Write(step("stranger")));
    ASSERT_TRUE(open->Read(&response));
    EXPECT_EQ(response.has_error(), keyed) << response.error().message();
    open->WritesDone();
    EXPECT_TRUE(open->Finish().ok());
    EXPECT_EQ(Tokens("stranger"), keyed ? 0 : 1);
  }
}

// An empty key is no key: behind the proxy it is refused like a missing one (nginx routes it
// where keyless calls go), and it never makes a generated id.
TEST_F(RoutingTest, AnEmptyKeyIsNoKey) {
  const grpc::Status refused = Create("", {"", true});
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << refused.error_message();
  EXPECT_EQ(Create("empty-key", {"", true}).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(Tokens("empty-key"), -1);
  ASSERT_TRUE(Create("empty-key", {"", false}).ok());  // direct: as without a key
  EXPECT_EQ(Get("empty-key", {"", true}).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
}

}  // namespace
}  // namespace attend
