#include "core/lessons/multi_head_attention.h"

#include "absl/strings/str_cat.h"
#include "core/base/status_macros.h"
#include "core/kernels/onednn.h"

namespace attend {
namespace {

absl::Status CheckMatrix(const TensorView& m, absl::string_view name,
                         const AttentionLimits& limits) {
  if (m.rank() != 2) {
    return absl::InvalidArgumentError(absl::StrCat(name, ".shape ", ShapeToString(m.shape),
                                                   ": expected a matrix (rank 2), got rank ",
                                                   m.rank()));
  }
  return CheckedElementCount(m.shape, absl::StrCat(name, ".shape"), limits.max_tensor_elements)
      .status();
}

std::vector<float> ToFloats(const TensorView& view) {
  std::vector<float> out(static_cast<size_t>(view.num_elements()));
  ConvertToFloat(view, out.data());
  return out;
}

// out[rows, cols] = a[rows, inner] x b[inner, cols], dense f32.
absl::Status Project(const float* a, const float* b, int64_t rows, int64_t inner, int64_t cols,
                     float* out) {
  onednn::MatmulSpec spec;
  spec.src = {rows, inner, inner, 1, DType::kFloat32};
  spec.weights = {inner, cols, cols, 1, DType::kFloat32};
  spec.dst = {rows, cols, cols, 1, DType::kFloat32};
  return onednn::RunMatmul(spec, a, b, out);
}

}  // namespace

ParameterCounts CountParameters(int64_t d_model, int64_t n_head, int64_t n_head_kv,
                                int64_t head_dim, int64_t head_dim_v, int64_t d_out) {
  ParameterCounts c;
  c.wq = d_model * n_head * head_dim;
  c.wk = d_model * n_head_kv * head_dim;
  c.wv = d_model * n_head_kv * head_dim_v;
  c.wo = n_head * head_dim_v * d_out;
  c.kv = c.wk + c.wv;
  c.total = c.wq + c.wk + c.wv + c.wo;
  return c;
}

absl::StatusOr<MultiHeadAttention> MultiHeadAttention::Create(const TensorView& wq,
                                                              const TensorView& wk,
                                                              const TensorView& wv,
                                                              const std::optional<TensorView>& wo,
                                                              int64_t n_head, int64_t n_head_kv,
                                                              const AttentionLimits& limits) {
  if (n_head < 1) {
    return absl::InvalidArgumentError(absl::StrCat("n_head: ", n_head, "; must be >= 1"));
  }
  if (n_head_kv == 0) n_head_kv = n_head;
  if (n_head_kv < 1 || n_head % n_head_kv != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("n_head_kv: ", n_head_kv, "; must be >= 1 and divide n_head ", n_head));
  }
  ATTEND_RETURN_IF_ERROR(CheckMatrix(wq, "wq", limits));
  ATTEND_RETURN_IF_ERROR(CheckMatrix(wk, "wk", limits));
  ATTEND_RETURN_IF_ERROR(CheckMatrix(wv, "wv", limits));
  if (wo) ATTEND_RETURN_IF_ERROR(CheckMatrix(*wo, "wo", limits));

  const int64_t d_model = wq.dim(0);
  const std::string shapes = absl::StrCat("wq ", ShapeToString(wq.shape), ", wk ",
                                          ShapeToString(wk.shape), ", wv ", ShapeToString(wv.shape),
                                          wo ? absl::StrCat(", wo ", ShapeToString(wo->shape)) : "",
                                          ", n_head ", n_head, ", n_head_kv ", n_head_kv);
  if (wk.dim(0) != d_model || wv.dim(0) != d_model) {
    return absl::InvalidArgumentError(
        absl::StrCat("wq, wk and wv need the same number of rows (d_model); got ", shapes));
  }
  if (wq.dim(1) % n_head != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "wq.shape[1] = ", wq.dim(1), " is not a multiple of n_head ", n_head, " (", shapes, ")"));
  }
  const int64_t head_dim = wq.dim(1) / n_head;
  if (wk.dim(1) != n_head_kv * head_dim) {
    return absl::InvalidArgumentError(absl::StrCat("wk.shape[1] = ", wk.dim(1),
                                                   " but n_head_kv x head_dim = ", n_head_kv, " x ",
                                                   head_dim, " (", shapes, ")"));
  }
  if (wv.dim(1) % n_head_kv != 0) {
    return absl::InvalidArgumentError(absl::StrCat("wv.shape[1] = ", wv.dim(1),
                                                   " is not a multiple of n_head_kv ", n_head_kv,
                                                   " (", shapes, ")"));
  }
  const int64_t head_dim_v = wv.dim(1) / n_head_kv;
  if (wo && wo->dim(0) != n_head * head_dim_v) {
    return absl::InvalidArgumentError(absl::StrCat("wo.shape[0] = ", wo->dim(0),
                                                   " but n_head x head_dim_v = ", n_head, " x ",
                                                   head_dim_v, " (", shapes, ")"));
  }

  ATTEND_RETURN_IF_ERROR(CheckFinite(wq, "wq"));
  ATTEND_RETURN_IF_ERROR(CheckFinite(wk, "wk"));
  ATTEND_RETURN_IF_ERROR(CheckFinite(wv, "wv"));
  if (wo) ATTEND_RETURN_IF_ERROR(CheckFinite(*wo, "wo"));

  MultiHeadAttention layer;
  layer.d_model_ = d_model;
  layer.n_head_ = n_head;
  layer.n_head_kv_ = n_head_kv;
  layer.head_dim_ = head_dim;
  layer.head_dim_v_ = head_dim_v;
  layer.has_wo_ = wo.has_value();
  layer.d_out_ = wo ? wo->dim(1) : n_head * head_dim_v;
  layer.wq_ = ToFloats(wq);
  layer.wk_ = ToFloats(wk);
  layer.wv_ = ToFloats(wv);
  if (wo) layer.wo_ = ToFloats(*wo);
  return layer;
}

ParameterCounts MultiHeadAttention::parameter_counts() const {
  return CountParameters(d_model_, n_head_, n_head_kv_, head_dim_, head_dim_v_,
                         has_wo_ ? d_out_ : 0);
}

absl::StatusOr<MultiHeadAttention::Output> MultiHeadAttention::Forward(
    const TensorView& x, const AttentionOptions& options, bool want_weights, bool keep_projections,
    const AttentionEngine& engine, const AttentionLimits& limits,
    const Cancellation* cancel) const {
  if (x.rank() != 2 || x.dim(1) != d_model_) {
    return absl::InvalidArgumentError(
        absl::StrCat("x.shape ", ShapeToString(x.shape),
                     ": expected [n, d_model] with d_model = ", d_model_, " (the rows of wq)"));
  }
  ATTEND_ASSIGN_OR_RETURN(const int64_t x_elements,
                          CheckedElementCount(x.shape, "x.shape", limits.max_tensor_elements));
  (void)x_elements;
  const int64_t n = x.dim(0);
  // Intermediates are bounded like inputs, before they are allocated.
  for (const auto& [name, cols] : {std::pair<const char*, int64_t>{"q", n_head_ * head_dim_},
                                   {"k", n_head_kv_ * head_dim_},
                                   {"v", n_head_kv_ * head_dim_v_},
                                   {"output", d_out()}}) {
    ATTEND_RETURN_IF_ERROR(CheckedElementCount({n, cols}, absl::StrCat(name, " projection"),
                                               limits.max_tensor_elements)
                               .status());
  }
  ATTEND_RETURN_IF_ERROR(CheckFinite(x, "x"));
  std::vector<float> xf = ToFloats(x);
  Output out;
  out.q.resize(static_cast<size_t>(n * n_head_ * head_dim_));
  out.k.resize(static_cast<size_t>(n * n_head_kv_ * head_dim_));
  out.v.resize(static_cast<size_t>(n * n_head_kv_ * head_dim_v_));
  // Finite x and weights can still overflow in their product: say which projection did, since
  // the attention inputs it makes are not in the request.
  const auto project = [&](const char* name, const std::vector<float>& w, int64_t cols,
                           std::vector<float>& dst) -> absl::Status {
    ATTEND_RETURN_IF_ERROR(Project(xf.data(), w.data(), n, d_model_, cols, dst.data()));
    const int64_t bad =
        FirstNonFiniteElement(TensorView{DType::kFloat32, {n, cols}, dst.data()}, /*threads=*/0);
    if (bad < 0) return absl::OkStatus();
    return absl::InvalidArgumentError(absl::StrCat(
        "the ", name, " projection (x * w", name, ", [", n, ", ", cols, "]) overflowed float32 at ",
        "element ", bad, "; the magnitudes of x or w", name, " are too large"));
  };
  ATTEND_RETURN_IF_ERROR(project("q", wq_, n_head_ * head_dim_, out.q));
  ATTEND_RETURN_IF_ERROR(CheckCancelled(cancel, "the layer"));
  ATTEND_RETURN_IF_ERROR(project("k", wk_, n_head_kv_ * head_dim_, out.k));
  ATTEND_RETURN_IF_ERROR(project("v", wv_, n_head_kv_ * head_dim_v_, out.v));
  ATTEND_RETURN_IF_ERROR(CheckCancelled(cancel, "the layer"));

  const TensorView q{DType::kFloat32, {n, n_head_, head_dim_}, out.q.data()};
  const TensorView k{DType::kFloat32, {n, n_head_kv_, head_dim_}, out.k.data()};
  const TensorView v{DType::kFloat32, {n, n_head_kv_, head_dim_v_}, out.v.data()};
  std::vector<float> heads(static_cast<size_t>(n * n_head_ * head_dim_v_));
  if (want_weights) {
    ATTEND_RETURN_IF_ERROR(ValidateAttention(q, k, v, options, limits).status());
    out.weights.resize(static_cast<size_t>(n_head_ * n * n));
  }
  ATTEND_RETURN_IF_ERROR(engine.Compute(q, k, v, options, limits, absl::MakeSpan(heads),
                                        absl::MakeSpan(out.weights), &out.stats, cancel));
  if (has_wo_) {
    out.output.resize(static_cast<size_t>(n * d_out_));
    ATTEND_RETURN_IF_ERROR(
        Project(heads.data(), wo_.data(), n, n_head_ * head_dim_v_, d_out_, out.output.data()));
    const int64_t bad = FirstNonFiniteElement(
        TensorView{DType::kFloat32, {n, d_out_}, out.output.data()}, /*threads=*/0);
    if (bad >= 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "output element ", bad, " is not finite: the Wo projection overflowed float32; the ",
          "magnitudes of wo (or of the attention output it mixes) are too large"));
    }
  } else {
    out.output = std::move(heads);
  }
  if (!keep_projections) {
    out.q = {};
    out.k = {};
    out.v = {};
  }
  return out;
}

}  // namespace attend
