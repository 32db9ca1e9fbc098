#include "core/attention/scores.h"

#include <omp.h>

#include <atomic>
#include <limits>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/half.h"
#include "core/base/status_macros.h"

namespace attend {
namespace {

// `view` as float32, rounded through bfloat16 when the products are bf16 (as the engine's
// operands are), so that the scores are the ones the weights came from.
std::vector<float> Operand(const TensorView& view, bool bf16) {
  std::vector<float> out(static_cast<size_t>(view.num_elements()));
  ConvertToFloat(view, out.data());
  if (bf16) {
    for (float& f : out) f = Bf16ToFloat(FloatToBf16(f));
  }
  return out;
}

}  // namespace

absl::Status ComputeScores(const AttentionProblem& problem, absl::Span<float> scores,
                           absl::Span<float> masked_scores, const Cancellation* cancel,
                           int threads) {
  const AttentionShape& s = problem.shape();
  const int64_t elements = s.weight_elements();
  if (static_cast<int64_t>(scores.size()) != elements ||
      static_cast<int64_t>(masked_scores.size()) != elements) {
    return absl::InvalidArgumentError(
        absl::StrCat("score tables hold ", scores.size(), " and ", masked_scores.size(),
                     " elements; the problem has n_head x n_q x n_kv = ", elements));
  }
  // Every pair is computed here, seen or not: the keys must all be finite.
  if (!problem.kv_checked()) ATTEND_RETURN_IF_ERROR(CheckFinite(problem.k(), "k", threads));
  const bool bf16 = ResolvePrecision(problem.options().precision, problem.q(), problem.k(),
                                     problem.v()) == Precision::kBFloat16;
  const std::vector<float> q = Operand(problem.q(), bf16);
  const std::vector<float> k = Operand(problem.k(), bf16);
  const double scale = EffectiveScale(problem.options(), s);
  const MaskSpec& mask = problem.options().mask;
  const int64_t rows = s.n_head * s.n_q;
  std::atomic<bool> stopped{false};
  const int team = threads > 0 ? threads : omp_get_max_threads();
#pragma omp parallel for num_threads(team) schedule(dynamic, 16)
  for (int64_t row = 0; row < rows; ++row) {
    if (stopped.load(std::memory_order_relaxed)) continue;
    if (IsCancelled(cancel)) {
      stopped.store(true, std::memory_order_relaxed);
      continue;
    }
    const int64_t h = row / s.n_q, i = row % s.n_q, g = h / s.group_size();
    const float* qi = &q[static_cast<size_t>((i * s.n_head + h) * s.head_dim)];
    for (int64_t j = 0; j < s.n_kv; ++j) {
      const float* kj = &k[static_cast<size_t>((j * s.n_head_kv + g) * s.head_dim)];
      double dot = 0;
      for (int64_t c = 0; c < s.head_dim; ++c) dot += static_cast<double>(qi[c]) * kj[c];
      const float score = static_cast<float>(scale * dot);
      const size_t at = static_cast<size_t>(row * s.n_kv + j);
      scores[at] = score;
      masked_scores[at] =
          IsVisible(mask, s.n_q, s.n_kv, i, j) ? score : -std::numeric_limits<float>::infinity();
    }
  }
  if (stopped.load()) return CheckCancelled(cancel, "computing the scores");
  return absl::OkStatus();
}

}  // namespace attend
