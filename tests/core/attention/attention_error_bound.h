// How far a computed attention may be from the reference (double arithmetic on the same
// operands), derived from the arithmetic rather than tuned: the differential tests of the engine
// and of the KV cache compare every output element and weight against these bounds.
//
// The model, for query row (i, h) over its visible keys J (|J| terms), with u = 2^-24 (float32
// unit roundoff):
//   - Scores: a float32 dot product of d terms is off by at most about d u sum|q_c k_c| in any
//     summation order (matmul blocking, FMA or not); the scale product and the subtraction of the
//     running max add a few u. So |ds| <= delta = (d + 4) u S with S = |scale| |q| max_j |k_j|
//     (Cauchy-Schwarz bounds sum|q_c k_c|). Operands that are off by e per element (int8
//     storage) add |scale| |q|_1 e.
//   - Probabilities: scores off by at most delta change each softmax probability by a factor in
//     [e^-2delta, e^2delta]; the exponential kernel adds kExpError relative (simd_internal.h
//     documents about 1e-7; we allow 2^-21), and summing |J| terms plus one rescale per tile or key
//     split (at most one per 64 keys, plus one) adds about n_terms u. Under bf16 precision each
//     probability is rounded to bf16 before it weighs the values: relative 2^-8 (bf16 keeps 8
//     significant bits, round to nearest).
//   - Outputs: o = sum p_j v_j / sum p_j with every p_j off by a relative eta and the sum off by
//     a relative eta is off by at most 2 eta / (1 - eta) max|v_j|, plus n_terms u max|v_j| for
//     accumulating in float32, plus the values' own error (int8).
//   - Output dtype: encoding in bf16 or f16 rounds each value x, by at most 2^-8 or 2^-11 times
//     |x| <= |reference| + the bound above (plus half the smallest f16 subnormal, 2^-25).
// Masked weights and the outputs of rows that see no key must be exactly 0.
#ifndef ATTEND_TESTS_CORE_ATTENTION_ATTENTION_ERROR_BOUND_H_
#define ATTEND_TESTS_CORE_ATTENTION_ATTENTION_ERROR_BOUND_H_

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "core/attention/attention.h"
#include "core/attention/mask.h"

namespace attend::testing {

inline constexpr double kF32Roundoff = 0x1p-24;
inline constexpr double kBf16Roundoff = 0x1p-8;
inline constexpr double kF16Roundoff = 0x1p-11;
inline constexpr double kExpError = 0x1p-21;
// exp() below -87 is flushed to 0 (simd.h): such a weight is below e^-87 < 2^-125.
inline constexpr double kWeightFloor = 0x1p-125;

// Unit roundoff of encoding a float32 output in `dtype`, and the absolute floor (subnormals).
inline double OutputRoundoff(DType dtype) {
  return dtype == DType::kBFloat16 ? kBf16Roundoff
                                   : (dtype == DType::kFloat16 ? kF16Roundoff : 0.0);
}
inline double OutputFloor(DType dtype) { return dtype == DType::kFloat16 ? 0x1p-25 : 0.0; }

// The operands the computation multiplies (float32 values: inputs as decoded, rounded to bf16
// under bf16 precision), in the layouts of attention.h.
struct Operands {
  AttentionShape shape;
  MaskSpec mask;
  float scale = 1.0f;
  const float* q = nullptr;
  const float* k = nullptr;
  const float* v = nullptr;
  bool bf16_probabilities = false;
  // Optional, [n_kv * n_head_kv]: the most each element of key / value row (j, g) may differ
  // from the values the reference was given (int8 storage: half the row's scale).
  const std::vector<double>* k_error = nullptr;
  const std::vector<double>* v_error = nullptr;
};

struct RowBound {
  KeyRange keys;
  double scores = 0.0;       // S
  double score_error = 0.0;  // delta
  double values = 0.0;       // max |v_j| over the visible keys
  double weight_relative = 0.0;
  double output = 0.0;  // absolute, before encoding
  std::string ToString() const {
    return absl::StrCat("visible keys [", keys.begin, ", ", keys.end, "), S ", scores,
                        ", score error ", score_error, ", max|v| ", values, ", weight rel ",
                        weight_relative, ", output abs ", output);
  }
};

class ErrorBound {
 public:
  explicit ErrorBound(const Operands& o) : o_(o) {
    const AttentionShape& s = o.shape;
    const int64_t rows = s.n_kv * s.n_head_kv;
    k_norm_.resize(static_cast<size_t>(rows));
    v_max_.resize(static_cast<size_t>(rows));
    for (int64_t r = 0; r < rows; ++r) {
      double norm = 0.0, max = 0.0;
      for (int64_t c = 0; c < s.head_dim; ++c) norm += Square(o.k[r * s.head_dim + c]);
      for (int64_t c = 0; c < s.head_dim_v; ++c)
        max = std::max(max, std::abs(o.v[r * s.head_dim_v + c]) + 0.0);
      k_norm_[r] = std::sqrt(norm) + (o.k_error ? std::sqrt(s.head_dim) * (*o.k_error)[r] : 0.0);
      v_max_[r] = max + (o.v_error ? (*o.v_error)[r] : 0.0);
    }
  }

  RowBound Row(int64_t i, int64_t h) const {
    const AttentionShape& s = o_.shape;
    const int64_t g = h / s.group_size();
    RowBound b;
    b.keys = VisibleKeys(o_.mask, s.n_q, s.n_kv, i);
    double k_max = 0.0, k_err = 0.0, v_err = 0.0;
    for (int64_t j = b.keys.begin; j < b.keys.end; ++j) {
      const size_t r = static_cast<size_t>(j * s.n_head_kv + g);
      k_max = std::max(k_max, k_norm_[r]);
      b.values = std::max(b.values, v_max_[r]);
      if (o_.k_error) k_err = std::max(k_err, (*o_.k_error)[r]);
      if (o_.v_error) v_err = std::max(v_err, (*o_.v_error)[r]);
    }
    double q2 = 0.0, q1 = 0.0;
    for (int64_t c = 0; c < s.head_dim; ++c) {
      const double x = o_.q[(i * s.n_head + h) * s.head_dim + c];
      q2 += x * x;
      q1 += std::abs(x);
    }
    const double scale = std::abs(static_cast<double>(o_.scale));
    const double u = kF32Roundoff;
    b.scores = scale * std::sqrt(q2) * k_max;
    b.score_error = (s.head_dim + 4) * u * b.scores + scale * q1 * k_err;
    const double terms = b.keys.size() + 2 * ((s.n_kv + 63) / 64 + 1) + 4;
    b.weight_relative = std::expm1(2 * b.score_error) + kExpError + terms * u;
    const double eta = b.weight_relative + (o_.bf16_probabilities ? kBf16Roundoff : 0.0);
    // Any weighted average of the values is within max|v| of the reference: the bound never
    // needs to exceed 2 max|v| (reached when the score errors can reorder the softmax, as large
    // scales over int8 keys can).
    const double spread = 2 * b.values + v_err;
    b.output =
        eta >= 0.5
            ? spread
            : std::min(spread, b.values * (2 * eta / (1 - eta) + terms * u) + v_err * (1 + eta));
    return b;
  }

 private:
  static double Square(double x) { return x * x; }
  const Operands o_;
  std::vector<double> k_norm_, v_max_;
};

// How many elements are out of bounds, and a description of the first.
// (`worst` is the largest error / tolerance ratio among elements with a nonzero tolerance: how
// close the case came to its bounds.)
struct Mismatches {
  int64_t count = 0;
  std::string first;
  double worst = 0.0;
};

// `got` ([n_q, n_head, head_dim_v], already decoded from `out_dtype`) against `want`.
inline Mismatches CompareOutput(absl::Span<const float> got, absl::Span<const double> want,
                                const ErrorBound& bound, const AttentionShape& s, DType out_dtype) {
  Mismatches m;
  for (int64_t i = 0; i < s.n_q; ++i) {
    for (int64_t h = 0; h < s.n_head; ++h) {
      const RowBound row = bound.Row(i, h);
      for (int64_t c = 0; c < s.head_dim_v; ++c) {
        const int64_t e = (i * s.n_head + h) * s.head_dim_v + c;
        const double tolerance =
            row.keys.size() == 0
                ? 0.0
                : row.output + (std::abs(want[e]) + row.output) * OutputRoundoff(out_dtype) +
                      OutputFloor(out_dtype);
        const double error = std::abs(static_cast<double>(got[e]) - want[e]);
        if (tolerance > 0) m.worst = std::max(m.worst, error / tolerance);
        if (error <= tolerance) continue;  // (a NaN fails here too)
        if (m.count++ == 0) {
          m.first = absl::StrCat("output element ", e, " (query ", i, ", head ", h, ", column ", c,
                                 "): got ", got[e], ", want ", want[e], ", error ", error,
                                 " > tolerance ", tolerance, " (", row.ToString(), ")");
        }
      }
    }
  }
  return m;
}

// Weights [n_head, n_q, n_kv]: masked ones exactly 0, the others within the relative bound.
inline Mismatches CompareWeights(absl::Span<const float> got, absl::Span<const double> want,
                                 const ErrorBound& bound, const AttentionShape& s,
                                 const MaskSpec& mask) {
  Mismatches m;
  for (int64_t h = 0; h < s.n_head; ++h) {
    for (int64_t i = 0; i < s.n_q; ++i) {
      const RowBound row = bound.Row(i, h);
      // (Weights are in [0, 1]: a relative bound of 1 or more bounds nothing.)
      const double relative =
          row.weight_relative >= 0.5 ? 1.0 : row.weight_relative / (1 - row.weight_relative);
      for (int64_t j = 0; j < s.n_kv; ++j) {
        const int64_t e = (h * s.n_q + i) * s.n_kv + j;
        const bool visible = IsVisible(mask, s.n_q, s.n_kv, i, j);
        const double tolerance = visible ? relative * want[e] + kWeightFloor : 0.0;
        const double error = std::abs(static_cast<double>(got[e]) - want[e]);
        if (tolerance > kWeightFloor) m.worst = std::max(m.worst, error / tolerance);
        if (error <= tolerance) continue;
        if (m.count++ == 0) {
          m.first = absl::StrCat("weight ", e, " (head ", h, ", query ", i, ", key ", j,
                                 visible ? "" : ", masked", "): got ", got[e], ", want ", want[e],
                                 ", error ", error, " > tolerance ", tolerance, " (",
                                 row.ToString(), ")");
        }
      }
    }
  }
  return m;
}

}  // namespace attend::testing

#endif  // ATTEND_TESTS_CORE_ATTENTION_ATTENTION_ERROR_BOUND_H_
