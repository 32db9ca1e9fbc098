// attend.v1.Attention through a real channel: golden values, every kind of bad input, limits,
// and that the server keeps serving after each error.
#include <cmath>
#include <cstring>
#include <limits>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/half.h"
#include "core/kernels/simd.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "tests/server/server_fixture.h"
#include "tests/test_util.h"

namespace attend {
namespace {

using ::attend::testing::F32Data;
using ::attend::testing::Filled;
using ::attend::testing::Values;

class AttentionServiceTest : public ::attend::testing::ServerSuite {
 protected:
  void SetUp() override {
    channel_ = ::attend::testing::ChannelTo(*server_);
    stub_ = v1::Attention::NewStub(channel_);
  }
  // Every test ends by proving the server still answers.
  void TearDown() override {
    v1::SoftmaxResponse response;
    EXPECT_TRUE(Softmax({1.0, 1.0}, &response).ok()) << "server stopped serving";
  }

  grpc::Status Attend(const v1::AttendRequest& request, v1::AttendResponse* response) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    return stub_->Attend(&context, request, response);
  }
  grpc::Status Softmax(std::vector<double> logits, v1::SoftmaxResponse* response,
                       bool jacobian = false) {
    v1::SoftmaxRequest request;
    request.mutable_logits()->Add(logits.begin(), logits.end());
    request.set_jacobian(jacobian);
    grpc::ClientContext context;
    return stub_->Softmax(&context, request, response);
  }
  void ExpectError(const v1::AttendRequest& request, grpc::StatusCode code,
                   std::vector<std::string> substrings) {
    v1::AttendResponse response;
    const grpc::Status status = Attend(request, &response);
    EXPECT_EQ(status.error_code(), code) << status.error_message();
    for (const std::string& s : substrings) {
      EXPECT_NE(status.error_message().find(s), std::string::npos)
          << "\"" << status.error_message() << "\" lacks \"" << s << "\"";
    }
  }

  // A valid request: 3 queries, 4 query heads over 2 key/value heads, head_dim 2.
  static v1::AttendRequest ValidRequest() {
    v1::AttendRequest request;
    *request.mutable_q() = Filled({3, 4, 2});
    *request.mutable_k() = Filled({5, 2, 2});
    *request.mutable_v() = Filled({5, 2, 2});
    return request;
  }

  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::Attention::Stub> stub_;
};

// The lessons' "it" example as a hand call: values in, values out.
TEST_F(AttentionServiceTest, AttendReproducesTheItExample) {
  v1::AttendRequest request;
  *request.mutable_q() = Values({1, 1, 4}, {1, 1, 1, 1});
  *request.mutable_k() = Values({3, 1, 4}, {1, 1, 1, 1, 1, 1, 0, 0, 1, 0, 0, 0});
  *request.mutable_v() = Values({3, 1, 2}, {1, 0, 0, 1, 1, 1});
  request.set_return_weights(true);
  v1::AttendResponse response;
  ASSERT_TRUE(Attend(request, &response).ok());
  ASSERT_EQ(response.output().values_size(), 2);
  EXPECT_NEAR(response.output().values(0), 0.77, 0.005);
  EXPECT_NEAR(response.output().values(1), 0.37, 0.005);
  EXPECT_THAT(response.weights().shape(), ::testing::ElementsAre(1, 1, 3));
  EXPECT_NEAR(response.weights().values(0), 0.63, 0.005);
  EXPECT_NEAR(response.weights().values(1), 0.23, 0.005);
  EXPECT_NEAR(response.weights().values(2), 0.14, 0.005);
  EXPECT_EQ(response.stats().attended_pairs(), 3);
  EXPECT_EQ(response.stats().attention_flops(), 3 * 2 * (4 + 2));
  // One query row: the vector kernels ran, and the engine names their set.
  EXPECT_EQ(response.stats().engine(),
            absl::StrCat("onednn/f32+", simd::KernelName({DType::kFloat32})));
}

// A response whose tensors alone fit the message limit but whose framing (tags, shapes, stats)
// does not is refused by the server up front, naming the flag, not computed and then refused by
// gRPC ("Sent message larger than max"). 511 queries over 512 keys, one head of size 1: output
// 2,044 bytes and weights 1,046,528, 4 bytes short of the 1 MiB limit.
TEST_F(AttentionServiceTest, ResponseFramingCountsAgainstTheMessageLimit) {
  v1::AttendRequest request;
  *request.mutable_q() = ::attend::testing::F32Data({511, 1, 1}, std::vector<float>(511, 0.5f));
  *request.mutable_k() = ::attend::testing::F32Data({512, 1, 1}, std::vector<float>(512, 0.25f));
  *request.mutable_v() = ::attend::testing::F32Data({512, 1, 1}, std::vector<float>(512, 1.0f));
  request.set_return_weights(true);
  v1::AttendResponse response;
  const grpc::Status status = Attend(request, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_NE(status.error_message().find("--max_message_bytes"), std::string::npos)
      << status.error_message();
  EXPECT_NE(status.error_message().find("framing"), std::string::npos) << status.error_message();
  // 100 queries fewer leave room for the framing.
  *request.mutable_q() = ::attend::testing::F32Data({411, 1, 1}, std::vector<float>(411, 0.5f));
  EXPECT_TRUE(Attend(request, &response).ok());
}

// An answer in `values` is float32 whatever output_dtype asks: a value beyond float16's range is
// returned as it is, not refused for a conversion that does not happen. Raw float16 bytes are.
TEST_F(AttentionServiceTest, ValuesAnswersAreNotNarrowedByOutputDtype) {
  v1::AttendRequest request;
  for (auto* t : {request.mutable_q(), request.mutable_k(), request.mutable_v()}) {
    t->set_dtype(v1::FLOAT32);
    t->add_shape(1);
    t->add_shape(1);
    t->add_shape(1);
  }
  request.mutable_q()->add_values(1.0f);
  request.mutable_k()->add_values(1.0f);
  request.mutable_v()->add_values(1e5f);
  request.set_output_dtype(v1::FLOAT16);
  v1::AttendResponse response;
  ASSERT_TRUE(Attend(request, &response).ok());
  ASSERT_EQ(response.output().values_size(), 1);
  EXPECT_EQ(response.output().values(0), 1e5f);
  // The same as raw bytes cannot be float16.
  *request.mutable_q() = ::attend::testing::F32Data({1, 1, 1}, {1.0f});
  *request.mutable_k() = ::attend::testing::F32Data({1, 1, 1}, {1.0f});
  *request.mutable_v() = ::attend::testing::F32Data({1, 1, 1}, {1e5f});
  const grpc::Status status = Attend(request, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << status.error_message();
  EXPECT_NE(status.error_message().find("float16"), std::string::npos) << status.error_message();
}

TEST_F(AttentionServiceTest, CausalWeightsAreLowerTriangular) {
  v1::AttendRequest request;
  std::vector<float> x = {1, 0, 0, 1, 1, 1, 2, 0};
  *request.mutable_q() = Values({4, 1, 2}, x);
  *request.mutable_k() = Values({4, 1, 2}, x);
  *request.mutable_v() = Values({4, 1, 2}, x);
  request.mutable_mask()->set_causal(true);
  request.set_scale(1.0f);
  request.set_return_weights(true);
  v1::AttendResponse response;
  ASSERT_TRUE(Attend(request, &response).ok());
  for (int i = 0; i < 4; ++i) {
    for (int j = i + 1; j < 4; ++j) EXPECT_EQ(response.weights().values(i * 4 + j), 0.0f);
  }
  // Lesson 3, Example 3: the last row.
  EXPECT_NEAR(response.weights().values(12), 0.105, 0.0005);
  EXPECT_NEAR(response.weights().values(15), 0.776, 0.0005);
}

// Raw bytes in bf16 and f16 give the f32 answer within the dtype's precision, and the output
// comes back in the requested dtype.
TEST_F(AttentionServiceTest, HalfPrecisionInputsAndOutputs) {
  std::mt19937_64 rng(1);
  const auto q = ::attend::testing::RandomFloats(rng, 6 * 4 * 16);
  const auto k = ::attend::testing::RandomFloats(rng, 9 * 2 * 16);
  const auto v = ::attend::testing::RandomFloats(rng, 9 * 2 * 16);
  v1::AttendRequest request;
  *request.mutable_q() = F32Data({6, 4, 16}, q);
  *request.mutable_k() = F32Data({9, 2, 16}, k);
  *request.mutable_v() = F32Data({9, 2, 16}, v);
  request.mutable_mask()->set_causal(true);
  v1::AttendResponse exact;
  ASSERT_TRUE(Attend(request, &exact).ok());
  ASSERT_EQ(exact.output().data().size(), 6u * 4 * 16 * 4);
  std::vector<float> expected(6 * 4 * 16);
  std::memcpy(expected.data(), exact.output().data().data(), exact.output().data().size());

  for (v1::DType dtype : {v1::BFLOAT16, v1::FLOAT16}) {
    v1::AttendRequest half = request;
    for (auto [tensor, values] :
         {std::pair{half.mutable_q(), &q}, {half.mutable_k(), &k}, {half.mutable_v(), &v}}) {
      tensor->set_dtype(dtype);
      std::string bytes(values->size() * 2, '\0');
      for (size_t i = 0; i < values->size(); ++i) {
        const uint16_t h =
            dtype == v1::BFLOAT16 ? FloatToBf16((*values)[i]) : FloatToHalf((*values)[i]);
        std::memcpy(&bytes[2 * i], &h, 2);
      }
      tensor->set_data(bytes);
    }
    half.set_output_dtype(dtype);
    v1::AttendResponse response;
    ASSERT_TRUE(Attend(half, &response).ok());
    EXPECT_EQ(response.output().dtype(), dtype);
    ASSERT_EQ(response.output().data().size(), expected.size() * 2);
    for (size_t i = 0; i < expected.size(); ++i) {
      uint16_t h;
      std::memcpy(&h, response.output().data().data() + 2 * i, 2);
      const float got = dtype == v1::BFLOAT16 ? Bf16ToFloat(h) : HalfToFloat(h);
      EXPECT_NEAR(got, expected[i], dtype == v1::BFLOAT16 ? 0.06 : 0.01) << i;
    }
    // bf16 inputs default to bf16 products.
    EXPECT_EQ(
        response.stats().engine().rfind(dtype == v1::BFLOAT16 ? "onednn/bf16" : "onednn/f32", 0),
        0u);
  }
}

TEST_F(AttentionServiceTest, MultiHeadAttendBuildsThePreviousTokenHead) {
  v1::MultiHeadAttendRequest request;
  std::vector<float> x(24, 0), wq(24, 0), wk(24, 0), wv(12, 0);
  const float content[4][2] = {{1, 0}, {0, 1}, {1, 1}, {2, 0}};
  for (int i = 0; i < 4; ++i) {
    x[i * 6 + i] = 1;
    x[i * 6 + 4] = content[i][0];
    x[i * 6 + 5] = content[i][1];
    wk[i * 4 + i] = 1;
  }
  for (int p = 1; p < 4; ++p) wq[p * 4 + p - 1] = 10;
  wq[0] = 10;
  wv[8] = 1;
  wv[11] = 1;
  *request.mutable_x() = Values({4, 6}, x);
  *request.mutable_wq() = Values({6, 4}, wq);
  *request.mutable_wk() = Values({6, 4}, wk);
  *request.mutable_wv() = Values({6, 2}, wv);
  request.set_n_head(1);
  request.mutable_mask()->set_causal(true);
  request.set_return_weights(true);
  request.set_return_projections(true);
  v1::MultiHeadAttendResponse response;
  grpc::ClientContext context;
  ASSERT_TRUE(stub_->MultiHeadAttend(&context, request, &response).ok());
  EXPECT_NEAR(response.weights().values(4), 0.993, 0.0005);
  EXPECT_NEAR(response.weights().values(9), 0.987, 0.0005);
  EXPECT_NEAR(response.weights().values(14), 0.980, 0.0005);
  // Position 3 outputs position 2's content (1, 1).
  EXPECT_NEAR(response.output().values(6), 1.00, 0.005);
  EXPECT_NEAR(response.output().values(7), 0.99, 0.005);
  EXPECT_EQ(response.parameters().wq(), 24);
  EXPECT_EQ(response.parameters().wo(), 0);
  EXPECT_EQ(response.parameters().kv(), 36);
  EXPECT_EQ(response.head_dim(), 4);
  EXPECT_THAT(response.q().shape(), ::testing::ElementsAre(4, 1, 4));
}

TEST_F(AttentionServiceTest, SoftmaxGoldenSharesAndJacobian) {
  v1::SoftmaxResponse response;
  ASSERT_TRUE(Softmax({2, 1, 0.5}, &response, /*jacobian=*/true).ok());
  EXPECT_NEAR(response.probabilities(0), 0.63, 0.005);
  EXPECT_NEAR(response.probabilities(1), 0.23, 0.005);
  EXPECT_NEAR(response.probabilities(2), 0.14, 0.005);
  ASSERT_EQ(response.jacobian_size(), 9);
  for (int r = 0; r < 3; ++r) {
    EXPECT_NEAR(
        response.jacobian(r * 3) + response.jacobian(r * 3 + 1) + response.jacobian(r * 3 + 2), 0.0,
        1e-15);
  }
  v1::SoftmaxResponse masked;
  ASSERT_TRUE(Softmax({-std::numeric_limits<double>::infinity(), 0.0}, &masked).ok());
  EXPECT_EQ(masked.probabilities(0), 0.0);
  v1::SoftmaxResponse all_masked;
  ASSERT_TRUE(Softmax({-std::numeric_limits<double>::infinity()}, &all_masked).ok());
  EXPECT_EQ(all_masked.probabilities(0), 0.0);
}

TEST_F(AttentionServiceTest, SoftmaxRejectsBadScores) {
  v1::SoftmaxResponse response;
  grpc::Status s = Softmax({1.0, std::nan("")}, &response);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(s.error_message().find("logits[1]"), std::string::npos);
  EXPECT_EQ(Softmax({}, &response).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(Softmax({std::numeric_limits<double>::infinity()}, &response).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  // A Jacobian over the element limit (2^16) is refused before it is built.
  s = Softmax(std::vector<double>(300, 0.0), &response, /*jacobian=*/true);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_NE(s.error_message().find("jacobian"), std::string::npos);
  v1::SoftmaxRequest request;
  request.add_logits(1.0);
  request.set_temperature(0.0);
  grpc::ClientContext context;
  EXPECT_EQ(stub_->Softmax(&context, request, &response).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
}

TEST_F(AttentionServiceTest, ScalingExperimentReproducesTheLesson) {
  v1::ScalingExperimentRequest request;  // defaults: 4, 64, 1024 with seed 5
  v1::ScalingExperimentResponse response;
  grpc::ClientContext context;
  ASSERT_TRUE(stub_->ScalingExperiment(&context, request, &response).ok());
  ASSERT_EQ(response.rows_size(), 3);
  EXPECT_NEAR(response.rows(1).score_std(), 8.23, 0.005);
  EXPECT_NEAR(response.rows(2).mean_max_weight_unscaled(), 0.965, 0.0005);
  EXPECT_NEAR(response.rows(2).mean_max_weight_scaled(), 0.358, 0.0005);
  EXPECT_EQ(response.seed(), 5u);
}

TEST_F(AttentionServiceTest, ScalingExperimentRejectsBadAndHugeRequests) {
  v1::ScalingExperimentRequest request;
  request.add_head_dims(0);
  v1::ScalingExperimentResponse response;
  grpc::ClientContext c1;
  EXPECT_EQ(stub_->ScalingExperiment(&c1, request, &response).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  request.Clear();
  request.add_head_dims(1 << 30);
  grpc::ClientContext c2;
  EXPECT_EQ(stub_->ScalingExperiment(&c2, request, &response).error_code(),
            grpc::StatusCode::RESOURCE_EXHAUSTED);
}

// Bad input, one case each. Every case must get its code and a message naming the problem.
TEST_F(AttentionServiceTest, RejectsMissingTensors) {
  v1::AttendRequest request = ValidRequest();
  request.clear_k();
  ExpectError(request, grpc::StatusCode::INVALID_ARGUMENT, {"k: missing"});
}

TEST_F(AttentionServiceTest, RejectsWrongRank) {
  v1::AttendRequest request = ValidRequest();
  *request.mutable_q() = Filled({3, 8});
  ExpectError(request, grpc::StatusCode::INVALID_ARGUMENT, {"q.shape [3, 8]", "rank 3"});
}

TEST_F(AttentionServiceTest, RejectsMismatchedHeadDims) {
  v1::AttendRequest request = ValidRequest();
  *request.mutable_k() = Filled({5, 2, 3});
  ExpectError(request, grpc::StatusCode::INVALID_ARGUMENT,
              {"head_dim", "k [5, 2, 3]", "q [3, 4, 2]"});
}

TEST_F(AttentionServiceTest, RejectsHeadCountThatDoesNotDivide) {
  v1::AttendRequest request = ValidRequest();
  *request.mutable_q() = Filled({3, 3, 2});
  ExpectError(request, grpc::StatusCode::INVALID_ARGUMENT, {"n_head 3", "n_head_kv 2"});
}

TEST_F(AttentionServiceTest, RejectsDataLengthThatDoesNotMatchTheShape) {
  v1::AttendRequest request = ValidRequest();
  *request.mutable_v() = F32Data({5, 2, 2}, std::vector<float>(19, 1.0f));
  ExpectError(request, grpc::StatusCode::INVALID_ARGUMENT,
              {"v.data", "76 bytes", "[5, 2, 2]", "80"});
  *request.mutable_v() = Values({5, 2, 2}, std::vector<float>(21, 1.0f));
  ExpectError(request, grpc::StatusCode::INVALID_ARGUMENT,
              {"v.values", "21 values", "20 elements"});
}

TEST_F(AttentionServiceTest, RejectsBothAndNeitherOfDataAndValues) {
  v1::AttendRequest request = ValidRequest();
  request.mutable_q()->set_data(std::string(24 * 4, '\0'));
  ExpectError(request, grpc::StatusCode::INVALID_ARGUMENT, {"q: both data", "set exactly one"});
  request = ValidRequest();
  request.mutable_q()->clear_values();
  ExpectError(request, grpc::StatusCode::INVALID_ARGUMENT, {"q: neither data nor values"});
}

TEST_F(AttentionServiceTest, RejectsZeroNegativeAndOverflowingDims) {
  v1::AttendRequest request = ValidRequest();
  request.mutable_q()->set_shape(1, 0);
  ExpectError(request, grpc::StatusCode::INVALID_ARGUMENT, {"q.shape", "dimension 1 is 0"});
  request.mutable_q()->set_shape(1, -4);
  ExpectError(request, grpc::StatusCode::INVALID_ARGUMENT, {"q.shape", "dimension 1 is -4"});
  // A zero-element shape needs no bytes: the complaint is the dimension, not the missing data.
  for (const int64_t dim : {int64_t{0}, int64_t{-4}}) {
    request = ValidRequest();
    request.mutable_q()->clear_values();
    request.mutable_q()->set_shape(0, dim);
    ExpectError(request, grpc::StatusCode::INVALID_ARGUMENT,
                {"q.shape", absl::StrCat("dimension 0 is ", dim), "must be >= 1"});
  }
  request = ValidRequest();
  request.mutable_k()->clear_shape();
  for (int64_t d : {int64_t{1} << 40, int64_t{1} << 40, int64_t{1} << 40})
    request.mutable_k()->add_shape(d);
  ExpectError(request, grpc::StatusCode::INVALID_ARGUMENT, {"k.shape", "overflows 64 bits"});
}

TEST_F(AttentionServiceTest, RejectsElementCountOverTheLimit) {
  v1::AttendRequest request = ValidRequest();
  request.mutable_q()->clear_values();
  request.mutable_q()->set_shape(0, 100000);  // 800000 elements > 2^16, data never looked at
  request.mutable_q()->set_data("x");
  ExpectError(request, grpc::StatusCode::RESOURCE_EXHAUSTED,
              {"q.shape", "800000 elements", "65536"});
}

TEST_F(AttentionServiceTest, RejectsNonFiniteInputs) {
  v1::AttendRequest request = ValidRequest();
  request.mutable_k()->set_values(3, std::numeric_limits<float>::quiet_NaN());
  ExpectError(request, grpc::StatusCode::INVALID_ARGUMENT,
              {"k holds a non-finite value (NaN)", "element 3"});
  request = ValidRequest();
  std::vector<float> v(20, 1.0f);
  v[7] = std::numeric_limits<float>::infinity();
  *request.mutable_v() = F32Data({5, 2, 2}, v);
  ExpectError(request, grpc::StatusCode::INVALID_ARGUMENT,
              {"v holds a non-finite value (+inf)", "element 7"});
}

TEST_F(AttentionServiceTest, RejectsUnknownEnums) {
  v1::AttendRequest request = ValidRequest();
  request.mutable_q()->set_dtype(static_cast<v1::DType>(7));
  ExpectError(request, grpc::StatusCode::INVALID_ARGUMENT, {"q.dtype: unknown value 7"});
  request = ValidRequest();
  request.set_precision(static_cast<v1::Precision>(9));
  ExpectError(request, grpc::StatusCode::INVALID_ARGUMENT, {"precision: unknown value 9"});
  request = ValidRequest();
  request.set_output_dtype(static_cast<v1::DType>(12));
  ExpectError(request, grpc::StatusCode::INVALID_ARGUMENT, {"output_dtype", "12"});
}

TEST_F(AttentionServiceTest, RejectsValuesWithAHalfDtype) {
  v1::AttendRequest request = ValidRequest();
  request.mutable_q()->set_dtype(v1::BFLOAT16);
  ExpectError(request, grpc::StatusCode::INVALID_ARGUMENT, {"q: values are float32", "bfloat16"});
}

TEST_F(AttentionServiceTest, RejectsNegativeWindowAndInfiniteScale) {
  v1::AttendRequest request = ValidRequest();
  request.mutable_mask()->set_window_tokens(-2);
  ExpectError(request, grpc::StatusCode::INVALID_ARGUMENT, {"window_tokens", "-2"});
  request = ValidRequest();
  request.set_scale(std::numeric_limits<float>::infinity());
  ExpectError(request, grpc::StatusCode::INVALID_ARGUMENT, {"scale"});
}

TEST_F(AttentionServiceTest, RefusesAResponseOverTheMessageLimit) {
  // 128 x 128 weights for 16 heads: 1 MiB of weights, over the server's 1 MiB message limit.
  v1::AttendRequest request;
  *request.mutable_q() = F32Data({128, 16, 1}, std::vector<float>(128 * 16, 0.1f));
  *request.mutable_k() = F32Data({128, 1, 1}, std::vector<float>(128, 0.1f));
  *request.mutable_v() = F32Data({128, 1, 1}, std::vector<float>(128, 0.1f));
  request.set_return_weights(true);
  ExpectError(request, grpc::StatusCode::RESOURCE_EXHAUSTED,
              {"maximum message size", "return_weights = false"});
  request.set_return_weights(false);
  v1::AttendResponse response;
  EXPECT_TRUE(Attend(request, &response).ok());
}

TEST_F(AttentionServiceTest, RefusesARequestOverTheMessageLimit) {
  v1::AttendRequest request = ValidRequest();
  request.mutable_q()->set_data(std::string(2 << 20, 'x'));  // 2 MiB > 1 MiB
  request.mutable_q()->clear_values();
  ExpectError(request, grpc::StatusCode::RESOURCE_EXHAUSTED, {"larger than max"});
}

TEST_F(AttentionServiceTest, MultiHeadAttendRejectsNonFiniteInputsAndWeights) {
  for (const char* field : {"x", "wq", "wk", "wv", "wo"}) {
    v1::MultiHeadAttendRequest request;
    *request.mutable_x() = Filled({4, 8});
    *request.mutable_wq() = Filled({8, 8});
    *request.mutable_wk() = Filled({8, 4});
    *request.mutable_wv() = Filled({8, 4});
    *request.mutable_wo() = Filled({8, 8});
    request.set_n_head(2);
    request.set_n_head_kv(1);
    v1::Tensor* bad = std::string(field) == "x"    ? request.mutable_x()
                      : std::string(field) == "wq" ? request.mutable_wq()
                      : std::string(field) == "wk" ? request.mutable_wk()
                      : std::string(field) == "wv" ? request.mutable_wv()
                                                   : request.mutable_wo();
    bad->set_values(5, std::numeric_limits<float>::quiet_NaN());
    v1::MultiHeadAttendResponse response;
    grpc::ClientContext context;
    const grpc::Status s = stub_->MultiHeadAttend(&context, request, &response);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << field;
    EXPECT_NE(s.error_message().find(std::string(field) + " holds a non-finite value (NaN) at "
                                                          "element 5"),
              std::string::npos)
        << s.error_message();
  }
}

// Outputs that overflow are refused, never answered as +inf: a value beyond the requested
// output dtype (float16 holds up to 65504), and a Wo projection that overflows float32.
TEST_F(AttentionServiceTest, OutputsThatOverflowAreRefused) {
  // Raw bytes in, raw float16 bytes out (values answers stay float32: see above).
  v1::AttendRequest request = ValidRequest();
  *request.mutable_q() = ::attend::testing::F32Data({5, 2, 2}, std::vector<float>(20, 1.0f));
  *request.mutable_k() = ::attend::testing::F32Data({5, 2, 2}, std::vector<float>(20, 1.0f));
  *request.mutable_v() = ::attend::testing::F32Data({5, 2, 2}, std::vector<float>(20, 1e6f));
  request.set_output_dtype(v1::FLOAT16);
  ExpectError(request, grpc::StatusCode::INVALID_ARGUMENT,
              {"output", "float16", "65504", "output_dtype"});
  request.set_output_dtype(v1::BFLOAT16);  // holds 1e6
  v1::AttendResponse response;
  grpc::ClientContext ok_context;
  EXPECT_TRUE(stub_->Attend(&ok_context, request, &response).ok());

  v1::MultiHeadAttendRequest mha;
  *mha.mutable_x() = Filled({4, 8});
  *mha.mutable_wq() = Filled({8, 8});
  *mha.mutable_wk() = Filled({8, 4});
  *mha.mutable_wv() = Filled({8, 4});
  *mha.mutable_wo() = Filled({8, 8}, 3e38f);
  mha.set_n_head(2);
  mha.set_n_head_kv(1);
  v1::MultiHeadAttendResponse mha_response;
  grpc::ClientContext context;
  const grpc::Status s = stub_->MultiHeadAttend(&context, mha, &mha_response);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(s.error_message().find("Wo"), std::string::npos) << s.error_message();
  EXPECT_NE(s.error_message().find("overflow"), std::string::npos) << s.error_message();

  // Finite x and weights whose product overflows: the error names the projection and its
  // operands, not an input the request never held.
  for (const char* weight : {"wq", "wk", "wv"}) {
    v1::MultiHeadAttendRequest big = mha;
    big.clear_wo();
    *big.mutable_x() = Filled({4, 8}, 1e30f);
    v1::Tensor* w = weight[1] == 'q' ? big.mutable_wq()
                                     : (weight[1] == 'k' ? big.mutable_wk() : big.mutable_wv());
    *w = Filled({8, weight[1] == 'q' ? 8 : 4}, 1e30f);
    grpc::ClientContext big_context;
    const grpc::Status big_status = stub_->MultiHeadAttend(&big_context, big, &mha_response);
    EXPECT_EQ(big_status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << weight;
    for (const std::string& want :
         {absl::StrCat("x * ", weight), std::string("overflowed float32 at")}) {
      EXPECT_NE(big_status.error_message().find(want), std::string::npos)
          << weight << ": " << big_status.error_message();
    }
  }
}

TEST_F(AttentionServiceTest, MultiHeadAttendRejectsBadShapes) {
  v1::MultiHeadAttendRequest request;
  *request.mutable_x() = Filled({4, 8});
  *request.mutable_wq() = Filled({8, 8});
  *request.mutable_wk() = Filled({8, 4});
  *request.mutable_wv() = Filled({8, 4});
  request.set_n_head(4);
  request.set_n_head_kv(3);
  v1::MultiHeadAttendResponse response;
  grpc::ClientContext c1;
  grpc::Status s = stub_->MultiHeadAttend(&c1, request, &response);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(s.error_message().find("n_head_kv: 3"), std::string::npos) << s.error_message();
  request.set_n_head(0);
  grpc::ClientContext c2;
  s = stub_->MultiHeadAttend(&c2, request, &response);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(s.error_message().find("n_head: 0"), std::string::npos) << s.error_message();
  request.set_n_head(2);
  request.set_n_head_kv(1);
  *request.mutable_x() = Filled({4, 7});
  grpc::ClientContext c3;
  s = stub_->MultiHeadAttend(&c3, request, &response);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(s.error_message().find("x.shape [4, 7]"), std::string::npos) << s.error_message();
  request.clear_wq();
  grpc::ClientContext c4;
  s = stub_->MultiHeadAttend(&c4, request, &response);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(s.error_message().find("wq: missing"), std::string::npos) << s.error_message();
}

TEST_F(AttentionServiceTest, ConcurrentCallsAllSucceed) {
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      auto stub = v1::Attention::NewStub(channel_);
      for (int i = 0; i < 10; ++i) {
        v1::AttendRequest request = ValidRequest();
        request.mutable_mask()->set_causal((t + i) % 2 == 0);
        v1::AttendResponse response;
        grpc::ClientContext context;
        if (!stub->Attend(&context, request, &response).ok()) failures++;
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(failures.load(), 0);
}

TEST_F(AttentionServiceTest, HealthReportsEveryServiceServing) {
  auto health = grpc::health::v1::Health::NewStub(channel_);
  for (const char* service :
       {"", "attend.v1.Attention", "attend.v1.KvCache", "attend.v1.Planner"}) {
    grpc::health::v1::HealthCheckRequest request;
    request.set_service(service);
    grpc::health::v1::HealthCheckResponse response;
    grpc::ClientContext context;
    ASSERT_TRUE(health->Check(&context, request, &response).ok()) << service;
    EXPECT_EQ(response.status(), grpc::health::v1::HealthCheckResponse::SERVING) << service;
  }
}

TEST(AttentionServiceMetrics, CountRequestsByMethodAndCode) {
  server::ServerOptions options = ::attend::testing::SmallServerOptions();
  options.metrics_address = "127.0.0.1:0";
  auto server = server::AttendServer::Start(options);
  ASSERT_TRUE(server.ok()) << server.status();
  ASSERT_GT((*server)->metrics_port(), 0);
  auto stub = v1::Attention::NewStub(::attend::testing::ChannelTo(**server));
  auto attend = [&](const v1::AttendRequest& request) {
    v1::AttendResponse response;
    grpc::ClientContext context;
    return stub->Attend(&context, request, &response);
  };
  v1::AttendRequest good;
  *good.mutable_q() = Filled({3, 4, 2});
  *good.mutable_k() = Filled({5, 2, 2});
  *good.mutable_v() = Filled({5, 2, 2});

  const std::string before = ::attend::testing::ScrapeMetrics((*server)->metrics_port());
  ASSERT_NE(before.find("attend_build_info"), std::string::npos) << before.substr(0, 200);
  const std::vector<std::string> invalid = {"grpc_method=\"Attend\"",
                                            "grpc_code=\"INVALID_ARGUMENT\""};
  const std::vector<std::string> ok = {"grpc_method=\"Attend\"", "grpc_code=\"OK\""};
  const double invalid_before =
      std::max(0.0, ::attend::testing::MetricValue(before, "grpc_server_handled_total", invalid));
  const double ok_before =
      std::max(0.0, ::attend::testing::MetricValue(before, "grpc_server_handled_total", ok));
  const double flops_before =
      std::max(0.0, ::attend::testing::MetricValue(before, "attend_attention_flops_total",
                                                   {"grpc_method=\"Attend\""}));

  v1::AttendRequest bad = good;
  bad.clear_q();
  EXPECT_FALSE(attend(bad).ok());
  EXPECT_TRUE(attend(good).ok());
  EXPECT_TRUE(attend(good).ok());

  const std::string after = ::attend::testing::ScrapeMetrics((*server)->metrics_port());
  EXPECT_EQ(::attend::testing::MetricValue(after, "grpc_server_handled_total", invalid),
            invalid_before + 1);
  EXPECT_EQ(::attend::testing::MetricValue(after, "grpc_server_handled_total", ok), ok_before + 2);
  // 3 queries x 4 heads x 5 keys x 2 (2 + 2) FLOPs, twice.
  EXPECT_EQ(::attend::testing::MetricValue(after, "attend_attention_flops_total",
                                           {"grpc_method=\"Attend\""}),
            flops_before + 2 * 3 * 4 * 5 * 8);
  EXPECT_GE(::attend::testing::MetricValue(after, "grpc_server_handling_seconds_count",
                                           {"grpc_method=\"Attend\""}),
            3);
}

// A server with one worker and one queue slot refuses what it cannot queue, and recovers.
TEST(AttentionServiceOverload, RefusesWorkBeyondTheQueueAndRecovers) {
  auto server = server::AttendServer::Start(::attend::testing::OneWorkerServerOptions(1));
  ASSERT_TRUE(server.ok()) << server.status();
  auto stub = v1::Attention::NewStub(::attend::testing::ChannelTo(**server, 64 << 20));

  const v1::AttendRequest slow = ::attend::testing::SlowAttendRequest(1024);
  const int kCalls = 8;
  ::attend::testing::ConcurrentAttends calls(stub.get(), slow, kCalls);
  const std::vector<grpc::Status>& statuses = calls.Wait();
  int refused = 0, served = 0;
  for (const grpc::Status& s : statuses) {
    if (s.ok()) served++;
    if (s.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED) {
      refused++;
      EXPECT_NE(s.error_message().find("busy"), std::string::npos) << s.error_message();
    }
  }
  EXPECT_GE(served, 2);
  EXPECT_GE(refused, 1);
  EXPECT_EQ(served + refused, kCalls);
  v1::AttendResponse response;
  grpc::ClientContext context;
  EXPECT_TRUE(stub->Attend(&context, slow, &response).ok());
  const std::string metrics = ::attend::testing::ScrapeMetrics((*server)->metrics_port());
  EXPECT_EQ(::attend::testing::MetricValue(metrics, "attend_worker_rejections_total"), refused);
}

TEST(AttentionServiceShutdown, StopsServingAfterShutdown) {
  auto server = server::AttendServer::Start(::attend::testing::SmallServerOptions());
  ASSERT_TRUE(server.ok());
  auto channel = ::attend::testing::ChannelTo(**server);
  auto stub = v1::Attention::NewStub(channel);
  v1::SoftmaxRequest request;
  request.add_logits(1.0);
  v1::SoftmaxResponse response;
  {
    grpc::ClientContext context;
    ASSERT_TRUE(stub->Softmax(&context, request, &response).ok());
  }
  (*server)->Shutdown(absl::Seconds(1));
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(500));
  EXPECT_FALSE(stub->Softmax(&context, request, &response).ok());
}

TEST(AttentionServiceStart, ReportsAnAddressThatCannotBeBound) {
  server::ServerOptions options = ::attend::testing::SmallServerOptions();
  options.address = "256.1.1.1:5000";  // not an address this machine has
  auto server = server::AttendServer::Start(options);
  EXPECT_FALSE(server.ok());
  EXPECT_EQ(server.status().code(), absl::StatusCode::kUnavailable);
}

}  // namespace
}  // namespace attend
