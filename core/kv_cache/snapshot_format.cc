#include "core/kv_cache/snapshot_format.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/base/status_macros.h"
#include "xxhash.h"

namespace attend::kv {
namespace {

constexpr char kMagic[8] = {'A', 'T', 'T', 'N', 'S', 'N', 'A', 'P'};
constexpr char kChunkTag[4] = {'C', 'H', 'N', 'K'};
constexpr char kDoneTag[4] = {'D', 'O', 'N', 'E'};
constexpr int64_t kMaxTokens = int64_t{1} << 40;
constexpr int64_t kMaxDimension = int64_t{1} << 16;
constexpr size_t kMaxString = 4096;
// A chunk's header: tag, layer, first token, count.
constexpr size_t kChunkHeaderBytes = 4 + 4 + 8 + 4;

uint64_t Hash(absl::string_view bytes, uint64_t seed) {
  return XXH3_64bits_withSeed(bytes.data(), bytes.size(), seed);
}

// Little-endian fields appended to a string.
class Encoder {
 public:
  void U8(uint8_t v) { out_.push_back(static_cast<char>(v)); }
  void U32(uint32_t v) { Raw(&v, 4); }
  void I64(int64_t v) { Raw(&v, 8); }
  void U64(uint64_t v) { Raw(&v, 8); }
  void F32(float v) { Raw(&v, 4); }
  void Str(absl::string_view s) {
    U32(static_cast<uint32_t>(s.size()));
    out_.append(s.data(), s.size());
  }
  std::string& bytes() { return out_; }

 private:
  // The format is little-endian, as every machine attend builds for is.
  void Raw(const void* p, size_t n) { out_.append(static_cast<const char*>(p), n); }
  std::string out_;
};

// Reads what Encoder wrote, refusing to read past the end.
class Decoder {
 public:
  explicit Decoder(absl::string_view bytes) : in_(bytes) {}
  bool U8(uint8_t* v) { return Raw(v, 1); }
  bool U32(uint32_t* v) { return Raw(v, 4); }
  bool I64(int64_t* v) { return Raw(v, 8); }
  bool F32(float* v) { return Raw(v, 4); }
  bool Str(std::string* s) {
    uint32_t n = 0;
    if (!U32(&n) || n > kMaxString || n > in_.size()) return false;
    s->assign(in_.data(), n);
    in_.remove_prefix(n);
    return true;
  }
  bool empty() const { return in_.empty(); }

 private:
  bool Raw(void* p, size_t n) {
    if (in_.size() < n) return false;
    std::memcpy(p, in_.data(), n);
    in_.remove_prefix(n);
    return true;
  }
  absl::string_view in_;
};

uint8_t DTypeCode(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return 1;
    case DType::kBFloat16:
      return 2;
    case DType::kFloat16:
      return 3;
    case DType::kInt8:
      return 4;
  }
  return 0;
}

std::optional<DType> DTypeOfCode(uint8_t code) {
  switch (code) {
    case 1:
      return DType::kFloat32;
    case 2:
      return DType::kBFloat16;
    case 4:
      return DType::kInt8;
    default:  // float16 is no storage dtype
      return std::nullopt;
  }
}

// What the reader and the writer both require of a header; the message says what is wrong.
std::optional<std::string> HeaderProblem(const SnapshotHeader& h) {
  const SequenceConfig& c = h.config;
  if (h.id.empty() || h.id.size() > kMaxString) return "the sequence id is empty or too long";
  if (h.forked_from.size() > kMaxString || h.attend_version.size() > kMaxString) {
    return "a name is too long";
  }
  if (c.layers < 1 || c.layers > kMaxSnapshotLayers) {
    return absl::StrCat("layers ", c.layers, " is not between 1 and ", kMaxSnapshotLayers);
  }
  for (const auto& [name, value] : {std::pair<const char*, int64_t>{"n_head", c.n_head},
                                    {"n_head_kv", c.n_head_kv},
                                    {"head_dim", c.head_dim},
                                    {"head_dim_v", c.head_dim_v}}) {
    if (value < 1 || value > kMaxDimension) {
      return absl::StrCat(name, " ", value, " is not between 1 and ", kMaxDimension);
    }
  }
  if (c.n_head % c.n_head_kv != 0) {
    return absl::StrCat("n_head ", c.n_head, " is not a multiple of n_head_kv ", c.n_head_kv);
  }
  if (c.kv_dtype != DType::kFloat32 && c.kv_dtype != DType::kBFloat16 &&
      c.kv_dtype != DType::kInt8) {
    return "the storage dtype is not float32, bfloat16 or int8";
  }
  if (c.window < 0 || c.window > kMaxTokens) return absl::StrCat("window ", c.window);
  if (h.reserved_tokens < 0 || h.reserved_tokens > kMaxTokens) {
    return absl::StrCat("reserved_tokens ", h.reserved_tokens);
  }
  if (static_cast<int64_t>(h.layer_tokens.size()) != c.layers ||
      h.first_stored.size() != h.layer_tokens.size()) {
    return "the per-layer token counts do not match the layers";
  }
  if (!h.shared_tokens.empty() && h.shared_tokens.size() != h.layer_tokens.size()) {
    return "the per-layer shared token counts do not match the layers";
  }
  for (int64_t l = 0; l < c.layers; ++l) {
    const int64_t tokens = h.layer_tokens[static_cast<size_t>(l)];
    const int64_t first = h.first_stored[static_cast<size_t>(l)];
    if (tokens < 0 || tokens > kMaxTokens || first < 0 || first > tokens) {
      return absl::StrCat("layer ", l, ": ", tokens, " tokens from ", first);
    }
    // Rows are only missing where a sliding window released their blocks: never those the next
    // query sees (from tokens - window + 1 on), nor a reservation's (which stays held).
    if (first > 0 &&
        (c.window == 0 || first > tokens - c.window + 1 || h.reserved_tokens > first)) {
      return absl::StrCat(
          "layer ", l, " stores no rows before token ", first, ", which ",
          c.window == 0 ? "a sequence without a sliding window needs"
          : h.reserved_tokens > first
              ? absl::StrCat("its reservation of ", h.reserved_tokens, " tokens holds")
              : absl::StrCat("its window of ", c.window, " tokens needs at ", tokens, " tokens"));
    }
    const int64_t shared = h.shared_tokens.empty() ? 0 : h.shared_tokens[static_cast<size_t>(l)];
    if (shared < 0 || shared > tokens || (shared > 0 && h.forked_from.empty())) {
      return absl::StrCat("layer ", l, ": shared_tokens ", shared, " of ", tokens, " tokens",
                          h.forked_from.empty() ? " without a source" : "");
    }
  }
  return std::nullopt;
}

}  // namespace

int64_t SnapshotHeader::row_bytes() const {
  const int64_t element = DTypeSize(config.kv_dtype);
  return config.n_head_kv * ((config.head_dim + config.head_dim_v) * element +
                             (config.kv_dtype == DType::kInt8 ? 8 : 0));
}

int64_t SnapshotHeader::stored_rows() const {
  int64_t rows = 0;
  for (size_t l = 0; l < layer_tokens.size() && l < first_stored.size(); ++l) {
    rows += layer_tokens[l] - first_stored[l];
  }
  return rows;
}

int64_t SnapshotWriter::RowsPerChunk(const SnapshotHeader& header) {
  return std::max<int64_t>(1, kMaxSnapshotChunkBytes / std::max<int64_t>(1, header.row_bytes()));
}

absl::Status SnapshotWriter::Put(absl::string_view bytes) { return sink_(bytes); }

absl::Status SnapshotWriter::WriteHeader(const SnapshotHeader& header) {
  if (started_) return absl::FailedPreconditionError("snapshot header written twice");
  if (std::optional<std::string> problem = HeaderProblem(header)) {
    return absl::InvalidArgumentError(absl::StrCat("snapshot header: ", *problem));
  }
  if (header.row_bytes() > kMaxSnapshotChunkBytes) {
    return absl::InvalidArgumentError("snapshot header: one token's row is over a chunk's limit");
  }
  header_ = header;
  header_.format_version = kSnapshotFormatVersion;
  started_ = true;
  Encoder body;
  body.Str(header.id);
  body.Str(header.forked_from);
  body.Str(header.attend_version);
  body.I64(header.created_ms);
  body.I64(header.reserved_tokens);
  const SequenceConfig& c = header.config;
  body.I64(c.layers);
  body.I64(c.n_head);
  body.I64(c.n_head_kv);
  body.I64(c.head_dim);
  body.I64(c.head_dim_v);
  body.U8(DTypeCode(c.kv_dtype));
  body.U8(c.scale.has_value() ? 1 : 0);
  body.F32(c.scale.value_or(0.0f));
  body.I64(c.window);
  for (size_t l = 0; l < header.layer_tokens.size(); ++l) {
    body.I64(header.layer_tokens[l]);
    body.I64(header.first_stored[l]);
    body.I64(header.shared_tokens.empty() ? 0 : header.shared_tokens[l]);
  }
  if (static_cast<int64_t>(body.bytes().size()) > kMaxSnapshotHeaderBytes) {
    return absl::InvalidArgumentError("snapshot header: over its size limit");
  }
  header_hash_ = Hash(body.bytes(), 0);
  Encoder head;
  head.bytes().append(kMagic, sizeof(kMagic));
  head.U32(kSnapshotFormatVersion);
  head.U32(static_cast<uint32_t>(body.bytes().size()));
  head.bytes() += body.bytes();
  head.U64(header_hash_);
  layer_ = 0;
  next_token_ = header.first_stored.empty() ? 0 : header.first_stored[0];
  return Put(head.bytes());
}

absl::Status SnapshotWriter::WriteChunk(int64_t layer, int64_t first_token, int64_t count,
                                        absl::string_view rows) {
  if (!started_) return absl::FailedPreconditionError("snapshot chunk before the header");
  // Skip layers whose rows are all written (or that store none).
  while (layer_ < header_.config.layers &&
         next_token_ >= header_.layer_tokens[static_cast<size_t>(layer_)]) {
    ++layer_;
    if (layer_ < header_.config.layers)
      next_token_ = header_.first_stored[static_cast<size_t>(layer_)];
  }
  if (layer != layer_ || first_token != next_token_ || count < 1 || count > RowsPerChunk(header_) ||
      first_token + count > header_.layer_tokens[static_cast<size_t>(layer)] ||
      static_cast<int64_t>(rows.size()) != count * header_.row_bytes()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "snapshot chunk of layer ", layer, " tokens [", first_token, ", ", first_token + count,
        ") with ", rows.size(), " bytes: expected layer ", layer_, " from token ", next_token_,
        ", at most ", RowsPerChunk(header_), " rows of ", header_.row_bytes(), " bytes"));
  }
  Encoder head;
  head.bytes().append(kChunkTag, sizeof(kChunkTag));
  head.U32(static_cast<uint32_t>(layer));
  head.I64(first_token);
  head.U32(static_cast<uint32_t>(count));
  XXH3_state_t* state = XXH3_createState();
  XXH3_64bits_reset_withSeed(state, header_hash_);
  XXH3_64bits_update(state, head.bytes().data(), head.bytes().size());
  XXH3_64bits_update(state, rows.data(), rows.size());
  const uint64_t hash = XXH3_64bits_digest(state);
  XXH3_freeState(state);
  ATTEND_RETURN_IF_ERROR(Put(head.bytes()));
  ATTEND_RETURN_IF_ERROR(Put(rows));
  Encoder tail;
  tail.U64(hash);
  ++chunks_;
  next_token_ += count;
  return Put(tail.bytes());
}

absl::Status SnapshotWriter::Finish() {
  if (!started_) return absl::FailedPreconditionError("snapshot finished before its header");
  while (layer_ < header_.config.layers &&
         next_token_ >= header_.layer_tokens[static_cast<size_t>(layer_)]) {
    ++layer_;
    if (layer_ < header_.config.layers)
      next_token_ = header_.first_stored[static_cast<size_t>(layer_)];
  }
  if (layer_ < header_.config.layers) {
    return absl::FailedPreconditionError(absl::StrCat("snapshot finished with layer ", layer_,
                                                      " unwritten from token ", next_token_));
  }
  Encoder done;
  done.bytes().append(kDoneTag, sizeof(kDoneTag));
  done.U64(chunks_);
  const uint64_t hash = Hash(done.bytes(), header_hash_);
  done.U64(hash);
  return Put(done.bytes());
}

absl::Status SnapshotReader::ReadExactly(char* dst, size_t n, absl::string_view what) {
  size_t got = 0;
  while (got < n) {
    ATTEND_ASSIGN_OR_RETURN(const size_t read, source_(dst + got, n - got));
    if (read == 0) {
      return absl::DataLossError(absl::StrCat("snapshot ", name_, ": truncated in ", what, " (",
                                              got, " of ", n, " bytes)"));
    }
    got += read;
  }
  return absl::OkStatus();
}

absl::Status SnapshotReader::Corrupt(absl::string_view what) const {
  return absl::DataLossError(absl::StrCat("snapshot ", name_, ": ", what));
}

absl::StatusOr<SnapshotHeader> SnapshotReader::ReadHeader() {
  if (have_header_) return absl::FailedPreconditionError("snapshot header read twice");
  char start[16];
  ATTEND_RETURN_IF_ERROR(ReadExactly(start, sizeof(start), "its header"));
  if (std::memcmp(start, kMagic, sizeof(kMagic)) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("snapshot ", name_,
                     ": not an attend snapshot (it does not start with "
                     "\"ATTNSNAP\")"));
  }
  uint32_t version = 0, length = 0;
  std::memcpy(&version, start + 8, 4);
  std::memcpy(&length, start + 12, 4);
  if (version > kSnapshotFormatVersion || version == 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("snapshot ", name_, ": format version ", version, " is ",
                     version == 0 ? "not one" : "newer than this attend's", " (",
                     kSnapshotFormatVersion, "); load it with the attend that wrote it or newer"));
  }
  if (length > kMaxSnapshotHeaderBytes) {
    return Corrupt(absl::StrCat("a header of ", length, " bytes is over the limit of ",
                                kMaxSnapshotHeaderBytes, " (corrupted)"));
  }
  std::string body(length, '\0');
  ATTEND_RETURN_IF_ERROR(ReadExactly(body.data(), length, "its header"));
  uint64_t hash = 0;
  ATTEND_RETURN_IF_ERROR(ReadExactly(reinterpret_cast<char*>(&hash), 8, "its header"));
  if (hash != Hash(body, 0))
    return Corrupt("the header's checksum does not match (torn or corrupted)");
  header_hash_ = hash;

  SnapshotHeader h;
  h.format_version = version;
  Decoder in(body);
  uint8_t dtype = 0, has_scale = 0;
  float scale = 0.0f;
  int64_t shared_in_every_layer = 0;  // version 1's one count
  SequenceConfig& c = h.config;
  bool ok = in.Str(&h.id) && in.Str(&h.forked_from) && in.Str(&h.attend_version) &&
            in.I64(&h.created_ms) && in.I64(&h.reserved_tokens) &&
            (version >= 2 || in.I64(&shared_in_every_layer)) && in.I64(&c.layers) &&
            in.I64(&c.n_head) && in.I64(&c.n_head_kv) && in.I64(&c.head_dim) &&
            in.I64(&c.head_dim_v) && in.U8(&dtype) && in.U8(&has_scale) && in.F32(&scale) &&
            in.I64(&c.window);
  if (ok && (c.layers < 1 || c.layers > kMaxSnapshotLayers)) {
    return Corrupt(absl::StrCat("layers ", c.layers, " is not between 1 and ", kMaxSnapshotLayers));
  }
  for (int64_t l = 0; ok && l < c.layers; ++l) {
    int64_t tokens = 0, first = 0, shared = shared_in_every_layer;
    ok = in.I64(&tokens) && in.I64(&first) && (version < 2 || in.I64(&shared));
    h.layer_tokens.push_back(tokens);
    h.first_stored.push_back(first);
    h.shared_tokens.push_back(shared);
  }
  if (!ok || !in.empty()) return Corrupt("the header's fields do not add up to its length");
  const std::optional<DType> kv_dtype = DTypeOfCode(dtype);
  if (!kv_dtype) return Corrupt(absl::StrCat("unknown storage dtype code ", dtype));
  c.kv_dtype = *kv_dtype;
  if (has_scale > 1) return Corrupt("the scale flag is not 0 or 1");
  if (has_scale == 1) c.scale = scale;
  if (std::optional<std::string> problem = HeaderProblem(h)) {
    return Corrupt(absl::StrCat("its header is inconsistent: ", *problem));
  }
  if (h.row_bytes() > kMaxSnapshotChunkBytes) return Corrupt("a row is over a chunk's limit");
  header_ = h;
  have_header_ = true;
  layer_ = 0;
  next_token_ = h.first_stored[0];
  return h;
}

absl::StatusOr<std::optional<SnapshotReader::Chunk>> SnapshotReader::Next() {
  if (!have_header_) return absl::FailedPreconditionError("snapshot chunk before the header");
  if (done_) return std::nullopt;
  while (layer_ < header_.config.layers &&
         next_token_ >= header_.layer_tokens[static_cast<size_t>(layer_)]) {
    ++layer_;
    if (layer_ < header_.config.layers)
      next_token_ = header_.first_stored[static_cast<size_t>(layer_)];
  }
  char tag[4];
  const std::string where = absl::StrCat(
      layer_ < header_.config.layers
          ? absl::StrCat("chunk ", chunks_, " (layer ", layer_, " from token ", next_token_, ")")
          : std::string("the trailer"));
  ATTEND_RETURN_IF_ERROR(ReadExactly(tag, 4, where));
  if (std::memcmp(tag, kDoneTag, 4) == 0) {
    char rest[16];
    ATTEND_RETURN_IF_ERROR(ReadExactly(rest, 16, "the trailer"));
    uint64_t chunks = 0, hash = 0;
    std::memcpy(&chunks, rest, 8);
    std::memcpy(&hash, rest + 8, 8);
    Encoder done;
    done.bytes().append(kDoneTag, 4);
    done.U64(chunks);
    if (hash != Hash(done.bytes(), header_hash_)) {
      return Corrupt("the trailer's checksum does not match (corrupted, or from another snapshot)");
    }
    if (chunks != chunks_ || layer_ < header_.config.layers) {
      return Corrupt(absl::StrCat("rows are missing: the trailer came after ", chunks_,
                                  " chunks, with layer ", layer_, " unread from token ",
                                  next_token_));
    }
    char extra;
    ATTEND_ASSIGN_OR_RETURN(const size_t more, source_(&extra, 1));
    if (more != 0) return Corrupt("bytes follow the trailer");
    done_ = true;
    return std::nullopt;
  }
  if (std::memcmp(tag, kChunkTag, 4) != 0) {
    return Corrupt(absl::StrCat(where, ": not a chunk or the trailer (corrupted)"));
  }
  char fields[16];
  ATTEND_RETURN_IF_ERROR(ReadExactly(fields, 16, where));
  uint32_t layer = 0, count = 0;
  int64_t first = 0;
  std::memcpy(&layer, fields, 4);
  std::memcpy(&first, fields + 4, 8);
  std::memcpy(&count, fields + 12, 4);
  if (layer_ >= header_.config.layers) {
    return Corrupt(absl::StrCat("chunk ", chunks_, " comes after every layer's rows"));
  }
  const int64_t end = header_.layer_tokens[static_cast<size_t>(layer_)];
  if (static_cast<int64_t>(layer) != layer_ || first != next_token_ || count < 1 ||
      static_cast<int64_t>(count) > SnapshotWriter::RowsPerChunk(header_) ||
      first + static_cast<int64_t>(count) > end) {
    return Corrupt(absl::StrCat(where, ": holds layer ", layer, " tokens [", first, ", ",
                                first + static_cast<int64_t>(count),
                                "), out of order or out of range (corrupted)"));
  }
  const size_t bytes = static_cast<size_t>(count) * static_cast<size_t>(header_.row_bytes());
  rows_.resize(bytes);
  ATTEND_RETURN_IF_ERROR(ReadExactly(rows_.data(), bytes, where));
  uint64_t hash = 0;
  ATTEND_RETURN_IF_ERROR(ReadExactly(reinterpret_cast<char*>(&hash), 8, where));
  XXH3_state_t* state = XXH3_createState();
  XXH3_64bits_reset_withSeed(state, header_hash_);
  XXH3_64bits_update(state, tag, 4);
  XXH3_64bits_update(state, fields, 16);
  XXH3_64bits_update(state, rows_.data(), rows_.size());
  const uint64_t want = XXH3_64bits_digest(state);
  XXH3_freeState(state);
  if (hash != want) {
    return Corrupt(absl::StrCat(where,
                                ": its checksum does not match (corrupted, or a chunk "
                                "of another snapshot)"));
  }
  ++chunks_;
  next_token_ += count;
  return Chunk{layer_, first, static_cast<int64_t>(count), rows_};
}

ByteSource StringSource(absl::string_view bytes) {
  return [bytes](char* dst, size_t n) mutable -> absl::StatusOr<size_t> {
    const size_t take = std::min(n, bytes.size());
    std::memcpy(dst, bytes.data(), take);
    bytes.remove_prefix(take);
    return take;
  };
}

ByteSink StringSink(std::string* out) {
  return [out](absl::string_view bytes) {
    out->append(bytes.data(), bytes.size());
    return absl::OkStatus();
  };
}

}  // namespace attend::kv
