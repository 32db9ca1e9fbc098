// The KV cache: sequences of cached keys and values in paged blocks from one byte budget, and
// attention of each layer's new queries over them.
//
// A sequence has a fixed shape (layers, heads, head sizes, storage dtype, optional sliding
// window: blocks that no later query can see are released as it slides). Each layer advances
// on its own: a client sends layer 0's new tokens, then layer 1's, and so on, and every Append
// returns the attention of the new queries over all of that layer's cached tokens (causal,
// queries aligned to the end, GQA/MQA aware). Sequences fork copy-on-write: blocks are shared
// (reference-counted) until one side writes into a shared block, which it then copies.
//
// Admission: an operation that needs blocks takes them all before it changes anything; when the
// pool cannot supply them (after eviction, if the policy allows) it fails RESOURCE_EXHAUSTED and
// says what would fit. A failed operation leaves every sequence exactly as it was.
//
// Eviction: kNone rejects; kLru evicts idle sequences, least recently used first, to make room;
// kTtl evicts sequences idle longer than the TTL (EvictExpired(), which the owner calls
// periodically, and before rejecting). A sequence in use by an operation is never evicted.
// Evicted sequences answer NOT_FOUND with the reason.
//
// Thread-safety: all methods are thread-safe. Operations on different sequences run in
// parallel; operations on one sequence are serialised by its lock. Lock order: a sequence's lock,
// then the registry lock, then the pool's lock.
#ifndef ATTEND_CORE_KV_CACHE_KV_CACHE_H_
#define ATTEND_CORE_KV_CACHE_KV_CACHE_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/attention/attention.h"
#include "core/base/cancellation.h"
#include "core/base/mutex.h"
#include "core/base/tensor.h"
#include "core/kv_cache/block_pool.h"
#include "core/kv_cache/layout.h"

namespace attend::kv {

struct Sequence;  // core/kv_cache/sequence.h
class SequenceRegistry;
class SnapshotReader;  // core/kv_cache/snapshot_format.h

enum class EvictionPolicy { kNone, kLru, kTtl };
absl::string_view EvictionPolicyName(EvictionPolicy policy);

// Milliseconds on some monotonic-enough clock; tests substitute their own.
using Clock = std::function<int64_t()>;
Clock SystemClock();

struct KvCacheOptions {
  int64_t capacity_bytes = int64_t{1} << 30;
  int64_t block_bytes = int64_t{1} << 20;
  // Blocks in memory advised for 2 MiB pages (see core/base/large_memory.h): decode reads them
  // faster; false avoids the kernel's compaction stalls at first write.
  bool huge_pages = true;
  int64_t max_sequences = 65536;
  // Most bytes the sequences' bookkeeping may take outside the blocks (each layer's block
  // table: about 32 bytes a layer and 16 a block reference, plus a few hundred a sequence).
  // Empty sequences take no blocks, and a fork copies its source's tables while sharing every
  // block, so without this limit memory would grow past the byte budget. 0 = an eighth of
  // capacity_bytes, at least 16 MiB.
  int64_t max_bookkeeping_bytes = 0;
  EvictionPolicy eviction = EvictionPolicy::kNone;
  int64_t idle_ttl_ms = 10 * 60 * 1000;
  int compute_threads = 0;  // OpenMP threads per attention call; 0 = all
  AttentionLimits limits;
  Clock clock;  // default SystemClock()
};

struct SequenceConfig {
  int64_t layers = 0;
  int64_t n_head = 0;
  int64_t n_head_kv = 0;  // 0 = n_head
  int64_t head_dim = 0;
  int64_t head_dim_v = 0;  // 0 = head_dim
  // Storage: kFloat32, kBFloat16, or kInt8 (symmetric, one float scale per token and head:
  // a quarter of f32's bytes; attention then runs in f32 on the dequantized values).
  DType kv_dtype = DType::kBFloat16;
  std::optional<float> scale;  // default 1 / sqrt(head_dim)
  int64_t window = 0;          // sliding window in tokens; 0 = unlimited
};

struct SequenceInfo {
  std::string id;
  SequenceConfig config;
  std::vector<int64_t> layer_tokens;
  int64_t tokens = 0;  // min over layers
  int64_t blocks = 0;
  int64_t shared_blocks = 0;
  int64_t bytes = 0;
  int64_t reserved_tokens = 0;
  int64_t tokens_per_block = 0;
  std::string forked_from;
  int64_t created_ms = 0;
  int64_t last_used_ms = 0;
};

struct CacheStats {
  int64_t capacity_bytes = 0;
  int64_t used_bytes = 0;
  int64_t block_bytes = 0;
  int64_t blocks_total = 0;
  int64_t blocks_used = 0;
  int64_t blocks_free = 0;
  int64_t sequences = 0;
  int64_t tokens = 0;                   // over sequences and layers
  int64_t bookkeeping_bytes = 0;        // charged to the sequences (see max_bookkeeping_bytes)
  int64_t bookkeeping_limit_bytes = 0;  // max_bookkeeping_bytes as applied
  int64_t evictions = 0;
  int64_t rejections = 0;
  EvictionPolicy policy = EvictionPolicy::kNone;
  // Sequence shapes whose prefill primitives were created at their first Create (at most
  // 1024 are remembered; see Create).
  int64_t warmed_shapes = 0;
};

// One layer's new tokens for one sequence. `q` may be absent (only append).
struct AppendInput {
  std::string id;
  std::optional<TensorView> q;  // [n, n_head, head_dim]
  TensorView k;                 // [n, n_head_kv, head_dim]
  TensorView v;                 // [n, n_head_kv, head_dim_v]
};

struct AppendResult {
  std::vector<float> output;   // [n, n_head, head_dim_v] (empty without q)
  std::vector<float> weights;  // [n_head, n, layer_tokens] when asked
  int64_t first_position = 0;
  int64_t layer_tokens = 0;
};

struct ListPage {
  std::vector<SequenceInfo> sequences;
  std::string next_page_token;
};

class KvCache {
 public:
  explicit KvCache(KvCacheOptions options);
  ~KvCache();

  KvCache(const KvCache&) = delete;
  KvCache& operator=(const KvCache&) = delete;

  // Creates a sequence. `id` empty: a generated id ("seq-<16 hex digits>", or
  // "<generated_key>/<16 hex digits>" when `generated_key` is given, so that the id routes by
  // that key: common/sequence_key.h). INVALID_ARGUMENT for a bad shape, id or key,
  // ALREADY_EXISTS for an id in use, RESOURCE_EXHAUSTED for the sequence limit or when the
  // reservation does not fit. The first sequence of each shape also creates the oneDNN
  // primitives its prefills need (WarmUpPagedAttention: tens of ms, once), so that appends
  // do not.
  absl::StatusOr<SequenceInfo> Create(const SequenceConfig& config, absl::string_view id,
                                      int64_t reserve_tokens, absl::string_view generated_key = {});

  // Appends one layer's new tokens to one sequence and returns the attention of its queries.
  // All shapes must match the sequence's config; n >= 1. With `want_weights`, weights larger
  // than `max_weight_elements` (or the score limit) are refused before anything changes. When
  // `cancel` is set during the attention, it stops between tiles, the sequence is left as it
  // was before the call, and the result is CANCELLED. An output that `output_dtype` (the dtype
  // the caller will encode it in) cannot hold is INVALID_ARGUMENT, and changes nothing either.
  absl::StatusOr<AppendResult> Append(int64_t layer, const AppendInput& input, Precision precision,
                                      bool want_weights, AttentionStats* stats,
                                      int64_t max_weight_elements = int64_t{1} << 62,
                                      const Cancellation* cancel = nullptr,
                                      DType output_dtype = DType::kFloat32);

  // One new token (n = 1) for each of several distinct sequences, in one layer, computed as one
  // batch; all or nothing (a cancelled batch changes nothing). Results are in the order of
  // `inputs`; every input needs q.
  absl::StatusOr<std::vector<AppendResult>> DecodeBatch(int64_t layer,
                                                        absl::Span<const AppendInput> inputs,
                                                        Precision precision, AttentionStats* stats,
                                                        const Cancellation* cancel = nullptr,
                                                        DType output_dtype = DType::kFloat32);

  // New tokens of several distinct sequences in one layer, each its own count (n >= 1; prompts,
  // decode steps or both), computed as one batch; all or nothing (a cancelled or failed batch
  // changes nothing). Inputs without q are only appended (their result has no output). Results
  // are in the order of `inputs`. Errors name the input as sequence_ids[i].
  absl::StatusOr<std::vector<AppendResult>> AppendBatch(int64_t layer,
                                                        absl::Span<const AppendInput> inputs,
                                                        Precision precision, AttentionStats* stats,
                                                        const Cancellation* cancel = nullptr,
                                                        DType output_dtype = DType::kFloat32);

  // Bytes of keys and values one decode step of these sequences reads in one layer: each one's
  // tokens (averaged over its layers) times its bytes per token and layer, scales included;
  // unknown and released ids count 0. An estimate for choosing where to run a step: it waits
  // for no sequence's lock, and the sequences may change before the step runs.
  int64_t DecodeReadBytes(absl::Span<const absl::string_view> ids) const;

  // Whether a DecodeBatch of these sequences is small enough that its attention runs on the
  // calling thread alone, without waking the OpenMP team: DecodeReadBytes(ids) under the
  // attention engine's serial threshold (tile::kSerialDecodeBytes, 1 MiB: about what waking and
  // joining a thread costs). A caller with threads of its own (a server's request threads) can
  // then run such a step where it is instead of handing it to a worker, which would only add
  // a hand-off. The same estimate as DecodeReadBytes, with its caveats: it waits for no lock and
  // may be stale by the time the step runs; a wrong answer costs time, never correctness. True
  // for no known sequence (nothing to read).
  bool DecodeRunsOnCallingThread(absl::Span<const absl::string_view> ids) const;

  // A new sequence sharing the first `tokens` (default: every layer's common length) of
  // `source`, copy-on-write. `new_id` empty: a generated id that routes by the source's routing
  // key ("<key>/<16 hex digits>"; INVALID_ARGUMENT when the key is too long for that), so that
  // the fork is found where its source is. INVALID_ARGUMENT when `tokens` is negative,
  // OUT_OF_RANGE past the source's common length.
  absl::StatusOr<SequenceInfo> Fork(absl::string_view source, absl::string_view new_id,
                                    std::optional<int64_t> tokens);
  // Drops every token at or after `tokens` in every layer; OUT_OF_RANGE past any layer's end.
  absl::StatusOr<SequenceInfo> Truncate(absl::string_view id, int64_t tokens);
  // Removes the sequence; returns the bytes returned to the pool (shared blocks are freed by
  // their last user).
  absl::StatusOr<int64_t> Release(absl::string_view id);
  absl::StatusOr<SequenceInfo> Get(absl::string_view id);
  // Sequences in id order after `page_token`; page_size in [1, 1000] (0 = 100).
  absl::StatusOr<ListPage> List(int64_t page_size, absl::string_view page_token);
  CacheStats Stats();

  // Evicts sequences idle for longer than the TTL (policy kTtl only); returns how many.
  int64_t EvictExpired();

  // Writes sequence `id` to `sink` in the snapshot format (core/kv_cache/snapshot_format.h):
  // its config, fork relation and every layer's stored rows, byte for byte. The rows are those
  // of one moment: the block tables are copied under the sequence's lock and the blocks are
  // read after it is let go, while appends to the sequence go on (an append that writes into a
  // block the save still reads copies it first, taking one block from the pool). With
  // `share_with_source`, the header also says, per layer, how many leading tokens the sequence
  // shares with the one it was forked from, so that a load can share them again. Does not count as
  // a use (the sequence's idle time goes on). NOT_FOUND for an unknown id; the sink's errors.
  absl::Status Save(absl::string_view id,
                    const std::function<absl::Status(absl::string_view)>& sink,
                    absl::string_view attend_version, bool share_with_source = true);

  // Reads a snapshot from `reader` (nothing read yet) and adds its sequence, named `id` (empty:
  // the saved id), exactly as saved: tokens, rows, reservation, window, fork relation and
  // creation time. All or nothing: the sequence is published only after the last row and the
  // trailer are checked, so a torn, corrupted or foreign file adds nothing and changes nothing.
  // With `share_with_source`, the leading tokens the snapshot shared with its source (per layer)
  // share that sequence's blocks again when the source still holds them and its rows are the
  // same bytes (compared); FAILED_PRECONDITION when they are not (load it again without sharing).
  // Errors: the reader's (DATA_LOSS, INVALID_ARGUMENT, FAILED_PRECONDITION, naming the file),
  // INVALID_ARGUMENT for a config this cache refuses, ALREADY_EXISTS, RESOURCE_EXHAUSTED when
  // its blocks do not fit (no eviction of other sequences is skipped for it).
  absl::StatusOr<SequenceInfo> Load(SnapshotReader& reader, absl::string_view id = {},
                                    bool share_with_source = true);

  // Freezes sequence `id` for a move to another server: from now on every change to it
  // (Append, DecodeBatch, AppendBatch, Truncate, Fork from it, Release) answers UNAVAILABLE
  // saying it is moving, while reads (Get, List, Save, DecodeReadBytes) go on. A change that
  // held the sequence's lock before the Seal finished first, so a Save after the Seal reads the
  // sequence's last state. Ends with Unseal (the move failed: it serves again) or ReleaseSealed
  // (the move finished). NOT_FOUND for an unknown id, FAILED_PRECONDITION when it is sealed
  // already (one move at a time).
  absl::Status Seal(absl::string_view id);
  // FAILED_PRECONDITION when the sequence is not sealed.
  absl::Status Unseal(absl::string_view id);
  // Release for the end of a move: as Release, but only of a sealed sequence
  // (FAILED_PRECONDITION otherwise).
  absl::StatusOr<int64_t> ReleaseSealed(absl::string_view id);

  // The block layout a config gets, or INVALID_ARGUMENT (for planning and tests).
  absl::StatusOr<BlockLayout> LayoutFor(const SequenceConfig& config) const;

  // For tests and fuzzing: OK when the pool's used blocks are exactly the distinct blocks the
  // sequences hold (no block is owned by nothing), every sequence has all its layers, each
  // layer's tokens fit in its blocks, and the token counts agree. INTERNAL naming the first
  // inconsistency otherwise. Meaningful only while no other operation runs.
  absl::Status CheckConsistency();

 private:
  // Takes the blocks a request needs, `need()` of them, evicting idle sequences when the policy
  // allows. `copies` are the shared blocks among them that the request would copy: evicting
  // their other holders lowers the need, which is why it is asked again after each eviction.
  // On failure the error says `what` needed them and what would fit.
  absl::Status TakeBlocks(const std::function<int64_t()>& need,
                          const std::vector<const Block*>& copies, std::vector<BlockRef>* out,
                          const std::function<std::string()>& what);
  // DecodeBatch (`decode`: one token each, q required) and AppendBatch.
  absl::StatusOr<std::vector<AppendResult>> AppendMany(int64_t layer,
                                                       absl::Span<const AppendInput> inputs,
                                                       Precision precision, AttentionStats* stats,
                                                       const Cancellation* cancel,
                                                       DType output_dtype, bool decode);
  // Blocks that evicting every idle sequence would free (0 unless the policy is kLru), for the
  // "how much fits" of a refusal.
  int64_t EvictableBlocks();
  // Creates the prefill primitives of a new shape once (see Create).
  void WarmUp(const BlockLayout& layout, int64_t n_head);
  // OK unless the sequence was released after it was looked up (then NOT_FOUND, as for an id
  // that is gone). REQUIRES: sequence.mu held.
  absl::Status CheckNotReleased(const Sequence& sequence);
  // CheckNotReleased, and UNAVAILABLE while the sequence is sealed (Seal): for the operations
  // that change it. REQUIRES: sequence.mu held.
  absl::Status CheckChangeable(const Sequence& sequence);
  // Release, with `sealed` saying whether the sequence must be sealed (ReleaseSealed) or must
  // not be (Release).
  absl::StatusOr<int64_t> ReleaseImpl(absl::string_view id, bool sealed);
  // REQUIRES: sequence.mu held.
  SequenceInfo Describe(const Sequence& sequence);
  absl::Status CheckAppend(const Sequence& sequence, int64_t layer, const AppendInput& input,
                           bool decode);

  const KvCacheOptions options_;
  BlockPool pool_;
  // After the pool: sequences hold blocks, so they must go first.
  std::unique_ptr<SequenceRegistry> registry_;
  std::atomic<int64_t> rejections_{0};

  // Shapes (layout and query heads) whose prefill primitives were created, at most 1024. Not
  // held while warming: two first creations of one shape may both warm up, which is harmless.
  Mutex warm_mu_;
  absl::flat_hash_set<std::string> warmed_ ABSL_GUARDED_BY(warm_mu_);
};

}  // namespace attend::kv

#endif  // ATTEND_CORE_KV_CACHE_KV_CACHE_H_
