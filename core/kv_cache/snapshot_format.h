// The snapshot format of one KV-cache sequence: what survives a restart, a save and a move to
// another replica. Independent of the block size and of the pool: a sequence's rows are stored
// token by token in its storage dtype, so that a server with another --kv_block_bytes loads it,
// and the bytes loaded are exactly the bytes saved (int8 scales included), so that decoding after
// a load is bit-identical to decoding without one.
//
// Layout (little-endian):
//   "ATTNSNAP"  u32 format version  u32 header length  header  u64 header hash
//   chunk*      "CHNK" u32 layer  i64 first token  u32 count  rows  u64 chunk hash
//   "DONE"      u64 chunks  u64 trailer hash
// The header holds the sequence's id, config, fork relation, per-layer token counts (appended,
// first stored, shared with the source) and the attend version that wrote it. Version 1 held one
// count of shared tokens for all layers; it is still read (that count for every layer), never
// written. A layer's chunks cover its stored tokens [first_stored, tokens)
// in order (first_stored > 0 where a sliding window released the blocks before it); the layers
// come in order. A row is one token of one layer: for each KV head its key, then its value
// (head_dim and head_dim_v elements of the storage dtype), and for int8 the key's and the value's
// float32 scales after them; SnapshotHeader::row_bytes() bytes.
//
// Every hash is XXH3-64 (Debian's libxxhash). Chunk and trailer hashes are seeded with the header
// hash, so a chunk copied from another snapshot, even of the same shape, is refused; the trailer
// counts the chunks, so a file cut at a chunk boundary is refused too. The reader bounds every
// length before it allocates, and refuses a torn, truncated, foreign or newer file with a message
// that says which.
//
// Thread-safety: a SnapshotWriter or SnapshotReader is used by one thread at a time.
#ifndef ATTEND_CORE_KV_CACHE_SNAPSHOT_FORMAT_H_
#define ATTEND_CORE_KV_CACHE_SNAPSHOT_FORMAT_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/kv_cache/kv_cache.h"

namespace attend::kv {

// 2: shared tokens per layer (1: one count for all layers).
inline constexpr uint32_t kSnapshotFormatVersion = 2;
// Bounds the reader holds a file to before it allocates: a header (ids, versions and 24 bytes a
// layer, for up to kMaxSnapshotLayers) and a chunk's rows.
inline constexpr int64_t kMaxSnapshotHeaderBytes = int64_t{2} << 20;
inline constexpr int64_t kMaxSnapshotChunkBytes = int64_t{16} << 20;
inline constexpr int64_t kMaxSnapshotLayers = int64_t{1} << 16;

struct SnapshotHeader {
  std::string id;
  std::string forked_from;     // the sequence it was forked from, or empty
  std::string attend_version;  // of the server that wrote it
  SequenceConfig config;       // n_head_kv and head_dim_v filled in
  int64_t created_ms = 0;
  int64_t reserved_tokens = 0;
  std::vector<int64_t> layer_tokens;  // tokens appended to each layer
  std::vector<int64_t> first_stored;  // per layer: the first token whose row is stored
  // Per layer: the leading tokens whose blocks were shared with `forked_from` when it was saved,
  // wherever both held a block (0: none; empty: none in any layer). A load may share them again
  // if that sequence still holds the same rows. Per layer, since a write copies a shared block
  // in the layer written only: one count for all layers lost the sharing of every layer nobody
  // wrote.
  std::vector<int64_t> shared_tokens;
  // The format version the reader read (the writer writes kSnapshotFormatVersion). A version 1
  // snapshot's one count stands in every layer of shared_tokens.
  uint32_t format_version = kSnapshotFormatVersion;

  // Bytes of one stored row (one token of one layer).
  int64_t row_bytes() const;
  // Rows the snapshot stores, over the layers.
  int64_t stored_rows() const;
};

// Receives the snapshot's bytes in order.
using ByteSink = std::function<absl::Status(absl::string_view bytes)>;
// Reads up to `n` bytes into `dst`; returns how many (fewer than `n` only at the end).
using ByteSource = std::function<absl::StatusOr<size_t>(char* dst, size_t n)>;

class SnapshotWriter {
 public:
  explicit SnapshotWriter(ByteSink sink) : sink_(std::move(sink)) {}

  // Once, first. INVALID_ARGUMENT for a header the reader would refuse.
  absl::Status WriteHeader(const SnapshotHeader& header);
  // `count` rows of `layer` starting at `first_token`, `rows` holding count * row_bytes()
  // bytes. Chunks must come in the order the format requires (checked).
  absl::Status WriteChunk(int64_t layer, int64_t first_token, int64_t count,
                          absl::string_view rows);
  // After the last chunk. FAILED_PRECONDITION when a layer's rows are not all written.
  absl::Status Finish();

  // Rows a chunk of this header holds at most (by kMaxSnapshotChunkBytes).
  static int64_t RowsPerChunk(const SnapshotHeader& header);

 private:
  absl::Status Put(absl::string_view bytes);

  ByteSink sink_;
  SnapshotHeader header_;
  bool started_ = false;
  uint64_t header_hash_ = 0;
  uint64_t chunks_ = 0;
  int64_t layer_ = 0;  // where the next row must be
  int64_t next_token_ = 0;
};

class SnapshotReader {
 public:
  // `name` says which snapshot in messages (a file name).
  SnapshotReader(ByteSource source, std::string name)
      : source_(std::move(source)), name_(std::move(name)) {}

  // Once, first. Errors (INVALID_ARGUMENT for a foreign, torn or inconsistent header,
  // FAILED_PRECONDITION for a newer format, DATA_LOSS for a truncated one) name the snapshot.
  absl::StatusOr<SnapshotHeader> ReadHeader();

  struct Chunk {
    int64_t layer = 0;
    int64_t first_token = 0;
    int64_t count = 0;
    absl::string_view rows;  // valid until the next call
  };
  // The next chunk, checked (its hash, its place in the order), or nullopt once the trailer
  // has been read and checked and nothing follows it. DATA_LOSS for a truncated or corrupted
  // file, a chunk from another snapshot, missing or surplus rows.
  absl::StatusOr<std::optional<Chunk>> Next();

  const std::string& name() const { return name_; }

 private:
  absl::Status ReadExactly(char* dst, size_t n, absl::string_view what);
  absl::Status Corrupt(absl::string_view what) const;

  ByteSource source_;
  std::string name_;
  SnapshotHeader header_;
  bool have_header_ = false;
  bool done_ = false;
  uint64_t header_hash_ = 0;
  uint64_t chunks_ = 0;
  int64_t layer_ = 0;
  int64_t next_token_ = 0;
  std::string rows_;
};

// A ByteSource over bytes in memory (for tests, fuzzing and streams), and a ByteSink that
// appends to a string.
ByteSource StringSource(absl::string_view bytes);
ByteSink StringSink(std::string* out);

}  // namespace attend::kv

#endif  // ATTEND_CORE_KV_CACHE_SNAPSHOT_FORMAT_H_
