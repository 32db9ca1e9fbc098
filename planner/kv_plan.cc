#include "planner/kv_plan.h"

#include <algorithm>
#include <map>
#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/base/status_macros.h"
#include "core/base/tensor.h"
#include "planner/fleet.h"

namespace attend::planner {
namespace {

// Layers that cache the same bytes per token with the same window and hold the same state,
// counted together so that a context costs O(distinct layer kinds) to evaluate, not O(layers).
struct LayerGroup {
  int64_t row_bytes = 0;    // one layer, one token: n_head_kv x (row(d_k) + row(d_v)), or latent
  int64_t window = 0;       // 0: full attention (or no KV)
  int64_t fixed_bytes = 0;  // one layer, one sequence: its state, whatever the context
  int64_t layers = 0;
};

// Which cached rows a LayerGroup counts: both (the cache), only the keys (indexers included) or
// the values, or only the indexers' keys.
enum class KvHalf { kBoth, kKeys, kValues, kIndexer };

struct GroupOptions {
  int64_t kv_override = 0;  // > 0: every KV layer's n_head_kv, latent layers expanded
  KvHalf half = KvHalf::kBoth;
  bool expand_latent = false;            // latent layers as their n_head_kv expanded heads
  std::optional<KvDType> indexer_dtype;  // nullopt: as published (IndexerRowBytes)
};

// A latent layer's indexer bytes per token under `o`. REQUIRES: canonical `l` (index_head_dim
// <= kMaxHeadDim, so no overflow).
int64_t IndexerBytes(const LayerSpec& l, const GroupOptions& o) {
  if (l.kind != LayerKind::kLatentAttention || l.index_head_dim == 0) return 0;
  if (o.half == KvHalf::kValues) return 0;
  return *IndexerRowBytes(l.index_head_dim, o.indexer_dtype);
}

// One layer's bytes per token and its fixed state bytes. REQUIRES: canonical `l`, rows that
// StorageBytes could size (checked by GroupLayers).
std::pair<int64_t, int64_t> LayerBytes(const LayerSpec& l, KvDType dtype, KvDType state_dtype,
                                       int64_t k_row, int64_t v_row, const GroupOptions& o) {
  if (HoldsState(l.kind)) {
    // A state is neither half of the key/value rows: the halves carry no fixed bytes.
    if (o.half != KvHalf::kBoth) return {0, 0};  // nor an indexer
    // Bounded by CanonicalModel: 2 x 2^36 values x 4 bytes.
    return {0, *StorageBytes(state_dtype, l.conv_state_values) +
                   *StorageBytes(state_dtype, l.recurrent_state_values)};
  }
  if (!HoldsKv(l.kind)) return {0, 0};
  const int64_t indexer = IndexerBytes(l, o);  // <= 65536 x 4 + scales
  if (o.half == KvHalf::kIndexer) return {indexer, 0};
  if (l.kind == LayerKind::kLatentAttention && o.kv_override == 0 && !o.expand_latent) {
    // <= 2 x 65536 values x 4 bytes.
    return {
        (o.half == KvHalf::kValues ? 0
                                   : *StorageBytes(dtype, l.kv_lora_rank + l.qk_rope_head_dim)) +
            indexer,
        0};
  }
  const int64_t kv = o.kv_override > 0 ? o.kv_override : l.n_head_kv;
  const int64_t k = o.half == KvHalf::kValues ? 0 : k_row;
  const int64_t v = o.half == KvHalf::kKeys ? 0 : v_row;
  // Bounded by CanonicalModel: 65536 heads x 2 x 65536 values x 4 bytes = 2^35.
  return {kv * (k + v) + indexer, 0};
}

// REQUIRES: `model` is canonical.
absl::StatusOr<std::vector<LayerGroup>> GroupLayers(const ModelSpec& model, KvDType dtype,
                                                    KvDType state_dtype,
                                                    const GroupOptions& options = {}) {
  const std::optional<int64_t> k_row = StorageBytes(dtype, model.head_dim);
  const std::optional<int64_t> v_row = StorageBytes(dtype, model.head_dim_v);
  if (!k_row || !v_row) return absl::InvalidArgumentError("head row bytes overflow int64");
  // (row bytes, window, fixed bytes) -> layers
  std::map<std::tuple<int64_t, int64_t, int64_t>, int64_t> counts;
  for (int64_t layer = 0; layer < model.layers; ++layer) {
    const LayerSpec l = model.layer_specs.empty() ? LayerSpec{model.n_head_kv, 0}
                                                  : model.layer_specs[static_cast<size_t>(layer)];
    const auto [row, fixed] = LayerBytes(l, dtype, state_dtype, *k_row, *v_row, options);
    ++counts[{row, HoldsKv(l.kind) ? l.window_tokens : 0, fixed}];
  }
  std::vector<LayerGroup> groups;
  for (const auto& [key, layers] : counts) {
    groups.push_back({std::get<0>(key), std::get<1>(key), std::get<2>(key), layers});
  }
  return groups;
}

// Blocks of `block_tokens` tokens that a layer with `window` (0: full attention) holds at
// `context`. It keeps the last min(context, window) tokens, positions [context - window,
// context) once the window is full; blocks are aligned at position 0 and one stays while any of
// its tokens is kept (attend's cache releases only blocks wholly before the first position a
// query can see), so the kept tokens touch blocks floor((context - window) / block_tokens) to
// floor((context - 1) / block_tokens): one block more than window / block_tokens whenever the
// window does not start on a block boundary. REQUIRES: block_tokens >= 1.
int64_t LayerBlocks(int64_t context, int64_t window, int64_t block_tokens) {
  const int64_t end = (context + block_tokens - 1) / block_tokens;  // one past the last block
  if (window == 0 || context <= window) return end;
  return end - (context - window) / block_tokens;
}

// Token slots a layer is allocated at `context`: the tokens it keeps, or with paging its whole
// blocks (at most context + block_tokens, so no overflow).
int64_t LayerSlots(int64_t context, int64_t window, int64_t block_tokens) {
  if (block_tokens == 0) return window > 0 ? std::min(context, window) : context;
  return LayerBlocks(context, window, block_tokens) * block_tokens;
}

// Bytes one sequence is allocated at `context`: every layer's slots (LayerSlots) x its bytes
// per token. nullopt on overflow.
std::optional<int64_t> SequenceBytes(const std::vector<LayerGroup>& groups, int64_t context,
                                     int64_t block_tokens) {
  int64_t total = 0;
  for (const LayerGroup& g : groups) {
    // Layers without KV hold no blocks: paging applies to KV layers only.
    const int64_t slots = g.row_bytes > 0 ? LayerSlots(context, g.window, block_tokens) : 0;
    std::optional<int64_t> bytes = CheckedMul(g.row_bytes, g.layers);
    if (bytes) bytes = CheckedMul(*bytes, slots);
    if (bytes) bytes = CheckedAdd(*bytes, g.fixed_bytes * g.layers);  // <= 4096 x 2^39
    if (bytes) bytes = CheckedAdd(total, *bytes);
    if (!bytes) return std::nullopt;
    total = *bytes;
  }
  return total;
}

// The most one sequence is allocated at any context up to `context`: a sequence grows through
// every shorter context, so this, not the allocation at `context`, is what must fit. Unpaged,
// and for full-attention layers, the allocation never shrinks. A paged sliding-window layer past
// its window gains a block when the context enters a new block and loses one when the window's
// first token leaves one, so its count alternates between two values.
//
// Blocks are aligned at position 0 in every layer, so all layers gain their blocks at the same
// contexts, c = k x block_tokens + 1, and in between only lose them. The allocation is therefore
// largest just after the newest block is opened, at ((context - 1) / block_tokens) x
// block_tokens + 1: from there to `context` no layer gains a block, and any earlier context c
// needs at most what c + block_tokens does (one block more within a window, the same past it),
// which brings it into the previous block's span, where the same argument holds. nullopt on
// overflow.
std::optional<int64_t> PeakSequenceBytes(const std::vector<LayerGroup>& groups, int64_t context,
                                         int64_t block_tokens) {
  if (block_tokens == 0 || context == 0) return SequenceBytes(groups, context, block_tokens);
  const int64_t newest_block_opened = (context - 1) / block_tokens * block_tokens + 1;
  return SequenceBytes(groups, newest_block_opened, block_tokens);
}

int64_t BytesPerToken(const std::vector<LayerGroup>& groups, bool full_attention_only) {
  int64_t total = 0;
  for (const LayerGroup& g : groups) {
    if (full_attention_only && g.window > 0) continue;
    total += g.row_bytes * g.layers;  // <= 4096 layers x 2^35: no overflow
  }
  return total;
}

// Whether `batch` sequences fit in `available` bytes at every context up to `context`
// (overflow: no).
bool Fits(const std::vector<LayerGroup>& groups, int64_t context, int64_t block_tokens,
          int64_t batch, int64_t available) {
  std::optional<int64_t> bytes = PeakSequenceBytes(groups, context, block_tokens);
  if (bytes) bytes = CheckedMul(*bytes, batch);
  return bytes && *bytes <= available;
}

// Longest context in [0, kMaxContextTokens] to which `batch` sequences can grow; -1 when even an
// empty cache does not fit (available < 0). The most a sequence needs on the way
// (PeakSequenceBytes) is non-decreasing in the context, so a binary search is exact, also across
// the kinks where windows fill up and where paged windows alternate between block counts.
int64_t MaxContext(const std::vector<LayerGroup>& groups, int64_t block_tokens, int64_t batch,
                   int64_t available) {
  if (!Fits(groups, 0, block_tokens, batch, available)) return -1;
  if (Fits(groups, kMaxContextTokens, block_tokens, batch, available)) return kMaxContextTokens;
  int64_t lo = 0, hi = kMaxContextTokens;  // fits(lo), !fits(hi)
  while (hi - lo > 1) {
    const int64_t mid = lo + (hi - lo) / 2;
    if (Fits(groups, mid, block_tokens, batch, available)) {
      lo = mid;
    } else {
      hi = mid;
    }
  }
  return lo;
}

std::string Bytes(int64_t bytes) {
  if (bytes < 1024) return FormatBytes(bytes);
  return absl::StrCat(FormatBytes(bytes), " (", FormatCount(bytes), " bytes)");
}

std::string Sequences(int64_t n) { return absl::StrCat(n, n == 1 ? " sequence" : " sequences"); }

absl::Status CheckRequestField(absl::string_view field, int64_t value, int64_t hi) {
  if (value < 0 || value > hi) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": ", value, "; must be in [0, ", hi, "]"));
  }
  return absl::OkStatus();
}

// The GQA row's KV head count for a model that is not itself GQA; 0 when n_head has no proper
// divisor.
int64_t DefaultGqaHeads(int64_t n_head) {
  for (int64_t min_group : {int64_t{4}, int64_t{2}}) {
    for (int64_t g = min_group; g < n_head; ++g) {
      if (n_head % g == 0) return n_head / g;
    }
  }
  return 0;
}

// The weight bytes a budget loses: 0 unless subtract_weights; then weights_bytes, or the
// model's parameters in weights_dtype (else the model's own).
absl::StatusOr<int64_t> WeightsToSubtract(const ModelSpec& m, const KvPlanRequest& request) {
  if (!request.subtract_weights) return 0;
  if (request.weights_bytes.has_value()) {
    if (*request.weights_bytes < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("weights_bytes: ", *request.weights_bytes, "; must be >= 0"));
    }
    return *request.weights_bytes;
  }
  const std::string dtype = request.weights_dtype.empty() ? m.weights_dtype : request.weights_dtype;
  if (dtype.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("weights_dtype: unknown for model ", QuoteForError(m.name),
                     "; give weights_dtype or weights_bytes to subtract the weights"));
  }
  if (m.parameters <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("parameters: unknown for model ",
                                                   QuoteForError(m.name),
                                                   "; give weights_bytes to subtract the weights"));
  }
  return WeightsBytes(m.parameters, dtype);
}

// The fleet of replicas of `request.replica_memory_bytes` each that holds `batch` sequences,
// each needing `bytes_one_sequence` on its way to `context`.
absl::StatusOr<FleetPlan> PlanFleet(const ModelSpec& m, const KvPlanRequest& request,
                                    int64_t context, int64_t batch, int64_t bytes_one_sequence) {
  FleetPlan f;
  f.replica_memory_bytes = request.replica_memory_bytes;
  ATTEND_ASSIGN_OR_RETURN(f.weights_bytes, WeightsToSubtract(m, request));
  f.available_bytes_per_replica = f.replica_memory_bytes - f.weights_bytes;
  const std::string what = absl::StrCat(Sequences(batch), " of ", FormatCount(context), " tokens");
  if (f.available_bytes_per_replica < 0) {
    f.explanation = absl::StrCat(
        "The weights (", Bytes(f.weights_bytes), ") alone exceed a replica's memory by ",
        Bytes(-f.available_bytes_per_replica), ": no replica holds a sequence.");
    return f;
  }
  if (f.available_bytes_per_replica < bytes_one_sequence) {
    f.explanation = absl::StrCat(
        "Not even one sequence of ", FormatCount(context), " tokens fits a replica: one needs ",
        Bytes(bytes_one_sequence), " and a replica has ", Bytes(f.available_bytes_per_replica),
        f.weights_bytes > 0 ? absl::StrCat(" after ", Bytes(f.weights_bytes), " of weights") : "",
        ".");
    return f;
  }
  f.sequences_per_replica = f.available_bytes_per_replica / bytes_one_sequence;
  const FleetSizing sizing = SizeFleet(batch, f.sequences_per_replica);
  f.even_replicas = sizing.even_replicas;
  f.replicas = sizing.replicas;
  f.busiest_replica_sequences = sizing.busiest_sequences;
  const std::string per_replica =
      absl::StrCat("A replica's ", FormatBytes(f.available_bytes_per_replica),
                   f.weights_bytes > 0 ? " left after the weights" : "", " hold ",
                   Sequences(f.sequences_per_replica), " of ", FormatCount(context), " tokens. ");
  if (f.replicas == 0) {
    f.explanation = absl::StrCat(
        per_replica, what, " would need ", f.even_replicas,
        " replicas if spread evenly, but consistent hashing cannot keep the busiest replica "
        "within ",
        Sequences(f.sequences_per_replica), " at any count up to ", kMaxReplicas,
        ": give each replica room for more sequences.");
    return f;
  }
  f.mean_sequences_per_replica = static_cast<double>(batch) / static_cast<double>(f.replicas);
  absl::StrAppend(&f.explanation, per_replica, what, " need ", f.replicas,
                  f.replicas == 1 ? " replica" : " replicas");
  if (f.replicas > f.even_replicas) {
    absl::StrAppend(
        &f.explanation, " (", f.even_replicas, " if spread evenly): the proxy's consistent hash (",
        kRingPointsPerReplica, " ring points per replica) puts up to ", f.busiest_replica_sequences,
        " on the busiest replica against a mean of ",
        absl::StrFormat("%.1f", f.mean_sequences_per_replica), " (",
        absl::StrFormat("%.2f", f.busiest_replica_sequences / f.mean_sequences_per_replica),
        "x) in 99 of 100 fleets");
  }
  absl::StrAppend(&f.explanation, ".");
  return f;
}

// `bytes_one_sequence` is the most one sequence needs on its way to `context`
// (PeakSequenceBytes), `bytes_at_context` what it is allocated at `context`.
absl::StatusOr<BudgetPlan> PlanBudget(const ModelSpec& m, const KvPlanRequest& request,
                                      const std::vector<LayerGroup>& groups, int64_t context,
                                      int64_t batch, int64_t block_tokens,
                                      int64_t bytes_one_sequence, int64_t bytes_at_context) {
  BudgetPlan b;
  b.budget_bytes = request.memory_budget_bytes;
  ATTEND_ASSIGN_OR_RETURN(b.weights_bytes, WeightsToSubtract(m, request));
  b.available_bytes = b.budget_bytes - b.weights_bytes;  // both in [0, INT64_MAX]: no overflow

  std::string words;
  if (request.subtract_weights) {
    words = absl::StrCat("Weights take ", Bytes(b.weights_bytes), " of the ", Bytes(b.budget_bytes),
                         " budget. ");
  }
  if (b.available_bytes < 0) {
    b.explanation = absl::StrCat(words, "The weights alone exceed the budget by ",
                                 Bytes(-b.available_bytes), ": there is no room for any cache.");
    return b;
  }
  const int64_t need = bytes_one_sequence * batch;  // checked by the caller
  b.fits = need <= b.available_bytes;
  b.max_sequences = b.available_bytes / bytes_one_sequence;  // bytes_one_sequence >= 1
  // -1 (not even an empty cache fits) when the state alone of the sequences does not fit.
  b.max_context_tokens =
      std::max<int64_t>(0, MaxContext(groups, block_tokens, batch, b.available_bytes));
  b.max_context_tokens_one_sequence =
      std::max<int64_t>(0, MaxContext(groups, block_tokens, 1, b.available_bytes));
  const bool all_windowed = BytesPerToken(groups, /*full_attention_only=*/true) == 0;
  b.context_unbounded = all_windowed && b.max_context_tokens == kMaxContextTokens;

  const std::string what = absl::StrCat(Sequences(batch), " of ", FormatCount(context), " tokens");
  const char* const verb = batch == 1 ? " needs " : " need ";
  const std::string longest =
      b.context_unbounded ? "any context"
                          : absl::StrCat("up to ", FormatCount(b.max_context_tokens), " tokens");
  if (b.fits) {
    absl::StrAppend(&words, what, verb, Bytes(need), " of the ", Bytes(b.available_bytes),
                    " available: it fits, with ", Bytes(b.available_bytes - need),
                    " to spare. At most ", Sequences(b.max_sequences), " of ", FormatCount(context),
                    " tokens fit, or ", Sequences(batch), " of ", longest, ".");
  } else if (b.max_sequences >= 1) {
    absl::StrAppend(&words, what, verb, Bytes(need), " but only ", Bytes(b.available_bytes),
                    " is available: it does not fit. ", Sequences(b.max_sequences), " of ",
                    FormatCount(context), " tokens fit, or ", Sequences(batch), " of ", longest,
                    ".");
  } else if (b.max_context_tokens_one_sequence > 0) {
    absl::StrAppend(&words, "Not even one sequence of ", FormatCount(context),
                    " tokens fits: one needs ", Bytes(bytes_one_sequence), " and ",
                    Bytes(b.available_bytes),
                    " is available. The longest context one sequence "
                    "can hold is ",
                    FormatCount(b.max_context_tokens_one_sequence), " tokens.");
  } else {
    absl::StrAppend(&words, "Not even one token fits: one token of one sequence needs ",
                    Bytes(SequenceBytes(groups, 1, block_tokens).value_or(0)), " and ",
                    Bytes(b.available_bytes), " is available.");
  }
  if (bytes_one_sequence > bytes_at_context) {
    absl::StrAppend(&words, " With ", FormatCount(block_tokens), "-token blocks one sequence is ",
                    "allocated ", Bytes(bytes_at_context), " at ", FormatCount(context),
                    " tokens but up to ", Bytes(bytes_one_sequence),
                    " on the way (a sliding window that straddles a block boundary holds one "
                    "block more); these answers allow for the most.");
  }
  if (b.context_unbounded) {
    int64_t widest = 0;
    for (const LayerGroup& g : groups) {
      if (g.row_bytes > 0) widest = std::max(widest, g.window);
    }
    if (widest == 0) {
      absl::StrAppend(&words,
                      " No layer caches keys and values per token, only a fixed state per "
                      "sequence: memory does not limit the context length.");
    } else {
      absl::StrAppend(&words, " Every layer keeps at most ", FormatCount(widest),
                      " tokens, so the cache stops growing there: memory does not limit the "
                      "context length.");
    }
  } else if (m.max_context_tokens > 0 && b.max_context_tokens > m.max_context_tokens) {
    absl::StrAppend(&words, " (The model itself accepts at most ",
                    FormatCount(m.max_context_tokens), " tokens.)");
  }
  b.explanation = std::move(words);
  return b;
}

// The fixed part of one sequence: every layer's state (bounded: 4096 layers x 2^39 bytes).
int64_t StateBytes(const std::vector<LayerGroup>& groups) {
  int64_t total = 0;
  for (const LayerGroup& g : groups) total += g.fixed_bytes * g.layers;
  return total;
}

// MHA, GQA and MQA rows for the model's layers (see PlanKvCache in kv_plan.h).
absl::StatusOr<std::vector<VariantRow>> PlanVariants(const ModelSpec& m, const KvPlan& plan) {
  std::vector<VariantRow> rows;
  if (!HasKvLayers(m) || m.n_head == 0) return rows;
  // The model's own row is marked only when it is one of these: every KV layer plain attention
  // with the model-wide head count.
  const bool uniform =
      std::all_of(m.layer_specs.begin(), m.layer_specs.end(), [&](const LayerSpec& l) {
        return !HoldsKv(l.kind) ||
               (l.kind != LayerKind::kLatentAttention && l.n_head_kv == m.n_head_kv);
      });
  int64_t gqa = m.n_head_kv;
  if (gqa == m.n_head || gqa == 1) gqa = DefaultGqaHeads(m.n_head);
  for (const auto& [variant, kv] :
       {std::pair<const char*, int64_t>{"MHA", m.n_head}, {"GQA", gqa}, {"MQA", int64_t{1}}}) {
    if (kv == 0) continue;
    VariantRow row;
    row.variant = variant;
    row.n_head_kv = kv;
    row.group_size = m.n_head / kv;
    row.is_model = uniform && kv == m.n_head_kv;
    GroupOptions options;
    options.kv_override = kv;
    options.indexer_dtype = plan.indexer_dtype;
    ATTEND_ASSIGN_OR_RETURN(const std::vector<LayerGroup> g,
                            GroupLayers(m, plan.kv_dtype, plan.state_dtype, options));
    row.bytes_per_token = BytesPerToken(g, false);
    const std::optional<int64_t> bytes = SequenceBytes(g, plan.context_tokens, 0);
    if (!bytes) {
      return absl::InvalidArgumentError(absl::StrCat("the ", variant, " cache of one sequence of ",
                                                     plan.context_tokens,
                                                     " tokens overflows int64"));
    }
    row.bytes_per_sequence = *bytes;
    rows.push_back(std::move(row));
  }
  return rows;
}

// The per-layer breakdown: one entry per distinct LayerSpec, each sized by the same GroupLayers
// as the totals (a one-layer model of it), so the entries' bytes add up to the plan's.
absl::StatusOr<std::vector<LayerGroupPlan>> PlanLayerGroups(const ModelSpec& m,
                                                            const KvPlan& plan) {
  std::vector<LayerGroupPlan> out;
  for (int64_t i = 0; i < m.layers; ++i) {
    const LayerSpec l =
        m.layer_specs.empty() ? LayerSpec{m.n_head_kv, 0} : m.layer_specs[static_cast<size_t>(i)];
    auto it = std::find_if(out.begin(), out.end(), [&](const LayerGroupPlan& g) {
      const LayerSpec& o = g.layer;
      return o.kind == l.kind && o.n_head_kv == l.n_head_kv && o.window_tokens == l.window_tokens &&
             o.kv_lora_rank == l.kv_lora_rank && o.qk_rope_head_dim == l.qk_rope_head_dim &&
             o.conv_state_values == l.conv_state_values &&
             o.recurrent_state_values == l.recurrent_state_values &&
             o.index_head_dim == l.index_head_dim;
    });
    if (it != out.end()) {
      it->layer_indices.push_back(i);
      continue;
    }
    ModelSpec one = m;
    one.layers = 1;
    one.layer_specs = {l};
    LayerGroupPlan g;
    g.layer = l;
    g.layer_indices = {i};
    GroupOptions options;
    options.indexer_dtype = plan.indexer_dtype;
    ATTEND_ASSIGN_OR_RETURN(const std::vector<LayerGroup> groups,
                            GroupLayers(one, plan.kv_dtype, plan.state_dtype, options));
    GroupOptions expanded = options;
    expanded.expand_latent = true;
    ATTEND_ASSIGN_OR_RETURN(const std::vector<LayerGroup> expanded_groups,
                            GroupLayers(one, plan.kv_dtype, plan.state_dtype, expanded));
    GroupOptions indexer = options;
    indexer.half = KvHalf::kIndexer;
    ATTEND_ASSIGN_OR_RETURN(const std::vector<LayerGroup> indexer_groups,
                            GroupLayers(one, plan.kv_dtype, plan.state_dtype, indexer));
    g.indexer_bytes_per_token = BytesPerToken(indexer_groups, false);
    g.bytes_per_token = BytesPerToken(groups, false);
    g.expanded_bytes_per_token = BytesPerToken(expanded_groups, false);
    g.state_bytes_per_sequence = StateBytes(groups);
    // A single layer's bytes are at most the plan's, which did not overflow.
    g.bytes_per_sequence = SequenceBytes(groups, plan.context_tokens, 0).value_or(0);
    out.push_back(std::move(g));
  }
  for (LayerGroupPlan& g : out) {
    g.bytes_per_sequence *= static_cast<int64_t>(g.layer_indices.size());
  }
  return out;
}

}  // namespace

absl::StatusOr<int64_t> WeightsBytes(int64_t parameters, absl::string_view dtype) {
  ATTEND_ASSIGN_OR_RETURN(const KvDType d, ParseDType(dtype, "weights_dtype"));
  if (parameters < 0) {
    return absl::InvalidArgumentError(absl::StrCat("parameters: ", parameters, "; must be >= 0"));
  }
  const std::optional<int64_t> bytes = StorageBytes(d, parameters);
  if (!bytes) {
    return absl::InvalidArgumentError(absl::StrCat("weight bytes of ", parameters, " ",
                                                   DTypeName(d), " parameters overflow int64"));
  }
  return *bytes;
}

absl::StatusOr<int64_t> KvBytesPerSequence(const ModelSpec& model, KvDType kv_dtype,
                                           int64_t context_tokens, int64_t block_tokens,
                                           std::optional<KvDType> state_dtype) {
  ATTEND_ASSIGN_OR_RETURN(const ModelSpec m, CanonicalModel(model));
  ATTEND_RETURN_IF_ERROR(CheckRequestField("context_tokens", context_tokens, kMaxContextTokens));
  ATTEND_RETURN_IF_ERROR(CheckRequestField("block_tokens", block_tokens, kMaxBlockTokens));
  ATTEND_ASSIGN_OR_RETURN(const std::vector<LayerGroup> groups,
                          GroupLayers(m, kv_dtype, state_dtype.value_or(kv_dtype)));
  const std::optional<int64_t> bytes = SequenceBytes(groups, context_tokens, block_tokens);
  if (!bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("the cache of one sequence of ", context_tokens, " tokens overflows int64"));
  }
  return *bytes;
}

absl::StatusOr<int64_t> StateBytesPerSequence(const ModelSpec& model, KvDType state_dtype) {
  ATTEND_ASSIGN_OR_RETURN(const ModelSpec m, CanonicalModel(model));
  ATTEND_ASSIGN_OR_RETURN(const std::vector<LayerGroup> groups,
                          GroupLayers(m, state_dtype, state_dtype));
  return StateBytes(groups);
}

absl::StatusOr<KvPlan> PlanKvCache(const ModelSpec& model, const KvPlanRequest& request) {
  KvPlan plan;
  ATTEND_ASSIGN_OR_RETURN(plan.model, CanonicalModel(model));
  const ModelSpec& m = plan.model;
  ATTEND_RETURN_IF_ERROR(
      CheckRequestField("context_tokens", request.context_tokens, kMaxContextTokens));
  ATTEND_RETURN_IF_ERROR(CheckRequestField("batch", request.batch, kMaxBatch));
  ATTEND_RETURN_IF_ERROR(CheckRequestField("block_tokens", request.block_tokens, kMaxBlockTokens));
  ATTEND_RETURN_IF_ERROR(CheckRequestField("memory_budget_bytes", request.memory_budget_bytes,
                                           std::numeric_limits<int64_t>::max()));
  ATTEND_RETURN_IF_ERROR(CheckRequestField("replica_memory_bytes", request.replica_memory_bytes,
                                           std::numeric_limits<int64_t>::max()));
  plan.kv_dtype = request.kv_dtype;
  plan.state_dtype = request.state_dtype.value_or(request.kv_dtype);
  plan.indexer_dtype = request.indexer_dtype;
  plan.context_tokens = request.context_tokens > 0 ? request.context_tokens : m.max_context_tokens;
  if (plan.context_tokens == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("context_tokens: 0 and model ", QuoteForError(m.name),
                     " has no max_context_tokens; give a context length"));
  }
  plan.batch = request.batch > 0 ? request.batch : 1;
  plan.bytes_per_value = BytesPerValue(request.kv_dtype);

  GroupOptions base;
  base.indexer_dtype = plan.indexer_dtype;
  ATTEND_ASSIGN_OR_RETURN(const std::vector<LayerGroup> groups,
                          GroupLayers(m, plan.kv_dtype, plan.state_dtype, base));
  plan.bytes_per_token = BytesPerToken(groups, false);
  plan.full_attention_bytes_per_token = BytesPerToken(groups, true);
  GroupOptions expanded = base;
  expanded.expand_latent = true;
  ATTEND_ASSIGN_OR_RETURN(const std::vector<LayerGroup> expanded_groups,
                          GroupLayers(m, plan.kv_dtype, plan.state_dtype, expanded));
  plan.expanded_bytes_per_token = BytesPerToken(expanded_groups, false);
  const auto overflow = [&](absl::string_view what) {
    return absl::InvalidArgumentError(absl::StrCat(what, " for ", plan.batch, " x ",
                                                   plan.context_tokens, " tokens overflows int64"));
  };
  const std::optional<int64_t> per_sequence = SequenceBytes(groups, plan.context_tokens, 0);
  if (!per_sequence) return overflow("the cache of one sequence");
  plan.bytes_per_sequence = *per_sequence;
  const std::optional<int64_t> total = CheckedMul(plan.bytes_per_sequence, plan.batch);
  if (!total) return overflow("the cache");
  plan.total_bytes = *total;
  // Parts of the totals above, so neither overflows.
  plan.state_bytes_per_sequence = StateBytes(groups);
  plan.state_total_bytes = plan.state_bytes_per_sequence * plan.batch;

  // The halves are counted by the same functions as the total, over rows of one half, so the
  // windows and block padding apply to each exactly as to the whole. Each half is at most the
  // total, so none of these overflows once the total has not.
  GroupOptions keys = base, values = base, indexers = base;
  keys.half = KvHalf::kKeys;
  values.half = KvHalf::kValues;
  indexers.half = KvHalf::kIndexer;
  ATTEND_ASSIGN_OR_RETURN(const std::vector<LayerGroup> k_groups,
                          GroupLayers(m, plan.kv_dtype, plan.state_dtype, keys));
  ATTEND_ASSIGN_OR_RETURN(const std::vector<LayerGroup> v_groups,
                          GroupLayers(m, plan.kv_dtype, plan.state_dtype, values));
  ATTEND_ASSIGN_OR_RETURN(const std::vector<LayerGroup> i_groups,
                          GroupLayers(m, plan.kv_dtype, plan.state_dtype, indexers));
  plan.indexer_bytes_per_token = BytesPerToken(i_groups, false);
  plan.indexer_bytes_per_sequence = SequenceBytes(i_groups, plan.context_tokens, 0).value_or(0);
  plan.indexer_total_bytes = plan.indexer_bytes_per_sequence * plan.batch;
  if (plan.indexer_bytes_per_token > 0) {
    plan.indexer_format = plan.indexer_dtype ? std::string(DTypeName(*plan.indexer_dtype))
                                             : "fp8 + float32 scale per 128 values (as published)";
  }
  plan.k_bytes_per_token = BytesPerToken(k_groups, false);
  plan.v_bytes_per_token = BytesPerToken(v_groups, false);
  plan.k_bytes_per_sequence = SequenceBytes(k_groups, plan.context_tokens, 0).value_or(0);
  plan.v_bytes_per_sequence = SequenceBytes(v_groups, plan.context_tokens, 0).value_or(0);
  plan.k_total_bytes = plan.k_bytes_per_sequence * plan.batch;
  plan.v_total_bytes = plan.v_bytes_per_sequence * plan.batch;
  plan.projections = LayerProjectionKinds(m);
  ATTEND_ASSIGN_OR_RETURN(plan.layer_groups, PlanLayerGroups(m, plan));

  if (request.block_tokens > 0) {
    // One computation for all three: each layer's blocks (LayerBlocks), their bytes
    // (SequenceBytes sums blocks x block_tokens x row bytes), and the waste against the tokens
    // kept.
    PagedPlan p;
    p.block_tokens = request.block_tokens;
    for (const LayerGroup& g : groups) {
      if (g.row_bytes == 0) continue;  // no KV: no blocks
      p.blocks_per_sequence = std::max(p.blocks_per_sequence,
                                       LayerBlocks(plan.context_tokens, g.window, p.block_tokens));
    }
    const std::optional<int64_t> one = SequenceBytes(groups, plan.context_tokens, p.block_tokens);
    if (!one) return overflow("the paged allocation of one sequence");
    p.allocated_bytes_per_sequence = *one;
    const std::optional<int64_t> all = CheckedMul(*one, plan.batch);
    if (!all) return overflow("the paged allocation");
    p.allocated_bytes = *all;
    p.waste_bytes = p.allocated_bytes - plan.total_bytes;
    plan.paged = p;
  }

  if (request.memory_budget_bytes > 0) {
    // What each sequence needs on its way to the context: with paged windows up to a block per
    // windowed layer more than it is allocated at the context itself.
    const std::optional<int64_t> peak =
        PeakSequenceBytes(groups, plan.context_tokens, request.block_tokens);
    if (!peak || !CheckedMul(*peak, plan.batch)) return overflow("the cache on the way");
    const int64_t at_context =
        plan.paged ? plan.paged->allocated_bytes_per_sequence : plan.bytes_per_sequence;
    ATTEND_ASSIGN_OR_RETURN(plan.budget,
                            PlanBudget(m, request, groups, plan.context_tokens, plan.batch,
                                       request.block_tokens, *peak, at_context));
  }

  if (request.replica_memory_bytes > 0) {
    const std::optional<int64_t> peak =
        PeakSequenceBytes(groups, plan.context_tokens, request.block_tokens);
    if (!peak) return overflow("the cache on the way");
    ATTEND_ASSIGN_OR_RETURN(plan.fleet, PlanFleet(m, request, plan.context_tokens, plan.batch,
                                                  std::max<int64_t>(1, *peak)));
  }

  ATTEND_ASSIGN_OR_RETURN(plan.variants, PlanVariants(m, plan));
  return plan;
}

}  // namespace attend::planner
