#include "planner/import/gguf.h"

#include <algorithm>
#include <cstring>
#include <functional>
#include <limits>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "core/base/status_macros.h"
#include "planner/import/gguf_format.h"
#include "planner/import/gguf_layers.h"
#include "planner/import/imported_model.h"

namespace attend::planner {
namespace {

// Strings longer than this are skipped, not kept: no key we read needs more.
constexpr uint64_t kMaxKeptString = 4096;
// Keys longer than this cannot be one we read, so their values are not kept.
constexpr uint64_t kMaxKeptKey = 256;
// Real headers have about 15 keys the importer reads; a header with many more decoys is hostile.
constexpr size_t kMaxKeptKeys = 256;
// Integer arrays are kept only up to one value per layer.
constexpr uint64_t kMaxKeptArray = static_cast<uint64_t>(kMaxLayers);
constexpr uint64_t kMaxTensorCount = uint64_t{1} << 24;

// "a uint32", "an array", "an int8": a GGUF value type for messages.
std::string TypeWithArticle(uint32_t type) {
  const absl::string_view name = gguf::ValueTypeName(type);
  const bool vowel = name == "array" || name == "unknown" || absl::StartsWith(name, "int");
  return absl::StrCat(vowel ? "an " : "a ", name);
}

// Whether the importer may read `key`: only these are kept, so the memory held per key/value
// does not scale with the number of key/values in the input.
bool IsModelKey(absl::string_view key) {
  static constexpr absl::string_view kExact[] = {"general.architecture", "general.name",
                                                 "general.file_type", "tokenizer.ggml.tokens"};
  static constexpr absl::string_view kSuffixes[] = {
      ".block_count",
      ".embedding_length",
      ".context_length",
      ".feed_forward_length",
      ".vocab_size",
      ".expert_count",
      ".expert_used_count",
      ".attention.head_count",
      ".attention.head_count_kv",
      ".attention.key_length",
      ".attention.value_length",
      ".attention.sliding_window",
      ".attention.sliding_window_pattern",
      // Latent attention, recurrent layers and hybrids (gguf_layers.h).
      ".attention.kv_lora_rank",
      ".attention.key_length_mla",
      ".attention.value_length_mla",
      ".attention.indexer.key_length",  // DeepSeek sparse attention's indexer (glm-dsa)
      ".attention.indexer.head_count",  // kept to refuse it without indexer.key_length
      ".attention.key_length_swa",      // sliding layers' head sizes (mimo2): refused when they
      ".attention.value_length_swa",    // differ from the model's
      ".rope.dimension_count",
      ".ssm.conv_kernel",
      ".ssm.inner_size",
      ".ssm.state_size",
      ".ssm.group_count",
      ".full_attention_interval",
  };
  if (key.size() > kMaxKeptKey) return false;
  for (absl::string_view k : kExact) {
    if (key == k) return true;
  }
  for (absl::string_view suffix : kSuffixes) {
    if (absl::EndsWith(key, suffix)) return true;
  }
  return false;
}

// One value as read: what the importer may use of it, and what was dropped.
struct GgufValue {
  uint32_t type = 0;
  // Scalars.
  std::optional<int64_t> integer;  // integer types and bool, when they fit in int64
  bool integer_too_large = false;  // a uint64 above INT64_MAX, kept in too_large for messages
  uint64_t too_large = 0;
  std::optional<double> real;
  std::optional<std::string> text;  // strings up to kMaxKeptString bytes
  // Arrays.
  uint32_t element_type = 0;
  uint64_t count = 0;
  std::optional<std::vector<int64_t>> integers;  // integer/bool arrays up to kMaxKeptArray
  bool any_integer_too_large = false;
};

// A cursor over the input that refuses to read past its end. Errors name the key being read
// (set_context) and the offset.
class GgufReader {
 public:
  explicit GgufReader(absl::string_view in) : in_(in) {}

  uint64_t remaining() const { return in_.size() - pos_; }
  size_t pos() const { return pos_; }
  void set_context(std::string context) { context_ = std::move(context); }

  absl::Status Error(absl::string_view what) const {
    return absl::InvalidArgumentError(context_.empty()
                                          ? absl::StrCat("gguf: ", what)
                                          : absl::StrCat("gguf: ", context_, ": ", what));
  }

  absl::Status PastEnd(absl::string_view what, uint64_t bytes) const {
    return Error(absl::StrCat(what, " (", bytes, " bytes at offset ", pos_,
                              ") runs past the end of the ", in_.size(), "-byte input"));
  }

  template <typename T>
  absl::StatusOr<T> Fixed(absl::string_view what) {
    if (remaining() < sizeof(T)) return PastEnd(what, sizeof(T));
    T value;
    std::memcpy(&value, in_.data() + pos_, sizeof(T));  // GGUF is little-endian, like x86/arm
    pos_ += sizeof(T);
    return value;
  }

  // A u64-length string. One longer than `max_bytes` is skipped: the view is empty and *kept
  // false.
  absl::StatusOr<absl::string_view> String(absl::string_view what, uint64_t max_bytes, bool* kept) {
    ATTEND_ASSIGN_OR_RETURN(const uint64_t length, Fixed<uint64_t>(absl::StrCat(what, " length")));
    if (length > remaining()) {
      return Error(absl::StrCat(what, " length ", length, " at offset ", pos_ - 8,
                                " runs past the end of the ", in_.size(), "-byte input"));
    }
    const absl::string_view s = in_.substr(pos_, length);
    pos_ += length;
    *kept = length <= max_bytes;
    return *kept ? s : absl::string_view();
  }

  absl::Status Skip(uint64_t bytes) {
    if (bytes > remaining()) return PastEnd("value", bytes);
    pos_ += bytes;
    return absl::OkStatus();
  }

  // Reads one value of `type`. Keeps what GgufValue keeps; skips the rest.
  absl::Status Value(uint32_t type, int depth, GgufValue* out) {
    out->type = type;
    switch (type) {
      case gguf::kU8:
        return Integer<uint8_t>("uint8 value", out);
      case gguf::kI8:
        return Integer<int8_t>("int8 value", out);
      case gguf::kU16:
        return Integer<uint16_t>("uint16 value", out);
      case gguf::kI16:
        return Integer<int16_t>("int16 value", out);
      case gguf::kU32:
        return Integer<uint32_t>("uint32 value", out);
      case gguf::kI32:
        return Integer<int32_t>("int32 value", out);
      case gguf::kU64:
        return U64(out);
      case gguf::kI64:
        return Integer<int64_t>("int64 value", out);
      case gguf::kF32:
        return Real<float>("float32 value", out);
      case gguf::kF64:
        return Real<double>("float64 value", out);
      case gguf::kBool:
        return Bool(out);
      case gguf::kString:
        return StringValue(out);
      case gguf::kArray:
        return Array(depth + 1, out);
      default:
        return Error(absl::StrCat("value type ", type, " is not a GGUF type (0..12)"));
    }
  }

 private:
  // Integer types that always fit in int64.
  template <typename T>
  absl::Status Integer(absl::string_view what, GgufValue* out) {
    ATTEND_ASSIGN_OR_RETURN(const T v, Fixed<T>(what));
    out->integer = v;
    return absl::OkStatus();
  }

  absl::Status U64(GgufValue* out) {
    ATTEND_ASSIGN_OR_RETURN(const uint64_t v, Fixed<uint64_t>("uint64 value"));
    if (v > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      out->integer_too_large = true;
      out->too_large = v;
    } else {
      out->integer = static_cast<int64_t>(v);
    }
    return absl::OkStatus();
  }

  template <typename T>
  absl::Status Real(absl::string_view what, GgufValue* out) {
    ATTEND_ASSIGN_OR_RETURN(const T v, Fixed<T>(what));
    out->real = v;
    return absl::OkStatus();
  }

  absl::Status Bool(GgufValue* out) {
    ATTEND_ASSIGN_OR_RETURN(const uint8_t v, Fixed<uint8_t>("bool value"));
    if (v > 1) return Error(absl::StrCat("bool value ", v, " is neither 0 nor 1"));
    out->integer = v;
    return absl::OkStatus();
  }

  absl::Status StringValue(GgufValue* out) {
    bool kept = false;
    ATTEND_ASSIGN_OR_RETURN(const absl::string_view s, String("string", kMaxKeptString, &kept));
    if (kept) out->text = std::string(s);
    return absl::OkStatus();
  }

  absl::Status Array(int depth, GgufValue* out) {
    if (depth > kMaxGgufArrayDepth) {
      return Error(absl::StrCat("arrays nested deeper than ", kMaxGgufArrayDepth, " levels"));
    }
    ATTEND_ASSIGN_OR_RETURN(const uint32_t element_type, Fixed<uint32_t>("array element type"));
    if (element_type >= gguf::kValueTypeCount) {
      return Error(
          absl::StrCat("array element type ", element_type, " is not a GGUF type (0..12)"));
    }
    ATTEND_ASSIGN_OR_RETURN(const uint64_t count, Fixed<uint64_t>("array length"));
    // Every element takes at least MinEncodedSize bytes, so a count the input cannot hold is
    // refused before any element is read or any memory is sized from it.
    const uint64_t min_size = gguf::MinEncodedSize(element_type);
    if (count > remaining() / min_size) {
      return Error(absl::StrCat("array of ", count, " ", gguf::ValueTypeName(element_type),
                                " elements at offset ", pos_ - 12, " runs past the end of the ",
                                in_.size(), "-byte input (", remaining(), " bytes remain)"));
    }
    out->element_type = element_type;
    out->count = count;
    if (gguf::IsInteger(element_type) && count <= kMaxKeptArray) {
      return KeptIntegers(element_type, count, depth, out);
    }
    const uint64_t fixed = gguf::FixedSize(element_type);
    if (fixed > 0) return Skip(count * fixed);  // count * fixed <= remaining(), checked above
    for (uint64_t i = 0; i < count; ++i) {
      GgufValue element;  // strings and arrays: read to find their ends, not kept
      if (element_type == gguf::kString) {
        bool kept = false;
        ATTEND_RETURN_IF_ERROR(String("string", 0, &kept).status());
      } else {
        ATTEND_RETURN_IF_ERROR(Value(element_type, depth, &element));
      }
    }
    return absl::OkStatus();
  }

  // The elements of an integer array short enough to keep (one value per layer at most).
  absl::Status KeptIntegers(uint32_t element_type, uint64_t count, int depth, GgufValue* out) {
    std::vector<int64_t> values;
    values.reserve(static_cast<size_t>(count));
    for (uint64_t i = 0; i < count; ++i) {
      GgufValue element;
      ATTEND_RETURN_IF_ERROR(Value(element_type, depth, &element));
      if (element.integer_too_large) out->any_integer_too_large = true;
      values.push_back(element.integer.value_or(0));
    }
    out->integers = std::move(values);
    return absl::OkStatus();
  }

  absl::string_view in_;
  size_t pos_ = 0;
  std::string context_;
};

// Typed access to the key/values read from a GGUF header, with errors naming the key.
class GgufMetadata {
 public:
  // The model's block count, once read (per-layer arrays are checked against it).
  int64_t layers() const { return layers_; }
  void set_layers(int64_t layers) { layers_ = layers; }

  absl::flat_hash_map<std::string, GgufValue>& map() { return map_; }

  const GgufValue* Find(const std::string& key) const {
    auto it = map_.find(key);
    return it == map_.end() ? nullptr : &it->second;
  }

  static absl::Status Bad(const std::string& key, absl::string_view what) {
    return absl::InvalidArgumentError(absl::StrCat("gguf: ", QuoteForError(key), ": ", what));
  }

  static absl::Status CheckRange(const std::string& key, int64_t value, int64_t lo, int64_t hi) {
    if (value < lo || value > hi) {
      return Bad(key, absl::StrCat(value, "; must be in [", lo, ", ", hi, "]"));
    }
    return absl::OkStatus();
  }

  // A scalar integer in [lo, hi], or nullopt when the key is absent.
  absl::StatusOr<std::optional<int64_t>> Int(const std::string& key, int64_t lo, int64_t hi) const {
    const GgufValue* v = Find(key);
    if (v == nullptr) return std::optional<int64_t>();
    // A bool is stored as an integer, but a count given as one is a malformed header.
    if (v->type == gguf::kArray || v->type == gguf::kBool || !gguf::IsInteger(v->type)) {
      return Bad(key, absl::StrCat("is ", TypeWithArticle(v->type), "; expected an integer"));
    }
    if (v->integer_too_large) {
      return Bad(key,
                 absl::StrCat(v->too_large, " is above 2^63 - 1; must be in [", lo, ", ", hi, "]"));
    }
    ATTEND_RETURN_IF_ERROR(CheckRange(key, *v->integer, lo, hi));
    return v->integer;
  }

  absl::StatusOr<int64_t> RequiredInt(const std::string& key, int64_t lo, int64_t hi) const {
    ATTEND_ASSIGN_OR_RETURN(std::optional<int64_t> v, Int(key, lo, hi));
    if (!v)
      return absl::InvalidArgumentError(absl::StrCat("gguf: ", QuoteForError(key), " is missing"));
    return *v;
  }

  // A scalar, or an integer array of exactly `layers` values, each in [lo, hi]. Empty when the
  // key is absent; one value for a scalar.
  absl::StatusOr<std::vector<int64_t>> IntOrPerLayer(const std::string& key, int64_t layers,
                                                     int64_t lo, int64_t hi) const {
    const GgufValue* v = Find(key);
    if (v == nullptr) return std::vector<int64_t>();
    if (v->type != gguf::kArray) {
      ATTEND_ASSIGN_OR_RETURN(std::optional<int64_t> scalar, Int(key, lo, hi));
      return std::vector<int64_t>{*scalar};
    }
    if (!gguf::IsInteger(v->element_type)) {
      return Bad(key, absl::StrCat("is an array of ", gguf::ValueTypeName(v->element_type),
                                   "; expected integers"));
    }
    if (static_cast<int64_t>(v->count) != layers || !v->integers) {
      return Bad(key, absl::StrCat("has ", v->count, " values for ", layers, " layers"));
    }
    if (v->any_integer_too_large) {
      return Bad(
          key, absl::StrCat("holds a value above 2^63 - 1; each must be in [", lo, ", ", hi, "]"));
    }
    for (size_t i = 0; i < v->integers->size(); ++i) {
      ATTEND_RETURN_IF_ERROR(CheckRange(absl::StrCat(key, "[", i, "]"), (*v->integers)[i], lo, hi));
    }
    return *v->integers;
  }

  absl::StatusOr<std::optional<std::string>> String(const std::string& key) const {
    const GgufValue* v = Find(key);
    if (v == nullptr) return std::optional<std::string>();
    if (v->type != gguf::kString) {
      return Bad(key, absl::StrCat("is ", TypeWithArticle(v->type), "; expected a string"));
    }
    if (!v->text) return Bad(key, absl::StrCat("is longer than ", kMaxKeptString, " bytes"));
    return v->text;
  }

 private:
  absl::flat_hash_map<std::string, GgufValue> map_;
  int64_t layers_ = 0;
};

bool AllEqual(const std::vector<int64_t>& v) {
  return std::adjacent_find(v.begin(), v.end(), std::not_equal_to<int64_t>()) == v.end();
}

// The fixed part of the header: magic, version, tensor_count and kv_count, each checked.
absl::Status ReadGgufHeader(GgufReader& r, absl::string_view bytes, uint32_t* version,
                            uint64_t* kv_count) {
  if (bytes.size() < gguf::kMagic.size()) {
    return r.Error(absl::StrCat("the input is ", bytes.size(),
                                " bytes, too short for the 4-byte magic 'GGUF'"));
  }
  if (bytes.substr(0, gguf::kMagic.size()) != gguf::kMagic) {
    return r.Error(
        absl::StrCat("bad magic ", QuoteForError(bytes.substr(0, 4)), "; expected 'GGUF'"));
  }
  ATTEND_RETURN_IF_ERROR(r.Skip(gguf::kMagic.size()));
  ATTEND_ASSIGN_OR_RETURN(*version, r.Fixed<uint32_t>("version"));
  // Versions 2 and 3 with their bytes swapped: a file written on a big-endian machine.
  if (*version == 0x02000000u || *version == 0x03000000u) {
    return r.Error("big-endian GGUF files are not supported");
  }
  if (*version < gguf::kMinVersion || *version > gguf::kMaxVersion) {
    return r.Error(absl::StrCat("version ", *version, " is not supported (2 or 3)"));
  }
  ATTEND_ASSIGN_OR_RETURN(const uint64_t tensor_count, r.Fixed<uint64_t>("tensor_count"));
  if (tensor_count > kMaxTensorCount) {
    return r.Error(
        absl::StrCat("tensor_count ", tensor_count, " is over the limit of ", kMaxTensorCount));
  }
  ATTEND_ASSIGN_OR_RETURN(*kv_count, r.Fixed<uint64_t>("kv_count"));
  if (*kv_count > kMaxGgufKeyValues) {
    return r.Error(
        absl::StrCat("kv_count ", *kv_count, " is over the limit of ", kMaxGgufKeyValues));
  }
  if (*kv_count > r.remaining() / gguf::kMinKeyValueBytes) {
    return r.Error(absl::StrCat("kv_count ", *kv_count, " key/values cannot fit in the ",
                                r.remaining(), " bytes after the header (each takes at least ",
                                gguf::kMinKeyValueBytes, ")"));
  }
  return absl::OkStatus();
}

// The header and its key/values; keeps only the model keys (IsModelKey).
absl::StatusOr<GgufMetadata> ReadGgufMetadata(absl::string_view bytes, uint32_t* version,
                                              uint64_t* kv_count) {
  GgufReader r(bytes);
  ATTEND_RETURN_IF_ERROR(ReadGgufHeader(r, bytes, version, kv_count));
  GgufMetadata metadata;
  for (uint64_t i = 0; i < *kv_count; ++i) {
    r.set_context(absl::StrCat("key ", i));
    bool kept = false;
    ATTEND_ASSIGN_OR_RETURN(const absl::string_view key, r.String("key", kMaxGgufKeyBytes, &kept));
    if (!kept) return r.Error(absl::StrCat("key longer than ", kMaxGgufKeyBytes, " bytes"));
    if (key.empty()) return r.Error("empty key");
    r.set_context(absl::StrCat("key ", i, " ", QuoteForError(key)));
    ATTEND_ASSIGN_OR_RETURN(const uint32_t type, r.Fixed<uint32_t>("value type"));
    GgufValue value;
    ATTEND_RETURN_IF_ERROR(r.Value(type, 0, &value));
    if (!IsModelKey(key)) continue;
    if (metadata.map().size() >= kMaxKeptKeys) {
      return r.Error(absl::StrCat("more than ", kMaxKeptKeys, " model keys"));
    }
    if (!metadata.map().emplace(std::string(key), std::move(value)).second) {
      return r.Error("duplicate key");
    }
  }
  return metadata;
}

// llama.cpp's llama_ftype values whose tensors are (almost) all of one type.
std::string WeightsDTypeFromFileType(int64_t file_type) {
  switch (file_type) {
    case 0:
      return "float32";
    case 1:
      return "float16";
    case 2:
      return "q4_0";
    case 7:
      return "q8_0";
    case 32:
      return "bfloat16";
    default:
      return "";
  }
}

// general.architecture, which prefixes every model key, so it must be a plain name.
absl::StatusOr<std::string> ReadArchitecture(const GgufMetadata& md) {
  ATTEND_ASSIGN_OR_RETURN(std::optional<std::string> arch, md.String("general.architecture"));
  if (!arch) return absl::InvalidArgumentError("gguf: 'general.architecture' is missing");
  const bool plain =
      !arch->empty() && arch->size() <= 64 && std::all_of(arch->begin(), arch->end(), [](char c) {
        return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_' || c == '-';
      });
  if (!plain) {
    return absl::InvalidArgumentError(
        absl::StrCat("gguf: 'general.architecture' ", QuoteForError(*arch),
                     " is not a plain name ([a-z0-9_-], 1 to 64 bytes)"));
  }
  return *arch;
}

// Query and key/value heads (`a` is "<arch>."). Sets n_head and n_head_kv (the largest per-layer
// count) and returns the key/value heads: one value, or one per layer.
absl::StatusOr<std::vector<int64_t>> ReadHeads(const GgufMetadata& md, const std::string& a,
                                               bool zero_kv_layers, ModelSpec* m) {
  // Hybrids write 0 heads for their recurrent and MLP layers (gguf_layers.h).
  const int64_t min_heads = zero_kv_layers ? 0 : 1;
  ATTEND_ASSIGN_OR_RETURN(
      std::vector<int64_t> heads,
      md.IntOrPerLayer(a + "attention.head_count", m->layers, min_heads, kMaxHeads));
  if (heads.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("gguf: ", QuoteForError(a + "attention.head_count"), " is missing"));
  }
  if (zero_kv_layers) {
    heads.erase(std::remove(heads.begin(), heads.end(), 0), heads.end());
    if (heads.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "gguf: ", QuoteForError(a + "attention.head_count"), ": no layer has attention heads"));
    }
  }
  if (!AllEqual(heads)) {
    return absl::InvalidArgumentError(
        absl::StrCat("gguf: ", QuoteForError(a + "attention.head_count"),
                     ": per-layer query head counts that differ are not supported"));
  }
  m->n_head = heads[0];

  const std::string kv_key = a + "attention.head_count_kv";
  ATTEND_ASSIGN_OR_RETURN(std::vector<int64_t> kv,
                          md.IntOrPerLayer(kv_key, m->layers, min_heads, m->n_head));
  if (kv.empty()) kv.push_back(m->n_head);
  for (size_t i = 0; i < kv.size(); ++i) {
    if (kv[i] == 0) continue;  // a recurrent or MLP layer of a hybrid
    if (m->n_head % kv[i] != 0) {
      const std::string field = kv.size() == 1 ? kv_key : absl::StrCat(kv_key, "[", i, "]");
      return absl::InvalidArgumentError(absl::StrCat("gguf: ", QuoteForError(field), ": ", kv[i],
                                                     " does not divide head_count ", m->n_head));
    }
  }
  m->n_head_kv = *std::max_element(kv.begin(), kv.end());
  return kv;
}

// Key and value head sizes; by default embedding_length / head_count, which must divide.
absl::Status ReadHeadSizes(const GgufMetadata& md, const std::string& a, ModelSpec* m) {
  ATTEND_ASSIGN_OR_RETURN(std::optional<int64_t> key_length,
                          md.Int(a + "attention.key_length", 1, kMaxHeadDim));
  if (!key_length) {
    if (m->d_model % m->n_head != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("gguf: ", QuoteForError(a + "embedding_length"), " ", m->d_model,
                       " is not a multiple of head_count ", m->n_head,
                       " and attention.key_length is not given"));
    }
    key_length = m->d_model / m->n_head;
  }
  m->head_dim = *key_length;
  ATTEND_ASSIGN_OR_RETURN(std::optional<int64_t> value_length,
                          md.Int(a + "attention.value_length", 1, kMaxHeadDim));
  m->head_dim_v = value_length.value_or(m->head_dim);
  return absl::OkStatus();
}

// Context length, MLP width and vocabulary (from tokenizer.ggml.tokens when vocab_size is absent).
absl::Status ReadSizes(const GgufMetadata& md, const std::string& a, ModelSpec* m) {
  ATTEND_ASSIGN_OR_RETURN(std::optional<int64_t> context,
                          md.Int(a + "context_length", 0, kMaxContextTokens));
  m->max_context_tokens = context.value_or(0);
  ATTEND_ASSIGN_OR_RETURN(
      std::vector<int64_t> ffn,
      md.IntOrPerLayer(a + "feed_forward_length", m->layers, 0, kMaxIntermediate));
  // Per-layer MLP widths that differ cannot be described by one intermediate_size: leave it
  // unknown, which leaves the parameter count unknown too.
  m->intermediate_size = !ffn.empty() && AllEqual(ffn) ? ffn[0] : 0;
  ATTEND_ASSIGN_OR_RETURN(std::optional<int64_t> vocab, md.Int(a + "vocab_size", 0, kMaxVocab));
  if (!vocab) {
    if (const GgufValue* tokens = md.Find("tokenizer.ggml.tokens");
        tokens != nullptr && tokens->type == gguf::kArray) {
      ATTEND_RETURN_IF_ERROR(GgufMetadata::CheckRange(
          "tokenizer.ggml.tokens length", static_cast<int64_t>(tokens->count), 0, kMaxVocab));
      vocab = static_cast<int64_t>(tokens->count);
    }
  }
  m->vocab_size = vocab.value_or(0);
  return absl::OkStatus();
}

// Mixture of experts: a model with more than one expert must say how many a token uses.
absl::Status ReadExperts(const GgufMetadata& md, const std::string& a, ModelSpec* m) {
  ATTEND_ASSIGN_OR_RETURN(std::optional<int64_t> experts,
                          md.Int(a + "expert_count", 0, kMaxExperts));
  m->experts = experts.value_or(0);
  ATTEND_ASSIGN_OR_RETURN(std::optional<int64_t> used,
                          md.Int(a + "expert_used_count", 0, std::max<int64_t>(m->experts, 1)));
  m->experts_active = m->experts > 1 ? used.value_or(0) : m->experts;
  if (m->experts > 1 && m->experts_active < 1) {
    return absl::InvalidArgumentError(absl::StrCat("gguf: ", QuoteForError(a + "expert_used_count"),
                                                   " is missing or 0 for a model with ", m->experts,
                                                   " experts"));
  }
  return absl::OkStatus();
}

// Which layers slide: attention.sliding_window_pattern as one boolean per layer (returned in
// *sliding, 0 or 1 each) or as a period (*period; 0 means every layer slides), by default the
// period llama.cpp uses for the architecture.
absl::Status ReadSlidingPattern(const GgufMetadata& md, const std::string& arch, int64_t layers,
                                std::vector<int64_t>* sliding, int64_t* period) {
  const std::string pattern_key = arch + ".attention.sliding_window_pattern";
  if (const GgufValue* p = md.Find(pattern_key); p != nullptr && p->type == gguf::kArray) {
    if (p->element_type != gguf::kBool) {
      return GgufMetadata::Bad(pattern_key,
                               absl::StrCat("is an array of ", gguf::ValueTypeName(p->element_type),
                                            "; expected booleans"));
    }
    ATTEND_ASSIGN_OR_RETURN(*sliding, md.IntOrPerLayer(pattern_key, layers, 0, 1));
    return absl::OkStatus();
  }
  ATTEND_ASSIGN_OR_RETURN(std::optional<int64_t> given, md.Int(pattern_key, 0, kMaxLayers));
  if (given) {
    *period = *given;
  } else if (arch == "gemma2") {
    *period = 2;
  } else if (arch == "gemma3") {
    *period = 6;
  } else if (arch == "cohere2") {
    *period = 4;
  } else if (arch == "gpt-oss") {
    *period = 2;  // llama.cpp's OPENAI_MOE: set_swa_pattern(2), even layers slide
  }
  return absl::OkStatus();
}

// Each layer's window: attention.sliding_window on the layers that slide, 0 on the others.
absl::StatusOr<std::vector<int64_t>> ReadWindows(const GgufMetadata& md, const std::string& arch,
                                                 int64_t layers) {
  ATTEND_ASSIGN_OR_RETURN(std::optional<int64_t> window,
                          md.Int(arch + ".attention.sliding_window", 0, kMaxContextTokens));
  std::vector<int64_t> windows(static_cast<size_t>(layers), 0);
  if (window.value_or(0) <= 0) return windows;
  std::vector<int64_t> sliding;  // one 0/1 per layer, when given as booleans
  int64_t period = 0;            // 0: every layer slides
  ATTEND_RETURN_IF_ERROR(ReadSlidingPattern(md, arch, layers, &sliding, &period));
  for (int64_t i = 0; i < layers; ++i) {
    bool slides = true;
    if (!sliding.empty()) {
      slides = sliding[static_cast<size_t>(i)] != 0;
    } else if (period > 0) {
      // llama.cpp: layer il slides when il % period < period - 1, i.e. every period-th layer
      // (counting from 1) is global.
      slides = i % period < period - 1;
    }
    windows[static_cast<size_t>(i)] = slides ? *window : 0;
  }
  return windows;
}

// The header as gguf_layers.cc reads it.
GgufInts LayerLookup(const GgufMetadata& md) {
  GgufInts ints;
  ints.scalar = [&md](const std::string& key, int64_t lo, int64_t hi) {
    return md.Int(key, lo, hi);
  };
  ints.per_layer = [&md](const std::string& key, int64_t lo, int64_t hi) {
    // Every caller passes keys of per-layer values; the layer count is the block count's.
    return md.IntOrPerLayer(key, md.layers(), lo, hi);
  };
  ints.has = [&md](const std::string& key) { return md.Find(key) != nullptr; };
  return ints;
}

}  // namespace

absl::StatusOr<ModelSpec> ImportGguf(absl::string_view bytes, absl::string_view name) {
  uint32_t version = 0;
  uint64_t kv_count = 0;
  ATTEND_ASSIGN_OR_RETURN(GgufMetadata md, ReadGgufMetadata(bytes, &version, &kv_count));
  ModelSpec m;
  ATTEND_ASSIGN_OR_RETURN(m.architecture, ReadArchitecture(md));
  const std::string a = m.architecture + ".";
  ATTEND_ASSIGN_OR_RETURN(m.layers, md.RequiredInt(a + "block_count", 1, kMaxLayers));
  md.set_layers(m.layers);
  ATTEND_ASSIGN_OR_RETURN(m.d_model, md.RequiredInt(a + "embedding_length", 1, kMaxDModel));
  std::vector<int64_t> kv = {0};
  if (!GgufArchIsStateSpaceOnly(m.architecture)) {
    ATTEND_ASSIGN_OR_RETURN(kv, ReadHeads(md, a, GgufArchHasZeroKvLayers(m.architecture), &m));
    ATTEND_RETURN_IF_ERROR(ReadHeadSizes(md, a, &m));
  }
  ATTEND_RETURN_IF_ERROR(ReadSizes(md, a, &m));
  ATTEND_RETURN_IF_ERROR(ReadExperts(md, a, &m));
  ATTEND_ASSIGN_OR_RETURN(std::optional<int64_t> file_type,
                          md.Int("general.file_type", 0, std::numeric_limits<int32_t>::max()));
  if (file_type) m.weights_dtype = WeightsDTypeFromFileType(*file_type);

  ATTEND_ASSIGN_OR_RETURN(const std::vector<int64_t> windows,
                          ReadWindows(md, m.architecture, m.layers));
  m.layer_specs.resize(static_cast<size_t>(m.layers));
  for (int64_t i = 0; i < m.layers; ++i) {
    const size_t l = static_cast<size_t>(i);
    m.layer_specs[l] = LayerSpec{kv.size() == 1 ? kv[0] : kv[l], windows[l]};
  }
  ATTEND_RETURN_IF_ERROR(ReadGgufLayerKinds(LayerLookup(md), m.architecture, kv, &m));

  ATTEND_ASSIGN_OR_RETURN(std::optional<std::string> general_name, md.String("general.name"));
  NameImportedModel(name, SanitizeText(general_name.value_or("")), m.architecture, &m);
  m.source = absl::StrCat("GGUF v", version, " header (architecture ", m.architecture, ", ",
                          kv_count, " key/values)");
  absl::StatusOr<ModelSpec> finished = FinishImportedModel(std::move(m));
  if (!finished.ok()) {
    // Every error of this importer starts with "gguf: ", CanonicalModel's too.
    return absl::Status(finished.status().code(),
                        absl::StrCat("gguf: ", finished.status().message()));
  }
  return finished;
}

}  // namespace attend::planner
