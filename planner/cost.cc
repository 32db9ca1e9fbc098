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

// FLOPs per attention pair of layer `layer`: every query head scores (2 d_k) and mixes (2 d_v);
// a latent layer's decode scores against the latent and mixes within it (cost.h). 0 for layers
// without KV.
double FlopsPerPair(const ModelSpec& m, int64_t layer, bool decode) {
  const LayerKind kind = LayerKindOf(m, layer);
  if (!HoldsKv(kind)) return 0.0;
  const double heads = static_cast<double>(m.n_head);
  if (kind == LayerKind::kLatentAttention && decode) {
    const LayerSpec& l = m.layer_specs[static_cast<size_t>(layer)];
    return 2.0 * static_cast<double>(2 * l.kv_lora_rank + l.qk_rope_head_dim) * heads;
  }
  return 2.0 * static_cast<double>(m.head_dim + m.head_dim_v) * heads;
}

// `kv_bytes` is the cache traffic, `state_bytes` the state's part of it.
PhaseCost Phase(double attention_flops, double weight_flops, double weight_bytes, double kv_bytes,
                double state_bytes, double tokens, double peak_flops, double bandwidth,
                double price_per_hour) {
  PhaseCost p;
  if (tokens <= 0.0) return p;
  p.attention_flops = attention_flops;
  p.weight_flops = weight_flops;
  p.weight_bytes = weight_bytes;
  p.kv_bytes = kv_bytes;
  p.state_bytes = state_bytes;
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

double ChunkedPrefillPairs(int64_t n, int64_t chunk, bool causal) {
  const double full = static_cast<double>(n / chunk);
  const double c = static_cast<double>(chunk);
  const double r = static_cast<double>(n % chunk);
  if (causal) return full * c * (c + 1.0) / 2.0 + r * (r + 1.0) / 2.0;
  return full * c * c + r * r;
}

double PrefillAttentionFlops(const ModelSpec& model, int64_t n, bool causal) {
  double flops = 0.0;
  for (int64_t layer = 0; layer < model.layers; ++layer) {
    const double per_pair = FlopsPerPair(model, layer, /*decode=*/false);
    if (per_pair == 0.0) continue;
    const int64_t window = LayerWindow(model, layer);
    const double pairs = LayerKindOf(model, layer) == LayerKind::kChunkedAttention
                             ? ChunkedPrefillPairs(n, window, causal)
                             : PrefillPairs(n, window, causal);
    flops += per_pair * pairs;
  }
  return flops;
}

double DecodeAttentionFlops(const ModelSpec& model, int64_t n) {
  double flops = 0.0;
  for (int64_t layer = 0; layer < model.layers; ++layer) {
    const int64_t window = LayerWindow(model, layer);
    flops += FlopsPerPair(model, layer, /*decode=*/true) *
             static_cast<double>(window > 0 ? std::min(n, window) : n);
  }
  return flops;
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
  const KvDType state_dtype = request.state_dtype.value_or(request.kv_dtype);
  ATTEND_ASSIGN_OR_RETURN(const int64_t state_one, StateBytesPerSequence(m, state_dtype));
  const double state = batch * static_cast<double>(state_one);
  if (e.prompt_tokens > 0) {
    ATTEND_ASSIGN_OR_RETURN(
        const int64_t cache_one,
        KvBytesPerSequence(m, request.kv_dtype, e.prompt_tokens, 0, state_dtype));
    const double tokens = batch * static_cast<double>(e.prompt_tokens);
    e.prefill = Phase(batch * PrefillAttentionFlops(m, e.prompt_tokens, causal), 2.0 * p * tokens,
                      weights.BytesRead(tokens), batch * static_cast<double>(cache_one), state,
                      tokens, e.peak_flops, bandwidth, request.price_per_hour_usd);
  }
  ATTEND_ASSIGN_OR_RETURN(
      const int64_t cache_one,
      KvBytesPerSequence(m, request.kv_dtype, e.context_tokens, 0, state_dtype));
  const double resident = batch * static_cast<double>(cache_one);
  // A decode step reads the whole cache and writes the updated state back.
  e.decode = Phase(batch * DecodeAttentionFlops(m, e.context_tokens), 2.0 * p * batch,
                   weights.BytesRead(batch), resident + state, 2.0 * state, batch, e.peak_flops,
                   bandwidth, request.price_per_hour_usd);
  e.weights_bytes = static_cast<double>(weights.total) * weights.bytes_per_weight;
  e.kv_cache_bytes = resident;
  e.state_bytes = state;
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
