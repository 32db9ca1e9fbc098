#include "core/kv_cache/kv_cache.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <map>

#include "absl/strings/str_cat.h"
#include "core/attention/tile_attention.h"
#include "core/base/status_macros.h"
#include "core/kv_cache/paged_attention.h"
#include "core/kv_cache/pending_write.h"
#include "core/kv_cache/sequence.h"
#include "core/kv_cache/sequence_registry.h"
#include "core/kv_cache/token_storage.h"

namespace attend::kv {
namespace {

constexpr int64_t kMaxLayers = 4096;
constexpr int64_t kMaxHeads = 4096;
constexpr int64_t kMaxHeadDim = 16384;
constexpr size_t kMaxWarmShapes = 1024;
// The default bookkeeping limit is an eighth of the cache, but at least this: enough for a few
// thousand sequences of a hundred layers in a small cache.
constexpr int64_t kMinDefaultBookkeepingBytes = int64_t{16} << 20;

// `blocks` blocks of `block_bytes`, computed in floating point: a request's count may be far
// beyond what int64 bytes can hold (2^40 tokens in 4096 layers).
std::string BlockBytes(int64_t blocks, int64_t block_bytes) {
  return FormatBytes(static_cast<double>(blocks) * static_cast<double>(block_bytes));
}

// A query tensor as float32 rows: read in place when it is float32 (the tiles pack their own
// rows), else widened into `widened`.
const float* QueryFloats(const TensorView& q, std::vector<float>* widened) {
  if (q.dtype == DType::kFloat32) return static_cast<const float*>(q.data);
  widened->resize(static_cast<size_t>(q.num_elements()));
  ConvertToFloat(q, widened->data());
  return widened->data();
}

absl::Status CheckShape(const TensorView& t, absl::string_view field, int64_t n, int64_t heads,
                        int64_t dim, absl::string_view layout) {
  if (t.rank() != 3 || t.dim(0) != n || t.dim(1) != heads || t.dim(2) != dim) {
    return absl::InvalidArgumentError(absl::StrCat(field, ".shape is ", ShapeToString(t.shape),
                                                   " but the sequence needs [", n, ", ", heads,
                                                   ", ", dim, "] ", layout));
  }
  return absl::OkStatus();
}

// The outputs are encoded in `dtype` by the caller: one that does not fit fails the append.
absl::Status CheckOutputFits(const std::vector<float>& output, DType dtype,
                             absl::string_view field) {
  return CheckFitsDType(output, dtype, field,
                        "; ask for output_dtype FLOAT32 (or BFLOAT16); nothing was appended");
}

}  // namespace

absl::string_view EvictionPolicyName(EvictionPolicy policy) {
  switch (policy) {
    case EvictionPolicy::kNone:
      return "none";
    case EvictionPolicy::kLru:
      return "lru";
    case EvictionPolicy::kTtl:
      return "ttl";
  }
  return "unknown";
}

Clock SystemClock() {
  return [] {
    return std::chrono::duration_cast<std::chrono::milliseconds>(
               std::chrono::system_clock::now().time_since_epoch())
        .count();
  };
}

KvCache::KvCache(KvCacheOptions options)
    : options_([&] {
        if (!options.clock) options.clock = SystemClock();
        return options;
      }()),
      pool_(options_.capacity_bytes, options_.block_bytes, options_.huge_pages),
      registry_(std::make_unique<SequenceRegistry>(
          options_.max_sequences,
          options_.max_bookkeeping_bytes > 0
              ? options_.max_bookkeeping_bytes
              : std::max(options_.capacity_bytes / 8, kMinDefaultBookkeepingBytes),
          options_.clock)) {}

KvCache::~KvCache() = default;

absl::StatusOr<BlockLayout> KvCache::LayoutFor(const SequenceConfig& config) const {
  for (const auto& [name, value, max] :
       {std::tuple<const char*, int64_t, int64_t>{"config.layers", config.layers, kMaxLayers},
        {"config.n_head", config.n_head, kMaxHeads},
        {"config.n_head_kv", config.n_head_kv, kMaxHeads},
        {"config.head_dim", config.head_dim, kMaxHeadDim},
        {"config.head_dim_v", config.head_dim_v, kMaxHeadDim}}) {
    if (value < 1 || value > max) {
      return absl::InvalidArgumentError(
          absl::StrCat(name, ": ", value, "; must be between 1 and ", max));
    }
  }
  if (config.n_head % config.n_head_kv != 0) {
    return absl::InvalidArgumentError(absl::StrCat("config.n_head_kv: ", config.n_head_kv,
                                                   " does not divide n_head ", config.n_head));
  }
  if (config.kv_dtype != DType::kFloat32 && config.kv_dtype != DType::kBFloat16 &&
      config.kv_dtype != DType::kInt8) {
    return absl::InvalidArgumentError(absl::StrCat("config.kv_dtype: ", DTypeName(config.kv_dtype),
                                                   "; the cache stores FLOAT32, BFLOAT16 or INT8"));
  }
  if (config.window < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("config.window_tokens: ", config.window, "; must be >= 0"));
  }
  if (config.scale && !std::isfinite(*config.scale)) {
    return absl::InvalidArgumentError(
        absl::StrCat("config.scale: ", *config.scale, "; must be finite"));
  }
  const BlockLayout layout = MakeLayout(config.n_head_kv, config.head_dim, config.head_dim_v,
                                        config.kv_dtype, options_.block_bytes);
  if (layout.tokens_per_block < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("one token of one layer needs ", layout.token_bytes(), " bytes (n_head_kv ",
                     config.n_head_kv, " x (head_dim ", config.head_dim, " + head_dim_v ",
                     config.head_dim_v, ") x ", layout.element_bytes(), "), more than a block of ",
                     options_.block_bytes, " bytes (server flag --kv_block_bytes)"));
  }
  return layout;
}

void KvCache::WarmUp(const BlockLayout& layout, int64_t n_head) {
  const std::string shape =
      absl::StrCat(n_head, "/", layout.n_head_kv, "/", layout.head_dim, "/", layout.head_dim_v, "/",
                   DTypeName(layout.dtype), "/", layout.tokens_per_block);
  {
    MutexLock lock(&warm_mu_);
    if (warmed_.contains(shape)) return;
  }
  // A failed warm-up only means the first Append creates what is missing (and reports a real
  // failure itself): it does not fail the creation.
  if (!WarmUpPagedAttention(layout, n_head, options_.compute_threads).ok()) return;
  MutexLock lock(&warm_mu_);
  // Bounded like the primitives themselves (which the matmul cache may have dropped by the time
  // a forgotten shape comes back: it is then warmed up again).
  if (warmed_.size() >= kMaxWarmShapes) warmed_.erase(warmed_.begin());
  warmed_.insert(shape);
}

absl::StatusOr<SequenceInfo> KvCache::Create(const SequenceConfig& requested, absl::string_view id,
                                             int64_t reserve_tokens,
                                             absl::string_view generated_key) {
  SequenceConfig config = requested;
  if (config.n_head_kv == 0) config.n_head_kv = config.n_head;
  if (config.head_dim_v == 0) config.head_dim_v = config.head_dim;
  ATTEND_ASSIGN_OR_RETURN(const BlockLayout layout, LayoutFor(config));
  if (!id.empty()) ATTEND_RETURN_IF_ERROR(CheckSequenceId(id, "sequence_id"));
  if (id.empty() && !generated_key.empty()) {
    ATTEND_RETURN_IF_ERROR(CheckGeneratedKey(generated_key, "routing key"));
  }
  if (reserve_tokens < 0 || reserve_tokens > (int64_t{1} << 40)) {
    return absl::InvalidArgumentError(
        absl::StrCat("reserve_tokens: ", reserve_tokens, "; must be between 0 and 2^40"));
  }
  const auto counted = [this](absl::Status status) {
    if (status.code() == absl::StatusCode::kResourceExhausted) rejections_++;
    return status;
  };
  const int64_t per_layer = layout.blocks_for(reserve_tokens);
  const int64_t bookkeeping = BookkeepingBytes(config.layers, config.layers * per_layer);
  const std::string what = absl::StrCat("a sequence of ", config.layers, " layers",
                                        reserve_tokens > 0 ? " with its reservation" : "");
  // The layers' tables now; their reserved blocks' references when it is published, after the
  // pool has said whether the blocks themselves fit (the more telling refusal of a huge
  // reservation; the references of blocks the pool hands out are bounded by the pool).
  ATTEND_RETURN_IF_ERROR(
      counted(registry_->CheckRoom(id, BookkeepingBytes(config.layers, 0), what)));
  WarmUp(layout, config.n_head);

  auto sequence = std::make_shared<Sequence>();
  sequence->config = config;
  sequence->layout = layout;
  sequence->created_ms = options_.clock();
  sequence->last_used_ms = sequence->created_ms;
  sequence->bookkeeping_bytes = bookkeeping;
  std::vector<BlockRef> blocks;
  const int64_t reserved_blocks = config.layers * per_layer;
  ATTEND_RETURN_IF_ERROR(TakeBlocks([&] { return reserved_blocks; }, {}, &blocks,
                                    [&] {
                                      return absl::StrCat("reserving ", reserve_tokens,
                                                          " tokens in ", config.layers, " layers");
                                    }));
  // Held from before the sequence is published until it is described, so that the response
  // describes what was created even if a Release of the new id comes at once.
  MutexLock sequence_lock(&sequence->mu);
  sequence->layers.resize(static_cast<size_t>(config.layers));
  for (int64_t l = 0; l < config.layers; ++l) {
    CachedLayer& layer = sequence->layers[static_cast<size_t>(l)];
    layer.blocks.assign(blocks.begin() + l * per_layer, blocks.begin() + (l + 1) * per_layer);
  }
  sequence->reserved_tokens = reserve_tokens;
  blocks.clear();
  ATTEND_RETURN_IF_ERROR(counted(registry_->Publish(sequence, id, what, generated_key)));
  return Describe(*sequence);
}

absl::Status KvCache::TakeBlocks(const std::function<int64_t()>& need,
                                 const std::vector<const Block*>& copies,
                                 std::vector<BlockRef>* out,
                                 const std::function<std::string()>& what) {
  int64_t count = need();
  BlockPool::Refusal refusal;
  if (pool_.TryAllocate(count, out, &refusal)) return absl::OkStatus();
  if (options_.eviction == EvictionPolicy::kLru) {
    // A concurrent taker may use the room an eviction made: plan again, a few times, each time
    // evicting only when that makes this request fit.
    for (int attempt = 0; attempt < 3; ++attempt) {
      std::vector<std::shared_ptr<Sequence>> victims = registry_->EvictLruFor(count, pool_, copies);
      if (victims.empty()) break;
      victims.clear();  // frees their blocks (those no concurrent Get still describes)
      count = need();
      if (pool_.TryAllocate(count, out, &refusal)) return absl::OkStatus();
    }
  } else if (options_.eviction == EvictionPolicy::kTtl && EvictExpired() > 0) {
    count = need();
    if (pool_.TryAllocate(count, out, &refusal)) return absl::OkStatus();
  }
  rejections_++;
  // The counts are those of the last refusal: blocks returned since then would make the message
  // contradict itself ("needs 1 block; 1 is free").
  const std::string free =
      refusal.out_of_memory
          ? absl::StrCat("the system refused memory for them although ", refusal.free_blocks)
          : absl::StrCat(refusal.free_blocks);
  return absl::ResourceExhaustedError(absl::StrCat(
      what(), " needs ", count, " blocks (", BlockBytes(count, pool_.block_bytes()), "); ", free,
      " of ", pool_.total_blocks(), " blocks of ", BlockBytes(1, pool_.block_bytes()),
      " were free (cache capacity ", BlockBytes(pool_.total_blocks(), pool_.block_bytes()),
      ", eviction policy ", EvictionPolicyName(options_.eviction), ")"));
}

int64_t KvCache::EvictableBlocks() {
  return options_.eviction == EvictionPolicy::kLru ? registry_->EvictableBlocks() : 0;
}

int64_t KvCache::EvictExpired() {
  if (options_.eviction != EvictionPolicy::kTtl) return 0;
  // Dropped here, outside the registry's lock: their blocks go back to the pool.
  return static_cast<int64_t>(registry_->EvictIdle(options_.idle_ttl_ms).size());
}

SequenceInfo KvCache::Describe(const Sequence& s) {
  SequenceInfo info;
  info.id = s.id;
  info.config = s.config;
  info.tokens = s.layers.empty() ? 0 : std::numeric_limits<int64_t>::max();
  for (const CachedLayer& layer : s.layers) {
    info.layer_tokens.push_back(layer.tokens);
    info.tokens = std::min(info.tokens, layer.tokens);
    for (const BlockRef& block : layer.blocks) {
      if (!block) continue;
      ++info.blocks;
      info.shared_blocks += block.use_count() > 1;
    }
  }
  info.bytes = info.blocks * pool_.block_bytes();
  info.reserved_tokens = s.reserved_tokens;
  info.tokens_per_block = s.layout.tokens_per_block;
  info.forked_from = s.forked_from;
  info.created_ms = s.created_ms;
  info.last_used_ms = s.last_used_ms.load();
  return info;
}

absl::Status KvCache::CheckNotReleased(const Sequence& s) {
  if (!s.released) return absl::OkStatus();
  return registry_->NotFound(s.id);
}

absl::Status KvCache::CheckChangeable(const Sequence& s) {
  ATTEND_RETURN_IF_ERROR(CheckNotReleased(s));
  if (!s.sealed) return absl::OkStatus();
  // UNAVAILABLE: nothing was applied, and the same call succeeds once the sequence is found
  // where it moved (through a fleet's proxy) or, when the move fails, here again.
  return absl::UnavailableError(absl::StrCat("sequence ", QuotedId(s.id),
                                             " is moving to another replica; nothing was "
                                             "changed: retry the call (through the proxy)"));
}

absl::Status KvCache::CheckAppend(const Sequence& s, int64_t layer, const AppendInput& input,
                                  bool decode) {
  ATTEND_RETURN_IF_ERROR(CheckChangeable(s));
  const SequenceConfig& c = s.config;
  if (layer < 0 || layer >= c.layers) {
    return absl::InvalidArgumentError(absl::StrCat("layer ", layer, " is out of range: sequence ",
                                                   QuotedId(s.id), " has ", c.layers,
                                                   " layers (0 to ", c.layers - 1, ")"));
  }
  if (input.k.rank() != 3 || input.k.dim(0) < 1) {
    return absl::InvalidArgumentError(absl::StrCat("k.shape is ", ShapeToString(input.k.shape),
                                                   "; expected [n_new >= 1, n_head_kv, head_dim]"));
  }
  const int64_t n = input.k.dim(0);
  if (decode && n != 1) {
    return absl::InvalidArgumentError(absl::StrCat("k.shape is ", ShapeToString(input.k.shape),
                                                   "; a decode step appends 1 token"));
  }
  ATTEND_RETURN_IF_ERROR(
      CheckShape(input.k, "k", n, c.n_head_kv, c.head_dim, "[n_new, n_head_kv, head_dim]"));
  ATTEND_RETURN_IF_ERROR(
      CheckShape(input.v, "v", n, c.n_head_kv, c.head_dim_v, "[n_new, n_head_kv, head_dim_v]"));
  if (input.q) {
    ATTEND_RETURN_IF_ERROR(
        CheckShape(*input.q, "q", n, c.n_head, c.head_dim, "[n_new, n_head, head_dim]"));
    ATTEND_RETURN_IF_ERROR(CheckFinite(*input.q, "q", options_.compute_threads));
  } else if (decode) {
    return absl::InvalidArgumentError("q: missing; a decode step needs the new token's queries");
  }
  ATTEND_RETURN_IF_ERROR(CheckStorable(input.k, "k", c.kv_dtype, options_.compute_threads));
  ATTEND_RETURN_IF_ERROR(CheckStorable(input.v, "v", c.kv_dtype, options_.compute_threads));
  const int64_t tokens = s.layers[static_cast<size_t>(layer)].tokens;
  if (tokens + n > (int64_t{1} << 40)) {
    return absl::OutOfRangeError(
        absl::StrCat("layer ", layer, " would hold more than 2^40 tokens"));
  }
  return absl::OkStatus();
}

absl::StatusOr<AppendResult> KvCache::Append(int64_t layer, const AppendInput& input,
                                             Precision precision, bool want_weights,
                                             AttentionStats* stats, int64_t max_weight_elements,
                                             const Cancellation* cancel, DType output_dtype) {
  ATTEND_ASSIGN_OR_RETURN(SequenceRegistry::Lease sequence, registry_->Acquire(input.id));
  MutexLock lock(&sequence->mu);
  ATTEND_RETURN_IF_ERROR(CheckAppend(*sequence, layer, input, /*decode=*/false));
  const int64_t n = input.k.dim(0);
  const CachedLayer& target = sequence->layers[static_cast<size_t>(layer)];
  const int64_t after = target.tokens + n;
  const SequenceConfig& c = sequence->config;
  if (input.q && want_weights) {
    const int64_t limit = std::min(options_.limits.max_score_elements, max_weight_elements);
    std::optional<int64_t> elements = CheckedMul(c.n_head * n, after);
    if (!elements || *elements > limit) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "weights of ", c.n_head, " heads x ", n, " queries x ", after,
          " keys are over the limit of ", limit, " elements (ask without return_weights)"));
    }
  }

  std::vector<BlockRef> fresh;
  const BlockLayout& layout = sequence->layout;
  const auto need = [&] { return BlocksToTake(target, layout, n); };
  ATTEND_RETURN_IF_ERROR(TakeBlocks(need, BlocksToCopy(target, layout, n), &fresh, [&] {
    const int64_t room = (pool_.free_blocks() + EvictableBlocks()) * layout.tokens_per_block;
    return absl::StrCat("appending ", n, " tokens to layer ", layer, " of sequence ",
                        QuotedId(input.id), " (at most about ", room,
                        " more tokens fit in that layer now)");
  }));
  const size_t slots_before = target.blocks.size();
  PendingWrite write(*sequence, layer, input, pool_.block_bytes(), options_.compute_threads, fresh);
  AppendResult result;
  result.first_position = write.first_position();
  result.layer_tokens = write.layer_tokens();
  if (input.q) {
    std::vector<float> widened;
    const float* q = QueryFloats(*input.q, &widened);
    result.output.resize(static_cast<size_t>(n * c.n_head * c.head_dim_v));
    if (want_weights) result.weights.resize(static_cast<size_t>(c.n_head * n * after));
    const PagedProblem problem =
        write.Problem(q, result.output.data(), want_weights ? result.weights.data() : nullptr);
    absl::Status status =
        RunPagedAttention({&problem, 1}, precision, options_.compute_threads, stats, cancel);
    if (status.ok()) status = CheckOutputFits(result.output, output_dtype, "output");
    if (!status.ok()) {
      write.Rollback();
      return status;
    }
  }
  write.Commit();
  registry_->AddBookkeeping(*sequence, SlotBytes(target.blocks.size(), slots_before));
  return result;
}

absl::StatusOr<std::vector<AppendResult>> KvCache::DecodeBatch(
    int64_t layer, absl::Span<const AppendInput> inputs, Precision precision, AttentionStats* stats,
    const Cancellation* cancel, DType output_dtype) {
  return AppendMany(layer, inputs, precision, stats, cancel, output_dtype, /*decode=*/true);
}

absl::StatusOr<std::vector<AppendResult>> KvCache::AppendBatch(
    int64_t layer, absl::Span<const AppendInput> inputs, Precision precision, AttentionStats* stats,
    const Cancellation* cancel, DType output_dtype) {
  return AppendMany(layer, inputs, precision, stats, cancel, output_dtype, /*decode=*/false);
}

absl::StatusOr<std::vector<AppendResult>> KvCache::AppendMany(
    int64_t layer, absl::Span<const AppendInput> inputs, Precision precision, AttentionStats* stats,
    const Cancellation* cancel, DType output_dtype, bool decode) {
  // How the inputs are named in messages: DecodeBatch's steps, AppendBatch's sequences.
  const absl::string_view items = decode ? "steps" : "sequence_ids";
  if (inputs.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(items, ": empty; give at least one sequence"));
  }
  std::map<std::string, size_t, std::less<>> order;  // id -> step index, sorted for locking
  for (size_t i = 0; i < inputs.size(); ++i) {
    auto [it, inserted] = order.emplace(inputs[i].id, i);
    if (!inserted) {
      return absl::InvalidArgumentError(
          absl::StrCat(items, "[", i, "]: sequence ", QuotedId(inputs[i].id),
                       " appears twice (also ", items, "[", it->second, "])"));
    }
  }
  std::vector<SequenceRegistry::Lease> leases;
  std::vector<Sequence*> sequences(inputs.size());
  leases.reserve(inputs.size());
  for (size_t i = 0; i < inputs.size(); ++i) {
    absl::StatusOr<SequenceRegistry::Lease> acquired = registry_->Acquire(inputs[i].id);
    if (!acquired.ok()) {
      return absl::Status(acquired.status().code(),
                          absl::StrCat(items, "[", i, "]: ", acquired.status().message()));
    }
    sequences[i] = &**acquired;
    leases.push_back(*std::move(acquired));
  }
  // Lock in id order so that two batches over the same sequences cannot deadlock.
  std::vector<std::unique_ptr<MutexLock>> locks;
  for (const auto& [id, index] : order) {
    locks.push_back(std::make_unique<MutexLock>(&sequences[index]->mu));
  }

  std::vector<const Block*> copies;
  for (size_t i = 0; i < inputs.size(); ++i) {
    Sequence& s = *sequences[i];
    s.mu.AssertHeld();
    absl::Status status = CheckAppend(s, layer, inputs[i], decode);
    if (!status.ok()) {
      return absl::Status(status.code(), absl::StrCat(items, "[", i, "] (sequence ", QuotedId(s.id),
                                                      "): ", status.message()));
    }
    for (const Block* block :
         BlocksToCopy(s.layers[static_cast<size_t>(layer)], s.layout, inputs[i].k.dim(0))) {
      copies.push_back(block);
    }
  }
  // Every sequence is locked (above) while the need is asked for.
  const auto need = [&]() ABSL_NO_THREAD_SAFETY_ANALYSIS {
    int64_t needed = 0;
    for (size_t i = 0; i < sequences.size(); ++i) {
      const Sequence* s = sequences[i];
      needed += BlocksToTake(s->layers[static_cast<size_t>(layer)], s->layout, inputs[i].k.dim(0));
    }
    return needed;
  };
  std::vector<BlockRef> fresh;
  ATTEND_RETURN_IF_ERROR(TakeBlocks(need, copies, &fresh, [&] {
    if (decode)
      return absl::StrCat("a decode step of ", inputs.size(), " sequences in layer ", layer);
    int64_t tokens = 0;
    for (const AppendInput& in : inputs) tokens += in.k.dim(0);
    return absl::StrCat("appending ", tokens, " tokens of ", inputs.size(), " sequences to layer ",
                        layer);
  }));

  std::vector<size_t> slots_before(inputs.size());
  for (size_t i = 0; i < inputs.size(); ++i) {
    sequences[i]->mu.AssertHeld();
    slots_before[i] = sequences[i]->layers[static_cast<size_t>(layer)].blocks.size();
  }
  std::vector<PendingWrite> writes;
  writes.reserve(inputs.size());
  std::vector<std::vector<float>> queries(inputs.size());
  std::vector<AppendResult> results(inputs.size());
  std::vector<PagedProblem> problems;
  problems.reserve(inputs.size());
  for (size_t i = 0; i < inputs.size(); ++i) {
    Sequence& s = *sequences[i];
    writes.emplace_back(s, layer, inputs[i], pool_.block_bytes(), options_.compute_threads, fresh);
    results[i].first_position = writes.back().first_position();
    results[i].layer_tokens = writes.back().layer_tokens();
    if (!inputs[i].q) continue;  // only appended
    results[i].output.resize(
        static_cast<size_t>(inputs[i].k.dim(0) * s.config.n_head * s.config.head_dim_v));
    problems.push_back(writes.back().Problem(QueryFloats(*inputs[i].q, &queries[i]),
                                             results[i].output.data(), nullptr));
  }
  absl::Status status =
      problems.empty()
          ? absl::OkStatus()
          : RunPagedAttention(problems, precision, options_.compute_threads, stats, cancel);
  for (size_t i = 0; i < results.size() && status.ok(); ++i) {
    status = CheckOutputFits(results[i].output, output_dtype,
                             decode ? absl::StrCat("steps[", i, "].output")
                                    : absl::StrCat("output of sequence_ids[", i, "]"));
  }
  for (PendingWrite& write : writes) {
    if (status.ok()) {
      write.Commit();
    } else {
      write.Rollback();
    }
  }
  if (!status.ok()) return status;
  for (size_t i = 0; i < sequences.size(); ++i) {
    Sequence& s = *sequences[i];
    s.mu.AssertHeld();
    registry_->AddBookkeeping(
        s, SlotBytes(s.layers[static_cast<size_t>(layer)].blocks.size(), slots_before[i]));
  }
  return results;
}

int64_t KvCache::DecodeReadBytes(absl::Span<const absl::string_view> ids) const {
  int64_t bytes = 0;
  for (absl::string_view id : ids) {
    absl::StatusOr<std::shared_ptr<Sequence>> sequence = registry_->Find(id);
    if (!sequence.ok()) continue;
    const Sequence& s = **sequence;
    const int64_t tokens = s.total_tokens.load(std::memory_order_relaxed) / s.config.layers;
    bytes += tokens * s.layout.token_bytes();
  }
  return bytes;
}

bool KvCache::DecodeRunsOnCallingThread(absl::Span<const absl::string_view> ids) const {
  // The engine decides per call from the works' own rows (tile::Run); this is the same
  // threshold applied to the cache's estimate of those rows.
  return DecodeReadBytes(ids) < tile::kSerialDecodeBytes;
}

absl::StatusOr<SequenceInfo> KvCache::Get(absl::string_view id) {
  ATTEND_ASSIGN_OR_RETURN(const std::shared_ptr<Sequence> sequence, registry_->Find(id));
  MutexLock lock(&sequence->mu);
  ATTEND_RETURN_IF_ERROR(CheckNotReleased(*sequence));
  return Describe(*sequence);
}

absl::StatusOr<ListPage> KvCache::List(int64_t page_size, absl::string_view page_token) {
  if (page_size == 0) page_size = 100;
  if (page_size < 0 || page_size > 1000) {
    return absl::InvalidArgumentError(
        absl::StrCat("page_size: ", page_size, "; must be between 1 and 1000 (0 = 100)"));
  }
  // A token is the id of the last sequence of the previous page.
  if (!page_token.empty() && !CheckSequenceId(page_token, "page_token").ok()) {
    return absl::InvalidArgumentError("page_token: not a token this server returned");
  }
  bool more = false;
  const std::vector<std::shared_ptr<Sequence>> page = registry_->Page(page_size, page_token, &more);
  ListPage result;
  if (more && !page.empty()) result.next_page_token = page.back()->id;
  for (const auto& sequence : page) {
    MutexLock lock(&sequence->mu);
    if (!sequence->released) result.sequences.push_back(Describe(*sequence));
  }
  return result;
}

CacheStats KvCache::Stats() {
  CacheStats stats;
  stats.block_bytes = pool_.block_bytes();
  stats.blocks_total = pool_.total_blocks();
  stats.blocks_used = pool_.used_blocks();
  stats.blocks_free = stats.blocks_total - stats.blocks_used;
  stats.capacity_bytes = stats.blocks_total * stats.block_bytes;
  stats.used_bytes = stats.blocks_used * stats.block_bytes;
  stats.evictions = registry_->evictions();
  stats.rejections = rejections_.load();
  stats.policy = options_.eviction;
  {
    MutexLock lock(&warm_mu_);
    stats.warmed_shapes = static_cast<int64_t>(warmed_.size());
  }
  stats.sequences = registry_->size();
  stats.bookkeeping_bytes = registry_->bookkeeping_bytes();
  stats.bookkeeping_limit_bytes = registry_->max_bookkeeping_bytes();
  stats.tokens = registry_->tokens();
  return stats;
}

absl::Status KvCache::CheckConsistency() {
  const std::vector<std::shared_ptr<Sequence>> all = registry_->All();
  absl::flat_hash_set<const Block*> held;
  for (const auto& s : all) {
    MutexLock lock(&s->mu);
    if (static_cast<int64_t>(s->layers.size()) != s->config.layers) {
      return absl::InternalError(absl::StrCat("sequence ", QuotedId(s->id), " has ",
                                              s->layers.size(), " layers of ", s->config.layers));
    }
    int64_t tokens = 0;
    for (size_t l = 0; l < s->layers.size(); ++l) {
      const CachedLayer& layer = s->layers[l];
      tokens += layer.tokens;
      if (layer.tokens > static_cast<int64_t>(layer.blocks.size()) * s->layout.tokens_per_block) {
        return absl::InternalError(absl::StrCat("layer ", l, " of sequence ", QuotedId(s->id),
                                                " holds ", layer.tokens, " tokens in ",
                                                layer.blocks.size(), " blocks"));
      }
      for (const BlockRef& block : layer.blocks) {
        if (block) held.insert(block.get());
      }
    }
    if (tokens != s->total_tokens.load()) {
      return absl::InternalError(absl::StrCat("sequence ", QuotedId(s->id), " counts ",
                                              s->total_tokens.load(), " tokens; its layers hold ",
                                              tokens));
    }
  }
  const int64_t used = pool_.used_blocks();
  if (static_cast<int64_t>(held.size()) != used) {
    return absl::InternalError(absl::StrCat(used, " blocks are in use but the ", all.size(),
                                            " sequences hold ", held.size()));
  }
  return absl::OkStatus();
}

}  // namespace attend::kv
