// The cost model of a prefill and a decode step: FLOPs for attention and for the weight
// matmuls, bytes moved, arithmetic intensity and the roofline time on a hardware profile, and
// the context length at which attention overtakes the weights. Mirrors attend.v1.EstimateCost.
//
// Counting rules (the lessons' Example 12, extended):
//   - Attention: each (query, key) pair costs 2 x d_k FLOPs for the score and 2 x d_v for the
//     weighted value, per query head per layer (4 x d_head when d_k = d_v). Softmax is not
//     counted.
//   - Pairs per layer for a prompt of n tokens: n(n+1)/2 causal, n^2 non-causal. A causal
//     sliding-window layer (window w) lets token i see min(i, w) keys: n(n+1)/2 while n <= w,
//     then w(w+1)/2 + (n - w) w. Non-causal with a window counts the pairs with |i - j| < w:
//     n + (w - 1)(2n - w) when w < n. A decode step at context c (keys in the cache, the new
//     token's included) has c pairs, min(c, w) on a windowed layer.
//   - Other layer kinds (model.h): a chunked layer (chunk C) lets token i see the i mod C + 1
//     tokens of its chunk, so a prefill of n = kC + r costs k C(C+1)/2 + r(r+1)/2 pairs causal
//     (k C^2 + r^2 non-causal), and a decode step is counted at min(c, C) pairs, the most it
//     sees (at a chunk's last token), which keeps the crossover search monotone. A latent layer
//     (MLA) computes a prefill in the expanded form (head_dim / head_dim_v per query head, as
//     above) and a decode step in the absorbed form that reads the cached latent: 2 x
//     (kv_lora_rank + qk_rope_head_dim) FLOPs for the score and 2 x kv_lora_rank for the mix,
//     per query head per pair (DeepSeek-V2's paper, section 2.1.3; vLLM's MLA backend does the
//     same). Linear-attention and state-space layers have no pairs: their recurrence costs a few
//     FLOPs per state value per token, not counted, as softmax is not.
//   - Weights: 2 x P FLOPs per token, P = the model's active parameters or the request's.
//   - Bytes: a prefill reads the weights once and writes the prompt's KV cache and each
//     sequence's state; a decode step reads the weights once, the whole KV cache of every
//     sequence, and reads and writes back every sequence's state (the recurrence updates all of
//     it each token). For a mixture of experts
//     the weights read are the shared part plus min(experts, tokens x experts_active) experts (an
//     upper bound: the batch's tokens may share experts). Activations are not counted.
//   - Memory: the weights (all of them, every expert) plus the cache (KV and state) of batch x
//     context tokens must fit in the hardware's memory; activations and workspace are not counted.
//   - Roofline: time = max(FLOPs / peak, bytes / bandwidth), and the larger term is the bound.
//     Doubles throughout (FLOP counts reach 10^18 and beyond).
//
// Thread-safety: pure functions.
#ifndef ATTEND_PLANNER_COST_H_
#define ATTEND_PLANNER_COST_H_

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "planner/hardware.h"
#include "planner/kv_plan.h"  // kMaxBatch
#include "planner/model.h"

namespace attend::planner {

struct CostRequest {
  int64_t prompt_tokens = 0;   // prefill length per sequence; 0: no prefill phase
  int64_t context_tokens = 0;  // cache length at the decode step; 0: prompt_tokens
  int64_t batch = 1;           // sequences; 0: 1
  bool non_causal = false;     // count n^2 prefill pairs instead of n(n+1)/2
  std::string compute_dtype;   // "bfloat16" (default; also "float16"), "float32", "fp8"/"int8"
  KvDType kv_dtype = KvDType::kFloat16;
  std::optional<KvDType> state_dtype;  // recurrent layers' state; default kv_dtype
  std::string weights_dtype;           // default: the model's
  std::optional<int64_t> parameters;   // P; default: the model's active parameters (dense)
  double price_per_hour_usd = 0.0;
};

// Mirrors attend.v1.PhaseCost, for the whole batch.
struct PhaseCost {
  double attention_flops = 0.0;
  double weight_flops = 0.0;
  double weight_bytes = 0.0;          // weights read
  double kv_bytes = 0.0;              // cache written (prefill) or read (decode), state too
  double state_bytes = 0.0;           // the state's part of kv_bytes
  double bytes_moved = 0.0;           // weight_bytes + kv_bytes
  double arithmetic_intensity = 0.0;  // FLOPs per byte
  double compute_seconds = 0.0;       // FLOPs / peak
  double memory_seconds = 0.0;        // bytes / bandwidth
  double roofline_seconds = 0.0;      // max of the two
  std::string bound;                  // "compute", "memory", or "" for an empty phase
  double tokens_per_second = 0.0;     // prefill: prompt tokens; decode: generated tokens
  double usd_per_million_tokens = 0.0;
};

struct CostEstimate {
  ModelSpec model;  // canonical
  HardwareProfile hardware;
  int64_t prompt_tokens = 0;  // after defaults
  int64_t context_tokens = 0;
  int64_t batch = 0;
  int64_t parameters = 0;     // P used for weight FLOPs
  std::string compute_dtype;  // canonical name
  double peak_flops = 0.0;    // the hardware peak for compute_dtype
  PhaseCost prefill;          // the whole prompt for the batch
  PhaseCost decode;           // one step for the batch
  // Shortest prompt whose prefill attention FLOPs exceed its weight FLOPs, and shortest context
  // at which a decode step's do; 0 when that never happens within kMaxContextTokens (every
  // layer windowed).
  int64_t prefill_crossover_tokens = 0;
  int64_t decode_crossover_tokens = 0;
  // What must stay resident: every weight (all experts) in weights_dtype, and the KV cache of
  // batch x context_tokens in kv_dtype. `fits` says whether their sum is at most
  // hardware.memory_bytes; nullopt when that is unknown (0).
  double weights_bytes = 0.0;
  double kv_cache_bytes = 0.0;  // KV and state
  double state_bytes = 0.0;     // the state's part of kv_cache_bytes
  std::optional<bool> fits;
};

// INVALID_ARGUMENT for an invalid model or hardware profile, negative or over-limit counts
// (tokens <= kMaxContextTokens, batch <= kMaxBatch), neither prompt nor context given, an
// unknown dtype, a compute dtype the hardware has no peak for, an unknown weights dtype or
// parameter count, or a negative / non-finite price.
absl::StatusOr<CostEstimate> EstimateCost(const ModelSpec& model, const CostRequest& request,
                                          const HardwareProfile& hardware);

// Attention pairs of one layer for a prompt of n tokens (see above); window 0 = full.
double PrefillPairs(int64_t n, int64_t window, bool causal);
// The same for a chunked layer of `chunk` tokens (>= 1).
double ChunkedPrefillPairs(int64_t n, int64_t chunk, bool causal);
// Attention FLOPs of one sequence's prefill of n tokens, and of one decode step at context n,
// summed over layers and heads. REQUIRES: `model` is canonical, n >= 0.
double PrefillAttentionFlops(const ModelSpec& model, int64_t n, bool causal);
double DecodeAttentionFlops(const ModelSpec& model, int64_t n);

}  // namespace attend::planner

#endif  // ATTEND_PLANNER_COST_H_
