// The lessons' worked examples through a real in-process server: inputs drawn on the server by
// MultiHeadAttendRequest.init (java.util.Random, as the lessons' Java programs draw them) and the
// score tables of return_scores. Every expected number is one the lessons print (lesson 003
// Examples 3, 4, 6, 7 and 9), never one this code produced; and the bad inputs of both options.
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "client/attention_client.h"
#include "tests/server/server_fixture.h"
#include "tests/test_util.h"

namespace attend {
namespace {

using ::attend::testing::Filled;
using ::attend::testing::Values;

constexpr float kInf = std::numeric_limits<float>::infinity();

class AttentionLessonsTest : public ::attend::testing::ServerSuite {
 protected:
  void SetUp() override {
    channel_ = ::attend::testing::ChannelTo(*server_);
    stub_ = v1::Attention::NewStub(channel_);
  }

  grpc::Status Attend(const v1::AttendRequest& request, v1::AttendResponse* response) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    return stub_->Attend(&context, request, response);
  }
  grpc::Status MultiHead(const v1::MultiHeadAttendRequest& request,
                         v1::MultiHeadAttendResponse* response) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    return stub_->MultiHeadAttend(&context, request, response);
  }
  void ExpectMultiHeadError(const v1::MultiHeadAttendRequest& request, grpc::StatusCode code,
                            std::vector<std::string> substrings) {
    v1::MultiHeadAttendResponse response;
    const grpc::Status status = MultiHead(request, &response);
    EXPECT_EQ(status.error_code(), code) << status.error_message();
    for (const std::string& s : substrings) {
      EXPECT_NE(status.error_message().find(s), std::string::npos)
          << "\"" << status.error_message() << "\" lacks \"" << s << "\"";
    }
  }

  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::Attention::Stub> stub_;
};

void ExpectValues(const v1::Tensor& t, int offset, std::vector<double> expected, double tolerance) {
  ASSERT_GE(t.values_size(), offset + static_cast<int>(expected.size()));
  for (size_t i = 0; i < expected.size(); ++i) {
    EXPECT_NEAR(t.values(offset + static_cast<int>(i)), expected[i], tolerance)
        << "element " << offset + i;
  }
}

// Examples 4 and 7: Random(1), x [4, 4], Wq, Wk, Wv [4, 2], std 0.5, one head, no Wo.
v1::MultiHeadAttendRequest Example4Request() {
  v1::MultiHeadAttendRequest request;
  v1::LessonInit* init = request.mutable_init();
  init->set_seed(1);
  init->set_n(4);
  init->set_d_model(4);
  init->set_head_dim(2);
  request.set_n_head(1);
  return request;
}

// Example 4: the projections, and q2.k1 = 0.407 against q1.k2 = -0.417 (unscaled: scale 1).
TEST_F(AttentionLessonsTest, InitReproducesExample4) {
  v1::MultiHeadAttendRequest request = Example4Request();
  request.set_scale(1.0f);
  request.set_return_projections(true);
  request.set_return_scores(true);
  request.set_return_inputs(true);
  v1::MultiHeadAttendResponse response;
  const grpc::Status status = MultiHead(request, &response);
  ASSERT_TRUE(status.ok()) << status.error_message();
  ExpectValues(response.q(), 0, {0.12, -0.46, 0.43, -1.10, -0.16, 0.59, -0.18, 0.26}, 0.005);
  ExpectValues(response.k(), 0, {0.57, 0.12, 0.64, 0.86, -0.10, 0.34, 0.12, -0.51}, 0.005);
  ExpectValues(response.v(), 0, {1.44, 0.91, 1.07, -0.33, 0.05, -0.07, -0.68, -0.49}, 0.005);
  // scores [head 0, query i, key j]: q2.k1 at 2 * 4 + 1, q1.k2 at 1 * 4 + 2.
  ASSERT_EQ(response.scores().values_size(), 16);
  EXPECT_NEAR(response.scores().values(9), 0.407, 0.0005);
  EXPECT_NEAR(response.scores().values(6), -0.417, 0.0005);
  // The drawn inputs come back with their shapes; Wo was not drawn.
  EXPECT_EQ(response.x().shape_size(), 2);
  EXPECT_EQ(response.x().values_size(), 16);
  EXPECT_EQ(response.wq().values_size(), 8);
  EXPECT_EQ(response.wk().values_size(), 8);
  EXPECT_EQ(response.wv().values_size(), 8);
  EXPECT_FALSE(response.has_wo());
}

// Example 7: the same draws, causal, scaled by 1 / sqrt(2).
TEST_F(AttentionLessonsTest, InitReproducesExample7) {
  v1::MultiHeadAttendRequest request = Example4Request();
  request.mutable_mask()->set_causal(true);
  request.set_return_weights(true);
  request.set_return_scores(true);
  v1::MultiHeadAttendResponse response;
  const grpc::Status status = MultiHead(request, &response);
  ASSERT_TRUE(status.ok()) << status.error_message();
  ExpectValues(response.weights(), 0, {1.000, 0.000, 0.000, 0.000}, 0.0005);
  ExpectValues(response.weights(), 4, {0.635, 0.365, 0.000, 0.000}, 0.0005);
  ExpectValues(response.weights(), 8, {0.282, 0.383, 0.335, 0.000}, 0.0005);
  ExpectValues(response.weights(), 12, {0.237, 0.270, 0.269, 0.224}, 0.0005);
  ExpectValues(response.output(), 0, {1.438, 0.907, 1.305, 0.457, 0.833, 0.108, 0.490, 0.000},
               0.0006);
  // Scaled here: q2.k1 / sqrt(2); masked where the key comes after the query.
  EXPECT_NEAR(response.scores().values(9), 0.407 / std::sqrt(2.0), 0.0005);
  EXPECT_EQ(response.masked_scores().values(1), -kInf);
  EXPECT_EQ(response.masked_scores().values(9), response.scores().values(9));
}

// Example 9: Random(3), d_model 8, two heads of 4 sliced from one 8 x 8 matrix per projection,
// Wo drawn last; causal and scaled. The per-head weights of the last position.
TEST_F(AttentionLessonsTest, InitReproducesExample9) {
  v1::MultiHeadAttendRequest request;
  v1::LessonInit* init = request.mutable_init();
  init->set_seed(3);
  init->set_n(4);
  init->set_d_model(8);
  init->set_with_wo(true);  // head_dim 0: d_model / n_head = 4; d_out 0: d_model
  request.set_n_head(2);
  request.mutable_mask()->set_causal(true);
  request.set_return_weights(true);
  request.set_return_inputs(true);
  v1::MultiHeadAttendResponse response;
  const grpc::Status status = MultiHead(request, &response);
  ASSERT_TRUE(status.ok()) << status.error_message();
  ExpectValues(response.weights(), 12, {0.322, 0.268, 0.056, 0.355}, 0.0005);
  ExpectValues(response.weights(), 16 + 12, {0.137, 0.140, 0.217, 0.507}, 0.0005);
  // "concatenated: 4 x 8, after Wo: 4 x 8"; "parameters in Wq, Wk, Wv, Wo: 256".
  EXPECT_EQ(response.output().values_size(), 32);
  EXPECT_EQ(response.parameters().total(), 256);
  EXPECT_EQ(response.head_dim(), 4);
  EXPECT_EQ(response.wo().values_size(), 64);
}

// Example 3: q = k = v = x, scale 1, causal; the last row's scores are 2, 0, 2, 4.
TEST_F(AttentionLessonsTest, AttendScoresReproduceExample3) {
  v1::AttendRequest request;
  const std::vector<float> x = {1, 0, 0, 1, 1, 1, 2, 0};
  *request.mutable_q() = Values({4, 1, 2}, x);
  *request.mutable_k() = Values({4, 1, 2}, x);
  *request.mutable_v() = Values({4, 1, 2}, x);
  request.mutable_mask()->set_causal(true);
  request.set_scale(1.0f);
  request.set_return_weights(true);
  request.set_return_scores(true);
  v1::AttendResponse response;
  const grpc::Status status = Attend(request, &response);
  ASSERT_TRUE(status.ok()) << status.error_message();
  ExpectValues(response.scores(), 12, {2.0, 0.0, 2.0, 4.0}, 0.0);
  ExpectValues(response.masked_scores(), 12, {2.0, 0.0, 2.0, 4.0}, 0.0);
  ExpectValues(response.weights(), 12, {0.105, 0.014, 0.105, 0.776}, 0.0005);
  ExpectValues(response.output(), 6, {1.7615942, 0.11920292}, 1e-6);
}

// Example 6: the table 1 + 0.5 * ((3i + 5j) mod 4), built as one-hot queries against keys that
// hold its columns, scale 1, causal: the raw table, the masked one, and the weights.
TEST_F(AttentionLessonsTest, AttendScoresReproduceExample6) {
  std::vector<float> q(16, 0.0f), k(16);
  for (int i = 0; i < 4; ++i) q[i * 4 + i] = 1.0f;
  for (int j = 0; j < 4; ++j) {
    for (int c = 0; c < 4; ++c) k[j * 4 + c] = 1.0f + 0.5f * ((c * 3 + j * 5) % 4);
  }
  v1::AttendRequest request;
  *request.mutable_q() = Values({4, 1, 4}, q);
  *request.mutable_k() = Values({4, 1, 4}, k);
  *request.mutable_v() = Values({4, 1, 4}, k);
  request.mutable_mask()->set_causal(true);
  request.set_scale(1.0f);
  request.set_return_weights(true);
  request.set_return_scores(true);
  v1::AttendResponse response;
  const grpc::Status status = Attend(request, &response);
  ASSERT_TRUE(status.ok()) << status.error_message();
  const std::vector<double> raw = {1.000, 1.500, 2.000, 2.500, 2.500, 1.000, 1.500, 2.000,
                                   2.000, 2.500, 1.000, 1.500, 1.500, 2.000, 2.500, 1.000};
  ExpectValues(response.scores(), 0, raw, 0.0);
  const std::vector<double> masked = {1.000, -kInf, -kInf, -kInf, 2.500, 1.000, -kInf, -kInf,
                                      2.000, 2.500, 1.000, -kInf, 1.500, 2.000, 2.500, 1.000};
  ASSERT_EQ(response.masked_scores().values_size(), 16);
  for (int e = 0; e < 16; ++e) EXPECT_EQ(response.masked_scores().values(e), masked[e]) << e;
  ExpectValues(response.weights(), 4, {0.818, 0.182, 0.000, 0.000}, 0.0005);
  ExpectValues(response.weights(), 12, {0.167, 0.276, 0.455, 0.102}, 0.0005);
}

// Scores follow GQA's head sharing and come back as raw float32 for `data` inputs.
TEST_F(AttentionLessonsTest, ScoresFollowTheKeyValueHeadOfEachQueryHead) {
  v1::AttendRequest request;
  // 2 query heads over 1 key/value head: both heads score against the same keys.
  *request.mutable_q() = ::attend::testing::F32Data({1, 2, 2}, {1, 0, 0, 1});
  *request.mutable_k() = ::attend::testing::F32Data({2, 1, 2}, {3, 5, 7, 11});
  *request.mutable_v() = ::attend::testing::F32Data({2, 1, 2}, {0, 0, 0, 0});
  request.set_scale(2.0f);
  request.set_return_scores(true);
  v1::AttendResponse response;
  const grpc::Status status = Attend(request, &response);
  ASSERT_TRUE(status.ok()) << status.error_message();
  ASSERT_EQ(response.scores().data().size(), 4 * 4u);
  std::vector<float> s(4);
  std::memcpy(s.data(), response.scores().data().data(), 16);
  EXPECT_EQ(s, (std::vector<float>{6, 14, 10, 22}));  // head 0: 2*(3, 7); head 1: 2*(5, 11)
  EXPECT_EQ(response.scores().shape_size(), 3);
}

// The typed client exposes init, return_scores and return_inputs (Example 9 again, and the
// scores of Example 3 through Attend).
TEST_F(AttentionLessonsTest, ClientCarriesTheNewFields) {
  client::AttentionClient attention(channel_, client::ConnectionOptions{});
  client::MultiHeadInput input;
  input.init.emplace();
  input.init->set_seed(3);
  input.init->set_n(4);
  input.init->set_d_model(8);
  input.init->set_with_wo(true);
  input.n_head = 2;
  input.mask.causal = true;
  input.return_weights = true;
  input.return_scores = true;
  input.return_inputs = true;
  auto out = attention.MultiHeadAttend(input);
  ASSERT_TRUE(out.ok()) << out.status();
  ASSERT_TRUE(out->weights && out->scores && out->masked_scores && out->x && out->wo);
  EXPECT_NEAR(out->weights->values[16 + 15], 0.507, 0.0005);
  EXPECT_EQ(out->masked_scores->values[1], -kInf);
  EXPECT_EQ(out->x->shape, (std::vector<int64_t>{4, 8}));
  EXPECT_EQ(out->wo->shape, (std::vector<int64_t>{8, 8}));

  client::AttendInput attend;
  attend.q = {{4, 1, 2}, {1, 0, 0, 1, 1, 1, 2, 0}};
  attend.k = attend.q;
  attend.v = attend.q;
  attend.scale = 1.0f;
  attend.return_scores = true;
  auto scores = attention.Attend(attend);
  ASSERT_TRUE(scores.ok()) << scores.status();
  ASSERT_TRUE(scores->scores && scores->masked_scores);
  EXPECT_EQ(scores->scores->values[15], 4.0f);
}

TEST_F(AttentionLessonsTest, InitRejectsTensorsAlongsideIt) {
  for (const char* field : {"x", "wq", "wk", "wv", "wo"}) {
    v1::MultiHeadAttendRequest request = Example4Request();
    v1::Tensor* t = field == std::string("x")    ? request.mutable_x()
                    : field == std::string("wq") ? request.mutable_wq()
                    : field == std::string("wk") ? request.mutable_wk()
                    : field == std::string("wv") ? request.mutable_wv()
                                                 : request.mutable_wo();
    *t = Filled({4, 2});
    ExpectMultiHeadError(request, grpc::StatusCode::INVALID_ARGUMENT,
                         {"init and " + std::string(field) + " are both set"});
  }
}

TEST_F(AttentionLessonsTest, InitRejectsBadSizesAndStddev) {
  auto with = [](auto edit) {
    v1::MultiHeadAttendRequest request = Example4Request();
    edit(request.mutable_init());
    return request;
  };
  const auto ia = grpc::StatusCode::INVALID_ARGUMENT;
  const auto re = grpc::StatusCode::RESOURCE_EXHAUSTED;
  ExpectMultiHeadError(with([](v1::LessonInit* i) { i->set_n(0); }), ia, {"init.n: 0", ">= 1"});
  ExpectMultiHeadError(with([](v1::LessonInit* i) { i->set_n(-4); }), ia, {"init.n: -4"});
  ExpectMultiHeadError(with([](v1::LessonInit* i) { i->set_d_model(0); }), ia, {"init.d_model: 0"});
  ExpectMultiHeadError(with([](v1::LessonInit* i) { i->set_head_dim(-2); }), ia,
                       {"init.head_dim: -2"});
  ExpectMultiHeadError(with([](v1::LessonInit* i) { i->set_d_out(3); }), ia,
                       {"init.d_out: 3", "with_wo"});
  for (double bad : {-0.5, 0.0, std::nan(""), std::numeric_limits<double>::infinity()}) {
    ExpectMultiHeadError(with([bad](v1::LessonInit* i) { i->set_stddev(bad); }), ia,
                         {"init.stddev", "finite and > 0"});
  }
  // The server's limit is 65536 elements per tensor: x [65537, 1] is refused before drawing.
  ExpectMultiHeadError(with([](v1::LessonInit* i) {
                         i->set_n(65537);
                         i->set_d_model(1);
                         i->set_head_dim(1);
                       }),
                       re, {"init: x [n, d_model] [65537, 1]", "over the limit of 65536"});
  ExpectMultiHeadError(
      with([](v1::LessonInit* i) { i->set_d_model(std::numeric_limits<int32_t>::max()); }), re,
      {"init: x [n, d_model]", "over the limit of 65536"});
  ExpectMultiHeadError(
      with([](v1::LessonInit* i) { i->set_head_dim(std::numeric_limits<int32_t>::max()); }), re,
      {"init: wq [d_model, n_head * head_dim]", "over the limit of 65536"});
  // Each matrix within 65536 elements, but 327680 together: more than the 1 MiB message limit
  // could have carried as tensors (262144 float32s).
  ExpectMultiHeadError(with([](v1::LessonInit* i) {
                         i->set_n(64);
                         i->set_d_model(1024);
                         i->set_head_dim(64);
                         i->set_with_wo(true);
                       }),
                       re, {"327680 elements together", "over the limit of 262144"});
  v1::MultiHeadAttendRequest no_heads = Example4Request();
  no_heads.set_n_head(0);
  ExpectMultiHeadError(no_heads, ia, {"n_head: 0"});
}

TEST_F(AttentionLessonsTest, ReturnInputsNeedsInit) {
  v1::MultiHeadAttendRequest request;
  *request.mutable_x() = Filled({2, 2});
  *request.mutable_wq() = Filled({2, 2});
  *request.mutable_wk() = Filled({2, 2});
  *request.mutable_wv() = Filled({2, 2});
  request.set_n_head(1);
  request.set_return_inputs(true);
  ExpectMultiHeadError(request, grpc::StatusCode::INVALID_ARGUMENT,
                       {"return_inputs", "only with init"});
}

// The scores double the weights' share of the response: refused up front, naming the field.
TEST_F(AttentionLessonsTest, ScoresOverTheMessageLimitAreRefused) {
  // 1 x 300 x 300 = 90000 score elements: weights alone fit in 1 MiB (360 KB), weights and both
  // score tables (1.08 MB) do not.
  v1::AttendRequest request;
  *request.mutable_q() = Filled({300, 1, 1});
  *request.mutable_k() = Filled({300, 1, 1});
  *request.mutable_v() = Filled({300, 1, 1});
  request.set_return_weights(true);
  v1::AttendResponse response;
  ASSERT_TRUE(Attend(request, &response).ok());
  request.set_return_scores(true);
  const grpc::Status status = Attend(request, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_NE(status.error_message().find("return_scores"), std::string::npos)
      << status.error_message();

  v1::MultiHeadAttendRequest mha = Example4Request();
  mha.mutable_init()->set_n(300);
  mha.set_return_weights(true);
  mha.set_return_scores(true);
  v1::MultiHeadAttendResponse mha_response;
  const grpc::Status s = MultiHead(mha, &mha_response);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << s.error_message();
}

// Over max_score_elements (4194304 here) the scores are refused like the weights.
TEST_F(AttentionLessonsTest, ScoresOverTheScoreLimitAreRefused) {
  v1::AttendRequest request;
  *request.mutable_q() = Filled({2049, 1, 1});
  *request.mutable_k() = Filled({2049, 1, 1});
  *request.mutable_v() = Filled({2049, 1, 1});
  request.set_return_scores(true);
  v1::AttendResponse response;
  const grpc::Status status = Attend(request, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_NE(status.error_message().find("over the limit of 4194304"), std::string::npos)
      << status.error_message();
}

}  // namespace
}  // namespace attend
