// Typed client of attend.v1.Attention. Every call returns absl::Status / StatusOr carrying the
// server's canonical code and message.
//
// Thread-safety: an AttentionClient may be used from many threads at once.
#ifndef ATTEND_CLIENT_ATTENTION_CLIENT_H_
#define ATTEND_CLIENT_ATTENTION_CLIENT_H_

#include <memory>
#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "attend/v1/attention.grpc.pb.h"
#include "client/connection.h"
#include "client/tensor.h"

namespace attend::client {

struct MaskSettings {
  bool causal = false;
  int64_t window_tokens = 0;
};

// Whether query `query` (of n_q, aligned to the end of n_kv keys: it sits at position
// n_kv - n_q + query) sees key `key` under `mask`, by the rule of attend.v1.MaskOptions: causal
// hides later keys; a window keeps keys in (position - window, position] when causal and keys
// within window - 1 positions otherwise. The server's masked weights are exactly 0, but so can
// be a visible weight that underflowed; this tells them apart (e.g. to draw masked cells).
bool KeyVisible(const MaskSettings& mask, int64_t n_q, int64_t n_kv, int64_t query, int64_t key);

struct AttendInput {
  FloatTensor q;  // [n_q, n_head, head_dim]
  FloatTensor k;  // [n_kv, n_head_kv, head_dim]
  FloatTensor v;  // [n_kv, n_head_kv, head_dim_v]
  MaskSettings mask;
  std::optional<float> scale;
  v1::Precision precision = v1::PRECISION_UNSPECIFIED;
  bool return_weights = false;
  // Also return scale * q.k before and after the mask (-inf where masked).
  bool return_scores = false;
  Wire wire = Wire::kFloat32;  // how q/k/v travel; the output comes back the same way
};

struct AttendOutput {
  FloatTensor output;                        // [n_q, n_head, head_dim_v]
  std::optional<FloatTensor> weights;        // [n_head, n_q, n_kv]
  std::optional<FloatTensor> scores;         // [n_head, n_q, n_kv], with return_scores
  std::optional<FloatTensor> masked_scores;  // the same, -inf where masked
  v1::ComputeStats stats;
};

struct MultiHeadInput {
  // With `init` the server draws x, wq, wk, wv (and wo) as the lessons do (attend.v1.LessonInit)
  // and the tensors below are not sent.
  std::optional<v1::LessonInit> init;
  FloatTensor x;                  // [n, d_model]
  FloatTensor wq, wk, wv;         // [d_model, heads * dims]
  std::optional<FloatTensor> wo;  // [n_head * head_dim_v, d_out]
  int32_t n_head = 1;
  int32_t n_head_kv = 0;  // 0 = n_head
  MaskSettings mask;
  std::optional<float> scale;
  v1::Precision precision = v1::PRECISION_UNSPECIFIED;
  bool return_weights = false;
  bool return_projections = false;
  bool return_scores = false;
  bool return_inputs = false;  // only with init: the drawn x, wq, wk, wv, wo
  Wire wire = Wire::kFloat32;
};

struct MultiHeadOutput {
  FloatTensor output;
  std::optional<FloatTensor> weights;
  std::optional<FloatTensor> q, k, v;
  std::optional<FloatTensor> scores, masked_scores;  // [n_head, n, n]
  std::optional<FloatTensor> x, wq, wk, wv, wo;      // the drawn inputs, with return_inputs
  v1::ParameterCounts parameters;
  int32_t head_dim = 0;
  int32_t head_dim_v = 0;
  v1::ComputeStats stats;
};

class AttentionClient {
 public:
  AttentionClient(std::shared_ptr<grpc::Channel> channel, ConnectionOptions options);

  absl::StatusOr<AttendOutput> Attend(const AttendInput& input) const;
  absl::StatusOr<MultiHeadOutput> MultiHeadAttend(const MultiHeadInput& input) const;
  absl::StatusOr<v1::SoftmaxResponse> Softmax(const std::vector<double>& logits, bool jacobian,
                                              std::optional<double> temperature = {}) const;
  absl::StatusOr<v1::ScalingExperimentResponse> ScalingExperiment(
      const v1::ScalingExperimentRequest& request) const;

 private:
  std::unique_ptr<v1::Attention::Stub> stub_;
  ConnectionOptions options_;
};

// Serving status of `service` ("" = the whole server) from grpc.health.v1.Health/Check:
// "SERVING", "NOT_SERVING", "SERVICE_UNKNOWN" or "UNKNOWN".
absl::StatusOr<std::string> CheckHealth(const std::shared_ptr<grpc::Channel>& channel,
                                        const std::string& service, absl::Duration deadline);

// What one Health/Check of the whole server tells: its serving status (as CheckHealth) and the
// version line it sends in its initial metadata (kServerVersionMetadata in
// common/version/version.h), "" when it sends none (a server built before it did).
struct ServerProbe {
  std::string status;
  std::string version;
};
absl::StatusOr<ServerProbe> ProbeServer(const std::shared_ptr<grpc::Channel>& channel,
                                        absl::Duration deadline);

}  // namespace attend::client

#endif  // ATTEND_CLIENT_ATTENTION_CLIENT_H_
