// KV-cache capacity planning: bytes per token and per sequence, paged-block rounding, what fits
// in a memory budget, and the MHA / GQA / MQA comparison. Mirrors attend.v1.PlanKvCache.
//
// The cache of one layer for one token is n_head_kv x (row(head_dim) + row(head_dim_v)) bytes,
// where row(d) is StorageBytes(kv_dtype, d): d x 4/2/1 bytes, or whole 32-value blocks for q8_0
// (34 bytes) and q4_0 (18 bytes), so a head row that is not a multiple of 32 values is padded up
// to the next block. A sliding-window layer holds at most window_tokens tokens, so the bytes of a
// sequence are a piecewise-linear, non-decreasing function of its context:
//   bytes(n) = sum over layers of row_bytes(layer) x min(n, window(layer) or n).
//
// Paged, each layer is allocated whole blocks of block_tokens tokens, aligned at position 0; a
// block stays while any of its tokens is kept, as in attend's cache. A layer keeps positions
// [n - min(n, w), n), so it holds ceil(n / B) - floor(max(0, n - w) / B) blocks (w = the window,
// or n for full attention; B = block_tokens): past its window, one block more than w / B
// whenever the window does not start on a block boundary. Blocks, allocated bytes (blocks x
// block_tokens x row_bytes, summed over layers) and waste (allocated minus bytes(n)) come from
// that one count. Past a window the count alternates (a block is gained as n enters a new block,
// one released as the window's first token leaves one), so a sequence on its way to n may have
// needed more than it is allocated at n.
//
// Budget answers hold at every length on the way to the context: they size a sequence by the
// most it needs at any length up to it (unpaged, bytes(n); paged, the allocation just after its
// newest block was opened), and search that non-decreasing function exactly (binary search over
// the context), never dividing by one bytes-per-token figure.
//
// Layers of other kinds (model.h's LayerKind): a chunked layer (Llama 4) is sized as a window of
// its chunk, the most it holds (at a chunk's last token; (n - 1) mod chunk + 1 tokens at n). A
// latent layer (MLA) caches one row(kv_lora_rank + qk_rope_head_dim) per token, counted in the
// key half: the values are read from the same latent, as llama.cpp's V view of its K cache. A
// linear-attention or state-space layer caches nothing per token but holds a fixed state per
// sequence, row(conv_state_values) + row(recurrent_state_values) bytes in the state dtype (the
// request's, default the KV dtype), whatever the context. The state is part of every
// per-sequence figure (bytes_per_sequence, totals, budgets, the fleet) and is also reported on
// its own; it is not paged, since a sequence's state is one fixed allocation. A feed-forward
// layer holds nothing. Lightning-attention (MiniMax-M1) and Kimi-delta-attention (Kimi Linear)
// layers are recurrent like linear attention: their state is sized the same way.
//
// A latent layer with a sparse-attention indexer (index_head_dim > 0: DeepSeek-V3.2, GLM-5)
// also caches the indexer's key of every token, IndexerRowBytes(index_head_dim,
// request.indexer_dtype) bytes (132 for 128 values as published: fp8 values and one float32
// scale), beside its latent row. The indexer is a key cache, so it is counted in the key half;
// it is also reported on its own (indexer_bytes_*), and paged with the latent, in the same
// blocks.
//
// All byte counts are int64 with overflow checks; an input whose answer would overflow is
// INVALID_ARGUMENT.
//
// Thread-safety: pure functions.
#ifndef ATTEND_PLANNER_KV_PLAN_H_
#define ATTEND_PLANNER_KV_PLAN_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "planner/model.h"
#include "planner/parameter_counts.h"

namespace attend::planner {

inline constexpr int64_t kMaxBatch = int64_t{1} << 24;
inline constexpr int64_t kMaxBlockTokens = int64_t{1} << 20;

struct KvPlanRequest {
  KvDType kv_dtype = KvDType::kFloat16;
  // Type of the recurrent layers' state; default kv_dtype. Engines differ (llama.cpp keeps it in
  // float32, vLLM in the model's dtype unless told otherwise), so the plan says which it used.
  std::optional<KvDType> state_dtype;
  // Type of the sparse-attention indexer's cached keys; nullopt: as published (fp8 values plus
  // one float32 scale per 128, IndexerRowBytes). Engines that keep it in the KV type ask for
  // that type here.
  std::optional<KvDType> indexer_dtype;
  int64_t context_tokens = 0;  // per sequence; 0: the model's max_context_tokens
  int64_t batch = 1;           // concurrent sequences; 0: 1
  int64_t block_tokens = 0;    // paged allocation block; 0: no paging
  // Memory for the cache (and the weights when subtract_weights); 0: no budget answers.
  int64_t memory_budget_bytes = 0;
  bool subtract_weights = false;
  // Weight bytes to subtract; default: parameters x bytes per weight of weights_dtype.
  std::optional<int64_t> weights_bytes;
  std::string weights_dtype;  // default: the model's
  // Memory of one replica of a fleet (less the weights when subtract_weights); 0: no fleet
  // answer. The fleet is to hold `batch` sequences of context_tokens.
  int64_t replica_memory_bytes = 0;
};

struct PagedPlan {
  int64_t block_tokens = 0;
  // Blocks at context_tokens of the layer that holds the most: ceil(context / block_tokens) when
  // some layer attends fully; a sliding-window layer holds the blocks its last min(context,
  // window) tokens touch (see above), so a model whose layers all slide reports those.
  int64_t blocks_per_sequence = 0;
  // Every layer's blocks x block_tokens x its bytes per token, at context_tokens.
  int64_t allocated_bytes_per_sequence = 0;
  int64_t allocated_bytes = 0;  // whole batch
  int64_t waste_bytes = 0;      // allocated minus needed, whole batch
};

struct BudgetPlan {
  int64_t budget_bytes = 0;
  int64_t weights_bytes = 0;    // subtracted from the budget (0 unless subtract_weights)
  int64_t available_bytes = 0;  // for the cache; negative when the weights alone do not fit
  // batch sequences of context_tokens fit, at every length on the way (with paging and sliding
  // windows a sequence may need a block per windowed layer more on the way than at the end).
  bool fits = false;
  // Longest context `batch` sequences, and one sequence, can grow to (0 when not even one token
  // fits). With paging, allocations are whole blocks.
  int64_t max_context_tokens = 0;
  int64_t max_context_tokens_one_sequence = 0;
  // Every layer is windowed and the full-window cache fits: the cache stops growing, so memory
  // never limits the context. max_context_tokens is then kMaxContextTokens.
  bool context_unbounded = false;
  int64_t max_sequences = 0;  // most sequences that can grow to context_tokens
  std::string explanation;    // the answer in words, incl. why not even one fits and what would
};

// How many replicas hold the batch when a consistent-hash proxy places sequences (planner/fleet.h:
// sized so that the busiest replica fits in 99% of fleets).
struct FleetPlan {
  int64_t replica_memory_bytes = 0;
  int64_t weights_bytes = 0;                // per replica (0 unless subtract_weights)
  int64_t available_bytes_per_replica = 0;  // for the cache; negative when the weights exceed it
  int64_t sequences_per_replica = 0;        // of context_tokens, at every length on the way
  int64_t even_replicas = 0;                // if sequences were spread evenly
  int64_t replicas = 0;                     // 0: no replica count works (see explanation)
  int64_t busiest_replica_sequences = 0;    // at `replicas`, 99th percentile
  double mean_sequences_per_replica = 0.0;  // batch / replicas
  std::string explanation;
};

struct VariantRow {
  std::string variant;  // "MHA", "GQA", "MQA"
  int64_t n_head_kv = 0;
  int64_t group_size = 0;  // query heads per key/value head
  int64_t bytes_per_token = 0;
  int64_t bytes_per_sequence = 0;  // at context_tokens
  bool is_model = false;           // the model's own (uniform) KV head count
};

// The layers that share one LayerSpec, in the order of their first layer.
struct LayerGroupPlan {
  LayerSpec layer;  // canonical
  std::vector<int64_t> layer_indices;
  int64_t bytes_per_token = 0;  // one layer, while within its window or chunk
  // One layer, if a latent layer cached its n_head_kv expanded heads (the multi-head form);
  // bytes_per_token for the other kinds.
  int64_t expanded_bytes_per_token = 0;
  int64_t state_bytes_per_sequence = 0;  // one layer
  int64_t bytes_per_sequence = 0;        // every layer of the group, at context_tokens, state too
  int64_t indexer_bytes_per_token = 0;   // one layer's indexer part of bytes_per_token
};

struct KvPlan {
  ModelSpec model;  // canonical
  KvDType kv_dtype = KvDType::kFloat16;
  KvDType state_dtype = KvDType::kFloat16;  // after the default
  std::optional<KvDType> indexer_dtype;     // the request's (nullopt: as published)
  int64_t context_tokens = 0;               // after defaults
  int64_t batch = 0;
  double bytes_per_value = 0.0;
  // Bytes one token adds while the context is within every window (all layers grow).
  int64_t bytes_per_token = 0;
  // Bytes one token adds once every window is full (full-attention layers only).
  int64_t full_attention_bytes_per_token = 0;
  int64_t bytes_per_sequence = 0;  // at context_tokens, the state included
  int64_t total_bytes = 0;         // bytes_per_sequence x batch
  // The recurrent layers' state: its part of bytes_per_sequence and of total_bytes.
  int64_t state_bytes_per_sequence = 0;
  int64_t state_total_bytes = 0;
  // bytes_per_token if every latent layer cached its expanded heads; equal to it without them.
  int64_t expanded_bytes_per_token = 0;
  std::vector<LayerGroupPlan> layer_groups;
  // The key and value halves of bytes_per_token, bytes_per_sequence and total_bytes, as
  // llama.cpp reports "K (f16): 2.00 MiB, V (f16): 2.00 MiB". A half is every layer's
  // n_head_kv x row(head_dim) (keys) or row(head_dim_v) (values) x the tokens it keeps, with the
  // same windows as the total, so they differ only when head_dim_v != head_dim. Block formats
  // pad each head row of each half to whole blocks, which is how the total is counted too, so
  // the halves always sum exactly to the KV part of the total (the total less the state).
  int64_t k_bytes_per_token = 0;
  int64_t v_bytes_per_token = 0;
  int64_t k_bytes_per_sequence = 0;
  int64_t v_bytes_per_sequence = 0;
  int64_t k_total_bytes = 0;
  int64_t v_total_bytes = 0;
  // The sparse-attention indexers' part of the key half (0 without indexers), and how it is
  // stored: "fp8 + float32 scale per 128 values" or a DTypeName.
  int64_t indexer_bytes_per_token = 0;
  int64_t indexer_bytes_per_sequence = 0;
  int64_t indexer_total_bytes = 0;
  std::string indexer_format;
  // Wq, Wk, Wv and Wo of one layer per distinct n_head_kv (planner/parameter_counts.h); empty
  // when d_model is unknown.
  std::vector<LayerProjectionKind> projections;
  std::optional<PagedPlan> paged;    // when block_tokens > 0
  std::optional<BudgetPlan> budget;  // when memory_budget_bytes > 0
  std::optional<FleetPlan> fleet;    // when replica_memory_bytes > 0
  std::vector<VariantRow> variants;  // MHA, GQA, MQA for the same shape
};

// Plans the cache of `model` for `request`. INVALID_ARGUMENT for an invalid model (see
// CanonicalModel), negative or over-limit request fields (context <= kMaxContextTokens, batch
// <= kMaxBatch, block_tokens <= kMaxBlockTokens), a context of 0 for a model without
// max_context_tokens, weights that cannot be sized (no dtype and no weights_bytes, or no
// parameter count), and answers that overflow int64.
//
// The variant rows replace every KV layer's n_head_kv by n_head (MHA), the model's n_head_kv
// (GQA; for a multi-head or multi-query model, n_head / g for the smallest group size g >= 4
// that divides n_head, else the smallest g >= 2; omitted when n_head has no proper divisor) and
// 1 (MQA), keeping the windows, the state and the indexers; a latent layer counts as expanded
// heads there, so the MHA row of an MLA model is its multi-head cache. No rows for a model without
// KV layers.
absl::StatusOr<KvPlan> PlanKvCache(const ModelSpec& model, const KvPlanRequest& request);

// Bytes the cache of one sequence of `context_tokens` needs (block_tokens 0) or is allocated at
// that length (block_tokens > 0: whole blocks per KV layer, as above), the state of recurrent
// layers (in `state_dtype`, default kv_dtype) included. INVALID_ARGUMENT for an invalid model or
// context, or on overflow.
// Indexers are counted as published (IndexerRowBytes with no dtype).
absl::StatusOr<int64_t> KvBytesPerSequence(const ModelSpec& model, KvDType kv_dtype,
                                           int64_t context_tokens, int64_t block_tokens = 0,
                                           std::optional<KvDType> state_dtype = std::nullopt);
// The state part of that: every recurrent layer's state of one sequence in `state_dtype`.
absl::StatusOr<int64_t> StateBytesPerSequence(const ModelSpec& model, KvDType state_dtype);

// Weight bytes of `parameters` stored as `dtype` (a DTypeName or alias); block formats round up
// to whole blocks over the whole count. INVALID_ARGUMENT on a bad dtype, negative count or
// overflow.
absl::StatusOr<int64_t> WeightsBytes(int64_t parameters, absl::string_view dtype);

}  // namespace attend::planner

#endif  // ATTEND_PLANNER_KV_PLAN_H_
