#include "core/lessons/lesson_init.h"

#include <cmath>
#include <string>

#include "absl/strings/str_cat.h"
#include "core/base/status_macros.h"
#include "core/lessons/java_random.h"

namespace attend {
namespace {

absl::Status AtLeastOne(int64_t value, absl::string_view field) {
  if (value >= 1) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(field, ": ", value, "; must be >= 1"));
}

// The shapes the spec asks for, or why not. Only arithmetic: nothing is allocated here.
struct Resolved {
  Shape x, wq, wk, wv, wo;
  int64_t head_dim = 0;
  double stddev = kDefaultLessonStddev;
};

absl::StatusOr<Resolved> Resolve(const LessonInitSpec& spec, const AttentionLimits& limits,
                                 int64_t max_total_elements) {
  ATTEND_RETURN_IF_ERROR(AtLeastOne(spec.n, "init.n"));
  ATTEND_RETURN_IF_ERROR(AtLeastOne(spec.d_model, "init.d_model"));
  ATTEND_RETURN_IF_ERROR(AtLeastOne(spec.n_head, "n_head"));
  const int64_t n_head_kv = spec.n_head_kv == 0 ? spec.n_head : spec.n_head_kv;
  if (n_head_kv < 1 || spec.n_head % n_head_kv != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("n_head_kv: ", n_head_kv, "; must be >= 1 and divide n_head ", spec.n_head));
  }
  Resolved r;
  if (spec.stddev) {
    if (!std::isfinite(*spec.stddev) || *spec.stddev <= 0) {
      return absl::InvalidArgumentError(absl::StrCat("init.stddev: ", *spec.stddev,
                                                     "; must be finite and > 0 (unset means 0.5)"));
    }
    r.stddev = *spec.stddev;
  }
  r.head_dim = spec.head_dim;
  if (r.head_dim < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("init.head_dim: ", r.head_dim, "; must be >= 1, or 0 for d_model / n_head"));
  }
  if (r.head_dim == 0) {
    if (spec.d_model % spec.n_head != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("init.head_dim: 0 means d_model / n_head, but n_head ", spec.n_head,
                       " does not divide init.d_model ", spec.d_model, "; set init.head_dim"));
    }
    r.head_dim = spec.d_model / spec.n_head;
  }
  if (spec.d_out < 0 || (spec.d_out != 0 && !spec.with_wo)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "init.d_out: ", spec.d_out, "; must be >= 1 with init.with_wo, or 0 (d_model)"));
  }
  // Products of validated positive int32-sized values: q_cols and kv_cols fit in int64.
  const int64_t q_cols = spec.n_head * r.head_dim;
  const int64_t kv_cols = n_head_kv * r.head_dim;
  r.x = {spec.n, spec.d_model};
  r.wq = {spec.d_model, q_cols};
  r.wk = {spec.d_model, kv_cols};
  r.wv = {spec.d_model, kv_cols};
  if (spec.with_wo) r.wo = {q_cols, spec.d_out == 0 ? spec.d_model : spec.d_out};
  const int64_t max = limits.max_tensor_elements;
  ATTEND_RETURN_IF_ERROR(CheckedElementCount(r.x, "init: x [n, d_model]", max).status());
  ATTEND_RETURN_IF_ERROR(
      CheckedElementCount(r.wq, "init: wq [d_model, n_head * head_dim]", max).status());
  ATTEND_RETURN_IF_ERROR(
      CheckedElementCount(r.wk, "init: wk and wv [d_model, n_head_kv * head_dim]", max).status());
  if (spec.with_wo) {
    ATTEND_RETURN_IF_ERROR(
        CheckedElementCount(r.wo, "init: wo [n_head * head_dim, d_out]", max).status());
  }
  // Each count is <= max_tensor_elements, so the sum cannot overflow.
  const int64_t total = r.x[0] * r.x[1] + r.wq[0] * r.wq[1] + 2 * r.wk[0] * r.wk[1] +
                        (spec.with_wo ? r.wo[0] * r.wo[1] : 0);
  if (total > max_total_elements) {
    return absl::ResourceExhaustedError(
        absl::StrCat("init: x, wq, wk, wv", spec.with_wo ? " and wo" : "", " hold ", total,
                     " elements together, over the limit of ", max_total_elements,
                     " (what one request message could carry)"));
  }
  return r;
}

// Java's `(float) (r.nextGaussian() * std)` for every element, row-major.
std::vector<float> Draw(JavaRandom& random, const Shape& shape, double stddev) {
  std::vector<float> m(static_cast<size_t>(shape[0] * shape[1]));
  for (float& value : m) value = static_cast<float>(random.NextGaussian() * stddev);
  return m;
}

}  // namespace

absl::StatusOr<LessonInputs> DrawLessonInputs(const LessonInitSpec& spec,
                                              const AttentionLimits& limits,
                                              int64_t max_total_elements,
                                              const Cancellation* cancel) {
  ATTEND_ASSIGN_OR_RETURN(const Resolved r, Resolve(spec, limits, max_total_elements));
  JavaRandom random(spec.seed);
  LessonInputs in;
  in.head_dim = r.head_dim;
  in.x_shape = r.x;
  in.wq_shape = r.wq;
  in.wk_shape = r.wk;
  in.wv_shape = r.wv;
  in.wo_shape = r.wo;
  // The lessons' order: x, then Wq, Wk, Wv, then Wo. Each matrix is at most
  // max_tensor_elements draws, so cancellation is polled between them.
  in.x = Draw(random, r.x, r.stddev);
  ATTEND_RETURN_IF_ERROR(CheckCancelled(cancel, "drawing the lesson inputs"));
  in.wq = Draw(random, r.wq, r.stddev);
  ATTEND_RETURN_IF_ERROR(CheckCancelled(cancel, "drawing the lesson inputs"));
  in.wk = Draw(random, r.wk, r.stddev);
  ATTEND_RETURN_IF_ERROR(CheckCancelled(cancel, "drawing the lesson inputs"));
  in.wv = Draw(random, r.wv, r.stddev);
  if (spec.with_wo) {
    ATTEND_RETURN_IF_ERROR(CheckCancelled(cancel, "drawing the lesson inputs"));
    in.wo = Draw(random, r.wo, r.stddev);
  }
  return in;
}

}  // namespace attend
