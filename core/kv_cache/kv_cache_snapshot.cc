// KvCache::Save and KvCache::Load: a sequence to and from the snapshot format
// (snapshot_format.h). A row is moved between the block layout (head-major inside a block) and
// the snapshot's token-major rows byte for byte, so nothing is converted and nothing rounds.
#include <algorithm>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/base/status_macros.h"
#include "core/kv_cache/kv_cache.h"
#include "core/kv_cache/sequence.h"
#include "core/kv_cache/sequence_registry.h"
#include "core/kv_cache/snapshot_format.h"
#include "core/kv_cache/token_storage.h"

namespace attend::kv {
namespace {

// The pieces of one token's row inside a block, in the row's order: for each head its key and
// value, then (int8) its key and value scales. Calls f(offset in block, bytes) in row order.
template <typename F>
void ForEachRowPiece(const BlockLayout& layout, int64_t slot, F&& f) {
  const int64_t e = layout.element_bytes();
  for (int64_t g = 0; g < layout.n_head_kv; ++g) {
    f(layout.key_offset(g, slot), layout.head_dim * e);
    f(layout.value_offset(g, slot), layout.head_dim_v * e);
    if (layout.quantized()) {
      f(layout.key_scale_offset(g, slot), int64_t{4});
      f(layout.value_scale_offset(g, slot), int64_t{4});
    }
  }
}

void ReadRow(const BlockLayout& layout, const char* block, int64_t slot, char* row) {
  ForEachRowPiece(layout, slot, [&](int64_t offset, int64_t bytes) {
    std::memcpy(row, block + offset, static_cast<size_t>(bytes));
    row += bytes;
  });
}

void WriteRow(const BlockLayout& layout, const char* row, int64_t slot, char* block) {
  ForEachRowPiece(layout, slot, [&](int64_t offset, int64_t bytes) {
    std::memcpy(block + offset, row, static_cast<size_t>(bytes));
    row += bytes;
  });
}

bool SameRow(const BlockLayout& layout, const char* row, int64_t slot, const char* block) {
  bool same = true;
  ForEachRowPiece(layout, slot, [&](int64_t offset, int64_t bytes) {
    same = same && std::memcmp(block + offset, row, static_cast<size_t>(bytes)) == 0;
    row += bytes;
  });
  return same;
}

bool SameLayout(const BlockLayout& a, const BlockLayout& b) {
  return a.n_head_kv == b.n_head_kv && a.head_dim == b.head_dim && a.head_dim_v == b.head_dim_v &&
         a.dtype == b.dtype && a.tokens_per_block == b.tokens_per_block;
}

// A sequence's tables as of one moment: holding the block references keeps the rows they had
// (a writer copies a block that others hold before writing into it).
struct TableCopy {
  SnapshotHeader header;
  BlockLayout layout;
  std::vector<std::vector<BlockRef>> blocks;  // per layer
};

}  // namespace

absl::Status KvCache::Save(absl::string_view id,
                           const std::function<absl::Status(absl::string_view)>& sink,
                           absl::string_view attend_version, bool share_with_source) {
  const auto copy_tables = [this](absl::string_view name) -> absl::StatusOr<TableCopy> {
    ATTEND_ASSIGN_OR_RETURN(std::shared_ptr<Sequence> s, registry_->Find(name));
    MutexLock lock(&s->mu);
    ATTEND_RETURN_IF_ERROR(CheckNotReleased(*s));
    TableCopy copy;
    SnapshotHeader& h = copy.header;
    h.id = s->id;
    h.forked_from = s->forked_from;
    h.config = s->config;
    h.created_ms = s->created_ms;
    h.reserved_tokens = s->reserved_tokens;
    copy.layout = s->layout;
    const int64_t tpb = s->layout.tokens_per_block;
    for (const CachedLayer& layer : s->layers) {
      // A sliding window releases the blocks no later query can see: the rows stored start
      // after the last released block before the end (a reservation's blocks before it stay
      // held, but no query reads them any more), or where the layer's rows start.
      int64_t first_block = 0;
      for (int64_t b = 0; b < static_cast<int64_t>(layer.blocks.size()) && b * tpb < layer.tokens;
           ++b) {
        if (!layer.blocks[static_cast<size_t>(b)]) first_block = b + 1;
      }
      h.layer_tokens.push_back(layer.tokens);
      h.first_stored.push_back(
          std::min(layer.tokens, std::max(first_block * tpb, layer.first_kept)));
      copy.blocks.push_back(layer.blocks);
    }
    return copy;
  };
  ATTEND_ASSIGN_OR_RETURN(TableCopy copy, copy_tables(id));
  SnapshotHeader& header = copy.header;
  header.attend_version = std::string(attend_version);
  if (share_with_source && !header.forked_from.empty()) {
    // The source's tables, taken under its own lock after this sequence's was let go (one
    // sequence lock at a time): equal block pointers mean equal rows, since a shared block is
    // copied before anyone writes into it. Counted layer by layer: a write copies a block in the
    // layer written only, and every other layer still shares.
    absl::StatusOr<TableCopy> source = copy_tables(header.forked_from);
    if (source.ok() && SameLayout(source->layout, copy.layout) &&
        source->blocks.size() == copy.blocks.size()) {
      const int64_t tpb = copy.layout.tokens_per_block;
      header.shared_tokens.assign(copy.blocks.size(), 0);
      for (size_t l = 0; l < copy.blocks.size(); ++l) {
        const std::vector<BlockRef>& mine = copy.blocks[l];
        const std::vector<BlockRef>& theirs = source->blocks[l];
        // Up to the first block both hold but not the same one (one of them wrote into it since
        // the fork); a block only one holds (a sliding window released it in the other) is
        // passed over, since it holds none of the rows the other one still shares after it. A
        // shared block ends it too where it holds rows of this sequence that the source's own
        // snapshot does not store (a reservation's blocks before ones its window released):
        // a load of the source leaves them out, so sharing it there would compare this one's
        // rows with rows never loaded, and be refused.
        const int64_t first_mine = header.first_stored[l];
        const int64_t first_theirs = source->header.first_stored[l];
        size_t end = 0;
        for (size_t b = 0; b < mine.size() && b < theirs.size(); ++b) {
          if (!mine[b] || !theirs[b]) continue;
          if (mine[b] != theirs[b] ||
              std::max(static_cast<int64_t>(b) * tpb, first_mine) < first_theirs) {
            break;
          }
          end = b + 1;
        }
        header.shared_tokens[l] = std::min({static_cast<int64_t>(end) * tpb, header.layer_tokens[l],
                                            source->header.layer_tokens[l]});
      }
    }
  }

  SnapshotWriter writer(sink);
  ATTEND_RETURN_IF_ERROR(writer.WriteHeader(header));
  const BlockLayout& layout = copy.layout;
  const int64_t tpb = layout.tokens_per_block;
  const int64_t row_bytes = header.row_bytes();
  const int64_t per_chunk = SnapshotWriter::RowsPerChunk(header);
  std::string rows;
  for (int64_t l = 0; l < header.config.layers; ++l) {
    const std::vector<BlockRef>& blocks = copy.blocks[static_cast<size_t>(l)];
    const int64_t end = header.layer_tokens[static_cast<size_t>(l)];
    for (int64_t first = header.first_stored[static_cast<size_t>(l)]; first < end;
         first += per_chunk) {
      const int64_t count = std::min(per_chunk, end - first);
      rows.resize(static_cast<size_t>(count * row_bytes));
      for (int64_t t = 0; t < count; ++t) {
        const int64_t position = first + t;
        ReadRow(layout, blocks[static_cast<size_t>(position / tpb)]->data, position % tpb,
                rows.data() + t * row_bytes);
      }
      ATTEND_RETURN_IF_ERROR(writer.WriteChunk(l, first, count, rows));
    }
  }
  return writer.Finish();
}

absl::StatusOr<SequenceInfo> KvCache::Load(SnapshotReader& reader, absl::string_view id,
                                           bool share_with_source) {
  ATTEND_ASSIGN_OR_RETURN(const SnapshotHeader header, reader.ReadHeader());
  const std::string name = id.empty() ? header.id : std::string(id);
  ATTEND_RETURN_IF_ERROR(CheckSequenceId(name, id.empty() ? "the snapshot's sequence id" : "id"));
  ATTEND_ASSIGN_OR_RETURN(const BlockLayout layout, LayoutFor(header.config));
  const SequenceConfig& config = header.config;
  const int64_t tpb = layout.tokens_per_block;
  const int64_t reserved_blocks = layout.blocks_for(header.reserved_tokens);
  const size_t layers = static_cast<size_t>(config.layers);

  // The block tables' references, counted before any table is built: a small file may declare
  // a huge one (a sliding window's layer of 2^40 tokens stores few rows), which the bookkeeping
  // limit refuses. At most 2^16 layers of 2^40 references each: no overflow.
  int64_t refs = 0;
  for (size_t l = 0; l < layers; ++l) {
    refs += std::max(layout.blocks_for(header.layer_tokens[l]), reserved_blocks);
  }
  const std::string what =
      absl::StrCat("loading sequence ", QuotedId(name), " (", config.layers, " layers, ",
                   header.stored_rows(), " stored tokens) from snapshot ", reader.name());
  auto sequence = std::make_shared<Sequence>();
  sequence->bookkeeping_bytes = BookkeepingBytes(config.layers, refs);
  if (absl::Status room = registry_->CheckRoom(name, sequence->bookkeeping_bytes, what);
      !room.ok()) {
    if (room.code() == absl::StatusCode::kResourceExhausted) rejections_++;
    return room;
  }

  // Blocks shared with the source again, when it is here with the same block layout and still
  // holds them; their rows are compared as they are read. In each layer, the blocks below that
  // layer's shared tokens where both hold one, and the block they end inside too when the fork
  // holds no row past it in that layer (a fork made mid-block and not appended to there since):
  // then the fork writes nothing into that block, and its first append there copies it, as
  // before the save. A block the fork holds no row of (before its first stored one) is not
  // shared: it held none there before the save.
  //
  // A version 1 snapshot has one count for all layers (shared_tokens holds it in each): it
  // shares in every layer or in none, and that block only when no layer holds a row past it, as
  // the attend that wrote it did.
  const bool every_layer_or_none = header.format_version < 2;
  std::vector<int64_t> whole(layers, 0);  // per layer: whole blocks wanted
  std::vector<bool> partial(layers, false);
  bool any_wanted = false;
  for (size_t l = 0; l < layers; ++l) {
    const int64_t tokens = header.shared_tokens[l];
    whole[l] = tokens / tpb;
    partial[l] = tokens % tpb != 0 && header.layer_tokens[l] == tokens &&
                 header.first_stored[l] <= whole[l] * tpb;
    any_wanted = any_wanted || tokens > 0;
  }
  if (every_layer_or_none && std::find(partial.begin(), partial.end(), false) != partial.end()) {
    partial.assign(layers, false);
  }
  // Where the fork's table holds a block: below its reservation, or from the block of its first
  // stored row to its last row.
  const auto fork_holds = [&](size_t l, int64_t b) {
    return b < reserved_blocks ||
           (b >= header.first_stored[l] / tpb && b * tpb < header.layer_tokens[l]);
  };
  std::vector<std::vector<BlockRef>> shared(layers);  // per layer; null where not shared
  if (share_with_source && any_wanted) {
    absl::StatusOr<std::shared_ptr<Sequence>> source = registry_->Find(header.forked_from);
    if (source.ok()) {
      MutexLock lock(&(*source)->mu);
      const Sequence& s = **source;
      if (!s.released && SameLayout(s.layout, layout) && s.layers.size() == layers) {
        bool missing = false;  // a block or row the source no longer holds
        for (size_t l = 0; l < layers; ++l) {
          const CachedLayer& from = s.layers[l];
          const int64_t wanted = whole[l] + (partial[l] ? 1 : 0);
          const int64_t rows_needed = partial[l] ? header.shared_tokens[l] : whole[l] * tpb;
          if (from.tokens < rows_needed) {
            missing = true;
            continue;
          }
          shared[l].resize(static_cast<size_t>(wanted));
          for (int64_t b = 0; b < wanted; ++b) {
            if (!fork_holds(l, b)) continue;
            if (b < static_cast<int64_t>(from.blocks.size()) &&
                from.blocks[static_cast<size_t>(b)]) {
              shared[l][static_cast<size_t>(b)] = from.blocks[static_cast<size_t>(b)];
            } else {
              missing = true;
            }
          }
        }
        if (missing && every_layer_or_none) shared.assign(layers, {});
      }
    }
  }
  const auto is_shared = [&](size_t l, int64_t b) {
    return b < static_cast<int64_t>(shared[l].size()) && shared[l][static_cast<size_t>(b)];
  };

  // Every layer's table: shared blocks, and fresh ones where rows will be written or the
  // reservation keeps them; null before a window's first stored row.
  std::vector<std::vector<bool>> fresh_at(layers);
  std::vector<std::vector<bool>> shared_at(layers);
  int64_t fresh_count = 0;
  for (size_t l = 0; l < layers; ++l) {
    const int64_t table = std::max(layout.blocks_for(header.layer_tokens[l]), reserved_blocks);
    fresh_at[l].resize(static_cast<size_t>(table));
    shared_at[l].resize(static_cast<size_t>(table));
    for (int64_t b = 0; b < table; ++b) {
      shared_at[l][static_cast<size_t>(b)] = is_shared(l, b);
      const bool held = !is_shared(l, b) && fork_holds(l, b);
      fresh_at[l][static_cast<size_t>(b)] = held;
      fresh_count += held ? 1 : 0;
    }
  }
  std::vector<BlockRef> fresh;
  if (absl::Status taken =
          TakeBlocks([fresh_count] { return fresh_count; }, {}, &fresh, [&] { return what; });
      !taken.ok()) {
    return taken;
  }
  std::vector<CachedLayer> tables(layers);
  for (size_t l = 0; l < layers; ++l) {
    std::vector<BlockRef>& blocks = tables[l].blocks;
    blocks = std::move(shared[l]);  // no longer than the table: its tokens are the layer's
    blocks.resize(fresh_at[l].size());
    for (size_t b = 0; b < fresh_at[l].size(); ++b) {
      if (fresh_at[l][b]) {
        blocks[b] = std::move(fresh.back());
        fresh.pop_back();
      }
    }
    tables[l].tokens = header.layer_tokens[l];
    // Rows before the first stored one inside its block are not the sequence's.
    if (header.first_stored[l] % tpb != 0) tables[l].first_kept = header.first_stored[l];
  }

  // The rows, into the blocks (or compared with the shared ones).
  while (true) {
    ATTEND_ASSIGN_OR_RETURN(std::optional<SnapshotReader::Chunk> chunk, reader.Next());
    if (!chunk) break;
    const size_t l = static_cast<size_t>(chunk->layer);
    const std::vector<BlockRef>& blocks = tables[l].blocks;
    const int64_t row_bytes = header.row_bytes();
    for (int64_t t = 0; t < chunk->count; ++t) {
      const int64_t position = chunk->first_token + t;
      const int64_t b = position / tpb;
      const char* row = chunk->rows.data() + t * row_bytes;
      if (shared_at[l][static_cast<size_t>(b)]) {
        if (!SameRow(layout, row, position % tpb, blocks[static_cast<size_t>(b)]->data)) {
          return absl::FailedPreconditionError(
              absl::StrCat(what, ": layer ", chunk->layer, " token ", position,
                           " differs from the same token of ", QuotedId(header.forked_from),
                           ", which the snapshot shared; load it without sharing"));
        }
        continue;
      }
      WriteRow(layout, row, position % tpb, blocks[static_cast<size_t>(b)]->data);
    }
  }

  sequence->config = config;
  sequence->layout = layout;
  sequence->created_ms = header.created_ms;
  sequence->last_used_ms = options_.clock();
  sequence->forked_from = header.forked_from;
  int64_t total = 0;
  for (const CachedLayer& layer : tables) total += layer.tokens;
  sequence->total_tokens = total;
  // Held until the sequence is described (see Create).
  MutexLock lock(&sequence->mu);
  sequence->layers = std::move(tables);
  sequence->reserved_tokens = header.reserved_tokens;
  for (CachedLayer& layer : sequence->layers) {
    DropOutsideWindow(config.window, reserved_blocks, layout, &layer);
  }
  absl::Status published = registry_->Publish(sequence, name, what);
  if (published.code() == absl::StatusCode::kResourceExhausted) rejections_++;
  ATTEND_RETURN_IF_ERROR(published);
  return Describe(*sequence);
}

}  // namespace attend::kv
