// KvCacheClient against a real attend server with a small KV cache (every method, numbers
// checked against the reference attention), and against a recording fake KvCache service for
// what a real server cannot show: the sequence-key metadata each call sends, and which calls
// are retried on UNAVAILABLE (counted on the server side), including a server that comes up
// late.
#include "client/kv_cache_client.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <map>
#include <mutex>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "core/attention/testing/reference_attention.h"
#include "tests/server/server_fixture.h"
#include "tests/test_util.h"

namespace attend {
namespace {

using ::attend::testing::RandomFloats;
using ::attend::testing::StatusIs;
using client::FloatTensor;
using client::KvCacheClient;
using ::testing::ElementsAre;

constexpr int kHeads = 4, kKvHeads = 2, kDim = 8;

// --- a real server ------------------------------------------------------------------------------

server::ServerOptions SmallKvServerOptions() {
  server::ServerOptions options = ::attend::testing::SmallServerOptions();
  // 64 blocks of 1 KiB: f32 k/v of 2 heads x 8 dims is 128 bytes per token and layer, so a
  // block holds 8 tokens of a layer and the cache about 512 token-layers.
  options.kv_cache.capacity_bytes = 64 << 10;
  options.kv_cache.block_bytes = 1 << 10;
  return options;
}

client::ConnectionOptions Options(int port) {
  client::ConnectionOptions options;
  options.target = absl::StrCat("127.0.0.1:", port);
  options.deadline = absl::Seconds(20);
  return options;
}

v1::SequenceConfig Shape(int layers = 2, v1::DType dtype = v1::FLOAT32) {
  v1::SequenceConfig config;
  config.set_layers(layers);
  config.set_n_head(kHeads);
  config.set_n_head_kv(kKvHeads);
  config.set_head_dim(kDim);
  config.set_kv_dtype(dtype);
  return config;
}

// The q/k/v of tokens [0, n) of one layer of a sequence.
struct Tokens {
  std::vector<float> q, k, v;
};

Tokens MakeTokens(int64_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  return {RandomFloats(rng, n * kHeads * kDim), RandomFloats(rng, n * kKvHeads * kDim),
          RandomFloats(rng, n * kKvHeads * kDim)};
}

FloatTensor Slice(const std::vector<float>& x, int64_t from, int64_t n, int64_t heads) {
  const int64_t width = heads * kDim;
  return {{n, heads, kDim},
          std::vector<float>(x.begin() + from * width, x.begin() + (from + n) * width)};
}

client::AppendInput AppendOf(const std::string& id, int layer, const Tokens& t, int64_t from,
                             int64_t n, bool with_q = true) {
  client::AppendInput input;
  input.sequence_id = id;
  input.layer = layer;
  if (with_q) input.q = Slice(t.q, from, n, kHeads);
  input.k = Slice(t.k, from, n, kKvHeads);
  input.v = Slice(t.v, from, n, kKvHeads);
  return input;
}

client::DecodeStep StepOf(const std::string& id, const Tokens& t, int64_t position) {
  return {id, Slice(t.q, position, 1, kHeads), Slice(t.k, position, 1, kKvHeads),
          Slice(t.v, position, 1, kKvHeads)};
}

// Causal reference attention over tokens [0, n) of `t`: the output rows [from, n) and all the
// weights.
ReferenceResult Reference(const Tokens& t, int64_t n, int64_t from) {
  AttentionOptions options;
  options.mask.causal = true;
  const int64_t rows = n - from;
  auto r =
      ReferenceAttention({DType::kFloat32, {rows, kHeads, kDim}, t.q.data() + from * kHeads * kDim},
                         {DType::kFloat32, {n, kKvHeads, kDim}, t.k.data()},
                         {DType::kFloat32, {n, kKvHeads, kDim}, t.v.data()}, options);
  EXPECT_TRUE(r.ok()) << r.status();
  return *r;
}

void ExpectNear(const std::vector<float>& got, const std::vector<double>& want, double tolerance) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_NEAR(got[i], want[i], tolerance) << "element " << i;
  }
}

class KvCacheClientTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    auto started = server::AttendServer::Start(SmallKvServerOptions());
    ASSERT_TRUE(started.ok()) << started.status();
    server_ = started->release();
  }
  static void TearDownTestSuite() {
    delete server_;
    server_ = nullptr;
  }
  void SetUp() override {
    const client::ConnectionOptions options = Options(server_->port());
    client_.emplace(client::Connect(options), options);
  }
  void TearDown() override {
    // Every test leaves the cache empty, so that the next one sees the whole capacity.
    auto all = client_->ListAllSequences();
    ASSERT_OK(all);
    for (const v1::SequenceInfo& s : *all) EXPECT_OK(client_->Release(s.sequence_id()));
  }

  inline static server::AttendServer* server_ = nullptr;
  std::optional<KvCacheClient> client_;
};

TEST_F(KvCacheClientTest, CreateGetAndCreateErrors) {
  auto created = client_->CreateSequence(Shape(3), "alpha", /*reserve_tokens=*/10);
  ASSERT_OK(created);
  EXPECT_EQ(created->sequence_id(), "alpha");
  EXPECT_EQ(created->config().layers(), 3);
  EXPECT_EQ(created->config().n_head_kv(), kKvHeads);
  EXPECT_EQ(created->config().head_dim_v(), kDim);  // defaulted by the server
  EXPECT_THAT(created->layer_tokens(), ElementsAre(0, 0, 0));
  EXPECT_EQ(created->reserved_tokens(), 10);
  EXPECT_EQ(created->tokens_per_block(), 8);
  EXPECT_EQ(created->blocks(), 3 * 2);  // 10 tokens = 2 blocks in each of 3 layers
  EXPECT_EQ(created->bytes(), 6 * 1024);

  auto got = client_->GetSequence("alpha");
  ASSERT_OK(got);
  EXPECT_EQ(got->blocks(), 6);
  EXPECT_EQ(got->created_unix_ms(), created->created_unix_ms());

  auto generated = client_->CreateSequence(Shape());
  ASSERT_OK(generated);
  EXPECT_FALSE(generated->sequence_id().empty());
  EXPECT_OK(client_->GetSequence(generated->sequence_id()));

  EXPECT_THAT(client_->CreateSequence(Shape(), "alpha"),
              StatusIs(absl::StatusCode::kAlreadyExists, {"'alpha'"}));
  v1::SequenceConfig bad = Shape();
  bad.set_n_head(3);
  EXPECT_THAT(client_->CreateSequence(bad, "bad"),
              StatusIs(absl::StatusCode::kInvalidArgument, {"n_head_kv"}));
  EXPECT_THAT(client_->CreateSequence(Shape(), "big", /*reserve_tokens=*/100000),
              StatusIs(absl::StatusCode::kResourceExhausted));
  EXPECT_THAT(client_->GetSequence("bad"), StatusIs(absl::StatusCode::kNotFound, {"'bad'"}));
}

TEST_F(KvCacheClientTest, PrefillAppendDecodeBatchMatchTheReference) {
  ASSERT_OK(client_->CreateSequence(Shape(2), "seq"));
  const Tokens t = MakeTokens(7, 11);

  // Prefill 5 tokens of layer 0, with weights.
  client::AppendInput prefill = AppendOf("seq", 0, t, 0, 5);
  prefill.return_weights = true;
  auto r = client_->Append(prefill);
  ASSERT_OK(r);
  EXPECT_EQ(r->first_position, 0);
  EXPECT_EQ(r->layer_tokens, 5);
  EXPECT_EQ(r->output.shape, (std::vector<int64_t>{5, kHeads, kDim}));
  const ReferenceResult want = Reference(t, 5, 0);
  ExpectNear(r->output.values, want.output, 2e-5);
  ASSERT_TRUE(r->weights.has_value());
  EXPECT_EQ(r->weights->shape, (std::vector<int64_t>{kHeads, 5, 5}));
  ExpectNear(r->weights->values, want.weights, 2e-5);
  EXPECT_EQ(r->stats.attended_pairs(), kHeads * (1 + 2 + 3 + 4 + 5));
  EXPECT_FALSE(r->stats.engine().empty());

  // Layer 1 only caches its keys and values: no output.
  auto cached = client_->Append(AppendOf("seq", 1, t, 0, 5, /*with_q=*/false));
  ASSERT_OK(cached);
  EXPECT_TRUE(cached->output.shape.empty());
  EXPECT_TRUE(cached->output.values.empty());
  EXPECT_FALSE(cached->weights.has_value());
  EXPECT_EQ(cached->layer_tokens, 5);

  // A decode step at position 5 through DecodeBatch attends over all 6 tokens.
  client::DecodeBatchInput step;
  step.layer = 0;
  step.request_id = 42;
  step.steps.push_back(StepOf("seq", t, 5));
  auto decoded = client_->DecodeBatch(step);
  ASSERT_OK(decoded);
  EXPECT_EQ(decoded->request_id, 42u);
  ASSERT_EQ(decoded->results.size(), 1u);
  EXPECT_EQ(decoded->results[0].sequence_id, "seq");
  EXPECT_EQ(decoded->results[0].layer_tokens, 6);
  EXPECT_EQ(decoded->results[0].output.shape, (std::vector<int64_t>{1, kHeads, kDim}));
  ExpectNear(decoded->results[0].output.values, Reference(t, 6, 5).output, 2e-5);
  EXPECT_EQ(decoded->stats.attended_pairs(), kHeads * 6);

  // Position 6 through Append, with bf16 on the wire: the output comes back as bf16.
  client::AppendInput bf16 = AppendOf("seq", 0, t, 6, 1);
  bf16.wire = client::Wire::kBFloat16;
  auto r7 = client_->Append(bf16);
  ASSERT_OK(r7);
  EXPECT_EQ(r7->first_position, 6);
  ExpectNear(r7->output.values, Reference(t, 7, 6).output, 5e-2);

  auto info = client_->GetSequence("seq");
  ASSERT_OK(info);
  EXPECT_THAT(info->layer_tokens(), ElementsAre(7, 5));
  EXPECT_EQ(info->tokens(), 5);
}

TEST_F(KvCacheClientTest, AppendErrorsChangeNothing) {
  ASSERT_OK(client_->CreateSequence(Shape(1), "guarded"));
  const Tokens t = MakeTokens(3, 5);
  ASSERT_OK(client_->Append(AppendOf("guarded", 0, t, 0, 2)));
  EXPECT_THAT(client_->Append(AppendOf("nobody", 0, t, 0, 1)),
              StatusIs(absl::StatusCode::kNotFound, {"'nobody'"}));
  EXPECT_THAT(client_->Append(AppendOf("guarded", 4, t, 0, 1)),
              StatusIs(absl::StatusCode::kInvalidArgument, {"layer 4 is out of range"}));
  client::AppendInput wrong = AppendOf("guarded", 0, t, 0, 1);
  wrong.k.shape = {1, kHeads, kDim / 2};  // same element count, wrong shape
  EXPECT_THAT(client_->Append(wrong), StatusIs(absl::StatusCode::kInvalidArgument, {"k.shape"}));
  // More tokens than the whole cache holds.
  const Tokens big = MakeTokens(600, 6);
  EXPECT_THAT(client_->Append(AppendOf("guarded", 0, big, 0, 600)),
              StatusIs(absl::StatusCode::kResourceExhausted));
  auto info = client_->GetSequence("guarded");
  ASSERT_OK(info);
  EXPECT_THAT(info->layer_tokens(), ElementsAre(2));
  auto stats = client_->Stats();
  ASSERT_OK(stats);
  EXPECT_GE(stats->rejections(), 1);
}

TEST_F(KvCacheClientTest, DecodeBatchIsAllOrNothingAndInStepOrder) {
  const Tokens a = MakeTokens(2, 1), b = MakeTokens(2, 2);
  for (const char* id : {"a", "b"}) ASSERT_OK(client_->CreateSequence(Shape(1), id));
  ASSERT_OK(client_->Append(AppendOf("a", 0, a, 0, 1)));
  client::DecodeBatchInput batch;
  batch.steps = {StepOf("b", b, 0), StepOf("a", a, 1)};
  auto r = client_->DecodeBatch(batch);
  ASSERT_OK(r);
  ASSERT_EQ(r->results.size(), 2u);
  EXPECT_EQ(r->results[0].sequence_id, "b");
  EXPECT_EQ(r->results[0].layer_tokens, 1);
  EXPECT_EQ(r->results[1].sequence_id, "a");
  EXPECT_EQ(r->results[1].layer_tokens, 2);
  ExpectNear(r->results[0].output.values, Reference(b, 1, 0).output, 2e-5);
  ExpectNear(r->results[1].output.values, Reference(a, 2, 1).output, 2e-5);

  // An unknown sequence fails the whole batch; "a" keeps its 2 tokens.
  batch.steps = {StepOf("a", a, 1), StepOf("ghost", b, 1)};
  EXPECT_THAT(client_->DecodeBatch(batch),
              StatusIs(absl::StatusCode::kNotFound, {"steps[1]", "'ghost'"}));
  auto info = client_->GetSequence("a");
  ASSERT_OK(info);
  EXPECT_EQ(info->tokens(), 2);
  batch.steps.clear();
  EXPECT_THAT(client_->DecodeBatch(batch), StatusIs(absl::StatusCode::kInvalidArgument, {"steps"}));
}

TEST_F(KvCacheClientTest, DecodeStreamAnswersInOrderWithPerMessageErrors) {
  ASSERT_OK(client_->CreateSequence(Shape(2), "s"));
  const Tokens t = MakeTokens(4, 9);
  auto stream = client_->OpenDecodeStream();
  EXPECT_THAT(stream->Read(), StatusIs(absl::StatusCode::kFailedPrecondition));

  const auto message = [&](const std::string& id, int layer, int64_t position) {
    client::DecodeBatchInput input;
    input.layer = layer;
    input.steps.push_back(StepOf(id, t, position));
    return input;
  };
  // good, unknown sequence, good, wrong layer: numbered 1-4 in order.
  for (auto [id, layer, position] : {std::tuple<std::string, int, int64_t>{"s", 0, 0},
                                     {"nobody", 0, 1},
                                     {"s", 0, 1},
                                     {"s", 7, 2}}) {
    auto written = stream->Write(message(id, layer, position));
    ASSERT_OK(written);
  }
  EXPECT_EQ(stream->pending(), 4);
  std::vector<client::DecodeStreamReply> replies;
  for (int i = 0; i < 4; ++i) {
    auto reply = stream->Read();
    ASSERT_OK(reply);
    replies.push_back(*std::move(reply));
  }
  for (size_t i = 0; i < replies.size(); ++i) EXPECT_EQ(replies[i].request_id, i + 1);
  ASSERT_OK(replies[0].result);
  ExpectNear(replies[0].result->results[0].output.values, Reference(t, 1, 0).output, 2e-5);
  EXPECT_THAT(replies[1].result, StatusIs(absl::StatusCode::kNotFound, {"'nobody'"}));
  ASSERT_OK(replies[2].result);
  EXPECT_EQ(replies[2].result->results[0].layer_tokens, 2);  // the bad message appended nothing
  ExpectNear(replies[2].result->results[0].output.values, Reference(t, 2, 1).output, 2e-5);
  EXPECT_THAT(replies[3].result,
              StatusIs(absl::StatusCode::kInvalidArgument, {"layer 7 is out of range"}));

  // A caller-chosen request id is kept; messages written before Finish stay readable after it.
  client::DecodeBatchInput tagged = message("s", 1, 0);
  tagged.request_id = 77;
  auto written = stream->Write(tagged);
  ASSERT_OK(written);
  EXPECT_EQ(*written, 77u);
  ASSERT_OK(stream->Write(message("s", 1, 1)));
  EXPECT_OK(stream->Finish());
  EXPECT_THAT(stream->Write(message("s", 0, 2)), StatusIs(absl::StatusCode::kFailedPrecondition));
  auto late = stream->Read();
  ASSERT_OK(late);
  EXPECT_EQ(late->request_id, 77u);
  ASSERT_OK(late->result);
  EXPECT_EQ(late->result->results[0].layer_tokens, 1);
  late = stream->Read();
  ASSERT_OK(late);
  EXPECT_EQ(late->request_id, 6u);
  EXPECT_THAT(stream->Read(), StatusIs(absl::StatusCode::kOutOfRange));
  EXPECT_EQ(stream->pending(), 0);
  EXPECT_OK(stream->Finish());  // idempotent

  auto info = client_->GetSequence("s");
  ASSERT_OK(info);
  EXPECT_THAT(info->layer_tokens(), ElementsAre(2, 2));
}

TEST_F(KvCacheClientTest, DecodeStreamReportsTheServersStreamLimit) {
  server::ServerOptions options = SmallKvServerOptions();
  options.max_concurrent_streams = 1;
  auto limited = server::AttendServer::Start(options);
  ASSERT_OK(limited);
  const client::ConnectionOptions connection = Options((*limited)->port());
  KvCacheClient kv(client::Connect(connection), connection);
  ASSERT_OK(kv.CreateSequence(Shape(1), "one"));
  const Tokens t = MakeTokens(2, 3);
  client::DecodeBatchInput input;
  input.steps.push_back(StepOf("one", t, 0));
  auto first = kv.OpenDecodeStream();
  ASSERT_OK(first->Write(input));
  auto reply = first->Read();  // the first stream is open on the server now
  ASSERT_OK(reply);
  ASSERT_OK(reply->result);

  auto second = kv.OpenDecodeStream();
  input.steps[0] = StepOf("one", t, 1);
  absl::StatusOr<uint64_t> written = second->Write(input);
  // The refusal arrives as the stream's status: on the Write when the call had already ended,
  // otherwise on the Read.
  const absl::Status refused = written.ok() ? second->Read().status() : written.status();
  EXPECT_THAT(refused, StatusIs(absl::StatusCode::kResourceExhausted, {"decode streams are open"}));
  EXPECT_THAT(second->Finish(), StatusIs(absl::StatusCode::kResourceExhausted));
  EXPECT_OK(first->Finish());
  auto info = kv.GetSequence("one");
  ASSERT_OK(info);
  EXPECT_EQ(info->tokens(), 1);  // the refused message was not applied
}

TEST_F(KvCacheClientTest, ForkTruncateListStatsRelease) {
  ASSERT_OK(client_->CreateSequence(Shape(2), "parent"));
  const Tokens t = MakeTokens(20, 4);
  for (int layer = 0; layer < 2; ++layer) {
    ASSERT_OK(client_->Append(AppendOf("parent", layer, t, 0, 20)));
  }
  auto child = client_->Fork("parent", "child", 12);
  ASSERT_OK(child);
  EXPECT_EQ(child->tokens(), 12);
  EXPECT_EQ(child->forked_from(), "parent");
  EXPECT_EQ(child->blocks(), 2 * 2);         // 12 tokens = 2 blocks per layer
  EXPECT_EQ(child->shared_blocks(), 2 * 2);  // all shared with the parent
  auto whole = client_->Fork("parent", "");  // default: every token, generated id
  ASSERT_OK(whole);
  EXPECT_EQ(whole->tokens(), 20);
  EXPECT_FALSE(whole->sequence_id().empty());
  EXPECT_THAT(client_->Fork("parent", "too-long", 21), StatusIs(absl::StatusCode::kOutOfRange));
  EXPECT_THAT(client_->Fork("nobody", "x"), StatusIs(absl::StatusCode::kNotFound));

  EXPECT_THAT(client_->Truncate("parent", 21),
              StatusIs(absl::StatusCode::kOutOfRange, {"holds only 20"}));
  auto truncated = client_->Truncate("parent", 10);
  ASSERT_OK(truncated);
  EXPECT_EQ(truncated->tokens(), 10);
  EXPECT_THAT(truncated->layer_tokens(), ElementsAre(10, 10));

  for (const char* id : {"x1", "x2"}) ASSERT_OK(client_->CreateSequence(Shape(1), id));
  auto page = client_->ListSequences(2);
  ASSERT_OK(page);
  EXPECT_EQ(page->sequences_size(), 2);
  EXPECT_FALSE(page->next_page_token().empty());
  auto next = client_->ListSequences(2, page->next_page_token());
  ASSERT_OK(next);
  EXPECT_GT(next->sequences(0).sequence_id(), page->sequences(1).sequence_id());
  auto all = client_->ListAllSequences(2);
  ASSERT_OK(all);
  std::vector<std::string> ids;
  for (const v1::SequenceInfo& s : *all) ids.push_back(s.sequence_id());
  std::vector<std::string> expected = {"child", "parent", "x1", "x2", whole->sequence_id()};
  std::sort(expected.begin(), expected.end());
  EXPECT_EQ(ids, expected);  // every sequence once, in id order, over three pages
  auto one_page = client_->ListAllSequences(1000);
  ASSERT_OK(one_page);
  EXPECT_EQ(one_page->size(), 5u);
  EXPECT_THAT(client_->ListSequences(2, std::string(200, 'x')),
              StatusIs(absl::StatusCode::kInvalidArgument, {"page_token"}));

  auto stats = client_->Stats();
  ASSERT_OK(stats);
  EXPECT_EQ(stats->capacity_bytes(), 64 << 10);
  EXPECT_EQ(stats->block_bytes(), 1 << 10);
  EXPECT_EQ(stats->blocks_total(), 64);
  EXPECT_EQ(stats->sequences(), 5);
  EXPECT_EQ(stats->tokens(), 2 * 10 + 2 * 12 + 2 * 20);
  EXPECT_EQ(stats->used_bytes(), stats->blocks_used() * stats->block_bytes());
  EXPECT_EQ(stats->blocks_used() + stats->blocks_free(), stats->blocks_total());
  EXPECT_DOUBLE_EQ(stats->usage_ratio(),
                   static_cast<double>(stats->used_bytes()) / stats->capacity_bytes());
  EXPECT_EQ(stats->eviction_policy(), "none");

  // The child shares all its blocks with the parent or the whole fork: releasing it frees
  // nothing; releasing the rest frees every block.
  auto freed = client_->Release("child");
  ASSERT_OK(freed);
  EXPECT_EQ(*freed, 0);
  EXPECT_THAT(client_->Release("child"), StatusIs(absl::StatusCode::kNotFound));
  int64_t total = 0;
  for (const std::string& id :
       {std::string("parent"), whole->sequence_id(), std::string("x1"), std::string("x2")}) {
    auto f = client_->Release(id);
    ASSERT_OK(f);
    total += *f;
  }
  EXPECT_EQ(total, stats->used_bytes());
  stats = client_->Stats();
  ASSERT_OK(stats);
  EXPECT_EQ(stats->used_bytes(), 0);
  EXPECT_EQ(stats->sequences(), 0);
}

// --- a recording fake ---------------------------------------------------------------------------

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
  ASSERT_OK(kv.CreateSequence(Shape()));  // generated id: no key to send
  client::AppendInput append;
  append.sequence_id = "a-1";
  append.k = append.v = token;
  ASSERT_OK(kv.Append(append));
  client::DecodeBatchInput batch;
  batch.steps = {{"first", token, token, token}, {"second", token, token, token}};
  auto decoded = kv.DecodeBatch(batch);
  ASSERT_OK(decoded);
  EXPECT_EQ(decoded->results[1].output.values, token.values);
  ASSERT_OK(kv.Fork("source", "fork"));
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
  ASSERT_OK(kv.GetSequence("bad\nid"));  // not a header value: sent without a key

  using Key = std::optional<std::string>;
  const std::vector<std::pair<std::string, Key>> expected = {{"CreateSequence", "c-1"},
                                                             {"CreateSequence", std::nullopt},
                                                             {"Append", "a-1"},
                                                             {"DecodeBatch", "first"},
                                                             {"Fork", "source"},
                                                             {"Truncate", "t-1"},
                                                             {"Release", "r-1"},
                                                             {"GetSequence", "g-1"},
                                                             {"ListSequences", std::nullopt},
                                                             {"Stats", std::nullopt},
                                                             {"DecodeStream", "first"},
                                                             {"GetSequence", std::nullopt}};
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
