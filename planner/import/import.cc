#include "planner/import/import.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/json.h"
#include "core/base/status_macros.h"
#include "planner/parameter_counts.h"

namespace attend::planner {
namespace {

// Printable ASCII survives; anything else becomes '?', so that names taken from untrusted input
// are safe to log and print. Cut at kMaxNameBytes.
std::string SanitizeText(absl::string_view text) {
  std::string out;
  for (char c : text.substr(0, kMaxNameBytes)) {
    const unsigned char u = static_cast<unsigned char>(c);
    out.push_back(u >= 0x20 && u < 0x7F ? c : '?');
  }
  return out;
}

// Everything both importers do last: uniform layers need no layer_specs, the shape is checked,
// and the parameter count is computed when the shape allows it.
absl::StatusOr<ModelSpec> Finish(ModelSpec m) {
  const bool uniform =
      std::all_of(m.layer_specs.begin(), m.layer_specs.end(), [&](const LayerSpec& l) {
        return l.window_tokens == 0 && (l.n_head_kv == 0 || l.n_head_kv == m.n_head_kv);
      });
  if (uniform) m.layer_specs.clear();
  ATTEND_ASSIGN_OR_RETURN(m, CanonicalModel(m));
  absl::StatusOr<ParameterCount> count = ComputeParameters(m);
  if (count.ok()) {
    m.parameters = count->total;
    m.active_parameters = count->active;
    m.parameters_source =
        absl::StrCat("computed from the shape (ComputeParameters: embeddings, attention, ",
                     HasGatedMlp(m) ? "gated MLP, norms)" : "two-matrix MLP, LayerNorms)");
  } else {
    m.parameters = 0;
    m.active_parameters = 0;
    m.parameters_source = absl::StrCat("unknown: ", count.status().message());
  }
  return m;
}

// ---------------------------------------------------------------------------------------------
// Hugging Face config.json

class ConfigReader {
 public:
  ConfigReader(const json::Value& object, std::string prefix)
      : object_(object), prefix_(std::move(prefix)) {}

  std::string Field(absl::string_view key) const { return absl::StrCat(prefix_, key); }

  // Absent and null both mean "not given".
  const json::Value* Get(absl::string_view key) const {
    const json::Value* v = object_.Find(key);
    return v == nullptr || v->is_null() ? nullptr : v;
  }

  absl::StatusOr<std::optional<int64_t>> Int(absl::string_view key, int64_t lo, int64_t hi) const {
    const json::Value* v = Get(key);
    if (v == nullptr) return std::optional<int64_t>();
    ATTEND_ASSIGN_OR_RETURN(const int64_t value, json::AsInt64(*v, Field(key)));
    if (value < lo || value > hi) {
      return absl::InvalidArgumentError(
          absl::StrCat(Field(key), ": ", value, "; must be in [", lo, ", ", hi, "]"));
    }
    return std::optional<int64_t>(value);
  }

  absl::StatusOr<int64_t> RequiredInt(absl::string_view key, int64_t lo, int64_t hi) const {
    ATTEND_ASSIGN_OR_RETURN(std::optional<int64_t> value, Int(key, lo, hi));
    if (!value) return absl::InvalidArgumentError(absl::StrCat(Field(key), " is missing"));
    return *value;
  }

  absl::StatusOr<std::optional<bool>> Bool(absl::string_view key) const {
    const json::Value* v = Get(key);
    if (v == nullptr) return std::optional<bool>();
    if (!v->is_bool()) {
      return absl::InvalidArgumentError(
          absl::StrCat(Field(key), ": expected a boolean, got ", v->type_name()));
    }
    return std::optional<bool>(v->bool_value());
  }

  absl::StatusOr<std::optional<std::string>> String(absl::string_view key) const {
    const json::Value* v = Get(key);
    if (v == nullptr) return std::optional<std::string>();
    if (!v->is_string()) {
      return absl::InvalidArgumentError(
          absl::StrCat(Field(key), ": expected a string, got ", v->type_name()));
    }
    return std::optional<std::string>(v->string_value());
  }

 private:
  const json::Value& object_;
  std::string prefix_;
};

// Falcon's model_type; its first releases, for their own modelling code, said RefinedWebModel
// (falcon-7b) and RefinedWeb (falcon-40b).
bool IsFalconModelType(absl::string_view model_type) {
  return model_type == "falcon" || model_type == "RefinedWebModel" || model_type == "RefinedWeb";
}

// `key` when the config gives it, else `alias` when that is given, else `key` (so that an error
// about a missing value names the current spelling).
std::string KeyOrAlias(const ConfigReader& r, absl::string_view key, absl::string_view alias) {
  if (r.Get(key) == nullptr && r.Get(alias) != nullptr) return std::string(alias);
  return std::string(key);
}

// Falcon's key/value heads, as Transformers' FalconAttention decides them: the new decoder
// architecture (falcon-40b, falcon-180B) groups the query heads by num_kv_heads (n_head_kv in
// RefinedWeb configs; default one per query head); otherwise multi_query (default true, as in
// Transformers' FalconConfig) shares one key/value head, and without it every query head has its
// own, whatever num_kv_heads says (the fused projection is then 3 x hidden_size wide). The
// RefinedWeb modelling code always used the new architecture, so its configs lack the flag.
// Sets *field to the key the count came from, for errors.
absl::StatusOr<int64_t> FalconKvHeads(const ConfigReader& r, absl::string_view model_type,
                                      int64_t n_head, std::string* field) {
  ATTEND_ASSIGN_OR_RETURN(std::optional<bool> new_architecture, r.Bool("new_decoder_architecture"));
  ATTEND_ASSIGN_OR_RETURN(std::optional<bool> multi_query, r.Bool("multi_query"));
  if (new_architecture.value_or(model_type == "RefinedWeb")) {
    *field = KeyOrAlias(r, "num_kv_heads", "n_head_kv");
    ATTEND_ASSIGN_OR_RETURN(std::optional<int64_t> kv, r.Int(*field, 1, kMaxHeads));
    return kv.value_or(n_head);
  }
  *field = "multi_query";
  return multi_query.value_or(true) ? 1 : n_head;
}

// Which layers slide, per the precedence documented in import.h. `window` is 0 when the config
// has no (non-null, positive) sliding_window.
absl::StatusOr<std::vector<int64_t>> HfWindows(const ConfigReader& r, int64_t layers,
                                               const std::string& model_type) {
  ATTEND_ASSIGN_OR_RETURN(std::optional<int64_t> window_opt,
                          r.Int("sliding_window", 0, kMaxContextTokens));
  const int64_t window = window_opt.value_or(0);
  std::vector<int64_t> windows(static_cast<size_t>(layers), 0);

  if (const json::Value* types = r.Get("layer_types")) {
    if (!types->is_array()) {
      return absl::InvalidArgumentError(
          absl::StrCat(r.Field("layer_types"), ": expected an array, got ", types->type_name()));
    }
    if (static_cast<int64_t>(types->size()) != layers) {
      return absl::InvalidArgumentError(absl::StrCat(r.Field("layer_types"), ": ", types->size(),
                                                     " entries for ", layers, " layers"));
    }
    // The parser keeps an array of numbers only as doubles (no Values): every element, the
    // first included, is then a number where a string belongs.
    if (types->all_numbers() && types->size() > 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(r.Field("layer_types"), "[0]: expected a string, got a number"));
    }
    for (size_t i = 0; i < types->size(); ++i) {
      const json::Value& t = types->items()[i];
      const std::string field = absl::StrCat(r.Field("layer_types"), "[", i, "]");
      if (!t.is_string()) {
        return absl::InvalidArgumentError(
            absl::StrCat(field, ": expected a string, got ", t.type_name()));
      }
      if (t.string_value() == "full_attention") continue;
      if (t.string_value() != "sliding_attention") {
        return absl::InvalidArgumentError(
            absl::StrCat(field, ": ", QuoteForError(t.string_value()),
                         " is not supported (expected sliding_attention or full_attention)"));
      }
      if (window == 0) {
        return absl::InvalidArgumentError(absl::StrCat(field, ": sliding_attention but ",
                                                       r.Field("sliding_window"), " is not set"));
      }
      windows[i] = window;
    }
    return windows;
  }
  if (window == 0) return windows;

  ATTEND_ASSIGN_OR_RETURN(std::optional<bool> use_window, r.Bool("use_sliding_window"));
  if (use_window.has_value()) {
    if (!*use_window) return windows;
    // Transformers' Qwen2: the first max_window_layers layers attend fully, the rest slide.
    ATTEND_ASSIGN_OR_RETURN(std::optional<int64_t> full_layers,
                            r.Int("max_window_layers", 0, kMaxLayers));
    for (int64_t i = full_layers.value_or(0); i < layers; ++i) {
      windows[static_cast<size_t>(i)] = window;
    }
    return windows;
  }
  ATTEND_ASSIGN_OR_RETURN(std::optional<int64_t> pattern,
                          r.Int("sliding_window_pattern", 1, kMaxLayers));
  if (!pattern && model_type == "gemma2") pattern = 2;
  for (int64_t i = 0; i < layers; ++i) {
    const bool global = pattern && (i + 1) % *pattern == 0;
    windows[static_cast<size_t>(i)] = global ? 0 : window;
  }
  return windows;
}

// ---------------------------------------------------------------------------------------------
// GGUF

enum GgufType : uint32_t {
  kU8 = 0,
  kI8 = 1,
  kU16 = 2,
  kI16 = 3,
  kU32 = 4,
  kI32 = 5,
  kF32 = 6,
  kBool = 7,
  kString = 8,
  kArray = 9,
  kU64 = 10,
  kI64 = 11,
  kF64 = 12,
};
constexpr uint32_t kGgufTypeCount = 13;

absl::string_view GgufTypeName(uint32_t type) {
  static constexpr const char* kNames[] = {"uint8",  "int8",    "uint16", "int16",  "uint32",
                                           "int32",  "float32", "bool",   "string", "array",
                                           "uint64", "int64",   "float64"};
  return type < kGgufTypeCount ? kNames[type] : "unknown";
}

// Bytes of one fixed-size value; 0 for strings and arrays.
uint64_t GgufFixedSize(uint32_t type) {
  switch (type) {
    case kU8:
    case kI8:
    case kBool:
      return 1;
    case kU16:
    case kI16:
      return 2;
    case kU32:
    case kI32:
    case kF32:
      return 4;
    case kU64:
    case kI64:
    case kF64:
      return 8;
    default:
      return 0;
  }
}

bool GgufIsInteger(uint32_t type) {
  return type == kU8 || type == kI8 || type == kU16 || type == kI16 || type == kU32 ||
         type == kI32 || type == kU64 || type == kI64 || type == kBool;
}

// Smallest encoding of one array element, for bounding counts against the remaining bytes: a
// string is at least its u64 length, an array at least its u32 type and u64 count.
uint64_t GgufMinSize(uint32_t type) {
  if (type == kString) return 8;
  if (type == kArray) return 12;
  return GgufFixedSize(type);
}

// Strings longer than this are skipped, not kept: no key we read needs more.
constexpr uint64_t kMaxKeptString = 4096;
// Keys longer than this cannot be one we read, so their values are not kept.
constexpr uint64_t kMaxKeptKey = 256;
// Real headers have about 15 keys the importer reads; a header with many more decoys is hostile.
constexpr size_t kMaxKeptKeys = 256;

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
// Integer arrays are kept only up to one value per layer.
constexpr uint64_t kMaxKeptArray = static_cast<uint64_t>(kMaxLayers);
constexpr uint64_t kMaxTensorCount = uint64_t{1} << 24;
// A key/value takes at least a u64 key length, a 1-byte key, a u32 type and a 1-byte value.
constexpr uint64_t kMinKeyValueBytes = 14;

struct GgufValue {
  uint32_t type = 0;
  // Scalars.
  std::optional<int64_t> integer;  // integer types and bool, when they fit in int64
  bool integer_too_large = false;  // a uint64 above INT64_MAX
  std::optional<double> real;
  std::optional<std::string> text;  // strings up to kMaxKeptString bytes
  // Arrays.
  uint32_t element_type = 0;
  uint64_t count = 0;
  std::optional<std::vector<int64_t>> integers;  // integer/bool arrays up to kMaxKeptArray
  bool any_integer_too_large = false;
};

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

  // A u64-length string. Lengths over `max_bytes` are refused when `refuse_long`; otherwise the
  // bytes are skipped and an empty view returned with *kept false.
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
      case kU8: {
        ATTEND_ASSIGN_OR_RETURN(const uint8_t v, Fixed<uint8_t>("uint8 value"));
        out->integer = v;
        return absl::OkStatus();
      }
      case kI8: {
        ATTEND_ASSIGN_OR_RETURN(const int8_t v, Fixed<int8_t>("int8 value"));
        out->integer = v;
        return absl::OkStatus();
      }
      case kU16: {
        ATTEND_ASSIGN_OR_RETURN(const uint16_t v, Fixed<uint16_t>("uint16 value"));
        out->integer = v;
        return absl::OkStatus();
      }
      case kI16: {
        ATTEND_ASSIGN_OR_RETURN(const int16_t v, Fixed<int16_t>("int16 value"));
        out->integer = v;
        return absl::OkStatus();
      }
      case kU32: {
        ATTEND_ASSIGN_OR_RETURN(const uint32_t v, Fixed<uint32_t>("uint32 value"));
        out->integer = v;
        return absl::OkStatus();
      }
      case kI32: {
        ATTEND_ASSIGN_OR_RETURN(const int32_t v, Fixed<int32_t>("int32 value"));
        out->integer = v;
        return absl::OkStatus();
      }
      case kU64: {
        ATTEND_ASSIGN_OR_RETURN(const uint64_t v, Fixed<uint64_t>("uint64 value"));
        if (v > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
          out->integer_too_large = true;
        } else {
          out->integer = static_cast<int64_t>(v);
        }
        return absl::OkStatus();
      }
      case kI64: {
        ATTEND_ASSIGN_OR_RETURN(const int64_t v, Fixed<int64_t>("int64 value"));
        out->integer = v;
        return absl::OkStatus();
      }
      case kF32: {
        ATTEND_ASSIGN_OR_RETURN(const float v, Fixed<float>("float32 value"));
        out->real = v;
        return absl::OkStatus();
      }
      case kF64: {
        ATTEND_ASSIGN_OR_RETURN(const double v, Fixed<double>("float64 value"));
        out->real = v;
        return absl::OkStatus();
      }
      case kBool: {
        ATTEND_ASSIGN_OR_RETURN(const uint8_t v, Fixed<uint8_t>("bool value"));
        if (v > 1) return Error(absl::StrCat("bool value ", v, " is neither 0 nor 1"));
        out->integer = v;
        return absl::OkStatus();
      }
      case kString: {
        bool kept = false;
        ATTEND_ASSIGN_OR_RETURN(const absl::string_view s, String("string", kMaxKeptString, &kept));
        if (kept) out->text = std::string(s);
        return absl::OkStatus();
      }
      case kArray:
        return Array(depth + 1, out);
      default:
        return Error(absl::StrCat("value type ", type, " is not a GGUF type (0..12)"));
    }
  }

 private:
  absl::Status Array(int depth, GgufValue* out) {
    if (depth > kMaxGgufArrayDepth) {
      return Error(absl::StrCat("arrays nested deeper than ", kMaxGgufArrayDepth, " levels"));
    }
    ATTEND_ASSIGN_OR_RETURN(const uint32_t element_type, Fixed<uint32_t>("array element type"));
    if (element_type >= kGgufTypeCount) {
      return Error(
          absl::StrCat("array element type ", element_type, " is not a GGUF type (0..12)"));
    }
    ATTEND_ASSIGN_OR_RETURN(const uint64_t count, Fixed<uint64_t>("array length"));
    // Every element takes at least GgufMinSize bytes, so a count the input cannot hold is
    // refused before any element is read or any memory is sized from it.
    const uint64_t min_size = GgufMinSize(element_type);
    if (count > remaining() / min_size) {
      return Error(absl::StrCat("array of ", count, " ", GgufTypeName(element_type),
                                " elements at offset ", pos_ - 12, " runs past the end of the ",
                                in_.size(), "-byte input (", remaining(), " bytes remain)"));
    }
    out->element_type = element_type;
    out->count = count;
    if (GgufIsInteger(element_type) && count <= kMaxKeptArray) {
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
    const uint64_t fixed = GgufFixedSize(element_type);
    if (fixed > 0) return Skip(count * fixed);  // count * fixed <= remaining(), checked above
    for (uint64_t i = 0; i < count; ++i) {
      GgufValue element;  // strings and arrays: read to find their ends, not kept
      if (element_type == kString) {
        bool kept = false;
        ATTEND_RETURN_IF_ERROR(String("string", 0, &kept).status());
      } else {
        ATTEND_RETURN_IF_ERROR(Value(element_type, depth, &element));
      }
    }
    return absl::OkStatus();
  }

  absl::string_view in_;
  size_t pos_ = 0;
  std::string context_;
};

// Typed access to the key/values read from a GGUF header, with errors naming the key.
class GgufMetadata {
 public:
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
    if (v->type == kArray || !GgufIsInteger(v->type)) {
      return Bad(key, absl::StrCat("is a ", GgufTypeName(v->type), "; expected an integer"));
    }
    if (v->integer_too_large) return Bad(key, "does not fit in 64 bits");
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
    if (v->type != kArray) {
      ATTEND_ASSIGN_OR_RETURN(std::optional<int64_t> scalar, Int(key, lo, hi));
      return std::vector<int64_t>{*scalar};
    }
    if (!GgufIsInteger(v->element_type)) {
      return Bad(key, absl::StrCat("is an array of ", GgufTypeName(v->element_type),
                                   "; expected integers"));
    }
    if (static_cast<int64_t>(v->count) != layers || !v->integers) {
      return Bad(key, absl::StrCat("has ", v->count, " values for ", layers, " layers"));
    }
    if (v->any_integer_too_large) return Bad(key, "holds a value that does not fit in 64 bits");
    for (size_t i = 0; i < v->integers->size(); ++i) {
      ATTEND_RETURN_IF_ERROR(CheckRange(absl::StrCat(key, "[", i, "]"), (*v->integers)[i], lo, hi));
    }
    return *v->integers;
  }

  absl::StatusOr<std::optional<std::string>> String(const std::string& key) const {
    const GgufValue* v = Find(key);
    if (v == nullptr) return std::optional<std::string>();
    if (v->type != kString) {
      return Bad(key, absl::StrCat("is a ", GgufTypeName(v->type), "; expected a string"));
    }
    if (!v->text) return Bad(key, absl::StrCat("is longer than ", kMaxKeptString, " bytes"));
    return v->text;
  }

 private:
  absl::flat_hash_map<std::string, GgufValue> map_;
};

bool AllEqual(const std::vector<int64_t>& v) {
  return std::adjacent_find(v.begin(), v.end(), std::not_equal_to<int64_t>()) == v.end();
}

absl::StatusOr<GgufMetadata> ReadGgufMetadata(absl::string_view bytes, uint32_t* version,
                                              uint64_t* kv_count) {
  GgufReader r(bytes);
  if (bytes.size() < 4) {
    return r.Error(absl::StrCat("the input is ", bytes.size(),
                                " bytes, too short for the 4-byte magic 'GGUF'"));
  }
  if (bytes.substr(0, 4) != "GGUF") {
    return r.Error(
        absl::StrCat("bad magic ", QuoteForError(bytes.substr(0, 4)), "; expected 'GGUF'"));
  }
  ATTEND_RETURN_IF_ERROR(r.Skip(4));
  ATTEND_ASSIGN_OR_RETURN(*version, r.Fixed<uint32_t>("version"));
  if (*version == 0x02000000u || *version == 0x03000000u) {
    return r.Error("big-endian GGUF files are not supported");
  }
  if (*version != 2 && *version != 3) {
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
  if (*kv_count > r.remaining() / kMinKeyValueBytes) {
    return r.Error(absl::StrCat("kv_count ", *kv_count, " key/values cannot fit in the ",
                                r.remaining(), " bytes after the header (each takes at least ",
                                kMinKeyValueBytes, ")"));
  }
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

}  // namespace

std::string ModelKey(absl::string_view text) {
  std::string key;
  bool dash = false;
  for (char c : text) {
    const char l = absl::ascii_tolower(static_cast<unsigned char>(c));
    if ((l >= 'a' && l <= 'z') || (l >= '0' && l <= '9') || l == '.') {
      if (dash && !key.empty()) key.push_back('-');
      dash = false;
      key.push_back(l);
      if (key.size() >= 64) break;
    } else {
      dash = true;
    }
  }
  return key;
}

json::Limits HfConfigJsonLimits() {
  json::Limits limits;
  limits.max_input_bytes = size_t{1} << 20;  // config.json files are a few KiB
  limits.max_depth = 64;
  limits.max_string_bytes = size_t{1} << 16;
  limits.max_number_chars = 256;  // longer numbers are not plausible and would only cost time
  limits.max_array_elements = size_t{1} << 16;
  limits.max_object_members = size_t{1} << 14;
  limits.max_values = size_t{1} << 16;
  return limits;
}

absl::StatusOr<ModelSpec> ImportHfConfig(absl::string_view text, absl::string_view name) {
  absl::StatusOr<json::Value> parsed = json::Parse(text, HfConfigJsonLimits());
  if (!parsed.ok()) {
    // The parser's message says where; this says what was being read.
    return absl::Status(parsed.status().code(),
                        absl::StrCat("config.json: ", parsed.status().message()));
  }
  const json::Value root = *std::move(parsed);
  if (!root.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat("config.json: the top level is not an object (got ", root.type_name(), ")"));
  }
  const json::Value* config = &root;
  std::string prefix;
  const json::Value* text_config = root.Find("text_config");
  if (root.Find("num_hidden_layers") == nullptr && text_config != nullptr &&
      text_config->is_object()) {
    config = text_config;
    prefix = "text_config.";
  }
  const ConfigReader r(*config, prefix);
  const ConfigReader top(root, "");

  ModelSpec m;
  ATTEND_ASSIGN_OR_RETURN(std::optional<std::string> model_type, r.String("model_type"));
  if (!model_type) {
    ATTEND_ASSIGN_OR_RETURN(model_type, top.String("model_type"));
  }
  const std::string given_type = SanitizeText(model_type.value_or(""));
  // Every Falcon config is one architecture, "falcon" as in Transformers and GGUF, so that the
  // parameter count applies Falcon's rules (HasGatedMlp) whichever model_type it was saved with.
  const bool falcon = IsFalconModelType(given_type);
  m.architecture = falcon ? "falcon" : given_type;

  // Falcon's first configs say n_layer and n_head, as GPT-2's do.
  const std::string layers_key =
      falcon ? KeyOrAlias(r, "num_hidden_layers", "n_layer") : "num_hidden_layers";
  const std::string heads_key =
      falcon ? KeyOrAlias(r, "num_attention_heads", "n_head") : "num_attention_heads";
  ATTEND_ASSIGN_OR_RETURN(m.layers, r.RequiredInt(layers_key, 1, kMaxLayers));
  ATTEND_ASSIGN_OR_RETURN(m.n_head, r.RequiredInt(heads_key, 1, kMaxHeads));
  std::string kv_field = "num_key_value_heads";
  if (falcon) {
    ATTEND_ASSIGN_OR_RETURN(m.n_head_kv, FalconKvHeads(r, given_type, m.n_head, &kv_field));
  } else {
    ATTEND_ASSIGN_OR_RETURN(std::optional<int64_t> kv, r.Int(kv_field, 1, kMaxHeads));
    m.n_head_kv = kv.value_or(m.n_head);
  }
  if (m.n_head_kv > m.n_head || m.n_head % m.n_head_kv != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        r.Field(kv_field), ": ", m.n_head_kv, " does not divide num_attention_heads ", m.n_head));
  }
  ATTEND_ASSIGN_OR_RETURN(m.d_model, r.RequiredInt("hidden_size", 1, kMaxDModel));
  ATTEND_ASSIGN_OR_RETURN(std::optional<int64_t> head_dim, r.Int("head_dim", 1, kMaxHeadDim));
  if (!head_dim) {
    if (m.d_model % m.n_head != 0) {
      return absl::InvalidArgumentError(absl::StrCat(r.Field("hidden_size"), " ", m.d_model,
                                                     " is not a multiple of num_attention_heads ",
                                                     m.n_head, " and head_dim is not given"));
    }
    head_dim = m.d_model / m.n_head;
  }
  m.head_dim = *head_dim;
  m.head_dim_v = *head_dim;
  ATTEND_ASSIGN_OR_RETURN(std::optional<int64_t> vocab, r.Int("vocab_size", 0, kMaxVocab));
  m.vocab_size = vocab.value_or(0);
  if (falcon) {
    // Falcon's MLP is 4 x hidden_size wide unless ffn_hidden_size says otherwise (Transformers'
    // FalconConfig); its configs have no intermediate_size. 4 x kMaxDModel <= kMaxIntermediate.
    ATTEND_ASSIGN_OR_RETURN(std::optional<int64_t> ffn,
                            r.Int("ffn_hidden_size", 0, kMaxIntermediate));
    m.intermediate_size = ffn.value_or(4 * m.d_model);
  } else {
    ATTEND_ASSIGN_OR_RETURN(std::optional<int64_t> inter,
                            r.Int("intermediate_size", 0, kMaxIntermediate));
    m.intermediate_size = inter.value_or(0);
  }
  ATTEND_ASSIGN_OR_RETURN(std::optional<int64_t> context,
                          r.Int("max_position_embeddings", 0, kMaxContextTokens));
  m.max_context_tokens = context.value_or(0);

  ATTEND_ASSIGN_OR_RETURN(std::optional<std::string> dtype, r.String("torch_dtype"));
  if (!dtype) {
    ATTEND_ASSIGN_OR_RETURN(dtype, r.String("dtype"));
  }
  if (!dtype) {
    ATTEND_ASSIGN_OR_RETURN(dtype, top.String("torch_dtype"));
  }
  if (dtype) {
    ATTEND_ASSIGN_OR_RETURN(const KvDType w, ParseDType(*dtype, r.Field("torch_dtype")));
    m.weights_dtype = std::string(DTypeName(w));
  }
  // Transformers' LlamaConfig, MistralConfig, MixtralConfig and Qwen2Config default to untied
  // embeddings; the Gemma configs default to tied ones, and so does FalconConfig (it keeps
  // PretrainedConfig's default, and FalconForCausalLM ties lm_head to the word embeddings).
  ATTEND_ASSIGN_OR_RETURN(std::optional<bool> tied, r.Bool("tie_word_embeddings"));
  if (!tied) {
    ATTEND_ASSIGN_OR_RETURN(tied, top.Bool("tie_word_embeddings"));
  }
  m.tied_embeddings = tied.value_or(absl::StartsWith(m.architecture, "gemma") || falcon);

  ATTEND_ASSIGN_OR_RETURN(std::optional<int64_t> experts,
                          r.Int("num_local_experts", 0, kMaxExperts));
  if (!experts) {
    ATTEND_ASSIGN_OR_RETURN(experts, r.Int("num_experts", 0, kMaxExperts));
  }
  m.experts = experts.value_or(0);
  if (m.experts > 1) {
    ATTEND_ASSIGN_OR_RETURN(std::optional<int64_t> per_token,
                            r.Int("num_experts_per_tok", 1, m.experts));
    if (!per_token) {
      return absl::InvalidArgumentError(absl::StrCat(
          r.Field("num_experts_per_tok"), " is missing for a model with ", m.experts, " experts"));
    }
    m.experts_active = *per_token;
  } else {
    m.experts_active = m.experts;
  }

  ATTEND_ASSIGN_OR_RETURN(std::vector<int64_t> windows, HfWindows(r, m.layers, m.architecture));
  m.layer_specs.resize(static_cast<size_t>(m.layers));
  for (size_t i = 0; i < windows.size(); ++i) m.layer_specs[i] = LayerSpec{m.n_head_kv, windows[i]};

  ATTEND_ASSIGN_OR_RETURN(std::optional<std::string> path, top.String("_name_or_path"));
  std::string label = path.value_or("");
  if (const size_t slash = label.find_last_of('/'); slash != std::string::npos) {
    label = label.substr(slash + 1);
  }
  if (label.empty()) label = m.architecture;
  if (!name.empty()) {
    m.name = std::string(name);
    m.display_name = std::string(name);
  } else {
    m.name = ModelKey(label);
    if (m.name.empty()) m.name = "imported";
    m.display_name = label.empty() ? m.name : SanitizeText(label);
  }
  m.source = given_type.empty()
                 ? "Hugging Face config.json"
                 : absl::StrCat("Hugging Face config.json (model_type ", given_type, ")");
  return Finish(std::move(m));
}

absl::StatusOr<ModelSpec> ImportGguf(absl::string_view bytes, absl::string_view name) {
  uint32_t version = 0;
  uint64_t kv_count = 0;
  ATTEND_ASSIGN_OR_RETURN(const GgufMetadata md, ReadGgufMetadata(bytes, &version, &kv_count));

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
  const std::string a = *arch + ".";

  ModelSpec m;
  m.architecture = *arch;
  ATTEND_ASSIGN_OR_RETURN(m.layers, md.RequiredInt(a + "block_count", 1, kMaxLayers));
  ATTEND_ASSIGN_OR_RETURN(m.d_model, md.RequiredInt(a + "embedding_length", 1, kMaxDModel));

  ATTEND_ASSIGN_OR_RETURN(std::vector<int64_t> heads,
                          md.IntOrPerLayer(a + "attention.head_count", m.layers, 1, kMaxHeads));
  if (heads.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("gguf: ", QuoteForError(a + "attention.head_count"), " is missing"));
  }
  if (!AllEqual(heads)) {
    return absl::InvalidArgumentError(
        absl::StrCat("gguf: ", QuoteForError(a + "attention.head_count"),
                     ": per-layer query head counts that differ are not supported"));
  }
  m.n_head = heads[0];

  const std::string kv_key = a + "attention.head_count_kv";
  ATTEND_ASSIGN_OR_RETURN(std::vector<int64_t> kv, md.IntOrPerLayer(kv_key, m.layers, 1, m.n_head));
  if (kv.empty()) kv.push_back(m.n_head);
  for (size_t i = 0; i < kv.size(); ++i) {
    if (m.n_head % kv[i] != 0) {
      const std::string field = kv.size() == 1 ? kv_key : absl::StrCat(kv_key, "[", i, "]");
      return absl::InvalidArgumentError(absl::StrCat("gguf: ", QuoteForError(field), ": ", kv[i],
                                                     " does not divide head_count ", m.n_head));
    }
  }
  m.n_head_kv = *std::max_element(kv.begin(), kv.end());

  ATTEND_ASSIGN_OR_RETURN(std::optional<int64_t> key_length,
                          md.Int(a + "attention.key_length", 1, kMaxHeadDim));
  if (!key_length) {
    if (m.d_model % m.n_head != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "gguf: ", QuoteForError(a + "embedding_length"), " ", m.d_model,
          " is not a multiple of head_count ", m.n_head, " and attention.key_length is not given"));
    }
    key_length = m.d_model / m.n_head;
  }
  m.head_dim = *key_length;
  ATTEND_ASSIGN_OR_RETURN(std::optional<int64_t> value_length,
                          md.Int(a + "attention.value_length", 1, kMaxHeadDim));
  m.head_dim_v = value_length.value_or(m.head_dim);

  ATTEND_ASSIGN_OR_RETURN(std::optional<int64_t> context,
                          md.Int(a + "context_length", 0, kMaxContextTokens));
  m.max_context_tokens = context.value_or(0);
  ATTEND_ASSIGN_OR_RETURN(
      std::vector<int64_t> ffn,
      md.IntOrPerLayer(a + "feed_forward_length", m.layers, 0, kMaxIntermediate));
  // Per-layer MLP widths that differ cannot be described by one intermediate_size: leave it
  // unknown, which leaves the parameter count unknown too.
  m.intermediate_size = !ffn.empty() && AllEqual(ffn) ? ffn[0] : 0;
  ATTEND_ASSIGN_OR_RETURN(std::optional<int64_t> vocab, md.Int(a + "vocab_size", 0, kMaxVocab));
  if (!vocab) {
    if (const GgufValue* tokens = md.Find("tokenizer.ggml.tokens");
        tokens != nullptr && tokens->type == kArray) {
      ATTEND_RETURN_IF_ERROR(GgufMetadata::CheckRange(
          "tokenizer.ggml.tokens length", static_cast<int64_t>(tokens->count), 0, kMaxVocab));
      vocab = static_cast<int64_t>(tokens->count);
    }
  }
  m.vocab_size = vocab.value_or(0);
  ATTEND_ASSIGN_OR_RETURN(std::optional<int64_t> experts,
                          md.Int(a + "expert_count", 0, kMaxExperts));
  m.experts = experts.value_or(0);
  ATTEND_ASSIGN_OR_RETURN(std::optional<int64_t> used,
                          md.Int(a + "expert_used_count", 0, std::max<int64_t>(m.experts, 1)));
  m.experts_active = m.experts > 1 ? used.value_or(0) : m.experts;
  if (m.experts > 1 && m.experts_active < 1) {
    return absl::InvalidArgumentError(absl::StrCat("gguf: ", QuoteForError(a + "expert_used_count"),
                                                   " is missing or 0 for a model with ", m.experts,
                                                   " experts"));
  }
  ATTEND_ASSIGN_OR_RETURN(std::optional<int64_t> file_type,
                          md.Int("general.file_type", 0, std::numeric_limits<int32_t>::max()));
  if (file_type) m.weights_dtype = WeightsDTypeFromFileType(*file_type);

  // Sliding windows.
  ATTEND_ASSIGN_OR_RETURN(std::optional<int64_t> window,
                          md.Int(a + "attention.sliding_window", 0, kMaxContextTokens));
  std::vector<int64_t> windows(static_cast<size_t>(m.layers), 0);
  if (window.value_or(0) > 0) {
    const std::string pattern_key = a + "attention.sliding_window_pattern";
    std::vector<int64_t> sliding;  // one 0/1 per layer, when given as booleans
    int64_t period = 0;            // 0: every layer slides
    if (const GgufValue* p = md.Find(pattern_key); p != nullptr && p->type == kArray) {
      if (p->element_type != kBool) {
        return GgufMetadata::Bad(
            pattern_key,
            absl::StrCat("is an array of ", GgufTypeName(p->element_type), "; expected booleans"));
      }
      ATTEND_ASSIGN_OR_RETURN(sliding, md.IntOrPerLayer(pattern_key, m.layers, 0, 1));
    } else {
      ATTEND_ASSIGN_OR_RETURN(std::optional<int64_t> given, md.Int(pattern_key, 0, kMaxLayers));
      if (given) {
        period = *given;
      } else if (*arch == "gemma2") {
        period = 2;
      } else if (*arch == "gemma3") {
        period = 6;
      } else if (*arch == "cohere2") {
        period = 4;
      }
    }
    for (int64_t i = 0; i < m.layers; ++i) {
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
  }
  m.layer_specs.resize(static_cast<size_t>(m.layers));
  for (int64_t i = 0; i < m.layers; ++i) {
    const size_t l = static_cast<size_t>(i);
    m.layer_specs[l] = LayerSpec{kv.size() == 1 ? kv[0] : kv[l], windows[l]};
  }

  ATTEND_ASSIGN_OR_RETURN(std::optional<std::string> general_name, md.String("general.name"));
  const std::string label = SanitizeText(general_name.value_or(""));
  if (!name.empty()) {
    m.name = std::string(name);
    m.display_name = std::string(name);
  } else {
    m.name = ModelKey(label);
    if (m.name.empty()) m.name = m.architecture;
    m.display_name = label.empty() ? m.name : label;
  }
  m.source = absl::StrCat("GGUF v", version, " header (architecture ", m.architecture, ", ",
                          kv_count, " key/values)");
  return Finish(std::move(m));
}

}  // namespace attend::planner
