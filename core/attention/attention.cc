#include "core/attention/attention.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/attention/tile_attention.h"
#include "core/base/status_macros.h"

namespace attend {

absl::string_view PrecisionName(Precision precision) {
  switch (precision) {
    case Precision::kAuto:
      return "auto";
    case Precision::kFloat32:
      return "f32";
    case Precision::kBFloat16:
      return "bf16";
  }
  return "unknown";
}

namespace {

absl::Status CheckRank3(const TensorView& t, absl::string_view field, absl::string_view layout) {
  if (t.rank() != 3) {
    return absl::InvalidArgumentError(absl::StrCat(field, ".shape ", ShapeToString(t.shape),
                                                   ": expected rank 3 ", layout, ", got rank ",
                                                   t.rank()));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<AttentionShape> ValidateAttention(const TensorView& q, const TensorView& k,
                                                 const TensorView& v,
                                                 const AttentionOptions& options,
                                                 const AttentionLimits& limits) {
  ATTEND_RETURN_IF_ERROR(CheckRank3(q, "q", "[n_q, n_head, head_dim]"));
  ATTEND_RETURN_IF_ERROR(CheckRank3(k, "k", "[n_kv, n_head_kv, head_dim]"));
  ATTEND_RETURN_IF_ERROR(CheckRank3(v, "v", "[n_kv, n_head_kv, head_dim_v]"));
  ATTEND_RETURN_IF_ERROR(
      CheckedElementCount(q.shape, "q.shape", limits.max_tensor_elements).status());
  ATTEND_RETURN_IF_ERROR(
      CheckedElementCount(k.shape, "k.shape", limits.max_tensor_elements).status());
  ATTEND_RETURN_IF_ERROR(
      CheckedElementCount(v.shape, "v.shape", limits.max_tensor_elements).status());

  AttentionShape s;
  s.n_q = q.dim(0);
  s.n_head = q.dim(1);
  s.head_dim = q.dim(2);
  s.n_kv = k.dim(0);
  s.n_head_kv = k.dim(1);
  s.head_dim_v = v.dim(2);
  const std::string shapes = absl::StrCat("q ", ShapeToString(q.shape), ", k ",
                                          ShapeToString(k.shape), ", v ", ShapeToString(v.shape));
  if (k.dim(2) != s.head_dim) {
    return absl::InvalidArgumentError(absl::StrCat("k.shape[2] (head_dim) is ", k.dim(2),
                                                   " but q.shape[2] is ", s.head_dim,
                                                   "; they must match (", shapes, ")"));
  }
  if (v.dim(0) != s.n_kv || v.dim(1) != s.n_head_kv) {
    return absl::InvalidArgumentError(absl::StrCat(
        "v.shape[0:2] is [", v.dim(0), ", ", v.dim(1), "] but k.shape[0:2] is [", s.n_kv, ", ",
        s.n_head_kv, "]; k and v need the same tokens and heads (", shapes, ")"));
  }
  if (s.n_head % s.n_head_kv != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "n_head ", s.n_head, " (q.shape[1]) is not a multiple of n_head_kv ", s.n_head_kv,
        " (k.shape[1]); each key/value head must serve a whole group of query heads (", shapes,
        ")"));
  }
  std::optional<int64_t> scores = CheckedMul(s.n_head, s.n_q);
  if (scores) scores = CheckedMul(*scores, s.n_kv);
  if (!scores || *scores > limits.max_score_elements) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "n_head x n_q x n_kv = ", s.n_head, " x ", s.n_q, " x ", s.n_kv,
        " score elements is over the limit of ", limits.max_score_elements, " (", shapes, ")"));
  }
  ATTEND_RETURN_IF_ERROR(ValidateMask(options.mask));
  if (options.scale && !std::isfinite(*options.scale)) {
    return absl::InvalidArgumentError(absl::StrCat("scale: ", *options.scale, "; must be finite"));
  }
  return s;
}

absl::StatusOr<AttentionProblem> PrepareAttention(const TensorView& q, const TensorView& k,
                                                  const TensorView& v,
                                                  const AttentionOptions& options,
                                                  const AttentionLimits& limits, int threads) {
  AttentionProblem problem;
  ATTEND_ASSIGN_OR_RETURN(problem.shape_, ValidateAttention(q, k, v, options, limits));
  const AttentionShape& s = problem.shape_;
  ATTEND_RETURN_IF_ERROR(CheckFinite(q, "q", threads));
  if (tile::UsesKernels(s.n_q, s.group_size())) {
    // The keys no query sees: between the queries' visible ranges (which move forward with the
    // query), and before and after them.
    std::vector<KeyRange> hidden;
    int64_t next = 0;
    for (int64_t i = 0; i < s.n_q; ++i) {
      const KeyRange seen = VisibleKeys(options.mask, s.n_q, s.n_kv, i);
      if (seen.size() == 0) continue;
      if (seen.begin > next) hidden.push_back({next, seen.begin});
      next = std::max(next, seen.end);
    }
    if (next < s.n_kv) hidden.push_back({next, s.n_kv});
    for (const KeyRange& r : hidden) {
      ATTEND_RETURN_IF_ERROR(CheckRowsFinite(k, r.begin, r.end, "k", threads));
    }
    for (const KeyRange& r : hidden) {
      ATTEND_RETURN_IF_ERROR(CheckRowsFinite(v, r.begin, r.end, "v", threads));
    }
    problem.kv_checked_ = false;
  } else {
    ATTEND_RETURN_IF_ERROR(CheckFinite(k, "k", threads));
    ATTEND_RETURN_IF_ERROR(CheckFinite(v, "v", threads));
  }
  problem.q_ = q;
  problem.k_ = k;
  problem.v_ = v;
  problem.options_ = options;
  return problem;
}

float EffectiveScale(const AttentionOptions& options, const AttentionShape& shape) {
  if (options.scale) return *options.scale;
  return static_cast<float>(1.0 / std::sqrt(static_cast<double>(shape.head_dim)));
}

Precision ResolvePrecision(Precision requested, const TensorView& q, const TensorView& k,
                           const TensorView& v) {
  if (requested != Precision::kAuto) return requested;
  const bool all_bf16 =
      q.dtype == DType::kBFloat16 && k.dtype == DType::kBFloat16 && v.dtype == DType::kBFloat16;
  return all_bf16 ? Precision::kBFloat16 : Precision::kFloat32;
}

AttentionStats CountAttentionWork(const AttentionShape& shape, const MaskSpec& mask) {
  AttentionStats stats;
  stats.attended_pairs = VisiblePairs(mask, shape.n_q, shape.n_kv) * shape.n_head;
  stats.attention_flops = stats.attended_pairs * 2 * (shape.head_dim + shape.head_dim_v);
  return stats;
}

}  // namespace attend
