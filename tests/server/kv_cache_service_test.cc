// attend.v1.KvCache through a real channel: cached attention, batches and streams, forks,
// budgets, eviction, metrics, and bad input that changes nothing.
#include <chrono>
#include <cmath>
#include <cstring>
#include <thread>

#include "absl/strings/str_cat.h"
#include "attend/v1/kv_cache.grpc.pb.h"
#include "core/attention/testing/reference_attention.h"
#include "core/kernels/cpu_features.h"
#include "core/kernels/simd.h"
#include "tests/server/server_fixture.h"
#include "tests/test_util.h"

namespace attend {
namespace {

using ::attend::testing::F32Data;
using ::attend::testing::RandomFloats;
using ::attend::testing::Values;

constexpr int kHeads = 4, kKvHeads = 2, kDim = 8;

class KvCacheServiceTest : public ::attend::testing::ServerSuite {
 protected:
  void SetUp() override {
    channel_ = ::attend::testing::ChannelTo(*server_);
    stub_ = v1::KvCache::NewStub(channel_);
  }

  grpc::Status Create(const std::string& id, v1::SequenceInfo* info, v1::DType dtype = v1::FLOAT32,
                      int layers = 2, int64_t reserve = 0) {
    v1::CreateSequenceRequest request;
    request.set_sequence_id(id);
    request.set_reserve_tokens(reserve);
    v1::SequenceConfig* c = request.mutable_config();
    c->set_layers(layers);
    c->set_n_head(kHeads);
    c->set_n_head_kv(kKvHeads);
    c->set_head_dim(kDim);
    c->set_kv_dtype(dtype);
    grpc::ClientContext context;
    return stub_->CreateSequence(&context, request, info);
  }

  // Tokens [from, from + n) of a seeded sequence: q [n, 4, 8], k/v [n, 2, 8].
  struct Tokens {
    std::vector<float> q, k, v;
  };
  static Tokens Make(int64_t n, uint64_t seed) {
    std::mt19937_64 rng(seed);
    return {RandomFloats(rng, n * kHeads * kDim), RandomFloats(rng, n * kKvHeads * kDim),
            RandomFloats(rng, n * kKvHeads * kDim)};
  }
  static std::vector<float> Slice(const std::vector<float>& x, int64_t from, int64_t n,
                                  int64_t width) {
    return std::vector<float>(x.begin() + from * width, x.begin() + (from + n) * width);
  }
  static v1::AppendRequest AppendOf(const std::string& id, int layer, const Tokens& t, int64_t from,
                                    int64_t n) {
    v1::AppendRequest request;
    request.set_sequence_id(id);
    request.set_layer(layer);
    *request.mutable_q() = F32Data({n, kHeads, kDim}, Slice(t.q, from, n, kHeads * kDim));
    *request.mutable_k() = F32Data({n, kKvHeads, kDim}, Slice(t.k, from, n, kKvHeads * kDim));
    *request.mutable_v() = F32Data({n, kKvHeads, kDim}, Slice(t.v, from, n, kKvHeads * kDim));
    return request;
  }
  grpc::Status Append(const v1::AppendRequest& request, v1::AppendResponse* response) {
    grpc::ClientContext context;
    return stub_->Append(&context, request, response);
  }
  static std::vector<float> Floats(const v1::Tensor& t) {
    std::vector<float> out(t.data().size() / 4);
    std::memcpy(out.data(), t.data().data(), t.data().size());
    return out;
  }
  // Causal reference over tokens [0, n): the output rows of positions [from, n).
  static std::vector<double> Reference(const Tokens& t, int64_t n, int64_t from) {
    AttentionOptions options;
    options.mask.causal = true;
    auto r = ReferenceAttention({DType::kFloat32, {n, kHeads, kDim}, t.q.data()},
                                {DType::kFloat32, {n, kKvHeads, kDim}, t.k.data()},
                                {DType::kFloat32, {n, kKvHeads, kDim}, t.v.data()}, options);
    EXPECT_TRUE(r.ok());
    return std::vector<double>(r->output.begin() + from * kHeads * kDim, r->output.end());
  }
  void ExpectNear(const std::vector<float>& got, const std::vector<double>& want, double tol) {
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < got.size(); ++i) ASSERT_NEAR(got[i], want[i], tol) << i;
  }

  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::KvCache::Stub> stub_;
};

TEST_F(KvCacheServiceTest, PrefillThenDecodeEqualsOneShotAttention) {
  v1::SequenceInfo info;
  ASSERT_TRUE(Create("pd", &info).ok());
  EXPECT_EQ(info.sequence_id(), "pd");
  EXPECT_GT(info.tokens_per_block(), 0);
  const Tokens t = Make(24, 1);
  v1::AppendResponse prefill;
  ASSERT_TRUE(Append(AppendOf("pd", 0, t, 0, 20), &prefill).ok());
  EXPECT_EQ(prefill.first_position(), 0);
  EXPECT_EQ(prefill.layer_tokens(), 20);
  EXPECT_THAT(prefill.output().shape(), ::testing::ElementsAre(20, kHeads, kDim));
  ExpectNear(Floats(prefill.output()), Reference(t, 20, 0), 2e-5);
  for (int64_t pos = 20; pos < 24; ++pos) {
    v1::AppendResponse step;
    ASSERT_TRUE(Append(AppendOf("pd", 0, t, pos, 1), &step).ok());
    ExpectNear(Floats(step.output()), Reference(t, pos + 1, pos), 2e-5);
    EXPECT_EQ(step.stats().attended_pairs(), kHeads * (pos + 1));
  }
  v1::GetSequenceRequest get;
  get.set_sequence_id("pd");
  grpc::ClientContext context;
  ASSERT_TRUE(stub_->GetSequence(&context, get, &info).ok());
  EXPECT_THAT(info.layer_tokens(), ::testing::ElementsAre(24, 0));
  EXPECT_EQ(info.tokens(), 0);
}

TEST_F(KvCacheServiceTest, Int8StorageIsCloseToOneShotAttention) {
  v1::SequenceInfo info;
  ASSERT_TRUE(Create("q8", &info, v1::INT8).ok());
  EXPECT_EQ(info.config().kv_dtype(), v1::INT8);
  const Tokens t = Make(40, 7);
  v1::AppendResponse prefill, step;
  ASSERT_TRUE(Append(AppendOf("q8", 0, t, 0, 39), &prefill).ok());
  ASSERT_TRUE(Append(AppendOf("q8", 0, t, 39, 1), &step).ok());
  ExpectNear(Floats(prefill.output()), Reference(t, 39, 0), 6e-2);
  ExpectNear(Floats(step.output()), Reference(t, 40, 39), 6e-2);
  EXPECT_NE(step.stats().engine().find("int8kv"), std::string::npos) << step.stats().engine();
  // INT8 is a storage type, not a tensor dtype.
  v1::AppendRequest int8_tensor = AppendOf("q8", 0, t, 0, 1);
  int8_tensor.mutable_k()->set_dtype(v1::INT8);
  v1::AppendResponse response;
  const grpc::Status s = Append(int8_tensor, &response);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(s.error_message().find("k.dtype: INT8 is a KV-cache storage type"), std::string::npos)
      << s.error_message();
}

TEST_F(KvCacheServiceTest, AppendWithValuesAnswersWithValuesAndWeights) {
  v1::SequenceInfo info;
  ASSERT_TRUE(Create("vals", &info, v1::BFLOAT16).ok());
  v1::AppendRequest request;
  request.set_sequence_id("vals");
  request.set_layer(1);
  *request.mutable_q() = ::attend::testing::Filled({2, kHeads, kDim}, 0.1f);
  *request.mutable_k() = ::attend::testing::Filled({2, kKvHeads, kDim}, 0.2f);
  *request.mutable_v() = ::attend::testing::Filled({2, kKvHeads, kDim}, 0.5f);
  request.set_return_weights(true);
  v1::AppendResponse response;
  ASSERT_TRUE(Append(request, &response).ok());
  ASSERT_EQ(response.output().values_size(), 2 * kHeads * kDim);
  EXPECT_NEAR(response.output().values(0), 0.5, 1e-3);  // every value is 0.5
  EXPECT_THAT(response.weights().shape(), ::testing::ElementsAre(kHeads, 2, 2));
  EXPECT_NEAR(response.weights().values(0), 1.0, 1e-6);  // the first token sees only itself
  EXPECT_EQ(response.weights().values(1), 0.0f);
  EXPECT_NEAR(response.weights().values(2), 0.5, 1e-6);  // equal scores: half each
  // A two-token append, computed by the vector kernels: the engine names their set (and says
  // "-emulated" where bf16 matmuls would run on f32 ones).
  EXPECT_EQ(response.stats().engine(),
            absl::StrCat("onednn-paged/bf16", UseBf16Matmul() ? "" : "-emulated", "+",
                         simd::KernelName({DType::kBFloat16})));
}

TEST_F(KvCacheServiceTest, DecodeBatchComputesEverySequence) {
  std::vector<Tokens> tokens;
  for (int s = 0; s < 3; ++s) {
    v1::SequenceInfo info;
    const std::string id = "batch" + std::to_string(s);
    ASSERT_TRUE(Create(id, &info).ok());
    tokens.push_back(Make(10, 10 + s));
    v1::AppendResponse r;
    ASSERT_TRUE(Append(AppendOf(id, 1, tokens[s], 0, 5 + s), &r).ok());
  }
  v1::DecodeBatchRequest request;
  request.set_layer(1);
  request.set_request_id(77);
  for (int s = 0; s < 3; ++s) {
    v1::AppendRequest one = AppendOf("batch" + std::to_string(s), 1, tokens[s], 5 + s, 1);
    v1::DecodeStep* step = request.add_steps();
    step->set_sequence_id(one.sequence_id());
    *step->mutable_q() = one.q();
    *step->mutable_k() = one.k();
    *step->mutable_v() = one.v();
  }
  v1::DecodeBatchResponse response;
  grpc::ClientContext context;
  ASSERT_TRUE(stub_->DecodeBatch(&context, request, &response).ok());
  ASSERT_EQ(response.results_size(), 3);
  EXPECT_EQ(response.request_id(), 77u);
  // A step this small ran on the thread that received it: it waited for no worker.
  EXPECT_EQ(response.stats().queue_seconds(), 0.0);
  EXPECT_GT(response.stats().compute_seconds(), 0.0);
  for (int s = 0; s < 3; ++s) {
    EXPECT_EQ(response.results(s).sequence_id(), "batch" + std::to_string(s));
    EXPECT_EQ(response.results(s).layer_tokens(), 6 + s);
    ExpectNear(Floats(response.results(s).output()), Reference(tokens[s], 6 + s, 5 + s), 2e-5);
  }
}

// AppendBatch: ragged prompts and decode steps of several sequences, packed, in one call; each
// sequence's rows of the packed output equal the reference of its own tokens. Then bad batches:
// each refused with the field named, and nothing applied.
TEST_F(KvCacheServiceTest, AppendBatchPacksRaggedSequencesAndIsAllOrNothing) {
  const std::vector<std::string> ids = {"ab-0", "ab-1", "ab-2"};
  const std::vector<int64_t> prompt = {5, 17, 1};
  std::vector<Tokens> tokens;
  for (size_t i = 0; i < ids.size(); ++i) {
    v1::SequenceInfo info;
    ASSERT_TRUE(Create(ids[i], &info).ok());
    tokens.push_back(Make(prompt[i] + 1, 50 + i));
  }
  const auto packed = [&](const std::vector<int64_t>& from, const std::vector<int64_t>& counts) {
    v1::AppendBatchRequest request;
    request.set_layer(0);
    std::vector<float> q, k, v;
    int64_t rows = 0;
    for (size_t i = 0; i < ids.size(); ++i) {
      request.add_sequence_ids(ids[i]);
      request.add_token_counts(counts[i]);
      const auto add = [&](std::vector<float>& out, const std::vector<float>& x, int64_t width) {
        const std::vector<float> part = Slice(x, from[i], counts[i], width);
        out.insert(out.end(), part.begin(), part.end());
      };
      add(q, tokens[i].q, kHeads * kDim);
      add(k, tokens[i].k, kKvHeads * kDim);
      add(v, tokens[i].v, kKvHeads * kDim);
      rows += counts[i];
    }
    *request.mutable_q() = F32Data({rows, kHeads, kDim}, q);
    *request.mutable_k() = F32Data({rows, kKvHeads, kDim}, k);
    *request.mutable_v() = F32Data({rows, kKvHeads, kDim}, v);
    return request;
  };
  const auto call = [&](const v1::AppendBatchRequest& request, v1::AppendBatchResponse* response) {
    grpc::ClientContext context;
    return stub_->AppendBatch(&context, request, response);
  };
  const auto tokens_of = [&](const std::string& id) {
    v1::GetSequenceRequest get;
    get.set_sequence_id(id);
    v1::SequenceInfo info;
    grpc::ClientContext context;
    EXPECT_TRUE(stub_->GetSequence(&context, get, &info).ok());
    return info.layer_tokens(0);
  };

  // Bad batches first: nothing may change.
  const v1::AppendBatchRequest good = packed({0, 0, 0}, prompt);
  struct Bad {
    std::string name;
    v1::AppendBatchRequest request;
    std::string fragment;
  };
  std::vector<Bad> bad;
  bad.push_back({"a count short", good, "token_counts: 2 counts for 3"});
  bad.back().request.mutable_token_counts()->RemoveLast();
  bad.push_back({"counts past the rows", good, "the sum of token_counts"});
  bad.back().request.set_token_counts(0, 6);
  bad.push_back({"a zero count", good, "token_counts[1]: 0"});
  bad.back().request.set_token_counts(1, 0);
  bad.push_back({"a sequence twice", good, "appears twice"});
  bad.back().request.set_sequence_ids(2, "ab-0");
  bad.back().request.set_token_counts(2, 1);
  bad.push_back({"an unknown id", good, "'nobody'"});
  bad.back().request.set_sequence_ids(1, "nobody");
  bad.push_back({"no k", good, "k: missing"});
  bad.back().request.clear_k();
  bad.push_back({"a layer out of range", good, "layer 7"});
  bad.back().request.set_layer(7);
  for (const Bad& b : bad) {
    v1::AppendBatchResponse response;
    const grpc::Status status = call(b.request, &response);
    EXPECT_NE(status.error_code(), grpc::StatusCode::OK) << b.name;
    EXPECT_NE(status.error_message().find(b.fragment), std::string::npos)
        << b.name << ": " << status.error_message();
    for (const char* id : {"ab-0", "ab-1", "ab-2"}) EXPECT_EQ(tokens_of(id), 0) << b.name;
  }

  // The prompts, ragged, in one call.
  v1::AppendBatchResponse response;
  ASSERT_TRUE(call(good, &response).ok());
  const int64_t rows = prompt[0] + prompt[1] + prompt[2];
  EXPECT_THAT(response.output().shape(), ::testing::ElementsAre(rows, kHeads, kDim));
  EXPECT_THAT(response.first_positions(), ::testing::ElementsAre(0, 0, 0));
  EXPECT_THAT(response.layer_tokens(), ::testing::ElementsAre(5, 17, 1));
  std::vector<float> out = Floats(response.output());
  int64_t at = 0;
  for (size_t i = 0; i < ids.size(); ++i) {
    const std::vector<double> want = Reference(tokens[i], prompt[i], 0);
    ExpectNear(std::vector<float>(out.begin() + at * kHeads * kDim,
                                  out.begin() + (at + prompt[i]) * kHeads * kDim),
               want, 2e-5);
    at += prompt[i];
  }
  // Then one decode step of each, in one call.
  ASSERT_TRUE(call(packed(prompt, {1, 1, 1}), &response).ok());
  EXPECT_THAT(response.first_positions(), ::testing::ElementsAre(5, 17, 1));
  out = Floats(response.output());
  for (size_t i = 0; i < ids.size(); ++i) {
    ExpectNear(
        std::vector<float>(out.begin() + i * kHeads * kDim, out.begin() + (i + 1) * kHeads * kDim),
        Reference(tokens[i], prompt[i] + 1, prompt[i]), 2e-5);
  }
}

// ComputeStats' phases say where the server's time on a call went: each is a duration (>= 0),
// the engine's writes show as cache time, and together with the queue and the compute they fit
// inside what the client waited, for every call that carries them.
TEST_F(KvCacheServiceTest, CallPhasesFitInsideTheClientsWait) {
  v1::SequenceInfo info;
  ASSERT_TRUE(Create("ph-0", &info).ok());
  ASSERT_TRUE(Create("ph-1", &info).ok());
  const Tokens t = Make(40, 7);
  const auto check = [](const std::string& what, const v1::ComputeStats& s, double waited,
                        bool computed) {
    SCOPED_TRACE(what);
    EXPECT_GE(s.prepare_seconds(), 0.0);
    EXPECT_GT(s.cache_seconds(), 0.0);  // the new tokens were written
    EXPECT_GE(s.respond_seconds(), 0.0);
    EXPECT_EQ(s.compute_seconds() > 0.0, computed);
    EXPECT_LE(s.queue_seconds() + s.prepare_seconds() + s.cache_seconds() + s.compute_seconds() +
                  s.respond_seconds(),
              waited);
  };
  const auto timed = [](const auto& call) {
    const auto start = std::chrono::steady_clock::now();
    const grpc::Status status = call();
    EXPECT_TRUE(status.ok()) << status.error_message();
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };

  v1::AppendResponse append;
  double waited = timed([&] { return Append(AppendOf("ph-0", 0, t, 0, 32), &append); });
  check("Append", append.stats(), waited, true);

  v1::AppendBatchRequest batch;
  batch.set_layer(0);
  batch.add_sequence_ids("ph-1");
  batch.add_token_counts(32);
  *batch.mutable_k() = F32Data({32, kKvHeads, kDim}, Slice(t.k, 0, 32, kKvHeads * kDim));
  *batch.mutable_v() = F32Data({32, kKvHeads, kDim}, Slice(t.v, 0, 32, kKvHeads * kDim));
  v1::AppendBatchResponse appended;
  waited = timed([&] {
    grpc::ClientContext context;
    return stub_->AppendBatch(&context, batch, &appended);
  });
  check("AppendBatch without q", appended.stats(), waited, false);

  batch.set_layer(1);
  *batch.mutable_q() = F32Data({32, kHeads, kDim}, Slice(t.q, 0, 32, kHeads * kDim));
  waited = timed([&] {
    grpc::ClientContext context;
    return stub_->AppendBatch(&context, batch, &appended);
  });
  check("AppendBatch", appended.stats(), waited, true);

  v1::DecodeBatchRequest decode;
  decode.set_layer(0);
  for (const std::string id : {"ph-0", "ph-1"}) {
    v1::DecodeStep* step = decode.add_steps();
    step->set_sequence_id(id);
    *step->mutable_q() = F32Data({1, kHeads, kDim}, Slice(t.q, 32, 1, kHeads * kDim));
    *step->mutable_k() = F32Data({1, kKvHeads, kDim}, Slice(t.k, 32, 1, kKvHeads * kDim));
    *step->mutable_v() = F32Data({1, kKvHeads, kDim}, Slice(t.v, 32, 1, kKvHeads * kDim));
  }
  v1::DecodeBatchResponse decoded;
  waited = timed([&] {
    grpc::ClientContext context;
    return stub_->DecodeBatch(&context, decode, &decoded);
  });
  check("DecodeBatch", decoded.stats(), waited, true);
}

TEST_F(KvCacheServiceTest, DecodeStreamAnswersInOrderAndSurvivesBadMessages) {
  v1::SequenceInfo info;
  ASSERT_TRUE(Create("stream", &info).ok());
  const Tokens t = Make(8, 20);
  grpc::ClientContext context;
  auto stream = stub_->DecodeStream(&context);
  auto step_message = [&](const std::string& id, int64_t pos, uint64_t request_id, int layer = 0) {
    v1::DecodeBatchRequest request;
    request.set_layer(layer);
    request.set_request_id(request_id);
    v1::AppendRequest one = AppendOf(id, layer, t, pos, 1);
    v1::DecodeStep* step = request.add_steps();
    step->set_sequence_id(id);
    *step->mutable_q() = one.q();
    *step->mutable_k() = one.k();
    *step->mutable_v() = one.v();
    return request;
  };
  // good, unknown sequence, good, wrong layer, good
  ASSERT_TRUE(stream->Write(step_message("stream", 0, 1)));
  ASSERT_TRUE(stream->Write(step_message("nobody", 0, 2)));
  ASSERT_TRUE(stream->Write(step_message("stream", 1, 3)));
  ASSERT_TRUE(stream->Write(step_message("stream", 2, 4, /*layer=*/9)));
  ASSERT_TRUE(stream->Write(step_message("stream", 2, 5)));
  stream->WritesDone();
  std::vector<v1::DecodeBatchResponse> responses;
  v1::DecodeBatchResponse response;
  while (stream->Read(&response)) responses.push_back(response);
  ASSERT_TRUE(stream->Finish().ok());
  ASSERT_EQ(responses.size(), 5u);
  for (size_t i = 0; i < responses.size(); ++i) EXPECT_EQ(responses[i].request_id(), i + 1);
  EXPECT_FALSE(responses[0].has_error());
  EXPECT_EQ(responses[1].error().code(), static_cast<int>(grpc::StatusCode::NOT_FOUND));
  EXPECT_NE(responses[1].error().message().find("'nobody'"), std::string::npos);
  EXPECT_EQ(responses[3].error().code(), static_cast<int>(grpc::StatusCode::INVALID_ARGUMENT));
  EXPECT_NE(responses[3].error().message().find("layer 9 is out of range"), std::string::npos);
  ExpectNear(Floats(responses[4].results(0).output()), Reference(t, 3, 2), 2e-5);
  EXPECT_EQ(responses[4].results(0).layer_tokens(), 3);  // the bad messages appended nothing
  for (int i : {0, 2, 4}) {  // as DecodeBatch's: small steps run where they were received
    EXPECT_EQ(responses[i].stats().queue_seconds(), 0.0) << i;
    EXPECT_GT(responses[i].stats().compute_seconds(), 0.0) << i;
  }
}

// Steps that read a megabyte or more of K/V go to a worker and report the time they waited
// for it; smaller ones run on the thread that received them, in a DecodeBatch as in a
// DecodeStream, and compute the same.
TEST_F(KvCacheServiceTest, LargeStepsRunOnAWorkerAndSmallOnesWhereReceived) {
  constexpr int64_t kLong = 8300;  // x 128 bytes of f32 K/V per token: just over 1 MiB
  const Tokens t = Make(kLong + 1, 31);
  const Tokens u = Make(5, 32);
  v1::SequenceInfo info;
  ASSERT_TRUE(Create("long", &info, v1::FLOAT32, 1).ok());
  ASSERT_TRUE(Create("short", &info, v1::FLOAT32, 1).ok());
  // k and v only (no attention needed), in chunks under the fixture's tensor limit.
  const auto prefill = [&](const std::string& id) {
    for (int64_t from = 0; from < kLong; from += 4000) {
      v1::AppendRequest chunk = AppendOf(id, 0, t, from, std::min<int64_t>(4000, kLong - from));
      chunk.clear_q();
      v1::AppendResponse r;
      const grpc::Status status = Append(chunk, &r);
      ASSERT_TRUE(status.ok()) << status.error_message();
    }
  };
  prefill("long");
  v1::AppendResponse appended;
  ASSERT_TRUE(Append(AppendOf("short", 0, u, 0, 3), &appended).ok());
  const auto step = [&](const std::string& id, const Tokens& tokens, int64_t pos) {
    v1::DecodeBatchRequest request;
    const v1::AppendRequest one = AppendOf(id, 0, tokens, pos, 1);
    v1::DecodeStep* s = request.add_steps();
    s->set_sequence_id(id);
    *s->mutable_q() = one.q();
    *s->mutable_k() = one.k();
    *s->mutable_v() = one.v();
    return request;
  };
  v1::DecodeBatchResponse big, small;
  {
    grpc::ClientContext context;
    ASSERT_TRUE(stub_->DecodeBatch(&context, step("long", t, kLong), &big).ok());
  }
  EXPECT_GT(big.stats().queue_seconds(), 0.0);
  {
    grpc::ClientContext context;
    ASSERT_TRUE(stub_->DecodeBatch(&context, step("short", u, 3), &small).ok());
  }
  EXPECT_EQ(small.stats().queue_seconds(), 0.0);
  ASSERT_EQ(small.results_size(), 1);
  ExpectNear(Floats(small.results(0).output()), Reference(u, 4, 3), 2e-5);

  // The same two on a stream, the long one first: both answered, in order.
  ASSERT_TRUE(Create("long2", &info, v1::FLOAT32, 1).ok());
  prefill("long2");
  grpc::ClientContext context;
  auto stream = stub_->DecodeStream(&context);
  v1::DecodeBatchRequest first = step("long2", t, kLong), second = step("short", u, 4);
  first.set_request_id(1);
  second.set_request_id(2);
  ASSERT_TRUE(stream->Write(first));
  ASSERT_TRUE(stream->Write(second));
  stream->WritesDone();
  std::vector<v1::DecodeBatchResponse> responses;
  v1::DecodeBatchResponse response;
  while (stream->Read(&response)) responses.push_back(response);
  ASSERT_TRUE(stream->Finish().ok());
  ASSERT_EQ(responses.size(), 2u);
  EXPECT_EQ(responses[0].request_id(), 1u);
  EXPECT_EQ(responses[1].request_id(), 2u);
  EXPECT_GT(responses[0].stats().queue_seconds(), 0.0);
  EXPECT_EQ(responses[1].stats().queue_seconds(), 0.0);
  // The stream's long step computes what the unary's did; its short one, the reference.
  ASSERT_FALSE(responses[0].has_error()) << responses[0].error().message();
  ASSERT_FALSE(responses[1].has_error()) << responses[1].error().message();
  const std::vector<float> unary = Floats(big.results(0).output());
  ExpectNear(Floats(responses[0].results(0).output()),
             std::vector<double>(unary.begin(), unary.end()), 1e-6);
  ExpectNear(Floats(responses[1].results(0).output()), Reference(u, 5, 4), 2e-5);
}

TEST_F(KvCacheServiceTest, ForkTruncateListRelease) {
  v1::SequenceInfo info;
  ASSERT_TRUE(Create("parent", &info, v1::FLOAT32, 1).ok());
  const Tokens t = Make(30, 30);
  v1::AppendResponse r;
  ASSERT_TRUE(Append(AppendOf("parent", 0, t, 0, 30), &r).ok());
  v1::ForkRequest fork;
  fork.set_source_id("parent");
  fork.set_new_id("child");
  fork.set_tokens(12);
  v1::SequenceInfo child;
  {
    grpc::ClientContext context;
    ASSERT_TRUE(stub_->Fork(&context, fork, &child).ok());
  }
  EXPECT_EQ(child.tokens(), 12);
  EXPECT_EQ(child.forked_from(), "parent");
  EXPECT_GT(child.shared_blocks(), 0);
  v1::TruncateRequest truncate;
  truncate.set_sequence_id("parent");
  truncate.set_tokens(31);
  {
    grpc::ClientContext context;
    const grpc::Status s = stub_->Truncate(&context, truncate, &info);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::OUT_OF_RANGE);
    EXPECT_NE(s.error_message().find("holds only 30"), std::string::npos) << s.error_message();
  }
  truncate.set_tokens(12);
  {
    grpc::ClientContext context;
    ASSERT_TRUE(stub_->Truncate(&context, truncate, &info).ok());
    EXPECT_EQ(info.tokens(), 12);
  }
  v1::ListSequencesRequest list;
  list.set_page_size(1000);
  v1::ListSequencesResponse page;
  {
    grpc::ClientContext context;
    ASSERT_TRUE(stub_->ListSequences(&context, list, &page).ok());
  }
  std::vector<std::string> ids;
  for (const auto& s : page.sequences()) ids.push_back(s.sequence_id());
  EXPECT_THAT(ids, ::testing::IsSupersetOf({"parent", "child"}));
  for (const char* id : {"parent", "child"}) {
    v1::ReleaseRequest release;
    release.set_sequence_id(id);
    v1::ReleaseResponse released;
    grpc::ClientContext context;
    ASSERT_TRUE(stub_->Release(&context, release, &released).ok());
  }
  v1::GetSequenceRequest get;
  get.set_sequence_id("child");
  grpc::ClientContext context;
  const grpc::Status gone = stub_->GetSequence(&context, get, &info);
  EXPECT_EQ(gone.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_NE(gone.error_message().find("was released"), std::string::npos);
}

TEST_F(KvCacheServiceTest, BadInputIsRefusedAndChangesNothing) {
  v1::SequenceInfo info;
  ASSERT_TRUE(Create("guarded", &info).ok());
  const Tokens t = Make(4, 40);
  v1::AppendResponse r;
  ASSERT_TRUE(Append(AppendOf("guarded", 0, t, 0, 2), &r).ok());
  struct Case {
    std::string name;
    v1::AppendRequest request;
    grpc::StatusCode code;
    std::string message;
  };
  std::vector<Case> cases;
  cases.push_back({"unknown id", AppendOf("missing", 0, t, 2, 1), grpc::StatusCode::NOT_FOUND,
                   "no sequence 'missing'"});
  cases.push_back({"empty id", AppendOf("", 0, t, 2, 1), grpc::StatusCode::INVALID_ARGUMENT,
                   "sequence_id: empty"});
  cases.push_back({"wrong layer", AppendOf("guarded", 5, t, 2, 1),
                   grpc::StatusCode::INVALID_ARGUMENT, "layer 5 is out of range"});
  cases.push_back({"negative layer", AppendOf("guarded", -1, t, 2, 1),
                   grpc::StatusCode::INVALID_ARGUMENT, "layer -1"});
  v1::AppendRequest heads = AppendOf("guarded", 0, t, 2, 1);
  *heads.mutable_k() = F32Data({1, 4, kDim}, std::vector<float>(4 * kDim, 0.1f));
  cases.push_back(
      {"wrong kv heads", heads, grpc::StatusCode::INVALID_ARGUMENT, "k.shape is [1, 4, 8]"});
  v1::AppendRequest dim = AppendOf("guarded", 0, t, 2, 1);
  *dim.mutable_q() = F32Data({1, kHeads, 4}, std::vector<float>(kHeads * 4, 0.1f));
  cases.push_back(
      {"wrong head_dim", dim, grpc::StatusCode::INVALID_ARGUMENT, "q.shape is [1, 4, 4]"});
  v1::AppendRequest empty = AppendOf("guarded", 0, t, 2, 1);
  empty.mutable_k()->set_shape(0, 0);
  empty.mutable_k()->clear_data();
  empty.mutable_k()->add_values(0);
  cases.push_back({"empty append", empty, grpc::StatusCode::INVALID_ARGUMENT, "dimension 0 is 0"});
  v1::AppendRequest nan = AppendOf("guarded", 0, t, 2, 1);
  std::vector<float> bad(kKvHeads * kDim, 0.1f);
  bad[3] = std::nanf("");
  *nan.mutable_v() = F32Data({1, kKvHeads, kDim}, bad);
  cases.push_back(
      {"NaN value", nan, grpc::StatusCode::INVALID_ARGUMENT, "v holds a non-finite value"});
  v1::AppendRequest no_v = AppendOf("guarded", 0, t, 2, 1);
  no_v.clear_v();
  cases.push_back({"missing v", no_v, grpc::StatusCode::INVALID_ARGUMENT, "v: missing"});
  // An output float16 cannot hold (v of 1e6 gives outputs of 1e6): refused, not appended.
  v1::AppendRequest big = AppendOf("guarded", 0, t, 2, 1);
  *big.mutable_v() = F32Data({1, kKvHeads, kDim}, std::vector<float>(kKvHeads * kDim, 1e6f));
  big.set_output_dtype(v1::FLOAT16);
  cases.push_back({"float16 output overflow", big, grpc::StatusCode::INVALID_ARGUMENT,
                   "beyond float16's range"});
  for (const Case& c : cases) {
    v1::AppendResponse response;
    const grpc::Status s = Append(c.request, &response);
    EXPECT_EQ(s.error_code(), c.code) << c.name << ": " << s.error_message();
    EXPECT_NE(s.error_message().find(c.message), std::string::npos)
        << c.name << ": " << s.error_message();
  }
  v1::GetSequenceRequest get;
  get.set_sequence_id("guarded");
  grpc::ClientContext context;
  ASSERT_TRUE(stub_->GetSequence(&context, get, &info).ok());
  EXPECT_THAT(info.layer_tokens(), ::testing::ElementsAre(2, 0));
}

TEST_F(KvCacheServiceTest, CreateRefusesBadConfigs) {
  v1::SequenceInfo info;
  grpc::Status s = Create("f16", &info, v1::FLOAT16);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(s.error_message().find("kv_dtype"), std::string::npos) << s.error_message();
  ASSERT_TRUE(Create("dup", &info).ok());
  s = Create("dup", &info);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::ALREADY_EXISTS);
  v1::CreateSequenceRequest no_config;
  grpc::ClientContext context;
  s = stub_->CreateSequence(&context, no_config, &info);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(s.error_message().find("config: missing"), std::string::npos);
}

TEST(KvCacheServiceBudget, RefusesWhatDoesNotFitAndReportsMetrics) {
  server::ServerOptions options = ::attend::testing::SmallServerOptions();
  options.metrics_address = "127.0.0.1:0";
  options.kv_cache.capacity_bytes = 4 * 4096;
  options.kv_cache.block_bytes = 4096;
  auto server = server::AttendServer::Start(options);
  ASSERT_TRUE(server.ok()) << server.status();
  auto stub = v1::KvCache::NewStub(::attend::testing::ChannelTo(**server));
  v1::CreateSequenceRequest create;
  create.set_sequence_id("full");
  create.mutable_config()->set_layers(1);
  create.mutable_config()->set_n_head(1);
  create.mutable_config()->set_head_dim(16);
  create.mutable_config()->set_kv_dtype(v1::FLOAT32);  // 128 bytes a token: 32 per block
  v1::SequenceInfo info;
  {
    grpc::ClientContext context;
    ASSERT_TRUE(stub->CreateSequence(&context, create, &info).ok());
  }
  v1::AppendRequest append;
  append.set_sequence_id("full");
  *append.mutable_k() = F32Data({128, 1, 16}, std::vector<float>(128 * 16, 0.1f));
  *append.mutable_v() = append.k();
  v1::AppendResponse response;
  {
    grpc::ClientContext context;
    ASSERT_TRUE(stub->Append(&context, append, &response).ok());
  }
  *append.mutable_k() = F32Data({1, 1, 16}, std::vector<float>(16, 0.1f));
  *append.mutable_v() = append.k();
  {
    grpc::ClientContext context;
    const grpc::Status s = stub->Append(&context, append, &response);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
    EXPECT_NE(s.error_message().find("0 of 4 blocks"), std::string::npos) << s.error_message();
  }
  v1::CacheStats stats;
  {
    grpc::ClientContext context;
    ASSERT_TRUE(stub->Stats(&context, v1::StatsRequest(), &stats).ok());
  }
  EXPECT_EQ(stats.blocks_used(), 4);
  EXPECT_EQ(stats.usage_ratio(), 1.0);
  EXPECT_EQ(stats.rejections(), 1);
  EXPECT_EQ(stats.tokens(), 128);
  EXPECT_EQ(stats.eviction_policy(), "none");
  const std::string metrics = ::attend::testing::ScrapeMetrics((*server)->metrics_port());
  EXPECT_EQ(::attend::testing::MetricValue(metrics, "attend_kv_cache_used_bytes"), 4 * 4096);
  EXPECT_EQ(::attend::testing::MetricValue(metrics, "attend_kv_cache_capacity_bytes"), 4 * 4096);
  EXPECT_EQ(::attend::testing::MetricValue(metrics, "attend_kv_cache_usage_ratio"), 1.0);
  EXPECT_EQ(::attend::testing::MetricValue(metrics, "attend_kv_cache_rejections_total"), 1);
  EXPECT_EQ(::attend::testing::MetricValue(metrics, "attend_kv_cache_sequences"), 1);
  // Blocks in the pool: a gauge, named without the counter suffix it once had.
  EXPECT_EQ(::attend::testing::MetricValue(metrics, "attend_kv_cache_blocks"), 4);
  EXPECT_EQ(::attend::testing::MetricValue(metrics, "attend_kv_cache_blocks_total"), -1);
  EXPECT_NE(metrics.find("# TYPE attend_kv_cache_blocks gauge"), std::string::npos);
}

TEST(KvCacheServiceTtl, IdleSequencesAreEvictedInTheBackground) {
  server::ServerOptions options = ::attend::testing::SmallServerOptions();
  options.kv_cache.eviction = kv::EvictionPolicy::kTtl;
  options.kv_cache.idle_ttl_ms = 200;
  auto server = server::AttendServer::Start(options);
  ASSERT_TRUE(server.ok()) << server.status();
  auto stub = v1::KvCache::NewStub(::attend::testing::ChannelTo(**server));
  v1::CreateSequenceRequest create;
  create.set_sequence_id("idle");
  create.mutable_config()->set_layers(1);
  create.mutable_config()->set_n_head(1);
  create.mutable_config()->set_head_dim(4);
  v1::SequenceInfo info;
  {
    grpc::ClientContext context;
    ASSERT_TRUE(stub->CreateSequence(&context, create, &info).ok());
  }
  grpc::Status status;
  for (int i = 0; i < 50 && status.ok(); ++i) {  // up to 5 s
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    v1::GetSequenceRequest get;
    get.set_sequence_id("idle");
    grpc::ClientContext context;
    status = stub->GetSequence(&context, get, &info);
  }
  EXPECT_EQ(status.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_NE(status.error_message().find("idle (TTL 0.2 s)"), std::string::npos)
      << status.error_message();
}

}  // namespace
}  // namespace attend
