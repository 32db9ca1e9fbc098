// KvCacheClient against a recording fake KvCache service, for what a real server cannot show:
// the sequence-key metadata each call sends, which calls are retried on UNAVAILABLE (counted on
// the server side) and when retries stop, streams that fail per message or break, and a server
// that comes up late.
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/kv_cache_client.h"
#include "grpcpp/grpcpp.h"
#include "tests/test_util.h"

namespace attend {
namespace {

using ::attend::testing::StatusIs;
using client::FloatTensor;
using client::KvCacheClient;

client::ConnectionOptions Options(int port) {
  client::ConnectionOptions options;
  options.target = absl::StrCat("127.0.0.1:", port);
  options.deadline = absl::Seconds(20);
  return options;
}

// A valid shape to create; the fake does not look at it.
v1::SequenceConfig Shape() {
  v1::SequenceConfig config;
  config.set_layers(2);
  config.set_n_head(4);
  config.set_n_head_kv(2);
  config.set_head_dim(8);
  config.set_kv_dtype(v1::FLOAT32);
  return config;
}

// A KvCache service that records each call's method and sequence-key metadata, answers with
// minimal responses, and fails the next `fail` calls with a chosen code.
class FakeKvCache final : public v1::KvCache::Service {
 public:
  struct Call {
    std::string method;
    std::optional<std::string> key;
    size_t key_count = 0;
  };

  std::atomic<bool> loop_pages{false};

  void FailNext(int n, grpc::StatusCode code = grpc::StatusCode::UNAVAILABLE) {
    std::lock_guard<std::mutex> lock(mu_);
    fail_ = n;
    code_ = code;
  }
  std::vector<Call> calls() const {
    std::lock_guard<std::mutex> lock(mu_);
    return calls_;
  }
  int Count(const std::string& method) const {
    std::lock_guard<std::mutex> lock(mu_);
    return static_cast<int>(std::count_if(calls_.begin(), calls_.end(),
                                          [&](const Call& c) { return c.method == method; }));
  }
  void Clear() {
    std::lock_guard<std::mutex> lock(mu_);
    calls_.clear();
  }

  grpc::Status CreateSequence(grpc::ServerContext* context, const v1::CreateSequenceRequest* r,
                              v1::SequenceInfo* out) override {
    out->set_sequence_id(r->sequence_id().empty() ? "generated" : r->sequence_id());
    return Record("CreateSequence", context);
  }
  grpc::Status Append(grpc::ServerContext* context, const v1::AppendRequest* r,
                      v1::AppendResponse* out) override {
    out->set_layer_tokens(r->k().shape_size() > 0 ? r->k().shape(0) : 0);
    return Record("Append", context);
  }
  grpc::Status DecodeBatch(grpc::ServerContext* context, const v1::DecodeBatchRequest* r,
                           v1::DecodeBatchResponse* out) override {
    Answer(*r, out);
    return Record("DecodeBatch", context);
  }
  grpc::Status DecodeStream(
      grpc::ServerContext* context,
      grpc::ServerReaderWriter<v1::DecodeBatchResponse, v1::DecodeBatchRequest>* stream) override {
    if (grpc::Status s = Record("DecodeStream", context); !s.ok()) return s;
    v1::DecodeBatchRequest request;
    while (stream->Read(&request)) {
      // A step for "hang-up" ends the stream without answering (a broken server).
      if (request.steps_size() > 0 && request.steps(0).sequence_id() == "hang-up") break;
      v1::DecodeBatchResponse response;
      Answer(request, &response);
      if (!stream->Write(response)) break;
    }
    return grpc::Status::OK;
  }
  grpc::Status Fork(grpc::ServerContext* context, const v1::ForkRequest* r,
                    v1::SequenceInfo* out) override {
    out->set_sequence_id(r->new_id());
    return Record("Fork", context);
  }
  grpc::Status Truncate(grpc::ServerContext* context, const v1::TruncateRequest* r,
                        v1::SequenceInfo* out) override {
    out->set_sequence_id(r->sequence_id());
    return Record("Truncate", context);
  }
  grpc::Status Release(grpc::ServerContext* context, const v1::ReleaseRequest*,
                       v1::ReleaseResponse* out) override {
    out->set_freed_bytes(1024);
    return Record("Release", context);
  }
  grpc::Status GetSequence(grpc::ServerContext* context, const v1::GetSequenceRequest* r,
                           v1::SequenceInfo* out) override {
    out->set_sequence_id(r->sequence_id());
    return Record("GetSequence", context);
  }
  grpc::Status ListSequences(grpc::ServerContext* context, const v1::ListSequencesRequest* r,
                             v1::ListSequencesResponse* out) override {
    // Two pages: "p1" then "p2"; or, with loop_pages, the same token every time.
    if (loop_pages) {
      out->set_next_page_token("loop");
    } else if (r->page_token().empty()) {
      out->add_sequences()->set_sequence_id("p1");
      out->set_next_page_token("after-p1");
    } else {
      out->add_sequences()->set_sequence_id("p2");
    }
    return Record("ListSequences", context);
  }
  grpc::Status Stats(grpc::ServerContext* context, const v1::StatsRequest*,
                     v1::CacheStats* out) override {
    out->set_capacity_bytes(1 << 20);
    return Record("Stats", context);
  }
  grpc::Status SaveSequence(grpc::ServerContext* context, const v1::SaveSequenceRequest* r,
                            v1::SaveSequenceResponse* out) override {
    out->set_name(r->name().empty() ? r->sequence_id() : r->name());
    out->set_bytes(123);
    return Record("SaveSequence", context);
  }
  grpc::Status LoadSequence(grpc::ServerContext* context, const v1::LoadSequenceRequest* r,
                            v1::SequenceInfo* out) override {
    out->set_sequence_id(r->sequence_id().empty() ? "from-file" : r->sequence_id());
    return Record("LoadSequence", context);
  }
  // Three chunks: "ab", "cd", "e"; records the chunk size asked for.
  grpc::Status ExportSequence(grpc::ServerContext* context, const v1::ExportSequenceRequest* r,
                              grpc::ServerWriter<v1::SequenceChunk>* writer) override {
    if (grpc::Status s = Record("ExportSequence", context); !s.ok()) return s;
    export_chunk_bytes = r->chunk_bytes();
    for (const char* data : {"ab", "cd", "e"}) {
      v1::SequenceChunk chunk;
      chunk.set_data(data);
      if (!writer->Write(chunk)) break;
    }
    return grpc::Status::OK;
  }
  // Records each message's size and the first message's fields; answers with the bytes' size.
  grpc::Status ImportSequence(grpc::ServerContext* context,
                              grpc::ServerReader<v1::ImportSequenceRequest>* reader,
                              v1::SequenceInfo* out) override {
    if (grpc::Status s = Record("ImportSequence", context); !s.ok()) return s;
    v1::ImportSequenceRequest request;
    std::lock_guard<std::mutex> lock(mu_);
    import_pieces.clear();
    import_first = {};
    int64_t bytes = 0;
    while (reader->Read(&request)) {
      if (import_pieces.empty()) {
        import_first = request;
        import_first.clear_data();
      }
      import_pieces.push_back(request.data().size());
      bytes += static_cast<int64_t>(request.data().size());
    }
    out->set_sequence_id(import_first.sequence_id());
    out->set_bytes(bytes);
    return grpc::Status::OK;
  }
  grpc::Status HandOff(grpc::ServerContext* context, const v1::HandOffRequest*,
                       v1::HandOffResponse* out) override {
    out->set_moved(2);
    return Record("HandOff", context);
  }

  std::atomic<int64_t> export_chunk_bytes{0};
  std::vector<size_t> import_pieces;       // guarded by mu_ while a call runs
  v1::ImportSequenceRequest import_first;  // without its data

 private:
  static void Answer(const v1::DecodeBatchRequest& request, v1::DecodeBatchResponse* response) {
    response->set_request_id(request.request_id());
    if (request.steps_size() > 0 && request.steps(0).sequence_id() == "refused") {
      response->mutable_error()->set_code(static_cast<int>(grpc::StatusCode::NOT_FOUND));
      response->mutable_error()->set_message("no sequence 'refused'");
      return;
    }
    for (const v1::DecodeStep& step : request.steps()) {
      v1::DecodeResult* result = response->add_results();
      result->set_sequence_id(step.sequence_id());
      *result->mutable_output() = step.q();  // an echo: enough to check the decoding
      result->set_layer_tokens(1);
    }
  }

  grpc::Status Record(const std::string& method, grpc::ServerContext* context) {
    const auto& metadata = context->client_metadata();
    Call call{method, std::nullopt, metadata.count(client::kSequenceKeyMetadata)};
    auto it = metadata.find(client::kSequenceKeyMetadata);
    if (it != metadata.end()) call.key = std::string(it->second.data(), it->second.size());
    std::lock_guard<std::mutex> lock(mu_);
    calls_.push_back(std::move(call));
    if (fail_ > 0) {
      --fail_;
      return grpc::Status(code_, "fake failure");
    }
    return grpc::Status::OK;
  }

  mutable std::mutex mu_;
  std::vector<Call> calls_;
  int fail_ = 0;
  grpc::StatusCode code_ = grpc::StatusCode::UNAVAILABLE;
};

// A port that nothing listens on right now (bound, then closed).
int UnusedPort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  EXPECT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  socklen_t length = sizeof(addr);
  EXPECT_EQ(getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &length), 0);
  close(fd);
  return ntohs(addr.sin_port);
}

std::unique_ptr<grpc::Server> StartFake(FakeKvCache* service, int port, int* bound = nullptr) {
  grpc::ServerBuilder builder;
  int selected = 0;
  builder.AddListeningPort(absl::StrCat("127.0.0.1:", port), grpc::InsecureServerCredentials(),
                           &selected);
  builder.RegisterService(service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  EXPECT_NE(selected, 0) << "could not listen on port " << port;
  if (bound) *bound = selected;
  return server;
}

class KvCacheClientFakeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    server_ = StartFake(&fake_, 0, &port_);
    ASSERT_NE(server_, nullptr);
  }
  void TearDown() override { server_->Shutdown(); }

  KvCacheClient Client(client::RetryPolicy retry = {},
                       absl::Duration deadline = absl::Seconds(10)) {
    client::ConnectionOptions options = Options(port_);
    options.deadline = deadline;
    return KvCacheClient(client::Connect(options), options, retry);
  }

  FakeKvCache fake_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
};

TEST_F(KvCacheClientFakeTest, EveryCallNamingASequenceSendsItsKey) {
  KvCacheClient kv = Client();
  const FloatTensor token{{1, 1, 2}, {1.5f, -2.0f}};
  ASSERT_OK(kv.CreateSequence(Shape(), "c-1"));
  // Generated here, "seq-<16 hex>", and sent as its own key.
  auto generated = kv.CreateSequence(Shape());
  ASSERT_OK(generated);
  client::AppendInput append;
  append.sequence_id = "a-1";
  append.k = append.v = token;
  ASSERT_OK(kv.Append(append));
  client::DecodeBatchInput batch;
  batch.steps = {{"first", token, token, token}, {"first/second", token, token, token}};
  auto decoded = kv.DecodeBatch(batch);
  ASSERT_OK(decoded);
  EXPECT_EQ(decoded->results[1].output.values, token.values);
  // Steps of different keys: no key (one server serves it; the proxy's replica refuses it).
  client::DecodeBatchInput mixed;
  mixed.steps = {{"first", token, token, token}, {"second", token, token, token}};
  ASSERT_OK(kv.DecodeBatch(mixed));
  ASSERT_OK(kv.Fork("source", "source/fork"));
  ASSERT_OK(kv.Fork("source/fork", ""));
  ASSERT_OK(kv.Fork("source", "elsewhere"));  // another key: none sent
  ASSERT_OK(kv.Truncate("t-1", 3));
  ASSERT_OK(kv.Release("r-1"));
  ASSERT_OK(kv.GetSequence("g-1"));
  ASSERT_OK(kv.ListSequences());
  ASSERT_OK(kv.Stats());
  {
    auto stream = kv.OpenDecodeStream();
    ASSERT_OK(stream->Write(batch));  // the first message's first step names the stream
    batch.steps = {{"other", token, token, token}};
    ASSERT_OK(stream->Write(batch));
    ASSERT_OK(stream->Finish());
  }
  ASSERT_OK(kv.GetSequence("bad\nid"));        // not a header value: sent without a key
  ASSERT_OK(kv.GetSequence("family/member"));  // the routing key: up to the first '/'
  ASSERT_OK(kv.Release("family/a/b"));

  using Key = std::optional<std::string>;
  ASSERT_EQ(generated->sequence_id().size(), 20u) << generated->sequence_id();
  EXPECT_EQ(generated->sequence_id().rfind("seq-", 0), 0u) << generated->sequence_id();
  const std::vector<std::pair<std::string, Key>> expected = {
      {"CreateSequence", "c-1"},
      {"CreateSequence", generated->sequence_id()},
      {"Append", "a-1"},
      {"DecodeBatch", "first"},
      {"DecodeBatch", std::nullopt},
      {"Fork", "source"},
      {"Fork", "source"},
      {"Fork", std::nullopt},
      {"Truncate", "t-1"},
      {"Release", "r-1"},
      {"GetSequence", "g-1"},
      {"ListSequences", std::nullopt},
      {"Stats", std::nullopt},
      {"DecodeStream", "first"},
      {"GetSequence", std::nullopt},
      {"GetSequence", "family"},
      {"Release", "family"}};
  const std::vector<FakeKvCache::Call> calls = fake_.calls();
  ASSERT_EQ(calls.size(), expected.size());
  for (size_t i = 0; i < calls.size(); ++i) {
    EXPECT_EQ(calls[i].method, expected[i].first) << "call " << i;
    EXPECT_EQ(calls[i].key, expected[i].second) << calls[i].method;
    EXPECT_LE(calls[i].key_count, 1u) << calls[i].method;
  }
}

// The start of a snapshot whose header names `id`: "ATTNSNAP", version 1, a header length, then
// the id's length and bytes (client::SnapshotSequenceId reads no further).
std::string SnapshotStart(const std::string& id) {
  std::string out = "ATTNSNAP";
  for (uint32_t v : {1u, 100u, static_cast<uint32_t>(id.size())}) {
    for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
  }
  return out + id;
}

// A ByteSource over `data`.
client::ByteSource SourceOf(const std::string& data) {
  auto at = std::make_shared<size_t>(0);
  return [data, at](char* dst, size_t n) -> absl::StatusOr<size_t> {
    const size_t k = std::min(n, data.size() - *at);
    std::copy_n(data.data() + *at, k, dst);
    *at += k;
    return k;
  };
}

TEST(SnapshotSequenceIdTest, ReadsTheIdFromTheHeaderOrSaysWhyNot) {
  auto id = client::SnapshotSequenceId(SnapshotStart("chat-1/b") + "rest");
  ASSERT_OK(id);
  EXPECT_EQ(*id, "chat-1/b");
  EXPECT_THAT(client::SnapshotSequenceId("ATTNSNAX" + std::string(20, '\0')),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(client::SnapshotSequenceId("ATTNSNAP"), StatusIs(absl::StatusCode::kInvalidArgument));
  const std::string cut = SnapshotStart("chat-1");
  EXPECT_THAT(client::SnapshotSequenceId(cut.substr(0, cut.size() - 1)),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(client::SnapshotSequenceId(SnapshotStart("")),
              StatusIs(absl::StatusCode::kInvalidArgument));
}

// Save, export and import send the key of the sequence they name (an import without an id: the
// one in the bytes' header); a load without an id and HandOff send none. An import goes in
// pieces of at most 512 KiB, the first carrying the id and share_with_source.
TEST_F(KvCacheClientFakeTest, TransferCallsSendTheirKeysAndImportsGoInPieces) {
  KvCacheClient kv = Client();
  auto saved = kv.SaveSequence("s/1", "snap");
  ASSERT_OK(saved);
  EXPECT_EQ(saved->name(), "snap");
  ASSERT_OK(kv.LoadSequence("snap"));
  ASSERT_OK(kv.LoadSequence("snap", "l/2"));
  std::string exported;
  auto result = kv.ExportSequence("e-1", [&](absl::string_view b) {
    exported.append(b.data(), b.size());
    return absl::OkStatus();
  });
  ASSERT_OK(result);
  EXPECT_EQ(exported, "abcde");
  EXPECT_EQ(result->bytes, 5);
  EXPECT_EQ(result->chunks, 3);
  EXPECT_EQ(fake_.export_chunk_bytes, int64_t{1} << 20);  // 64 MiB / 2, at most 1 MiB
  // A sink's error stops the stream and is returned as it is.
  EXPECT_THAT(
      kv.ExportSequence("e-2", [](absl::string_view) { return absl::DataLossError("disk full"); }),
      StatusIs(absl::StatusCode::kDataLoss));

  const std::string big = SnapshotStart("h/3") + std::string((int64_t{1} << 20) + 5, 'x');
  auto imported = kv.ImportSequence(SourceOf(big));
  ASSERT_OK(imported);
  EXPECT_EQ(imported->bytes(), static_cast<int64_t>(big.size()));
  {
    std::vector<size_t> pieces = fake_.import_pieces;
    ASSERT_EQ(pieces.size(), 3u);
    EXPECT_EQ(pieces[0], 512u << 10);
    EXPECT_EQ(pieces[1], 512u << 10);
    EXPECT_EQ(fake_.import_first.sequence_id(), "");
    EXPECT_FALSE(fake_.import_first.has_share_with_source());
  }
  ASSERT_OK(kv.ImportSequence(SourceOf("any bytes"), "i/4", false));
  EXPECT_EQ(fake_.import_pieces, std::vector<size_t>{9});
  EXPECT_EQ(fake_.import_first.sequence_id(), "i/4");
  EXPECT_TRUE(fake_.import_first.has_share_with_source());
  EXPECT_FALSE(fake_.import_first.share_with_source());
  // Without an id, bytes that are no snapshot have no key to send: refused before any call.
  EXPECT_THAT(kv.ImportSequence(SourceOf("not a snapshot, and long enough")),
              StatusIs(absl::StatusCode::kInvalidArgument));
  auto handed = kv.HandOff();
  ASSERT_OK(handed);
  EXPECT_EQ(handed->moved(), 2);

  using Key = std::optional<std::string>;
  const std::vector<std::pair<std::string, Key>> expected = {
      {"SaveSequence", "s"},     {"LoadSequence", std::nullopt}, {"LoadSequence", "l"},
      {"ExportSequence", "e-1"}, {"ExportSequence", "e-2"},      {"ImportSequence", "h"},
      {"ImportSequence", "i"},   {"HandOff", std::nullopt}};
  const std::vector<FakeKvCache::Call> calls = fake_.calls();
  ASSERT_EQ(calls.size(), expected.size());
  for (size_t i = 0; i < calls.size(); ++i) {
    EXPECT_EQ(calls[i].method, expected[i].first) << "call " << i;
    EXPECT_EQ(calls[i].key, expected[i].second) << calls[i].method;
    EXPECT_LE(calls[i].key_count, 1u) << calls[i].method;
  }
}

TEST_F(KvCacheClientFakeTest, IdempotentReadsAreRetriedOnUnavailableWithBackoff) {
  KvCacheClient kv = Client();
  for (const std::string method : {"GetSequence", "ListSequences", "Stats"}) {
    fake_.Clear();
    fake_.FailNext(2);
    const absl::Time start = absl::Now();
    absl::Status status;
    if (method == "GetSequence") status = kv.GetSequence("g").status();
    if (method == "ListSequences") status = kv.ListSequences().status();
    if (method == "Stats") status = kv.Stats().status();
    const absl::Duration elapsed = absl::Now() - start;
    EXPECT_OK(status) << method;
    EXPECT_EQ(fake_.Count(method), 3) << method;
    EXPECT_GE(elapsed, absl::Milliseconds(150)) << method << ": waits 50 ms, then 100 ms";
  }
  // Three attempts at most.
  fake_.Clear();
  fake_.FailNext(10);
  EXPECT_THAT(kv.GetSequence("g"), StatusIs(absl::StatusCode::kUnavailable, {"fake failure"}));
  EXPECT_EQ(fake_.Count("GetSequence"), 3);
  // Other codes are answers, not transport failures.
  fake_.Clear();
  fake_.FailNext(1, grpc::StatusCode::NOT_FOUND);
  EXPECT_THAT(kv.GetSequence("g"), StatusIs(absl::StatusCode::kNotFound));
  EXPECT_EQ(fake_.Count("GetSequence"), 1);
  fake_.FailNext(1, grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(kv.Stats(), StatusIs(absl::StatusCode::kResourceExhausted));
  EXPECT_EQ(fake_.Count("Stats"), 1);
  fake_.FailNext(0);
}

TEST_F(KvCacheClientFakeTest, CallsThatChangeTheCacheAreNeverRetried) {
  KvCacheClient kv = Client();
  const FloatTensor token{{1, 1, 2}, {1.0f, 2.0f}};
  client::AppendInput append;
  append.sequence_id = "a";
  append.q = append.k = append.v = token;
  client::DecodeBatchInput batch;
  batch.steps = {{"d", token, token, token}};
  const std::vector<std::pair<std::string, std::function<absl::Status()>>> calls = {
      {"CreateSequence", [&] { return kv.CreateSequence(Shape(), "c").status(); }},
      {"Append", [&] { return kv.Append(append).status(); }},
      {"DecodeBatch", [&] { return kv.DecodeBatch(batch).status(); }},
      {"Fork", [&] { return kv.Fork("s", "f").status(); }},
      {"Truncate", [&] { return kv.Truncate("t", 1).status(); }},
      {"Release", [&] { return kv.Release("r").status(); }},
  };
  for (const auto& [method, call] : calls) {
    fake_.Clear();
    fake_.FailNext(1);
    EXPECT_THAT(call(), StatusIs(absl::StatusCode::kUnavailable)) << method;
    EXPECT_EQ(fake_.Count(method), 1) << method;
    EXPECT_OK(call()) << method;  // the fake recovered: the call itself works
  }
  // A refused stream is not reopened either.
  fake_.Clear();
  fake_.FailNext(1);
  auto stream = kv.OpenDecodeStream();
  absl::StatusOr<uint64_t> written = stream->Write(batch);
  const absl::Status refused = written.ok() ? stream->Read().status() : written.status();
  EXPECT_THAT(refused, StatusIs(absl::StatusCode::kUnavailable, {"fake failure"}));
  EXPECT_EQ(fake_.Count("DecodeStream"), 1);
}

TEST_F(KvCacheClientFakeTest, RetriesStopAtTheDeadline) {
  client::RetryPolicy patient;
  patient.max_attempts = 100;
  patient.initial_backoff = absl::Milliseconds(40);
  patient.multiplier = 1.0;
  KvCacheClient kv = Client(patient, absl::Milliseconds(300));
  fake_.FailNext(1000);
  const absl::Time start = absl::Now();
  const absl::Status status = kv.Stats().status();
  // UNAVAILABLE, or DEADLINE_EXCEEDED when a loaded machine makes the last attempt start just
  // before the deadline.
  EXPECT_TRUE(status.code() == absl::StatusCode::kUnavailable ||
              status.code() == absl::StatusCode::kDeadlineExceeded)
      << status;
  EXPECT_LT(absl::Now() - start, absl::Milliseconds(1000));
  EXPECT_GE(fake_.Count("Stats"), 2);
  EXPECT_LE(fake_.Count("Stats"), 8);  // 300 ms / 40 ms, and not 100 attempts
  fake_.FailNext(0);
}

TEST_F(KvCacheClientFakeTest, DecodeStreamMessageErrorsAndABrokenServer) {
  KvCacheClient kv = Client();
  const FloatTensor token{{1, 1, 2}, {3.0f, 4.0f}};
  auto stream = kv.OpenDecodeStream();
  client::DecodeBatchInput good, refused, hang_up;
  good.steps = {{"ok", token, token, token}};
  refused.steps = {{"refused", token, token, token}};
  hang_up.steps = {{"hang-up", token, token, token}};
  ASSERT_OK(stream->Write(good));
  ASSERT_OK(stream->Write(refused));
  ASSERT_OK(stream->Write(good));
  for (int i = 1; i <= 3; ++i) {
    auto reply = stream->Read();
    ASSERT_OK(reply);
    EXPECT_EQ(reply->request_id, static_cast<uint64_t>(i));
    if (i == 2) {
      EXPECT_THAT(reply->result, StatusIs(absl::StatusCode::kNotFound, {"'refused'"}));
    } else {
      ASSERT_OK(reply->result);
      EXPECT_EQ(reply->result->results[0].output.values, token.values);
    }
  }
  EXPECT_THAT(stream->Read(), StatusIs(absl::StatusCode::kFailedPrecondition));
  // A server that ends the stream without answering breaks the one-response-per-message
  // contract; the client says so instead of waiting.
  ASSERT_OK(stream->Write(hang_up));
  EXPECT_THAT(stream->Read(), StatusIs(absl::StatusCode::kInternal, {"1 messages unanswered"}));
  EXPECT_OK(stream->Finish());
}

TEST_F(KvCacheClientFakeTest, AnAbandonedStreamIsCancelled) {
  KvCacheClient kv = Client();  // 10 s deadline
  const FloatTensor token{{1, 1, 2}, {3.0f, 4.0f}};
  client::DecodeBatchInput good;
  good.steps = {{"ok", token, token, token}};
  const absl::Time start = absl::Now();
  {
    auto stream = kv.OpenDecodeStream();
    ASSERT_OK(stream->Write(good));
    ASSERT_OK(stream->Read());       // the server's handler is running now
    ASSERT_OK(stream->Write(good));  // unanswered, no WritesDone, no Finish
  }
  // Without the cancel, the fake's handler would wait for more messages until the deadline and
  // the shutdown below with it.
  server_->Shutdown();
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  EXPECT_EQ(fake_.Count("DecodeStream"), 1);
}

TEST_F(KvCacheClientFakeTest, ListAllFollowsPagesAndRefusesARepeatedToken) {
  KvCacheClient kv = Client();
  auto all = kv.ListAllSequences();
  ASSERT_OK(all);
  ASSERT_EQ(all->size(), 2u);
  EXPECT_EQ((*all)[0].sequence_id(), "p1");
  EXPECT_EQ((*all)[1].sequence_id(), "p2");
  EXPECT_EQ(fake_.Count("ListSequences"), 2);
  fake_.loop_pages = true;
  EXPECT_THAT(kv.ListAllSequences(),
              StatusIs(absl::StatusCode::kInternal, {"page token 'loop' twice"}));
  EXPECT_EQ(fake_.Count("ListSequences"), 2 + 2);
}

// The retry story end to end: nothing listens on the port until ~100 ms after the call starts.
TEST(KvCacheClientLateServerTest, GetSequenceWaitsForAServerThatComesUpAppendDoesNot) {
  // The default backoff (50 ms, doubling); on an idle machine the default 3 attempts suffice,
  // 5 leave room for a loaded one.
  client::RetryPolicy retry;
  retry.max_attempts = 5;
  client::ConnectionOptions options;
  options.deadline = absl::Seconds(10);

  FakeKvCache fake;
  const int port = UnusedPort();
  std::unique_ptr<grpc::Server> server;
  std::thread starter([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    server = StartFake(&fake, port);
  });
  // The CLI's channel: gRPC's default reconnect backoff (1 s) applies unless the client resets it.
  options.target = absl::StrCat("127.0.0.1:", port);
  KvCacheClient kv(client::Connect(options), options, retry);
  auto got = kv.GetSequence("late");
  starter.join();
  ASSERT_OK(got);
  EXPECT_EQ(got->sequence_id(), "late");
  EXPECT_EQ(fake.Count("GetSequence"), 1);  // the failed attempts never reached a server
  server->Shutdown();

  // Append on a port where the server comes up later: one attempt, UNAVAILABLE, and the
  // server never sees it.
  FakeKvCache later;
  const int port2 = UnusedPort();
  options.target = absl::StrCat("127.0.0.1:", port2);
  KvCacheClient kv2(client::Connect(options), options, retry);
  client::AppendInput append;
  append.sequence_id = "late";
  append.k = append.v = FloatTensor{{1, 1, 1}, {1.0f}};
  EXPECT_THAT(kv2.Append(append), StatusIs(absl::StatusCode::kUnavailable));
  std::unique_ptr<grpc::Server> server2 = StartFake(&later, port2);
  ASSERT_OK(kv2.GetSequence("late"));   // the server is reachable now...
  EXPECT_EQ(later.Count("Append"), 0);  // ...and no Append was retried into it
  server2->Shutdown();
}

}  // namespace
}  // namespace attend
