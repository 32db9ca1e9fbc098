// KvCache's operations on a sequence as a whole: Fork, Truncate and Release (kv_cache.cc has
// creation, appends and the cache's own accounting; the class is declared in kv_cache.h).
#include <cstring>
#include <limits>

#include "absl/strings/str_cat.h"
#include "common/sequence_key.h"
#include "core/base/status_macros.h"
#include "core/kv_cache/kv_cache.h"
#include "core/kv_cache/sequence.h"
#include "core/kv_cache/sequence_registry.h"
#include "core/kv_cache/token_storage.h"

namespace attend::kv {

absl::StatusOr<SequenceInfo> KvCache::Fork(absl::string_view source, absl::string_view new_id,
                                           std::optional<int64_t> tokens) {
  if (!new_id.empty()) {
    ATTEND_RETURN_IF_ERROR(CheckSequenceId(new_id, "new_id"));
  } else if (absl::Status key = CheckGeneratedKey(RoutingKey(source), "source_id's routing key");
             !key.ok() && CheckSequenceId(source, "").ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "new_id: empty, and a generated one cannot route by its source's key: ", key.message()));
  }
  // Negative is bad input whatever the source holds (as for Truncate); past its end is not.
  if (tokens && *tokens < 0) {
    return absl::InvalidArgumentError(absl::StrCat("tokens: ", *tokens, "; must be >= 0"));
  }
  auto fork = std::make_shared<Sequence>();
  std::vector<CachedLayer> layers;
  int64_t length = 0;
  std::string what;
  {
    ATTEND_ASSIGN_OR_RETURN(SequenceRegistry::Lease from, registry_->Acquire(source));
    MutexLock lock(&from->mu);
    ATTEND_RETURN_IF_ERROR(CheckChangeable(*from));
    int64_t common = std::numeric_limits<int64_t>::max();
    for (const CachedLayer& layer : from->layers) common = std::min(common, layer.tokens);
    length = tokens.value_or(common);
    if (length < 0 || length > common) {
      return absl::OutOfRangeError(absl::StrCat("fork at ", length, " tokens: sequence ",
                                                QuotedId(source), " holds ", common,
                                                " tokens in every layer"));
    }
    ATTEND_RETURN_IF_ERROR(CheckWindowKept(from->layers, from->config.window, from->layout, length,
                                           "fork at", QuotedId(from->id)));
    fork->config = from->config;
    fork->layout = from->layout;
    const BlockLayout& layout = from->layout;
    const int64_t blocks = layout.blocks_for(length);
    // Checked before the block tables are copied: they are what the limit bounds.
    fork->bookkeeping_bytes = BookkeepingBytes(static_cast<int64_t>(from->layers.size()),
                                               blocks * static_cast<int64_t>(from->layers.size()));
    what = absl::StrCat("a fork of ", QuotedId(source), " (", from->layers.size(), " layers of ",
                        blocks, " blocks)");
    if (absl::Status room = registry_->CheckRoom(new_id, fork->bookkeeping_bytes, what);
        !room.ok()) {
      if (room.code() == absl::StatusCode::kResourceExhausted) rejections_++;
      return room;
    }
    // A reservation promises the source's appends up to its length cannot fail for lack of
    // memory. Sharing the partly written block at the fork point would make the source's next
    // append copy it first, from the pool: the fork takes its own copy of that block now
    // instead, in every layer. The choice is made once, from the shapes alone, never from the
    // blocks' reference counts: another sequence that shares the block (a sibling from an
    // earlier fork) may drop its reference at any moment, under its own lock, so a count read
    // here is only a snapshot. (Copying even where a sibling still shares the block costs one
    // block per layer and keeps the promise when the sibling lets go later.)
    const int64_t partial = length % layout.tokens_per_block != 0 ? blocks - 1 : -1;
    const bool own_partial = partial >= 0 && layout.blocks_for(from->reserved_tokens) > partial;
    const int64_t copies_needed = own_partial ? static_cast<int64_t>(from->layers.size()) : 0;
    std::vector<BlockRef> copies;
    ATTEND_RETURN_IF_ERROR(
        TakeBlocks([copies_needed] { return copies_needed; }, {}, &copies,
                   [&] {
                     return absl::StrCat(
                         "forking ", QuotedId(source), " at ", length,
                         " tokens (a copy of the partly written block the source's reservation "
                         "covers, in each layer)");
                   }));
    layers.resize(from->layers.size());
    for (size_t l = 0; l < layers.size(); ++l) {
      const CachedLayer& src = from->layers[l];
      layers[l].blocks.assign(src.blocks.begin(), src.blocks.begin() + blocks);
      layers[l].tokens = length;
      layers[l].first_kept = length > 0 ? src.first_kept : 0;
      if (own_partial) {
        BlockRef copy = std::move(copies[l]);
        std::memcpy(copy->data, src.blocks[static_cast<size_t>(partial)]->data,
                    static_cast<size_t>(pool_.block_bytes()));
        layers[l].blocks[static_cast<size_t>(partial)] = std::move(copy);
      }
    }
  }
  fork->created_ms = options_.clock();
  fork->last_used_ms = fork->created_ms;
  fork->forked_from = std::string(source);
  fork->total_tokens = length * static_cast<int64_t>(layers.size());
  // Held until the fork is described (see Create).
  MutexLock lock(&fork->mu);
  fork->layers = std::move(layers);
  absl::Status published = registry_->Publish(fork, new_id, what, RoutingKey(source));
  if (published.code() == absl::StatusCode::kResourceExhausted) rejections_++;
  ATTEND_RETURN_IF_ERROR(published);
  return Describe(*fork);
}

absl::StatusOr<SequenceInfo> KvCache::Truncate(absl::string_view id, int64_t tokens) {
  ATTEND_ASSIGN_OR_RETURN(SequenceRegistry::Lease sequence, registry_->Acquire(id));
  MutexLock lock(&sequence->mu);
  ATTEND_RETURN_IF_ERROR(CheckChangeable(*sequence));
  if (tokens < 0) {
    return absl::InvalidArgumentError(absl::StrCat("tokens: ", tokens, "; must be >= 0"));
  }
  for (size_t l = 0; l < sequence->layers.size(); ++l) {
    if (sequence->layers[l].tokens < tokens) {
      return absl::OutOfRangeError(absl::StrCat("truncate to ", tokens, " tokens: layer ", l,
                                                " of sequence ", QuotedId(id), " holds only ",
                                                sequence->layers[l].tokens));
    }
  }
  ATTEND_RETURN_IF_ERROR(CheckWindowKept(sequence->layers, sequence->config.window,
                                         sequence->layout, tokens, "truncate to", QuotedId(id)));
  const BlockLayout& layout = sequence->layout;
  const size_t keep = static_cast<size_t>(
      std::max(layout.blocks_for(tokens), layout.blocks_for(sequence->reserved_tokens)));
  size_t dropped = 0;
  for (CachedLayer& layer : sequence->layers) {
    sequence->total_tokens -= layer.tokens - tokens;
    layer.tokens = tokens;
    if (tokens == 0) layer.first_kept = 0;  // emptied: no row before it is missing
    if (layer.blocks.size() > keep) {
      dropped += layer.blocks.size() - keep;
      layer.blocks.resize(keep);
    }
  }
  registry_->AddBookkeeping(*sequence, SlotBytes(0, dropped));
  return Describe(*sequence);
}

absl::StatusOr<int64_t> KvCache::Release(absl::string_view id) {
  return ReleaseImpl(id, /*sealed=*/false);
}

absl::StatusOr<int64_t> KvCache::ReleaseSealed(absl::string_view id) {
  return ReleaseImpl(id, /*sealed=*/true);
}

absl::Status KvCache::Seal(absl::string_view id) {
  ATTEND_ASSIGN_OR_RETURN(const std::shared_ptr<Sequence> sequence, registry_->Find(id));
  MutexLock lock(&sequence->mu);
  ATTEND_RETURN_IF_ERROR(CheckNotReleased(*sequence));
  if (sequence->sealed) {
    return absl::FailedPreconditionError(
        absl::StrCat("sequence ", QuotedId(id), " is already sealed for a move"));
  }
  sequence->sealed = true;
  return absl::OkStatus();
}

absl::Status KvCache::Unseal(absl::string_view id) {
  ATTEND_ASSIGN_OR_RETURN(const std::shared_ptr<Sequence> sequence, registry_->Find(id));
  MutexLock lock(&sequence->mu);
  ATTEND_RETURN_IF_ERROR(CheckNotReleased(*sequence));
  if (!sequence->sealed) {
    return absl::FailedPreconditionError(absl::StrCat("sequence ", QuotedId(id), " is not sealed"));
  }
  sequence->sealed = false;
  return absl::OkStatus();
}

absl::StatusOr<int64_t> KvCache::ReleaseImpl(absl::string_view id, bool sealed) {
  ATTEND_ASSIGN_OR_RETURN(SequenceRegistry::Lease sequence, registry_->Acquire(id));
  MutexLock lock(&sequence->mu);
  if (sealed) {
    ATTEND_RETURN_IF_ERROR(CheckNotReleased(*sequence));
    if (!sequence->sealed) {
      return absl::FailedPreconditionError(
          absl::StrCat("sequence ", QuotedId(id), " is not sealed for a move"));
    }
  } else {
    ATTEND_RETURN_IF_ERROR(CheckChangeable(*sequence));
  }
  sequence->released = true;
  // A moved sequence is somewhere else now: its lookups here say so rather than "released".
  registry_->Remove(*sequence, sealed ? "moved to another replica (its key maps there now); "
                                        "call it through the fleet's proxy"
                                      : "was released");
  // Exactly the blocks this call returned: a shared block goes back to the pool on the thread
  // that drops its last reference, which may be a sibling's Release running at the same moment
  // (a reference count read here would be a snapshot, and two concurrent releases could each
  // see the other's reference and count the block neither or both times).
  const int64_t returned_before = BlockPool::ReturnedOnThisThread();
  sequence->total_tokens = 0;
  sequence->layers.clear();
  return (BlockPool::ReturnedOnThisThread() - returned_before) * pool_.block_bytes();
}

}  // namespace attend::kv
