// KvCacheClient against a real attend server with a small KV cache: every method, with the
// numbers checked against the reference attention, and the server's errors and limits as the
// client reports them. kv_cache_client_fake_test.cc covers what a real server cannot show.
#include "client/kv_cache_client.h"

#include <algorithm>
#include <cmath>
#include <optional>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
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
  // good, unknown sequence (of the stream's key), good, wrong layer: numbered 1-4 in order.
  for (auto [id, layer, position] : {std::tuple<std::string, int, int64_t>{"s", 0, 0},
                                     {"s/nobody", 0, 1},
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
  EXPECT_THAT(replies[1].result, StatusIs(absl::StatusCode::kNotFound, {"'s/nobody'"}));
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

}  // namespace
}  // namespace attend
