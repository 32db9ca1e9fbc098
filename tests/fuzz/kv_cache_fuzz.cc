// core/kv_cache, statefully: the input is a cache configuration and then a program of
// create / append / decode / fork / truncate / release operations on four ids, run against a
// KvCache directly and against a model of every sequence (each layer's length and v rows).
//
// Input: byte 0: bit 0 LRU eviction (else none), bits 1-2 storage (f32, bf16, int8, bf16),
// bit 3 a sliding window; byte 1: capacity in 4 KiB blocks (4 + b % 64); byte 2: the shape
// (layers 1-2, n_head_kv 1-2, heads per kv head 1-2, head_dim 4 or 8); byte 3: the window
// (1 + b % 16 tokens) and the values' magnitude (2^(18 - 10 * (b / 16)): down to subnormals).
// Then operations: an opcode byte (op = b % 8, id = b / 8 % 4) and two argument bytes.
//
// After every operation: CheckConsistency() (no block owned by nothing), every model sequence
// is there with the model's lengths (unless LRU evicted it), nothing else is, and the used bytes
// lie between the bytes the sequences hold alone and the bytes they reference (equal when no
// block is shared). A failed operation must change nothing. Every attention output must lie in
// the range of its v column (outputs are convex combinations of the cached v rows).
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "core/kv_cache/kv_cache.h"

namespace attend::fuzz {
namespace {

constexpr int kIds = 4;
constexpr int64_t kBlockBytes = 4096;

[[noreturn]] void Fail(const std::string& what) {
  std::fprintf(stderr, "fuzz: %s\n", what.c_str());
  std::abort();
}

// Codes KvCache documents for its operations; anything else is a finding.
void CheckCode(const char* op, const absl::Status& status) {
  switch (status.code()) {
    case absl::StatusCode::kOk:
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kNotFound:
    case absl::StatusCode::kAlreadyExists:
    case absl::StatusCode::kOutOfRange:
    case absl::StatusCode::kResourceExhausted:
      return;
    default:
      Fail(absl::StrCat(op, ": undocumented status ", status.ToString()));
  }
}

class Reader {
 public:
  Reader(const uint8_t* data, size_t size) : data_(data), size_(size) {}
  bool done() const { return at_ >= size_; }
  uint8_t Next() { return at_ < size_ ? data_[at_++] : 0; }

 private:
  const uint8_t* data_;
  size_t size_;
  size_t at_ = 0;
};

class Program {
 public:
  explicit Program(Reader* in) : in_(in) {
    const uint8_t flags = in->Next();
    const uint8_t capacity = in->Next();
    const uint8_t shape = in->Next();
    const uint8_t window = in->Next();
    lru_ = flags & 1;
    static constexpr DType kDTypes[4] = {DType::kFloat32, DType::kBFloat16, DType::kInt8,
                                         DType::kBFloat16};
    config_.kv_dtype = kDTypes[(flags >> 1) & 3];
    config_.window = (flags & 8) ? 1 + window % 16 : 0;
    exponent_ = 18 - 10 * (window >> 4);  // 2^18 down to 2^-132
    config_.layers = 1 + (shape & 1);
    config_.n_head_kv = 1 + ((shape >> 1) & 1);
    config_.n_head = config_.n_head_kv * (1 + ((shape >> 2) & 1));
    config_.head_dim = (shape & 8) ? 8 : 4;
    config_.head_dim_v = config_.head_dim;
    kv::KvCacheOptions options;
    options.capacity_bytes = (4 + capacity % 64) * kBlockBytes;
    options.block_bytes = kBlockBytes;
    options.huge_pages = false;
    options.max_sequences = 3;  // below kIds, so that the sequence limit is reached too
    options.eviction = lru_ ? kv::EvictionPolicy::kLru : kv::EvictionPolicy::kNone;
    options.compute_threads = 1;
    options.limits.max_tensor_elements = 1 << 12;
    options.limits.max_score_elements = 1 << 16;
    int64_t now = 0;
    options.clock = [now]() mutable { return ++now; };
    cache_.emplace(options);
  }

  void Run() {
    while (!in_->done()) {
      const uint8_t op = in_->Next();
      const uint8_t a = in_->Next();
      const uint8_t b = in_->Next();
      Step(op % 8, Id(op / 8), a, b);
      Check();
    }
    for (int i = 0; i < kIds; ++i) {
      if (model_.count(Id(i)) != 0) Release(Id(i));
    }
    Check();
    if (cache_->Stats().used_bytes != 0) Fail("bytes in use after every sequence was released");
  }

 private:
  // A layer of a modelled sequence: its length and the v rows appended to it (the stored
  // values, up to the storage's rounding).
  struct Layer {
    int64_t tokens = 0;
    std::vector<float> v;  // [tokens, n_head_kv, head_dim_v]
  };
  using Layers = std::vector<Layer>;

  static std::vector<int64_t> TokensOf(const Layers& layers) {
    std::vector<int64_t> tokens;
    for (const Layer& l : layers) tokens.push_back(l.tokens);
    return tokens;
  }

  // `layers` cut to their first `tokens` tokens (a Fork's or Truncate's result).
  Layers Prefix(Layers layers, int64_t tokens) const {
    for (Layer& l : layers) {
      l.tokens = tokens;
      l.v.resize(static_cast<size_t>(tokens * config_.n_head_kv * config_.head_dim_v));
    }
    return layers;
  }

  static std::string Id(int i) { return absl::StrCat("s", i % kIds); }

  void Step(int op, const std::string& id, uint8_t a, uint8_t b) {
    switch (op) {
      case 0:
        return Create(id, a % 64);
      case 1:
        return Append(id, a % config_.layers, 1 + b % 8, b & 0x80);
      case 2:
        return Decode(a % config_.layers, b);
      case 3:
        return Fork(id, Id(a), (b & 0x80) ? std::optional<int64_t>(b & 0x3f) : std::nullopt);
      case 4:
        return Truncate(id, a % 64);
      case 5:
        return Release(id);
      case 6:
        for (int64_t l = 0; l < config_.layers; ++l) Append(id, l, 1 + a % 16, b & 1);
        return;
      default:
        CheckCode("List", cache_->List(1 + a % 4, "").status());
        return;
    }
  }

  // Values in [-4, 4) times 2^exponent_, so that attention sees more than constants, and
  // storage sees magnitudes from 2^18 down to float32's subnormals.
  std::vector<float> Values(int64_t n) {
    std::vector<float> v(static_cast<size_t>(n));
    for (float& x : v) {
      x = std::ldexp((static_cast<int>(seed_ = seed_ * 33 + 7) % 256 - 128) / 32.0f, exponent_);
    }
    return v;
  }

  // The error a stored value may have, for values of magnitude up to `value` in rows of largest
  // magnitude `row`: none in float32, half an int8 step of the row, or bfloat16's rounding (8
  // significant bits). bfloat16 storage is also multiplied in bfloat16 (precision kAuto), whose
  // dot products (VDPBF16PS, AMX) treat subnormal inputs and results as zero: up to 2^-126.
  double StorageError(double value, double row) const {
    switch (config_.kv_dtype) {
      case DType::kFloat32:
        return 0.0;
      case DType::kInt8:
        return row / 254.0 * 1.02;
      default:
        return std::max(value * 0x1p-8, 0x1p-126);
    }
  }

  // Each output of attention is a convex combination of its head's cached v rows: it must lie
  // within the range of each column over the layer's tokens (a superset of those the query sees),
  // widened by the storage's error and float32 arithmetic.
  void CheckOutput(const char* op, const Layer& layer, const std::vector<float>& output,
                   int64_t n) const {
    const int64_t kv_heads = config_.n_head_kv, dv = config_.head_dim_v;
    const int64_t group = config_.n_head / kv_heads;
    for (int64_t kvh = 0; kvh < kv_heads; ++kvh) {
      double row = 0.0;
      for (int64_t t = 0; t < layer.tokens; ++t) {
        for (int64_t d = 0; d < dv; ++d) row = std::max(row, std::abs(VAt(layer, t, kvh, d)));
      }
      for (int64_t d = 0; d < dv; ++d) {
        double lo = INFINITY, hi = -INFINITY, largest = 0.0;
        for (int64_t t = 0; t < layer.tokens; ++t) {
          const double x = VAt(layer, t, kvh, d);
          lo = std::min(lo, x);
          hi = std::max(hi, x);
          largest = std::max(largest, std::abs(x));
        }
        const double slack = StorageError(largest, row) + 1e-5 * largest + 1e-42;
        for (int64_t i = 0; i < n; ++i) {
          for (int64_t h = kvh * group; h < (kvh + 1) * group; ++h) {
            const double out = output[static_cast<size_t>((i * config_.n_head + h) * dv + d)];
            if (!(out >= lo - slack && out <= hi + slack)) {
              Fail(absl::StrCat(op, ": output ", out, " of query ", i, ", head ", h, ", column ", d,
                                " is outside its v column's range [", lo, ", ", hi, "] +- ",
                                slack));
            }
          }
        }
      }
    }
  }

  double VAt(const Layer& layer, int64_t t, int64_t kvh, int64_t d) const {
    return layer.v[static_cast<size_t>((t * config_.n_head_kv + kvh) * config_.head_dim_v + d)];
  }

  void Create(const std::string& id, int64_t reserve) {
    absl::StatusOr<kv::SequenceInfo> info = cache_->Create(config_, id, reserve);
    Settle("Create", info.status(),
           [&] { model_[id] = Layers(static_cast<size_t>(config_.layers)); });
  }

  void Append(const std::string& id, int64_t layer, int64_t n, bool with_q) {
    const std::vector<float> q = Values(n * config_.n_head * config_.head_dim);
    const std::vector<float> k = Values(n * config_.n_head_kv * config_.head_dim);
    const std::vector<float> v = Values(n * config_.n_head_kv * config_.head_dim_v);
    kv::AppendInput input;
    input.id = id;
    if (with_q)
      input.q = TensorView{DType::kFloat32, {n, config_.n_head, config_.head_dim}, q.data()};
    input.k = TensorView{DType::kFloat32, {n, config_.n_head_kv, config_.head_dim}, k.data()};
    input.v = TensorView{DType::kFloat32, {n, config_.n_head_kv, config_.head_dim_v}, v.data()};
    AttentionStats stats;
    absl::StatusOr<kv::AppendResult> result =
        cache_->Append(layer, input, Precision::kAuto, /*want_weights=*/with_q && (n & 1), &stats);
    Settle("Append", result.status(), [&] {
      Layer& modelled = Model(id, "Append")[static_cast<size_t>(layer)];
      if (result->first_position != modelled.tokens) Fail("Append: wrong first_position");
      modelled.tokens += n;
      modelled.v.insert(modelled.v.end(), v.begin(), v.end());
      if (result->layer_tokens != modelled.tokens) Fail("Append: wrong layer_tokens");
      if (!with_q) return;
      if (static_cast<int64_t>(result->output.size()) != n * config_.n_head * config_.head_dim_v) {
        Fail("Append: wrong output size");
      }
      CheckOutput("Append", modelled, result->output, n);
    });
  }

  // One token for each id whose bit is set in `mask`.
  void Decode(int64_t layer, uint8_t mask) {
    std::vector<std::string> ids;
    for (int i = 0; i < kIds; ++i) {
      if (mask & (1 << i)) ids.push_back(Id(i));
    }
    if (mask & 0x10 && !ids.empty()) ids.push_back(ids.front());  // a duplicate is refused
    std::vector<std::vector<float>> data;
    std::vector<kv::AppendInput> inputs;
    for (size_t i = 0; i < ids.size(); ++i) {
      data.push_back(Values(config_.n_head * config_.head_dim));
      data.push_back(Values(config_.n_head_kv * config_.head_dim));
      data.push_back(Values(config_.n_head_kv * config_.head_dim_v));
    }
    for (size_t i = 0; i < ids.size(); ++i) {
      kv::AppendInput in;
      in.id = ids[i];
      in.q = TensorView{DType::kFloat32, {1, config_.n_head, config_.head_dim}, data[3 * i].data()};
      in.k = TensorView{
          DType::kFloat32, {1, config_.n_head_kv, config_.head_dim}, data[3 * i + 1].data()};
      in.v = TensorView{
          DType::kFloat32, {1, config_.n_head_kv, config_.head_dim_v}, data[3 * i + 2].data()};
      inputs.push_back(std::move(in));
    }
    AttentionStats stats;
    absl::StatusOr<std::vector<kv::AppendResult>> results =
        cache_->DecodeBatch(layer, inputs, Precision::kAuto, &stats);
    Settle("DecodeBatch", results.status(), [&] {
      if (results->size() != ids.size()) Fail("DecodeBatch: wrong number of results");
      for (size_t i = 0; i < ids.size(); ++i) {
        Layer& modelled = Model(ids[i], "DecodeBatch")[static_cast<size_t>(layer)];
        ++modelled.tokens;
        modelled.v.insert(modelled.v.end(), data[3 * i + 2].begin(), data[3 * i + 2].end());
        CheckOutput("DecodeBatch", modelled, (*results)[i].output, 1);
      }
    });
  }

  void Fork(const std::string& source, const std::string& id, std::optional<int64_t> tokens) {
    absl::StatusOr<kv::SequenceInfo> info = cache_->Fork(source, id, tokens);
    Settle("Fork", info.status(), [&] {
      const Layers& from = Model(source, "Fork");
      const std::vector<int64_t> lengths = TokensOf(from);
      const int64_t t = tokens ? *tokens : *std::min_element(lengths.begin(), lengths.end());
      model_[id] = Prefix(from, t);
    });
  }

  void Truncate(const std::string& id, int64_t tokens) {
    absl::StatusOr<kv::SequenceInfo> info = cache_->Truncate(id, tokens);
    Settle("Truncate", info.status(),
           [&] { Model(id, "Truncate") = Prefix(Model(id, "Truncate"), tokens); });
  }

  void Release(const std::string& id) {
    absl::StatusOr<int64_t> freed = cache_->Release(id);
    Settle("Release", freed.status(), [&] {
      if (*freed < 0 || *freed % kBlockBytes != 0) Fail("Release: odd freed bytes");
      model_.erase(id);
    });
  }

  // Applies `on_ok` to the model when the operation succeeded; a failure must change nothing,
  // which Check() then verifies against the unchanged model.
  template <typename F>
  void Settle(const char* op, const absl::Status& status, F on_ok) {
    // ATTEND_FUZZ_VERBOSE=1 prints every result, to see how deep a seed gets.
    static const bool verbose = std::getenv("ATTEND_FUZZ_VERBOSE") != nullptr;
    if (verbose) std::fprintf(stderr, "fuzz: %s -> %s\n", op, status.ToString().c_str());
    CheckCode(op, status);
    last_op_ = op;
    if (status.ok()) on_ok();
  }

  // The model of a sequence the cache just operated on successfully.
  Layers& Model(const std::string& id, const char* op) {
    auto it = model_.find(id);
    if (it == model_.end()) Fail(absl::StrCat(op, " succeeded on '", id, "', not in the model"));
    return it->second;
  }

  void Check() {
    const absl::Status consistent = cache_->CheckConsistency();
    if (!consistent.ok()) Fail(absl::StrCat("after ", last_op_, ": ", consistent.ToString()));
    int64_t alone = 0, referenced = 0, tokens = 0;
    bool shared = false;
    for (int i = 0; i < kIds; ++i) {
      const std::string id = Id(i);
      absl::StatusOr<kv::SequenceInfo> info = cache_->Get(id);
      auto it = model_.find(id);
      if (!info.ok()) {
        CheckCode("Get", info.status());
        if (it != model_.end()) {
          if (!lru_ || !absl::IsNotFound(info.status())) {
            Fail(absl::StrCat("after ", last_op_, ": '", id,
                              "' is gone: ", info.status().ToString()));
          }
          model_.erase(it);  // evicted
        }
        continue;
      }
      if (it == model_.end()) Fail(absl::StrCat("after ", last_op_, ": '", id, "' exists"));
      if (info->layer_tokens != TokensOf(it->second)) {
        Fail(
            absl::StrCat("after ", last_op_, ": '", id, "' has other layer lengths than modelled"));
      }
      referenced += info->bytes;
      alone += (info->blocks - info->shared_blocks) * kBlockBytes;
      shared = shared || info->shared_blocks > 0;
      for (int64_t t : info->layer_tokens) tokens += t;
    }
    const kv::CacheStats stats = cache_->Stats();
    const bool bytes_ok = shared ? (stats.used_bytes >= alone && stats.used_bytes <= referenced)
                                 : stats.used_bytes == referenced;
    if (!bytes_ok || stats.sequences != static_cast<int64_t>(model_.size()) ||
        stats.tokens != tokens) {
      Fail(absl::StrCat("after ", last_op_, ": stats say ", stats.used_bytes, " bytes, ",
                        stats.sequences, " sequences, ", stats.tokens, " tokens; the sequences ",
                        alone, "..", referenced, " bytes, ", model_.size(), " sequences, ", tokens,
                        " tokens"));
    }
  }

  Reader* in_;
  bool lru_ = false;
  kv::SequenceConfig config_;
  std::optional<kv::KvCache> cache_;
  std::map<std::string, Layers> model_;
  int exponent_ = 0;
  uint32_t seed_ = 1;
  const char* last_op_ = "start";
};

}  // namespace
}  // namespace attend::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  attend::fuzz::Reader in(data, size);
  attend::fuzz::Program program(&in);
  program.Run();
  return 0;
}
