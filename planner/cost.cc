#include "planner/cost.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "core/base/status_macros.h"
#include "planner/kv_plan.h"

namespace attend::planner {
namespace {

absl::Status CheckCount(absl::string_view field, int64_t value, int64_t hi) {
  if (value < 0 || value > hi) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": ", value, "; must be in [0, ", hi, "]"));
  }
  return absl::OkStatus();
}

// FLOPs per attention pair of one layer: every query head scores (2 d_k) and mixes (2 d_v).
double FlopsPerPair(const ModelSpec& m) {
  return 2.0 * static_cast<double>(m.head_dim + m.head_dim_v) * static_cast<double>(m.n_head);
}

PhaseCost Phase(double attention_flops, double weight_flops, double weight_bytes, double kv_bytes,
                double tokens, double peak_flops, double bandwidth, double price_per_hour) {
  PhaseCost p;
  if (tokens <= 0.0) return p;
  p.attention_flops = attention_flops;
  p.weight_flops = weight_flops;
  p.weight_bytes = weight_bytes;
  p.kv_bytes = kv_bytes;
  p.bytes_moved = weight_bytes + kv_bytes;
  const double flops = attention_flops + weight_flops;
  p.arithmetic_intensity = p.bytes_moved > 0.0 ? flops / p.bytes_moved : 0.0;
  p.compute_seconds = flops / peak_flops;
  p.memory_seconds = p.bytes_moved / bandwidth;
  p.roofline_seconds = std::max(p.compute_seconds, p.memory_seconds);
  p.bound = p.compute_seconds >= p.memory_seconds ? "compute" : "memory";
  if (p.roofline_seconds > 0.0) p.tokens_per_second = tokens / p.roofline_seconds;
  p.usd_per_million_tokens = price_per_hour / 3600.0 * p.roofline_seconds / tokens * 1e6;
  return p;
}

// Smallest n in [1, kMaxContextTokens] with exceeds(n), or 0 when there is none. REQUIRES:
// exceeds is monotone (false ... false true ... true).
template <typename Pred>
int64_t FirstTrue(Pred exceeds) {
  if (!exceeds(kMaxContextTokens)) return 0;
  int64_t lo = 0, hi = kMaxContextTokens;  // !exceeds(lo) (or lo = 0), exceeds(hi)
  while (hi - lo > 1) {
    const int64_t mid = lo + (hi - lo) / 2;
    if (exceeds(mid)) {
      hi = mid;
    } else {
      lo = mid;
    }
  }
  return hi;
}

}  // namespace

double PrefillPairs(int64_t n, int64_t window, bool causal) {
  const double dn = static_cast<double>(n);
  if (window <= 0 || window >= n) return causal ? dn * (dn + 1.0) / 2.0 : dn * dn;
  const double w = static_cast<double>(window);
  if (causal) return w * (w + 1.0) / 2.0 + (dn - w) * w;
  return dn + (w - 1.0) * (2.0 * dn - w);
}

double PrefillAttentionFlops(const ModelSpec& model, int64_t n, bool causal) {
  double pairs = 0.0;
  for (int64_t layer = 0; layer < model.layers; ++layer) {
    pairs += PrefillPairs(n, LayerWindow(model, layer), causal);
  }
  return FlopsPerPair(model) * pairs;
}

double DecodeAttentionFlops(const ModelSpec& model, int64_t n) {
  double pairs = 0.0;
  for (int64_t layer = 0; layer < model.layers; ++layer) {
    const int64_t window = LayerWindow(model, layer);
    pairs += static_cast<double>(window > 0 ? std::min(n, window) : n);
  }
  return FlopsPerPair(model) * pairs;
}

namespace {

// The peak a compute dtype runs at on `hardware`; sets e->compute_dtype.
absl::StatusOr<double> PeakFlops(const CostRequest& request, const HardwareProfile& hardware,
                                 CostEstimate* e) {
  const std::string compute = request.compute_dtype.empty() ? "bfloat16" : request.compute_dtype;
  ATTEND_ASSIGN_OR_RETURN(const KvDType compute_type, ParseDType(compute, "compute_dtype"));
  double peak = 0.0;
  switch (compute_type) {
    case KvDType::kFloat32:
      peak = hardware.peak_flops_f32;
      break;
    case KvDType::kFloat16:
    case KvDType::kBFloat16:
      peak = hardware.peak_flops_bf16;
      break;
    case KvDType::kFp8:
    case KvDType::kInt8:
      peak = hardware.peak_flops_fp8;
      break;
    case KvDType::kQ8_0:
    case KvDType::kQ4_0:
      return absl::InvalidArgumentError(
          absl::StrCat("compute_dtype: ", DTypeName(compute_type),
                       " is a storage format, not a compute type; use float32, bfloat16 or fp8"));
  }
  e->compute_dtype = std::string(DTypeName(compute_type));
  if (peak <= 0.0) {
    return absl::InvalidArgumentError(absl::StrCat("hardware ", QuoteForError(hardware.name),
                                                   " has no peak FLOP/s for compute_dtype ",
                                                   e->compute_dtype));
  }
  return peak;
}

// The weights a phase works with: P for its FLOPs, and the bytes it reads, which for a mixture
// of experts depend on how many experts its tokens touch.
struct Weights {
  int64_t total = 0;
  int64_t active = 0;  // P
  bool mixture = false;
  int64_t experts = 0;
  int64_t experts_active = 0;
  double bytes_per_weight = 0.0;

  double BytesRead(double tokens) const {
    double params = static_cast<double>(total);
    if (mixture) {
      const double per_expert =
          static_cast<double>(total - active) / static_cast<double>(experts - experts_active);
      const double touched =
          std::min(static_cast<double>(experts), tokens * static_cast<double>(experts_active));
      params = static_cast<double>(active) +
               (touched - static_cast<double>(experts_active)) * per_expert;
    }
    return params * bytes_per_weight;
  }
};

absl::StatusOr<Weights> WeightsOf(const ModelSpec& m, const CostRequest& request) {
  Weights w;
  w.total = m.parameters;
  w.active = m.active_parameters;
  w.mixture = m.experts > 1 && m.parameters > m.active_parameters;
  w.experts = m.experts;
  w.experts_active = m.experts_active;
  if (request.parameters.has_value()) {
    if (*request.parameters < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("parameters: ", *request.parameters, "; must be >= 1"));
    }
    w.total = w.active = *request.parameters;
    w.mixture = false;
  }
  if (w.active <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "parameters: unknown for model ", QuoteForError(m.name), "; give the parameter count"));
  }
  const std::string weights_dtype =
      request.weights_dtype.empty() ? m.weights_dtype : request.weights_dtype;
  if (weights_dtype.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("weights_dtype: unknown for model ",
                                                   QuoteForError(m.name), "; give weights_dtype"));
  }
  ATTEND_ASSIGN_OR_RETURN(const KvDType weights_type, ParseDType(weights_dtype, "weights_dtype"));
  w.bytes_per_weight = BytesPerValue(weights_type);
  return w;
}

}  // namespace

absl::StatusOr<CostEstimate> EstimateCost(const ModelSpec& model, const CostRequest& request,
                                          const HardwareProfile& hardware) {
  CostEstimate e;
  ATTEND_ASSIGN_OR_RETURN(e.model, CanonicalModel(model));
  const ModelSpec& m = e.model;
  ATTEND_RETURN_IF_ERROR(ValidateHardware(hardware));
  e.hardware = hardware;
  ATTEND_RETURN_IF_ERROR(CheckCount("prompt_tokens", request.prompt_tokens, kMaxContextTokens));
  ATTEND_RETURN_IF_ERROR(CheckCount("context_tokens", request.context_tokens, kMaxContextTokens));
  ATTEND_RETURN_IF_ERROR(CheckCount("batch", request.batch, kMaxBatch));
  if (!std::isfinite(request.price_per_hour_usd) || request.price_per_hour_usd < 0.0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "price_per_hour_usd: ", request.price_per_hour_usd, "; must be finite and >= 0"));
  }
  e.prompt_tokens = request.prompt_tokens;
  e.context_tokens = request.context_tokens > 0 ? request.context_tokens : request.prompt_tokens;
  if (e.context_tokens == 0) {
    return absl::InvalidArgumentError(
        "prompt_tokens and context_tokens are both 0; give a prompt or a context length");
  }
  e.batch = request.batch > 0 ? request.batch : 1;
  ATTEND_ASSIGN_OR_RETURN(e.peak_flops, PeakFlops(request, hardware, &e));
  ATTEND_ASSIGN_OR_RETURN(const Weights weights, WeightsOf(m, request));
  e.parameters = weights.active;

  const double p = static_cast<double>(weights.active);
  const double batch = static_cast<double>(e.batch);
  const double bandwidth = hardware.memory_bandwidth_bytes_per_second;
  const bool causal = !request.non_causal;
  if (e.prompt_tokens > 0) {
    ATTEND_ASSIGN_OR_RETURN(const int64_t kv_one,
                            KvBytesPerSequence(m, request.kv_dtype, e.prompt_tokens));
    const double tokens = batch * static_cast<double>(e.prompt_tokens);
    e.prefill = Phase(batch * PrefillAttentionFlops(m, e.prompt_tokens, causal), 2.0 * p * tokens,
                      weights.BytesRead(tokens), batch * static_cast<double>(kv_one), tokens,
                      e.peak_flops, bandwidth, request.price_per_hour_usd);
  }
  ATTEND_ASSIGN_OR_RETURN(const int64_t kv_one,
                          KvBytesPerSequence(m, request.kv_dtype, e.context_tokens));
  e.decode = Phase(batch * DecodeAttentionFlops(m, e.context_tokens), 2.0 * p * batch,
                   weights.BytesRead(batch), batch * static_cast<double>(kv_one), batch,
                   e.peak_flops, bandwidth, request.price_per_hour_usd);
  e.weights_bytes = static_cast<double>(weights.total) * weights.bytes_per_weight;
  e.kv_cache_bytes = e.decode.kv_bytes;
  if (hardware.memory_bytes > 0.0) {
    e.fits = e.weights_bytes + e.kv_cache_bytes <= hardware.memory_bytes;
  }

  for (const auto& [name, phase] :
       {std::pair<const char*, const PhaseCost*>{"prefill", &e.prefill}, {"decode", &e.decode}}) {
    for (double value : {phase->compute_seconds, phase->memory_seconds, phase->roofline_seconds,
                         phase->tokens_per_second, phase->bytes_moved, phase->attention_flops,
                         phase->weight_flops}) {
      if (!std::isfinite(value)) {
        return absl::InvalidArgumentError(
            absl::StrCat("the ", name,
                         " estimate overflows double: the model, batch or hardware figures are "
                         "too large"));
      }
    }
    if (!std::isfinite(phase->usd_per_million_tokens)) {
      return absl::InvalidArgumentError(
          absl::StrCat("price_per_hour_usd: ", request.price_per_hour_usd, " makes the ", name,
                       " cost per million tokens overflow double"));
    }
  }

  // Attention per token grows with n (its pairs are convex in n), so "attention > weights" is
  // monotone in n and a binary search finds the first n.
  e.prefill_crossover_tokens = FirstTrue([&](int64_t n) {
    return PrefillAttentionFlops(m, n, causal) > 2.0 * p * static_cast<double>(n);
  });
  e.decode_crossover_tokens =
      FirstTrue([&](int64_t n) { return DecodeAttentionFlops(m, n) > 2.0 * p; });
  return e;
}

}  // namespace attend::planner
