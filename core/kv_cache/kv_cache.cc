#include "core/kv_cache/kv_cache.h"

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <random>
#include <set>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/half.h"
#include "core/base/status_macros.h"
#include "core/kv_cache/paged_attention.h"

namespace attend::kv {
namespace {

constexpr int64_t kMaxLayers = 4096;
constexpr int64_t kMaxHeads = 4096;
constexpr int64_t kMaxHeadDim = 16384;
constexpr size_t kMaxIdBytes = 128;
constexpr size_t kRememberedEvictions = 10000;
constexpr size_t kMaxWarmShapes = 1024;

absl::Status CheckId(absl::string_view id, absl::string_view field) {
  if (id.empty() || id.size() > kMaxIdBytes) {
    return absl::InvalidArgumentError(absl::StrCat(field, ": length ", id.size(),
                                                   "; ids have 1 to ", kMaxIdBytes, " characters"));
  }
  for (char c : id) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '.' || c == '_' || c == ':' || c == '-';
    if (!ok) {
      return absl::InvalidArgumentError(absl::StrCat(field, ": '",
                                                     absl::CHexEscape(id.substr(0, 64)),
                                                     "' has a character outside [A-Za-z0-9._:-]"));
    }
  }
  return absl::OkStatus();
}

// An id for a message: as it is when it could be a sequence's id; otherwise (ids come from
// clients, and unknown ones are echoed in NOT_FOUND) escaped and cut to its first 64 bytes, so
// that no message carries control characters or grows with the request.
std::string Quoted(absl::string_view id) {
  if (CheckId(id, "").ok()) return absl::StrCat("'", id, "'");
  constexpr size_t kShown = 64;
  if (id.size() <= kShown) return absl::StrCat("'", absl::CHexEscape(id), "'");
  return absl::StrCat("'", absl::CHexEscape(id.substr(0, kShown)), "...' (", id.size(),
                      " characters)");
}

// A byte count in binary units, from bytes to ZiB.
std::string Bytes(double bytes) {
  static constexpr const char* kUnits[] = {"KiB", "MiB", "GiB", "TiB", "PiB", "EiB", "ZiB"};
  if (bytes < 1024) return absl::StrCat(static_cast<int64_t>(bytes), " bytes");
  int unit = 0;
  bytes /= 1024;
  while (bytes >= 1024 && unit + 1 < static_cast<int>(std::size(kUnits))) {
    bytes /= 1024;
    ++unit;
  }
  return absl::StrFormat("%.2f %s", bytes, kUnits[unit]);
}

// `blocks` blocks of `block_bytes`, computed in floating point: a request's count may be far
// beyond what int64 bytes can hold (2^40 tokens in 4096 layers).
std::string BlockBytes(int64_t blocks, int64_t block_bytes) {
  return Bytes(static_cast<double>(blocks) * static_cast<double>(block_bytes));
}

// `count` elements from element `offset` of `src` as floats: in place when `src` is float32
// (the common case, read without TensorView::At's per-element dispatch), else widened into
// `buffer`.
const float* FloatRow(const TensorView& src, int64_t offset, int64_t count,
                      std::vector<float>* buffer) {
  if (src.dtype == DType::kFloat32) return static_cast<const float*>(src.data) + offset;
  buffer->resize(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) (*buffer)[static_cast<size_t>(i)] = src.At(offset + i);
  return buffer->data();
}

// The sequence's q.k scale: its own, or 1 / sqrt(head_dim).
float SoftmaxScale(const SequenceConfig& c) {
  return c.scale ? *c.scale : static_cast<float>(1.0 / std::sqrt(static_cast<double>(c.head_dim)));
}

// A query tensor as float32 rows: read in place when it is float32 (the tiles pack their own
// rows), else widened into `widened`.
const float* QueryFloats(const TensorView& q, std::vector<float>* widened) {
  if (q.dtype == DType::kFloat32) return static_cast<const float*>(q.data);
  widened->resize(static_cast<size_t>(q.num_elements()));
  ConvertToFloat(q, widened->data());
  return widened->data();
}

// Stores `count` elements starting at element `offset` of `src` as symmetric int8 with one scale
// (max |x| / 127; 0 for an all-zero row) in `*scale`.
void Quantize(const TensorView& src, int64_t offset, int64_t count, int8_t* dst, float* scale) {
  thread_local std::vector<float> buffer;
  const float* x = FloatRow(src, offset, count, &buffer);
  float max = 0.0f;
  for (int64_t i = 0; i < count; ++i) max = std::max(max, std::abs(x[i]));
  *scale = max / 127.0f;
  const float inverse = max > 0.0f ? 127.0f / max : 0.0f;
  // Rounds half to even like std::nearbyint in the default rounding mode, without its library
  // call per value: adding 1.5 x 2^23 leaves no fraction bits, so the sum is rounded to an
  // integer; exact for |v| <= 2^22, and |v| <= 127 here. (This loop with nearbyint was 12.6% of
  // a 2048-token int8 prefill's time.)
  constexpr float kRound = 12582912.0f;
  for (int64_t i = 0; i < count; ++i) {
    const float q = (x[i] * inverse + kRound) - kRound;
    dst[i] = static_cast<int8_t>(std::clamp(q, -127.0f, 127.0f));
  }
}

// Copies `count` elements starting at element `offset` of `src` into `dst` as `dtype`
// (float32 or bfloat16).
void CopyConverted(const TensorView& src, int64_t offset, int64_t count, DType dtype, char* dst) {
  if (src.dtype == dtype) {
    std::memcpy(dst, static_cast<const char*>(src.data) + offset * DTypeSize(dtype),
                static_cast<size_t>(count * DTypeSize(dtype)));
    return;
  }
  if (dtype == DType::kFloat32) {
    auto* out = reinterpret_cast<float*>(dst);
    for (int64_t i = 0; i < count; ++i) out[i] = src.At(offset + i);
    return;
  }
  thread_local std::vector<float> buffer;
  const float* x = FloatRow(src, offset, count, &buffer);
  auto* out = reinterpret_cast<uint16_t*>(dst);  // bf16 slots are 2-byte aligned in a block
  for (int64_t i = 0; i < count; ++i) out[i] = FloatToBf16(x[i]);
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

// Marks a sequence in use (so it is never evicted) until destroyed.
class KvCache::Lease {
 public:
  Lease(KvCache* cache, std::shared_ptr<Sequence> sequence)
      : cache_(cache), sequence_(std::move(sequence)) {}
  ~Lease() {
    if (sequence_) cache_->Done(sequence_.get());
  }
  Lease(Lease&& other) noexcept : cache_(other.cache_), sequence_(std::move(other.sequence_)) {}
  Lease(const Lease&) = delete;
  Sequence* operator->() const { return sequence_.get(); }
  Sequence& operator*() const { return *sequence_; }

 private:
  KvCache* cache_;
  std::shared_ptr<Sequence> sequence_;
};

KvCache::KvCache(KvCacheOptions options)
    : options_([&] {
        if (!options.clock) options.clock = SystemClock();
        return options;
      }()),
      pool_(options_.capacity_bytes, options_.block_bytes, options_.huge_pages) {}

KvCache::~KvCache() {
  // Sequences hold blocks; they must go before the pool.
  MutexLock lock(&registry_mu_);
  sequences_.clear();
}

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

absl::StatusOr<SequenceInfo> KvCache::Create(const SequenceConfig& requested, absl::string_view id,
                                             int64_t reserve_tokens) {
  SequenceConfig config = requested;
  if (config.n_head_kv == 0) config.n_head_kv = config.n_head;
  if (config.head_dim_v == 0) config.head_dim_v = config.head_dim;
  ATTEND_ASSIGN_OR_RETURN(const BlockLayout layout, LayoutFor(config));
  if (!id.empty()) ATTEND_RETURN_IF_ERROR(CheckId(id, "sequence_id"));
  if (reserve_tokens < 0 || reserve_tokens > (int64_t{1} << 40)) {
    return absl::InvalidArgumentError(
        absl::StrCat("reserve_tokens: ", reserve_tokens, "; must be between 0 and 2^40"));
  }
  auto check_registry = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(registry_mu_) -> absl::Status {
    if (!id.empty() && sequences_.count(id) > 0) {
      return absl::AlreadyExistsError(absl::StrCat("sequence ", Quoted(id), " already exists"));
    }
    if (static_cast<int64_t>(sequences_.size()) >= options_.max_sequences) {
      rejections_++;
      return absl::ResourceExhaustedError(absl::StrCat("the cache holds ", sequences_.size(),
                                                       " sequences, its limit (--max_sequences)"));
    }
    return absl::OkStatus();
  };
  {
    MutexLock lock(&registry_mu_);
    ATTEND_RETURN_IF_ERROR(check_registry());
  }

  {
    const std::string shape =
        absl::StrCat(config.n_head, "/", layout.n_head_kv, "/", layout.head_dim, "/",
                     layout.head_dim_v, "/", DTypeName(layout.dtype), "/", layout.tokens_per_block);
    bool warm;
    {
      MutexLock lock(&warm_mu_);
      warm = warmed_.contains(shape);
    }
    // A failed warm-up only means the first Append creates what is missing (and reports a real
    // failure itself): it does not fail the creation.
    if (!warm && WarmUpPagedAttention(layout, config.n_head, options_.compute_threads).ok()) {
      MutexLock lock(&warm_mu_);
      // Bounded like the primitives themselves (which the matmul cache may have dropped by the
      // time a forgotten shape comes back: it is then warmed up again).
      if (warmed_.size() >= kMaxWarmShapes) warmed_.erase(warmed_.begin());
      warmed_.insert(shape);
    }
  }

  auto sequence = std::make_shared<Sequence>();
  sequence->config = config;
  sequence->layout = layout;
  sequence->created_ms = options_.clock();
  sequence->last_used_ms = sequence->created_ms;
  const int64_t per_layer = layout.blocks_for(reserve_tokens);
  std::vector<BlockRef> blocks;
  ATTEND_RETURN_IF_ERROR(TakeBlocks(config.layers * per_layer, &blocks, [&] {
    return absl::StrCat("reserving ", reserve_tokens, " tokens in ", config.layers, " layers");
  }));
  // Held from before the sequence is published until it is described, so that the response
  // describes what was created even if a Release of the new id comes at once.
  MutexLock sequence_lock(&sequence->mu);
  sequence->layers.resize(static_cast<size_t>(config.layers));
  for (int64_t l = 0; l < config.layers; ++l) {
    Layer& layer = sequence->layers[static_cast<size_t>(l)];
    layer.blocks.assign(blocks.begin() + l * per_layer, blocks.begin() + (l + 1) * per_layer);
  }
  sequence->reserved_tokens = reserve_tokens;
  blocks.clear();
  {
    MutexLock lock(&registry_mu_);
    ATTEND_RETURN_IF_ERROR(check_registry());
    sequence->id = id.empty() ? NewId() : std::string(id);
    evicted_.erase(sequence->id);
    sequences_.emplace(sequence->id, sequence);
  }
  return Describe(*sequence);
}

std::string KvCache::NewId() {
  static thread_local std::mt19937_64 random(std::random_device{}());
  while (true) {
    std::string id = absl::StrFormat("seq-%016x", random() ^ (++id_counter_));
    if (sequences_.count(id) == 0) return id;
  }
}

absl::Status KvCache::NotFound(absl::string_view id) {
  auto it = evicted_.find(std::string(id));
  if (it != evicted_.end()) {
    return absl::NotFoundError(absl::StrCat("sequence ", Quoted(id), " ", it->second));
  }
  return absl::NotFoundError(absl::StrCat("no sequence ", Quoted(id)));
}

absl::StatusOr<std::shared_ptr<KvCache::Sequence>> KvCache::Acquire(absl::string_view id) {
  MutexLock lock(&registry_mu_);
  auto it = sequences_.find(id);
  if (it == sequences_.end()) return NotFound(id);
  it->second->in_use.fetch_add(1);
  it->second->last_used_ms = options_.clock();
  return it->second;
}

void KvCache::Done(Sequence* sequence) {
  sequence->last_used_ms = options_.clock();
  sequence->in_use.fetch_sub(1);
}

absl::Status KvCache::TakeBlocks(int64_t count, std::vector<BlockRef>* out,
                                 const std::function<std::string()>& what) {
  if (pool_.TryAllocate(count, out)) return absl::OkStatus();
  if (options_.eviction == EvictionPolicy::kLru) {
    // A concurrent taker may use the room an eviction made: plan again, a few times, each time
    // evicting only when that makes this request fit.
    for (int attempt = 0; attempt < 3; ++attempt) {
      std::vector<std::shared_ptr<Sequence>> victims = EvictLruFor(count);
      if (victims.empty()) break;
      victims.clear();  // frees their blocks (those no concurrent Get still describes)
      if (pool_.TryAllocate(count, out)) return absl::OkStatus();
    }
  } else if (options_.eviction == EvictionPolicy::kTtl && EvictExpired() > 0) {
    if (pool_.TryAllocate(count, out)) return absl::OkStatus();
  }
  rejections_++;
  const int64_t free = pool_.free_blocks();
  return absl::ResourceExhaustedError(absl::StrCat(
      what(), " needs ", count, " blocks (", BlockBytes(count, pool_.block_bytes()), "); ", free,
      " of ", pool_.total_blocks(), " blocks of ", BlockBytes(1, pool_.block_bytes()),
      " are free (cache capacity ", BlockBytes(pool_.total_blocks(), pool_.block_bytes()),
      ", eviction policy ", EvictionPolicyName(options_.eviction), ")"));
}

std::vector<std::shared_ptr<KvCache::Sequence>> KvCache::EvictLruFor(int64_t count) {
  MutexLock lock(&registry_mu_);
  std::vector<Sequence*> idle;
  for (const auto& [id, sequence] : sequences_) {
    if (sequence->in_use.load() == 0) idle.push_back(sequence.get());
  }
  std::stable_sort(idle.begin(), idle.end(), [](const Sequence* a, const Sequence* b) {
    return a->last_used_ms.load() < b->last_used_ms.load();
  });
  // Walk the idle sequences least recently used first, counting the blocks that evicting them
  // would return: a block shared with a fork returns only when its last holder goes, so each
  // block's references from the sequences walked so far are counted against its use count.
  // Idle sequences' locks are free but for a moment (Get, List); one that cannot be locked now
  // is not a candidate. Locking a sequence after the registry is against the lock order, which
  // a try-lock cannot deadlock.
  const int64_t free = pool_.free_blocks();
  absl::flat_hash_map<const Block*, long> remaining;  // references not yet walked
  int64_t freed = 0;
  std::vector<Sequence*> victims;
  for (Sequence* sequence : idle) {
    if (free + freed >= count) break;
    if (!sequence->mu.TryLock()) continue;
    for (const Layer& layer : sequence->layers) {
      for (const BlockRef& block : layer.blocks) {
        if (!block) continue;
        auto [it, inserted] = remaining.try_emplace(block.get(), block.use_count());
        if (--it->second == 0) ++freed;
      }
    }
    sequence->mu.Unlock();
    victims.push_back(sequence);
  }
  std::vector<std::shared_ptr<Sequence>> evicted;
  if (free + freed < count) return evicted;  // evicting cannot make it fit: evict nothing
  for (Sequence* victim : victims) {
    auto it = sequences_.find(victim->id);
    evicted.push_back(std::move(it->second));
    sequences_.erase(it);
    Forget(victim->id,
           absl::StrCat("was evicted (least recently used, last used at ",
                        victim->last_used_ms.load(), " ms) to make room for another request"));
    evictions_++;
  }
  return evicted;
}

void KvCache::Forget(const std::string& id, const std::string& reason) {
  if (evicted_.insert_or_assign(id, reason).second) evicted_order_.push_back(id);
  if (evicted_order_.size() > kRememberedEvictions) {
    evicted_.erase(evicted_order_.front());
    evicted_order_.pop_front();
  }
}

int64_t KvCache::EvictExpired() {
  if (options_.eviction != EvictionPolicy::kTtl) return 0;
  std::vector<std::shared_ptr<Sequence>> expired;
  {
    MutexLock lock(&registry_mu_);
    const int64_t now = options_.clock();
    for (auto it = sequences_.begin(); it != sequences_.end();) {
      const int64_t idle = now - it->second->last_used_ms.load();
      if (it->second->in_use.load() == 0 && idle > options_.idle_ttl_ms) {
        Forget(it->first, absl::StrCat("was evicted after ", idle / 1000.0, " s idle (TTL ",
                                       options_.idle_ttl_ms / 1000.0, " s)"));
        evictions_++;
        expired.push_back(std::move(it->second));
        it = sequences_.erase(it);
      } else {
        ++it;
      }
    }
  }
  const int64_t count = static_cast<int64_t>(expired.size());
  expired.clear();  // frees their blocks, outside the registry lock
  return count;
}

SequenceInfo KvCache::Describe(const Sequence& s) {
  SequenceInfo info;
  info.id = s.id;
  info.config = s.config;
  info.tokens = s.layers.empty() ? 0 : std::numeric_limits<int64_t>::max();
  for (const Layer& layer : s.layers) {
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
  MutexLock lock(&registry_mu_);
  return NotFound(s.id);
}

absl::Status KvCache::CheckAppend(const Sequence& s, int64_t layer, const AppendInput& input,
                                  bool decode) {
  ATTEND_RETURN_IF_ERROR(CheckNotReleased(s));
  const SequenceConfig& c = s.config;
  if (layer < 0 || layer >= c.layers) {
    return absl::InvalidArgumentError(absl::StrCat("layer ", layer, " is out of range: sequence ",
                                                   Quoted(s.id), " has ", c.layers,
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
  ATTEND_RETURN_IF_ERROR(CheckFinite(input.k, "k", options_.compute_threads));
  ATTEND_RETURN_IF_ERROR(CheckFinite(input.v, "v", options_.compute_threads));
  const int64_t tokens = s.layers[static_cast<size_t>(layer)].tokens;
  if (tokens + n > (int64_t{1} << 40)) {
    return absl::OutOfRangeError(
        absl::StrCat("layer ", layer, " would hold more than 2^40 tokens"));
  }
  return absl::OkStatus();
}

int64_t KvCache::BlocksNeeded(const Sequence& s, int64_t layer, int64_t n) {
  const Layer& l = s.layers[static_cast<size_t>(layer)];
  const int64_t tpb = s.layout.tokens_per_block;
  const int64_t first = l.tokens / tpb;
  const int64_t last = s.layout.blocks_for(l.tokens + n);  // exclusive
  int64_t needed = 0;
  for (int64_t b = first; b < last; ++b) {
    // A block to write into is new, or existing and shared (copied before writing).
    if (b >= static_cast<int64_t>(l.blocks.size()) ||
        l.blocks[static_cast<size_t>(b)].use_count() > 1) {
      ++needed;
    }
  }
  return needed;
}

void KvCache::DropOutsideWindow(Sequence& s, Layer& layer) {
  const int64_t window = s.config.window;
  if (window <= 0) return;
  // The next query (position layer.tokens) sees keys from tokens - window + 1 on; every later
  // one sees no earlier key. Blocks wholly before that are never read again.
  const int64_t first_needed = layer.tokens - window + 1;
  const int64_t tpb = s.layout.tokens_per_block;
  const int64_t reserved = s.layout.blocks_for(s.reserved_tokens);
  for (int64_t b = 0;
       (b + 1) * tpb <= first_needed && b < static_cast<int64_t>(layer.blocks.size()); ++b) {
    if (b < reserved) continue;  // reservations stay taken
    layer.blocks[static_cast<size_t>(b)].reset();
  }
}

absl::Status KvCache::CheckWindowKept(const Sequence& s, int64_t tokens, absl::string_view what) {
  const int64_t window = s.config.window;
  if (window <= 0) return absl::OkStatus();
  const int64_t tpb = s.layout.tokens_per_block;
  const int64_t first_needed = std::max<int64_t>(0, tokens - window + 1);
  for (size_t l = 0; l < s.layers.size(); ++l) {
    const Layer& layer = s.layers[l];
    for (int64_t b = first_needed / tpb; b * tpb < tokens; ++b) {
      if (b < static_cast<int64_t>(layer.blocks.size()) && !layer.blocks[static_cast<size_t>(b)]) {
        int64_t kept_from = 0;
        while (kept_from < static_cast<int64_t>(layer.blocks.size()) &&
               !layer.blocks[static_cast<size_t>(kept_from)]) {
          ++kept_from;
        }
        return absl::OutOfRangeError(absl::StrCat(
            what, " ", tokens, " tokens: layer ", l, " of sequence ", Quoted(s.id),
            " released the keys before token ", kept_from * tpb, " as its sliding window of ",
            window, " moved on; the shortest length possible is ", kept_from * tpb + window - 1));
      }
    }
  }
  return absl::OkStatus();
}

void KvCache::WriteTokens(Sequence& s, int64_t layer_index, const AppendInput& input,
                          std::vector<BlockRef>& fresh) {
  Layer& layer = s.layers[static_cast<size_t>(layer_index)];
  const BlockLayout& layout = s.layout;
  const int64_t tpb = layout.tokens_per_block;
  const int64_t n = input.k.dim(0);
  const int64_t first = layer.tokens / tpb;
  const int64_t last = layout.blocks_for(layer.tokens + n);
  for (int64_t b = first; b < last; ++b) {
    if (b >= static_cast<int64_t>(layer.blocks.size())) {
      layer.blocks.push_back(std::move(fresh.back()));
      fresh.pop_back();
    } else if (layer.blocks[static_cast<size_t>(b)].use_count() > 1) {
      BlockRef copy = std::move(fresh.back());
      fresh.pop_back();
      std::memcpy(copy->data, layer.blocks[static_cast<size_t>(b)]->data,
                  static_cast<size_t>(pool_.block_bytes()));
      layer.blocks[static_cast<size_t>(b)] = std::move(copy);
    }
  }
  const int64_t d = layout.head_dim, dv = layout.head_dim_v;
  // Tokens write disjoint slots: a long append converts them on every compute thread (serially,
  // a 2048-token prefill's conversion to bf16 took 8% of its time while the other threads
  // waited).
  const int threads =
      options_.compute_threads > 0 ? options_.compute_threads : omp_get_max_threads();
#pragma omp parallel for schedule(static) num_threads(threads) if (n * layout.n_head_kv >= 256)
  for (int64_t t = 0; t < n; ++t) {
    const int64_t position = layer.tokens + t;
    char* block = layer.blocks[static_cast<size_t>(position / tpb)]->data;
    const int64_t slot = position % tpb;
    for (int64_t g = 0; g < layout.n_head_kv; ++g) {
      if (layout.quantized()) {
        Quantize(input.k, (t * layout.n_head_kv + g) * d, d,
                 reinterpret_cast<int8_t*>(block + layout.key_offset(g, slot)),
                 reinterpret_cast<float*>(block + layout.key_scale_offset(g, slot)));
        Quantize(input.v, (t * layout.n_head_kv + g) * dv, dv,
                 reinterpret_cast<int8_t*>(block + layout.value_offset(g, slot)),
                 reinterpret_cast<float*>(block + layout.value_scale_offset(g, slot)));
        continue;
      }
      CopyConverted(input.k, (t * layout.n_head_kv + g) * d, d, layout.dtype,
                    block + layout.key_offset(g, slot));
      CopyConverted(input.v, (t * layout.n_head_kv + g) * dv, dv, layout.dtype,
                    block + layout.value_offset(g, slot));
    }
  }
  layer.tokens += n;
  s.total_tokens += n;
}

absl::StatusOr<AppendResult> KvCache::Append(int64_t layer, const AppendInput& input,
                                             Precision precision, bool want_weights,
                                             AttentionStats* stats, int64_t max_weight_elements,
                                             const Cancellation* cancel) {
  ATTEND_ASSIGN_OR_RETURN(std::shared_ptr<Sequence> acquired, Acquire(input.id));
  Lease sequence(this, std::move(acquired));
  MutexLock lock(&sequence->mu);
  ATTEND_RETURN_IF_ERROR(CheckAppend(*sequence, layer, input, /*decode=*/false));
  const int64_t n = input.k.dim(0);
  Layer& target = sequence->layers[static_cast<size_t>(layer)];
  const int64_t before = target.tokens;
  const int64_t after = before + n;
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
  const int64_t needed = BlocksNeeded(*sequence, layer, n);
  ATTEND_RETURN_IF_ERROR(TakeBlocks(needed, &fresh, [&] {
    const int64_t room = pool_.free_blocks() * sequence->layout.tokens_per_block;
    return absl::StrCat("appending ", n, " tokens to layer ", layer, " of sequence ",
                        Quoted(input.id), " (at most about ", room,
                        " more tokens fit in that layer now)");
  }));

  // What a failed attention must restore: the block count and the shared blocks that writing
  // replaces with private copies (held here, they stay shared either way).
  const size_t old_size = target.blocks.size();
  std::vector<std::pair<size_t, BlockRef>> replaced;
  {
    const int64_t tpb = sequence->layout.tokens_per_block;
    for (int64_t b = before / tpb; b < static_cast<int64_t>(old_size); ++b) {
      if (target.blocks[static_cast<size_t>(b)].use_count() > 1) {
        replaced.emplace_back(static_cast<size_t>(b), target.blocks[static_cast<size_t>(b)]);
      }
    }
  }
  WriteTokens(*sequence, layer, input, fresh);

  AppendResult result;
  result.first_position = before;
  result.layer_tokens = after;
  if (input.q) {
    std::vector<float> widened;
    const float* q = QueryFloats(*input.q, &widened);
    result.output.resize(static_cast<size_t>(n * c.n_head * c.head_dim_v));
    if (want_weights) result.weights.resize(static_cast<size_t>(c.n_head * n * after));
    PagedProblem problem;
    problem.layout = &sequence->layout;
    problem.blocks = &target.blocks;
    problem.tokens = after;
    problem.mask = {/*causal=*/true, c.window};
    problem.scale = SoftmaxScale(c);
    problem.q = q;
    problem.n = n;
    problem.n_head = c.n_head;
    problem.output = result.output.data();
    problem.weights = want_weights ? result.weights.data() : nullptr;
    absl::Status status =
        RunPagedAttention({&problem, 1}, precision, options_.compute_threads, stats, cancel);
    if (!status.ok()) {
      target.tokens = before;
      sequence->total_tokens -= n;
      target.blocks.resize(old_size);
      for (auto& [index, block] : replaced) target.blocks[index] = std::move(block);
      return status;
    }
  }
  DropOutsideWindow(*sequence, target);
  return result;
}

absl::StatusOr<std::vector<AppendResult>> KvCache::DecodeBatch(int64_t layer,
                                                               absl::Span<const AppendInput> inputs,
                                                               Precision precision,
                                                               AttentionStats* stats,
                                                               const Cancellation* cancel) {
  if (inputs.empty()) return absl::InvalidArgumentError("steps: empty; give at least one sequence");
  std::map<std::string, size_t, std::less<>> order;  // id -> step index, sorted for locking
  for (size_t i = 0; i < inputs.size(); ++i) {
    auto [it, inserted] = order.emplace(inputs[i].id, i);
    if (!inserted) {
      return absl::InvalidArgumentError(
          absl::StrCat("steps[", i, "]: sequence ", Quoted(inputs[i].id),
                       " appears twice (also steps[", it->second, "])"));
    }
  }
  std::vector<Lease> leases;
  std::vector<Sequence*> sequences(inputs.size());
  leases.reserve(inputs.size());
  for (size_t i = 0; i < inputs.size(); ++i) {
    absl::StatusOr<std::shared_ptr<Sequence>> acquired = Acquire(inputs[i].id);
    if (!acquired.ok()) {
      return absl::Status(acquired.status().code(),
                          absl::StrCat("steps[", i, "]: ", acquired.status().message()));
    }
    sequences[i] = acquired->get();
    leases.emplace_back(this, *std::move(acquired));
  }
  // Lock in id order so that two batches over the same sequences cannot deadlock.
  std::vector<std::unique_ptr<MutexLock>> locks;
  for (const auto& [id, index] : order) {
    locks.push_back(std::make_unique<MutexLock>(&sequences[index]->mu));
  }

  int64_t needed = 0;
  for (size_t i = 0; i < inputs.size(); ++i) {
    Sequence& s = *sequences[i];
    s.mu.AssertHeld();
    absl::Status status = CheckAppend(s, layer, inputs[i], /*decode=*/true);
    if (!status.ok()) {
      return absl::Status(status.code(), absl::StrCat("steps[", i, "] (sequence ", Quoted(s.id),
                                                      "): ", status.message()));
    }
    needed += BlocksNeeded(s, layer, 1);
  }
  std::vector<BlockRef> fresh;
  ATTEND_RETURN_IF_ERROR(TakeBlocks(needed, &fresh, [&] {
    return absl::StrCat("a decode step of ", inputs.size(), " sequences in layer ", layer);
  }));

  struct Change {
    size_t old_size;
    std::vector<std::pair<size_t, BlockRef>> replaced;
  };
  std::vector<Change> changes(inputs.size());
  std::vector<std::vector<float>> queries(inputs.size());
  std::vector<AppendResult> results(inputs.size());
  std::vector<PagedProblem> problems(inputs.size());
  for (size_t i = 0; i < inputs.size(); ++i) {
    Sequence& s = *sequences[i];
    s.mu.AssertHeld();
    Layer& target = s.layers[static_cast<size_t>(layer)];
    const int64_t tpb = s.layout.tokens_per_block;
    changes[i].old_size = target.blocks.size();
    for (int64_t b = target.tokens / tpb; b < static_cast<int64_t>(target.blocks.size()); ++b) {
      if (target.blocks[static_cast<size_t>(b)].use_count() > 1) {
        changes[i].replaced.emplace_back(static_cast<size_t>(b),
                                         target.blocks[static_cast<size_t>(b)]);
      }
    }
    results[i].first_position = target.tokens;
    WriteTokens(s, layer, inputs[i], fresh);
    results[i].layer_tokens = target.tokens;

    const SequenceConfig& c = s.config;
    const float* q = QueryFloats(*inputs[i].q, &queries[i]);
    results[i].output.resize(static_cast<size_t>(c.n_head * c.head_dim_v));
    PagedProblem& p = problems[i];
    p.layout = &s.layout;
    p.blocks = &target.blocks;
    p.tokens = target.tokens;
    p.mask = {/*causal=*/true, c.window};
    p.scale = SoftmaxScale(c);
    p.q = q;
    p.n = 1;
    p.n_head = c.n_head;
    p.output = results[i].output.data();
  }
  absl::Status status =
      RunPagedAttention(problems, precision, options_.compute_threads, stats, cancel);
  if (!status.ok()) {
    for (size_t i = 0; i < inputs.size(); ++i) {
      Sequence& s = *sequences[i];
      s.mu.AssertHeld();
      Layer& target = s.layers[static_cast<size_t>(layer)];
      target.tokens -= 1;
      s.total_tokens -= 1;
      target.blocks.resize(changes[i].old_size);
      for (auto& [index, block] : changes[i].replaced) target.blocks[index] = std::move(block);
    }
    return status;
  }
  for (size_t i = 0; i < inputs.size(); ++i) {
    Sequence& s = *sequences[i];
    s.mu.AssertHeld();
    DropOutsideWindow(s, s.layers[static_cast<size_t>(layer)]);
  }
  return results;
}

absl::StatusOr<SequenceInfo> KvCache::Fork(absl::string_view source, absl::string_view new_id,
                                           std::optional<int64_t> tokens) {
  if (!new_id.empty()) ATTEND_RETURN_IF_ERROR(CheckId(new_id, "new_id"));
  auto fork = std::make_shared<Sequence>();
  std::vector<Layer> layers;
  int64_t length = 0;
  {
    ATTEND_ASSIGN_OR_RETURN(std::shared_ptr<Sequence> acquired, Acquire(source));
    Lease from(this, std::move(acquired));
    MutexLock lock(&from->mu);
    ATTEND_RETURN_IF_ERROR(CheckNotReleased(*from));
    int64_t common = std::numeric_limits<int64_t>::max();
    for (const Layer& layer : from->layers) common = std::min(common, layer.tokens);
    length = tokens.value_or(common);
    if (length < 0 || length > common) {
      return absl::OutOfRangeError(absl::StrCat("fork at ", length, " tokens: sequence ",
                                                Quoted(source), " holds ", common,
                                                " tokens in every layer"));
    }
    ATTEND_RETURN_IF_ERROR(CheckWindowKept(*from, length, "fork at"));
    fork->config = from->config;
    fork->layout = from->layout;
    const int64_t blocks = from->layout.blocks_for(length);
    layers.resize(from->layers.size());
    for (size_t l = 0; l < layers.size(); ++l) {
      const Layer& src = from->layers[l];
      layers[l].blocks.assign(src.blocks.begin(), src.blocks.begin() + blocks);
      layers[l].tokens = length;
    }
  }
  fork->created_ms = options_.clock();
  fork->last_used_ms = fork->created_ms;
  fork->forked_from = std::string(source);
  fork->total_tokens = length * static_cast<int64_t>(layers.size());
  // Held until the fork is described (see Create).
  MutexLock lock(&fork->mu);
  fork->layers = std::move(layers);
  {
    MutexLock registry(&registry_mu_);
    if (!new_id.empty() && sequences_.count(new_id) > 0) {
      return absl::AlreadyExistsError(absl::StrCat("sequence ", Quoted(new_id), " already exists"));
    }
    if (static_cast<int64_t>(sequences_.size()) >= options_.max_sequences) {
      rejections_++;
      return absl::ResourceExhaustedError(absl::StrCat("the cache holds ", sequences_.size(),
                                                       " sequences, its limit (--max_sequences)"));
    }
    fork->id = new_id.empty() ? NewId() : std::string(new_id);
    evicted_.erase(fork->id);
    sequences_.emplace(fork->id, fork);
  }
  return Describe(*fork);
}

absl::StatusOr<SequenceInfo> KvCache::Truncate(absl::string_view id, int64_t tokens) {
  ATTEND_ASSIGN_OR_RETURN(std::shared_ptr<Sequence> acquired, Acquire(id));
  Lease sequence(this, std::move(acquired));
  MutexLock lock(&sequence->mu);
  ATTEND_RETURN_IF_ERROR(CheckNotReleased(*sequence));
  if (tokens < 0) {
    return absl::InvalidArgumentError(absl::StrCat("tokens: ", tokens, "; must be >= 0"));
  }
  for (size_t l = 0; l < sequence->layers.size(); ++l) {
    if (sequence->layers[l].tokens < tokens) {
      return absl::OutOfRangeError(absl::StrCat("truncate to ", tokens, " tokens: layer ", l,
                                                " of sequence ", Quoted(id), " holds only ",
                                                sequence->layers[l].tokens));
    }
  }
  ATTEND_RETURN_IF_ERROR(CheckWindowKept(*sequence, tokens, "truncate to"));
  const BlockLayout& layout = sequence->layout;
  const size_t keep = static_cast<size_t>(
      std::max(layout.blocks_for(tokens), layout.blocks_for(sequence->reserved_tokens)));
  for (Layer& layer : sequence->layers) {
    sequence->total_tokens -= layer.tokens - tokens;
    layer.tokens = tokens;
    if (layer.blocks.size() > keep) layer.blocks.resize(keep);
  }
  return Describe(*sequence);
}

absl::StatusOr<int64_t> KvCache::Release(absl::string_view id) {
  ATTEND_ASSIGN_OR_RETURN(std::shared_ptr<Sequence> acquired, Acquire(id));
  Lease sequence(this, std::move(acquired));
  MutexLock lock(&sequence->mu);
  ATTEND_RETURN_IF_ERROR(CheckNotReleased(*sequence));
  sequence->released = true;
  {
    MutexLock registry(&registry_mu_);
    sequences_.erase(sequence->id);
    Forget(sequence->id, "was released");
  }
  int64_t freed = 0;
  for (Layer& layer : sequence->layers) {
    for (const BlockRef& block : layer.blocks) freed += block && block.use_count() == 1;
  }
  sequence->total_tokens = 0;
  sequence->layers.clear();
  return freed * pool_.block_bytes();
}

absl::StatusOr<SequenceInfo> KvCache::Get(absl::string_view id) {
  std::shared_ptr<Sequence> sequence;
  {
    MutexLock lock(&registry_mu_);
    auto it = sequences_.find(id);
    if (it == sequences_.end()) return NotFound(id);
    sequence = it->second;
  }
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
  if (page_token.size() > kMaxIdBytes) {
    return absl::InvalidArgumentError("page_token: not a token this server returned");
  }
  std::vector<std::shared_ptr<Sequence>> page;
  ListPage result;
  {
    MutexLock lock(&registry_mu_);
    auto it = page_token.empty() ? sequences_.begin() : sequences_.upper_bound(page_token);
    for (; it != sequences_.end() && static_cast<int64_t>(page.size()) < page_size; ++it) {
      page.push_back(it->second);
    }
    if (it != sequences_.end() && !page.empty()) result.next_page_token = page.back()->id;
  }
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
  stats.evictions = evictions_.load();
  stats.rejections = rejections_.load();
  stats.policy = options_.eviction;
  {
    MutexLock lock(&warm_mu_);
    stats.warmed_shapes = static_cast<int64_t>(warmed_.size());
  }
  MutexLock lock(&registry_mu_);
  stats.sequences = static_cast<int64_t>(sequences_.size());
  for (const auto& [id, sequence] : sequences_) stats.tokens += sequence->total_tokens.load();
  return stats;
}

absl::Status KvCache::CheckConsistency() {
  std::vector<std::shared_ptr<Sequence>> all;
  {
    MutexLock lock(&registry_mu_);
    for (const auto& [id, sequence] : sequences_) all.push_back(sequence);
  }
  absl::flat_hash_set<const Block*> held;
  for (const auto& s : all) {
    MutexLock lock(&s->mu);
    if (static_cast<int64_t>(s->layers.size()) != s->config.layers) {
      return absl::InternalError(absl::StrCat("sequence ", Quoted(s->id), " has ", s->layers.size(),
                                              " layers of ", s->config.layers));
    }
    int64_t tokens = 0;
    for (size_t l = 0; l < s->layers.size(); ++l) {
      const Layer& layer = s->layers[l];
      tokens += layer.tokens;
      if (layer.tokens > static_cast<int64_t>(layer.blocks.size()) * s->layout.tokens_per_block) {
        return absl::InternalError(absl::StrCat("layer ", l, " of sequence ", Quoted(s->id),
                                                " holds ", layer.tokens, " tokens in ",
                                                layer.blocks.size(), " blocks"));
      }
      for (const BlockRef& block : layer.blocks) {
        if (block) held.insert(block.get());
      }
    }
    if (tokens != s->total_tokens.load()) {
      return absl::InternalError(absl::StrCat("sequence ", Quoted(s->id), " counts ",
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
