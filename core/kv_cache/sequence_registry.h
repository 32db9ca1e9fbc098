// The KV cache's sequences by id: lookups that hold a sequence in use for an operation, the
// sequence limit, generated ids, the reasons recently gone ids went (evicted, released), and
// eviction, which only ever takes sequences no operation holds.
//
// Thread-safety: all methods are thread-safe. The registry's lock comes after a sequence's lock
// and before the block pool's (see kv_cache.h); the registry never waits for a sequence's lock.
#ifndef ATTEND_CORE_KV_CACHE_SEQUENCE_REGISTRY_H_
#define ATTEND_CORE_KV_CACHE_SEQUENCE_REGISTRY_H_

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "core/base/mutex.h"
#include "core/kv_cache/block_pool.h"
#include "core/kv_cache/kv_cache.h"
#include "core/kv_cache/sequence.h"

namespace attend::kv {

// OK when `id` can name a sequence: 1 to 128 characters of [A-Za-z0-9._:/-] whose parts between
// '/'s are not empty, "." or ".." (the part before the first '/' is the id's routing key:
// common/sequence_key.h); INVALID_ARGUMENT naming `field` otherwise.
absl::Status CheckSequenceId(absl::string_view id, absl::string_view field);

// An id for a message: quoted as it is when it could be a sequence's id; otherwise (ids come from
// clients, and unknown ones are echoed in NOT_FOUND) escaped and cut to its first 64 bytes, so
// that no message carries control characters or grows with the request.
std::string QuotedId(absl::string_view id);

// OK when ids generated to route by `key` ("<key>/<16 hex digits>") are valid ids: `key` is a
// valid id without '/' of at most 111 bytes. INVALID_ARGUMENT naming `field` otherwise.
absl::Status CheckGeneratedKey(absl::string_view key, absl::string_view field);

// A byte count for a message, in binary units from bytes to ZiB ("8.00 MiB").
std::string FormatBytes(double bytes);

class SequenceRegistry {
 public:
  // `max_bookkeeping_bytes` bounds the sum of the published sequences' bookkeeping_bytes.
  SequenceRegistry(int64_t max_sequences, int64_t max_bookkeeping_bytes, Clock clock);
  // Drops every sequence (their blocks go back to the pool, which must still exist).
  ~SequenceRegistry();

  SequenceRegistry(const SequenceRegistry&) = delete;
  SequenceRegistry& operator=(const SequenceRegistry&) = delete;

  // An operation's hold on a sequence: in use, so never evicted, until destroyed; its last use
  // is then now.
  class Lease {
   public:
    Lease(Lease&& other) noexcept;
    Lease(const Lease&) = delete;
    ~Lease();
    Sequence* operator->() const { return sequence_.get(); }
    Sequence& operator*() const { return *sequence_; }

   private:
    friend class SequenceRegistry;
    Lease(SequenceRegistry* registry, std::shared_ptr<Sequence> sequence);
    SequenceRegistry* registry_;
    std::shared_ptr<Sequence> sequence_;
  };

  // The sequence `id` for an operation, or NOT_FOUND (saying why, when it was evicted or
  // released recently).
  absl::StatusOr<Lease> Acquire(absl::string_view id) ABSL_LOCKS_EXCLUDED(mu_);
  // The sequence `id` to describe, without marking it in use.
  absl::StatusOr<std::shared_ptr<Sequence>> Find(absl::string_view id) ABSL_LOCKS_EXCLUDED(mu_);
  // Up to `count` sequences after `after` in id order; `more` says whether others follow.
  std::vector<std::shared_ptr<Sequence>> Page(int64_t count, absl::string_view after, bool* more)
      ABSL_LOCKS_EXCLUDED(mu_);
  std::vector<std::shared_ptr<Sequence>> All() ABSL_LOCKS_EXCLUDED(mu_);

  // OK when a sequence named `id` (empty: a generated id) of `bookkeeping_bytes` could be added
  // now; ALREADY_EXISTS, or RESOURCE_EXHAUSTED (the sequence or bookkeeping limit, the latter
  // saying that `what` needed them) otherwise.
  absl::Status CheckRoom(absl::string_view id, int64_t bookkeeping_bytes, absl::string_view what)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Adds `sequence` as `id` (empty: a generated one, stored in sequence->id, which routes by
  // `generated_key` when that is not empty: "<key>/<16 hex digits>"), after checking the room
  // again (for its bookkeeping_bytes, on behalf of `what`). REQUIRES: a generated id would be
  // valid (CheckGeneratedKey). REQUIRES: the caller holds sequence->mu, so that no operation on the
  // new id can run before the caller has described it.
  absl::Status Publish(const std::shared_ptr<Sequence>& sequence, absl::string_view id,
                       absl::string_view what, absl::string_view generated_key = {})
      ABSL_LOCKS_EXCLUDED(mu_);
  // Removes a sequence that is being released (its owner's lookups then say so: it "was
  // released", or `reason`, e.g. that it moved to another replica).
  void Remove(const Sequence& sequence, const std::string& reason = "was released")
      ABSL_LOCKS_EXCLUDED(mu_);
  // NOT_FOUND for `id`, with the reason it is gone when known.
  absl::Status NotFound(absl::string_view id) ABSL_LOCKS_EXCLUDED(mu_);

  // Removes idle sequences, least recently used first, until evicting them makes room in
  // `pool` for a request of `count` blocks, recording why; returns them, or nothing when
  // evicting every idle sequence would not make it fit. Room is the blocks already free, the
  // blocks the evicted sequences alone held (a block shared with a sequence that stays does not
  // count), and those of `copies` (shared blocks the request would copy before writing, which
  // count toward `count`) that the request would then hold alone. Of the sequences taken, the
  // most recently used ones that the room does not need are given back. Their blocks go back to
  // the pool when the last reference to them (the caller's, unless a concurrent Find still
  // describes one) is dropped.
  std::vector<std::shared_ptr<Sequence>> EvictLruFor(int64_t count, const BlockPool& pool,
                                                     absl::Span<const Block* const> copies)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Blocks that evicting every idle sequence now would free (blocks shared with a sequence in
  // use do not count).
  int64_t EvictableBlocks() ABSL_LOCKS_EXCLUDED(mu_);
  // Removes the sequences idle for longer than `ttl_ms`, recording why; returns them.
  std::vector<std::shared_ptr<Sequence>> EvictIdle(int64_t ttl_ms) ABSL_LOCKS_EXCLUDED(mu_);

  int64_t size() const ABSL_LOCKS_EXCLUDED(mu_);
  int64_t tokens() const ABSL_LOCKS_EXCLUDED(mu_);  // over sequences and layers
  int64_t evictions() const { return evictions_.load(); }
  int64_t bookkeeping_bytes() const ABSL_LOCKS_EXCLUDED(mu_);
  // Adds `delta` to the bookkeeping charged to `sequence` (its block tables grew or shrank:
  // appends are not refused for it, since the blocks they add are bounded by the pool), and to
  // the total while it is published. REQUIRES: sequence.mu held.
  void AddBookkeeping(Sequence& sequence, int64_t delta) ABSL_LOCKS_EXCLUDED(mu_);
  int64_t max_bookkeeping_bytes() const { return max_bookkeeping_bytes_; }

 private:
  void Done(Sequence* sequence);
  void Forget(const std::string& id, const std::string& reason) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status NotFoundLocked(absl::string_view id) ABSL_SHARED_LOCKS_REQUIRED(mu_);
  absl::Status CheckRoomLocked(absl::string_view id, int64_t bookkeeping_bytes,
                               absl::string_view what) ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // Takes the sequence `it` names out of sequences_, and its bookkeeping out of the total.
  std::shared_ptr<Sequence> EraseLocked(
      std::map<std::string, std::shared_ptr<Sequence>, std::less<>>::iterator it)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::string NewId(absl::string_view key) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const int64_t max_sequences_;
  const int64_t max_bookkeeping_bytes_;
  const Clock clock_;
  std::atomic<int64_t> evictions_{0};
  mutable Mutex mu_;
  std::map<std::string, std::shared_ptr<Sequence>, std::less<>> sequences_ ABSL_GUARDED_BY(mu_);
  // Recently gone ids and why, so that their owners get a reason instead of a bare NOT_FOUND.
  absl::flat_hash_map<std::string, std::string> gone_ ABSL_GUARDED_BY(mu_);
  std::deque<std::string> gone_order_ ABSL_GUARDED_BY(mu_);  // oldest first
  uint64_t id_counter_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t bookkeeping_bytes_ ABSL_GUARDED_BY(mu_) = 0;  // over sequences_
};

}  // namespace attend::kv

#endif  // ATTEND_CORE_KV_CACHE_SEQUENCE_REGISTRY_H_
