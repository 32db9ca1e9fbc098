// Differential test of the KV cache: random sequences of Create, Append (with and without
// queries, chunks of random lengths), DecodeBatch, Fork at random prefixes, Truncate and Release,
// over f32, bf16 and int8 storage, sliding windows, reservations, GQA/MQA and block sizes from
// one token per block up. The test keeps every sequence's full k/v history itself; after every
// attention it recomputes the result in one shot with the reference attention over that history
// (after a fork: the parent's prefix; after a truncate: cut) and compares within the bounds of
// tests/core/attention/attention_error_bound.h. int8 storage is compared with the exact values,
// allowing the documented quantization error (core/kv_cache/layout.h: each value is off by at
// most half its row's scale, max|row| / 127). After every operation CheckConsistency() must pass
// and the layer lengths must be the model's; after releasing everything no byte may be in use.
//
// Sliding windows: the test predicts, from the documented rule (kv_cache.h, token_storage.h),
// which blocks a sequence has released (wholly before the next query's window, except reserved
// ones), and so whether a Fork or Truncate must be refused with OUT_OF_RANGE.
//
// Environment: ATTEND_DIFF_CASES=N runs N cases (default kDefaultCases), ATTEND_DIFF_SEED=S
// changes the seed, ATTEND_DIFF_CASE=I runs only case I.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <map>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/half.h"
#include "core/attention/testing/reference_attention.h"
#include "core/attention/tile_attention.h"
#include "core/kernels/simd.h"
#include "core/kv_cache/kv_cache.h"
#include "tests/core/attention/attention_error_bound.h"
#include "tests/core/attention/encoded_input.h"
#include "tests/test_util.h"

namespace attend::kv {
namespace {

using ::attend::testing::EncodedInput;
using ::attend::testing::EncodeInput;
using ::attend::testing::RandomFloats;

constexpr int64_t kDefaultCases = 80;
constexpr uint64_t kDefaultSeed = 0x6b76c0de;
constexpr int64_t kOpsPerCase = 30;
constexpr int64_t kMaxTokens = 300;  // per layer, to keep the reference affordable
// Multiply-adds the reference may spend on one append.
constexpr int64_t kReferenceBudget = int64_t{1} << 21;

constexpr DType kInputDtypes[] = {DType::kFloat32, DType::kBFloat16, DType::kFloat16};
constexpr DType kStorage[] = {DType::kFloat32, DType::kBFloat16, DType::kInt8};
constexpr Precision kPrecisions[] = {Precision::kAuto, Precision::kFloat32, Precision::kBFloat16};

int64_t EnvInt(const char* name, int64_t fallback) {
  const char* value = std::getenv(name);
  return value != nullptr && *value != '\0' ? std::strtoll(value, nullptr, 0) : fallback;
}
int64_t Uniform(std::mt19937_64& rng, int64_t lo, int64_t hi) {  // [lo, hi]
  return std::uniform_int_distribution<int64_t>(lo, std::max(lo, hi))(rng);
}
template <typename T>
T Pick(std::mt19937_64& rng, std::initializer_list<T> values) {
  return values.begin()[Uniform(rng, 0, static_cast<int64_t>(values.size()) - 1)];
}
std::vector<float> Bf16Rounded(std::vector<float> x, bool round) {
  if (round) {
    for (float& e : x) e = Bf16ToFloat(FloatToBf16(e));
  }
  return x;
}

// What the test knows of one layer: the k/v values it appended (as their dtype decodes them)
// and the blocks the sliding window has released.
struct ModelLayer {
  std::vector<float> k, v;
  int64_t tokens = 0;
  std::vector<bool> released;
};
struct Model {
  int64_t reserved_blocks = 0;
  std::vector<ModelLayer> layers;
};

// Random values of `shape` (rank 3) encoded in `dtype`.
EncodedInput RandomInput(std::mt19937_64& rng, attend::Shape shape, DType dtype) {
  const int64_t n = shape[0] * shape[1] * shape[2];
  return EncodeInput(RandomFloats(rng, n), std::move(shape), dtype);
}

// One case: a cache, one sequence shape, and a random walk of operations over its sequences.
class Walk {
 public:
  // `covered` counts what the operations reached; `margins` keeps the largest error / tolerance
  // ratio by storage dtype.
  Walk(uint64_t seed, int64_t index, std::map<std::string, int64_t>* covered,
       std::map<std::string, double>* margins)
      : covered_(covered), margins_(margins) {
    std::seed_seq seq{seed, static_cast<uint64_t>(index)};
    rng_.seed(seq);
    config_.layers = Uniform(rng_, 1, 3);
    config_.n_head_kv = Uniform(rng_, 1, 2);
    config_.n_head = config_.n_head_kv * Pick<int64_t>(rng_, {1, 2, 3, 4, 8});
    config_.head_dim = Pick<int64_t>(rng_, {1, 4, 8, 17, 32, 64});
    config_.head_dim_v =
        Uniform(rng_, 0, 2) == 0 ? Pick<int64_t>(rng_, {3, 8, 32}) : config_.head_dim;
    config_.kv_dtype = kStorage[index % 3];
    config_.window = Pick<int64_t>(rng_, {0, 0, 1, Uniform(rng_, 2, 40), Uniform(rng_, 41, 200)});
    if (Uniform(rng_, 0, 2) == 0) config_.scale = Pick<float>(rng_, {0.0f, 0.1f, 0.7f, -0.4f});
    const BlockLayout unit =
        MakeLayout(config_.n_head_kv, config_.head_dim, config_.head_dim_v, config_.kv_dtype, 0);
    const int64_t target = Pick<int64_t>(rng_, {1, 2, 5, 16, 64, 200});
    KvCacheOptions options;
    options.block_bytes = std::max<int64_t>(
        64, (target * unit.token_bytes() + 4 + 63) / 64 * 64);  // 4: int8 scales' alignment
    options.capacity_bytes = int64_t{256} << 20;
    options.huge_pages = false;
    options.compute_threads = static_cast<int>(Pick<int64_t>(rng_, {0, 1, 2, 3}));
    // Every kernel set this CPU runs (scalar, AVX2, the AVX-512 sets), each as likely.
    const std::vector<std::string> sets = simd::testing::RunnableKernels();
    kernels_ = sets[static_cast<size_t>(Uniform(rng_, 0, static_cast<int64_t>(sets.size()) - 1))];
    cache_ = std::make_unique<KvCache>(options);
    header_ = absl::StrCat(
        "kv case ", index, " (reproduce: ATTEND_DIFF_SEED=", seed, " ATTEND_DIFF_CASE=", index,
        "): layers ", config_.layers, ", n_head ", config_.n_head, ", n_head_kv ",
        config_.n_head_kv, ", head_dim ", config_.head_dim, ", head_dim_v ", config_.head_dim_v,
        ", storage ", DTypeName(config_.kv_dtype), ", window ", config_.window, ", scale ",
        config_.scale ? absl::StrCat(*config_.scale) : "default", ", block_bytes ",
        options.block_bytes, ", compute_threads ", options.compute_threads, ", kernels ", kernels_);
  }

  void Run() {
    EXPECT_TRUE(simd::testing::UseKernels(kernels_)) << kernels_;
    Cover("kernels " + kernels_);
    for (int64_t op = 0; op < kOpsPerCase && !::testing::Test::HasFatalFailure(); ++op) Step();
    simd::testing::UseScalarKernels(false);  // back to the chosen sets
    for (const auto& [id, model] : std::map<std::string, Model>(models_)) ReleaseSequence(id);
    const CacheStats stats = cache_->Stats();
    EXPECT_EQ(stats.used_bytes, 0) << Describe();
    EXPECT_EQ(stats.sequences, 0) << Describe();
    EXPECT_EQ(stats.tokens, 0) << Describe();
    EXPECT_TRUE(cache_->CheckConsistency().ok()) << Describe();
  }

 private:
  std::string Describe() const {
    std::string out = header_;
    for (size_t i = 0; i < log_.size(); ++i) absl::StrAppend(&out, "\n  op ", i, ": ", log_[i]);
    return out;
  }
  void Cover(const std::string& what) { ++(*covered_)[what]; }

  std::string RandomLive() {
    auto it = models_.begin();
    std::advance(it, Uniform(rng_, 0, static_cast<int64_t>(models_.size()) - 1));
    return it->first;
  }
  int64_t CommonTokens(const Model& m) const {
    int64_t common = kMaxTokens;
    for (const ModelLayer& l : m.layers) common = std::min(common, l.tokens);
    return common;
  }

  void Step() {
    const int64_t kind = models_.empty() ? 0 : Uniform(rng_, 0, 11);
    if (kind == 0 || (kind == 1 && models_.size() < 4)) {
      CreateSequence();
    } else if (kind <= 6) {
      AppendTo(RandomLive());
    } else if (kind == 7) {
      DecodeBatchStep();
    } else if (kind == 8 || kind == 9) {
      ForkSequence(RandomLive());
    } else if (kind == 10) {
      TruncateSequence(RandomLive());
    } else {
      ReleaseSequence(RandomLive());
    }
    if (::testing::Test::HasFatalFailure()) return;
    const absl::Status consistent = cache_->CheckConsistency();
    ASSERT_TRUE(consistent.ok()) << Describe() << "\n" << consistent;
    for (const auto& [id, model] : models_) {
      auto info = cache_->Get(id);
      ASSERT_TRUE(info.ok()) << Describe() << "\n" << info.status();
      for (size_t l = 0; l < model.layers.size(); ++l) {
        ASSERT_EQ(info->layer_tokens[l], model.layers[l].tokens) << Describe() << "\nlayer " << l;
      }
    }
    ASSERT_EQ(cache_->Stats().sequences, static_cast<int64_t>(models_.size())) << Describe();
  }

  void CreateSequence() {
    const std::string id = absl::StrCat("s", next_id_++);
    const int64_t reserve = Pick<int64_t>(rng_, {0, 0, Uniform(rng_, 1, 40)});
    log_.push_back(absl::StrCat("Create ", id, " reserving ", reserve, " tokens"));
    auto info = cache_->Create(config_, id, reserve);
    ASSERT_TRUE(info.ok()) << Describe() << "\n" << info.status();
    tpb_ = info->tokens_per_block;
    Model m;
    m.reserved_blocks = (reserve + tpb_ - 1) / tpb_;
    m.layers.resize(static_cast<size_t>(config_.layers));
    models_[id] = std::move(m);
    Cover("create");
  }

  // Appends n new tokens (k, v, and q unless `with_q` is false) to the model, releasing the
  // blocks the window no longer needs once the write is committed.
  void Commit(Model& m, int64_t layer, const EncodedInput& k, const EncodedInput& v) {
    ModelLayer& l = m.layers[static_cast<size_t>(layer)];
    l.k.insert(l.k.end(), k.exact.begin(), k.exact.end());
    l.v.insert(l.v.end(), v.exact.begin(), v.exact.end());
    l.tokens += k.view.dim(0);
    if (config_.window <= 0) return;
    const int64_t first_needed = l.tokens - config_.window + 1;  // of the next query
    for (int64_t b = m.reserved_blocks; (b + 1) * tpb_ <= first_needed; ++b) {
      if (static_cast<int64_t>(l.released.size()) <= b) l.released.resize(b + 1, false);
      if (!l.released[b]) Cover("window released a block");
      l.released[b] = true;
    }
  }

  // Whether every key a query at position `tokens` may see is still cached in every layer.
  bool WindowKept(const Model& m, int64_t tokens) const {
    if (config_.window <= 0) return true;
    const int64_t first = std::max<int64_t>(0, tokens - config_.window + 1);
    for (const ModelLayer& l : m.layers) {
      for (int64_t b = first / tpb_; b * tpb_ < tokens; ++b) {
        if (b < static_cast<int64_t>(l.released.size()) && l.released[b]) return false;
      }
    }
    return true;
  }

  Precision RandomPrecision() { return kPrecisions[Uniform(rng_, 0, 2)]; }
  DType RandomInputDtype() { return kInputDtypes[Uniform(rng_, 0, 2)]; }

  // Appends to `layer` of `id` (a random layer when negative).
  void AppendTo(const std::string& id, int64_t layer = -1) {
    Model& m = models_[id];
    if (layer < 0) layer = Uniform(rng_, 0, config_.layers - 1);
    const int64_t before = m.layers[static_cast<size_t>(layer)].tokens;
    if (before >= kMaxTokens) return TruncateSequence(id);
    const int64_t group = config_.n_head / config_.n_head_kv;
    const int64_t first_matmul = (tile::kMatmulRows + group - 1) / group;
    int64_t n = Pick<int64_t>(rng_, {1, 1, 2, Uniform(rng_, 1, tpb_ + 1), first_matmul - 1,
                                     first_matmul, Uniform(rng_, 1, 80)});
    n = std::clamp<int64_t>(n, 1, kMaxTokens - before);
    while (n > 1 && config_.n_head * n * (before + n) * (config_.head_dim + config_.head_dim_v) >
                        kReferenceBudget) {
      n /= 2;
    }
    const bool with_q = Uniform(rng_, 0, 5) != 0;
    const bool weights = with_q && Uniform(rng_, 0, 2) == 0;
    const Precision precision = RandomPrecision();
    const DType out_dtype = kInputDtypes[Uniform(rng_, 0, 2)];
    const EncodedInput q =
        RandomInput(rng_, {n, config_.n_head, config_.head_dim}, RandomInputDtype());
    const EncodedInput k =
        RandomInput(rng_, {n, config_.n_head_kv, config_.head_dim}, RandomInputDtype());
    const EncodedInput v =
        RandomInput(rng_, {n, config_.n_head_kv, config_.head_dim_v}, RandomInputDtype());
    log_.push_back(absl::StrCat("Append ", n, " tokens to layer ", layer, " of ", id, " (at ",
                                before, "), q ", with_q ? DTypeName(q.view.dtype) : "none", ", k ",
                                DTypeName(k.view.dtype), ", v ", DTypeName(v.view.dtype),
                                ", precision ", PrecisionName(precision), ", weights ", weights,
                                ", output ", DTypeName(out_dtype)));
    AppendInput input{id, std::nullopt, k.view, v.view};
    if (with_q) input.q = q.view;
    auto result = cache_->Append(layer, input, precision, weights, nullptr, int64_t{1} << 62,
                                 nullptr, out_dtype);
    ASSERT_TRUE(result.ok()) << Describe() << "\n" << result.status();
    EXPECT_EQ(result->first_position, before) << Describe();
    EXPECT_EQ(result->layer_tokens, before + n) << Describe();
    Commit(m, layer, k, v);
    Cover(tile::UsesKernels(n, group) ? "append on the vector kernels" : "append on the matmuls");
    if (before % tpb_ != 0) Cover("append into a partly written block");
    if (with_q) CheckAttention(m, layer, q, precision, *result, weights);
  }

  void DecodeBatchStep() {
    const int64_t layer = Uniform(rng_, 0, config_.layers - 1);
    std::vector<std::string> ids;
    for (const auto& [id, m] : models_) {
      if (m.layers[static_cast<size_t>(layer)].tokens < kMaxTokens && Uniform(rng_, 0, 2) != 0) {
        ids.push_back(id);
      }
    }
    if (ids.empty()) return;
    std::shuffle(ids.begin(), ids.end(), rng_);
    const Precision precision = RandomPrecision();
    std::vector<EncodedInput> qs, ks, vs;
    std::vector<AppendInput> inputs;
    for (size_t i = 0; i < ids.size(); ++i) {
      qs.push_back(RandomInput(rng_, {1, config_.n_head, config_.head_dim}, RandomInputDtype()));
      ks.push_back(RandomInput(rng_, {1, config_.n_head_kv, config_.head_dim}, RandomInputDtype()));
      vs.push_back(
          RandomInput(rng_, {1, config_.n_head_kv, config_.head_dim_v}, RandomInputDtype()));
    }
    for (size_t i = 0; i < ids.size(); ++i) {
      inputs.push_back(AppendInput{ids[i], qs[i].view, ks[i].view, vs[i].view});
    }
    log_.push_back(absl::StrCat("DecodeBatch layer ", layer, " of ", absl::StrJoin(ids, ","),
                                ", precision ", PrecisionName(precision)));
    auto results = cache_->DecodeBatch(layer, inputs, precision, nullptr);
    ASSERT_TRUE(results.ok()) << Describe() << "\n" << results.status();
    ASSERT_EQ(results->size(), ids.size()) << Describe();
    for (size_t i = 0; i < ids.size(); ++i) {
      Model& m = models_[ids[i]];
      Commit(m, layer, ks[i], vs[i]);
      CheckAttention(m, layer, qs[i], precision, (*results)[i], /*weights=*/false);
    }
    Cover(ids.size() > 1 ? "decode batch of several" : "decode batch of one");
  }

  void ForkSequence(const std::string& source) {
    const Model& from = models_[source];
    const int64_t common = CommonTokens(from);
    std::optional<int64_t> at;
    switch (Uniform(rng_, 0, 4)) {
      case 0:
        break;  // default: the common length
      case 1:
        at = common / tpb_ * tpb_;  // a block boundary
        break;
      case 2:
        at = common + 1;  // past the end: refused
        break;
      default:
        at = Uniform(rng_, 0, common);
    }
    const std::string id = absl::StrCat("s", next_id_++);
    const int64_t length = at.value_or(common);
    const bool allowed = length <= common && WindowKept(from, length);
    log_.push_back(absl::StrCat("Fork ", source, " into ", id, " at ",
                                at ? absl::StrCat(*at) : "default", allowed ? "" : " (refused)"));
    auto info = cache_->Fork(source, id, at);
    if (!allowed) {
      ASSERT_EQ(info.status().code(), absl::StatusCode::kOutOfRange) << Describe() << "\n"
                                                                     << info.status();
      Cover(length > common ? "fork past the end refused" : "fork behind the window refused");
      return;
    }
    ASSERT_TRUE(info.ok()) << Describe() << "\n" << info.status();
    Model fork;
    for (const ModelLayer& l : from.layers) {
      ModelLayer copy;
      copy.tokens = length;
      copy.k.assign(l.k.begin(), l.k.begin() + length * config_.n_head_kv * config_.head_dim);
      copy.v.assign(l.v.begin(), l.v.begin() + length * config_.n_head_kv * config_.head_dim_v);
      copy.released = l.released;
      copy.released.resize(std::min<size_t>(copy.released.size(), (length + tpb_ - 1) / tpb_));
      fork.layers.push_back(std::move(copy));
    }
    models_[id] = std::move(fork);
    Cover(length % tpb_ != 0 ? "fork inside a block" : "fork at a block boundary");
    if (Uniform(rng_, 0, 1) == 0) {
      // Both sides write into (and then read) the blocks they share: copy-on-write must keep
      // each side's tokens its own.
      const int64_t layer = Uniform(rng_, 0, config_.layers - 1);
      AppendTo(id, layer);
      if (!::testing::Test::HasFatalFailure()) AppendTo(source, layer);
      Cover("appends to both sides of a fork");
    }
  }

  void TruncateSequence(const std::string& id) {
    Model& m = models_[id];
    const int64_t common = CommonTokens(m);
    const int64_t tokens =
        Pick<int64_t>(rng_, {Uniform(rng_, 0, common), common / 2, common, common + 1});
    const bool allowed = tokens <= common && WindowKept(m, tokens);
    log_.push_back(absl::StrCat("Truncate ", id, " to ", tokens, allowed ? "" : " (refused)"));
    auto info = cache_->Truncate(id, tokens);
    if (!allowed) {
      ASSERT_EQ(info.status().code(), absl::StatusCode::kOutOfRange) << Describe() << "\n"
                                                                     << info.status();
      Cover("truncate refused");
      return;
    }
    ASSERT_TRUE(info.ok()) << Describe() << "\n" << info.status();
    const size_t keep =
        static_cast<size_t>(std::max((tokens + tpb_ - 1) / tpb_, m.reserved_blocks));
    for (ModelLayer& l : m.layers) {
      l.tokens = tokens;
      l.k.resize(static_cast<size_t>(tokens * config_.n_head_kv * config_.head_dim));
      l.v.resize(static_cast<size_t>(tokens * config_.n_head_kv * config_.head_dim_v));
      if (l.released.size() > keep) l.released.resize(keep);
    }
    Cover("truncate");
  }

  void ReleaseSequence(const std::string& id) {
    log_.push_back(absl::StrCat("Release ", id));
    auto freed = cache_->Release(id);
    ASSERT_TRUE(freed.ok()) << Describe() << "\n" << freed.status();
    EXPECT_GE(*freed, 0) << Describe();
    models_.erase(id);
    Cover("release");
  }

  // The cache's attention for the layer's last q.view.dim(0) tokens against the reference over
  // the model's history.
  void CheckAttention(const Model& m, int64_t layer, const EncodedInput& q, Precision precision,
                      const AppendResult& result, bool weights);

  std::mt19937_64 rng_;
  std::map<std::string, int64_t>* covered_;
  std::map<std::string, double>* margins_;
  SequenceConfig config_;
  std::unique_ptr<KvCache> cache_;
  int64_t tpb_ = 1;
  int64_t next_id_ = 0;
  std::map<std::string, Model> models_;
  std::string header_;
  std::string kernels_;  // the simd kernel set the walk runs on
  std::vector<std::string> log_;
};

void Walk::CheckAttention(const Model& m, int64_t layer, const EncodedInput& q, Precision precision,
                          const AppendResult& result, bool weights) {
  const ModelLayer& l = m.layers[static_cast<size_t>(layer)];
  const DType storage = config_.kv_dtype;
  const bool bf16 = precision == Precision::kBFloat16 ||
                    (precision == Precision::kAuto && storage == DType::kBFloat16);
  const bool int8 = storage == DType::kInt8;
  // The operands: q rounded under bf16 arithmetic; k and v as stored (bf16 storage rounds), and
  // rounded again under bf16 arithmetic; int8 as given, with its error bound instead.
  const std::vector<float> rq = Bf16Rounded(q.exact, bf16);
  const bool round_kv = !int8 && (bf16 || storage == DType::kBFloat16);
  const std::vector<float> rk = Bf16Rounded(l.k, round_kv), rv = Bf16Rounded(l.v, round_kv);
  const int64_t n = q.view.dim(0), t = l.tokens;
  AttentionOptions options;
  options.mask = {/*causal=*/true, config_.window};
  options.scale = config_.scale;
  const TensorView qv{DType::kFloat32, {n, config_.n_head, config_.head_dim}, rq.data()};
  const TensorView kv{DType::kFloat32, {t, config_.n_head_kv, config_.head_dim}, rk.data()};
  const TensorView vv{DType::kFloat32, {t, config_.n_head_kv, config_.head_dim_v}, rv.data()};
  auto reference = ReferenceAttention(qv, kv, vv, options);
  ASSERT_TRUE(reference.ok()) << Describe() << "\n" << reference.status();
  auto shape = ValidateAttention(qv, kv, vv, options, {});
  ASSERT_TRUE(shape.ok());

  // int8: each value is off by at most half its row's scale (layout.h), plus a few float32
  // roundings of the quantization itself, plus bf16 rounding of the dequantized value under
  // bf16 arithmetic.
  std::vector<double> k_error, v_error;
  const auto row_errors = [&](const std::vector<float>& x, int64_t dim, std::vector<double>* e) {
    for (size_t r = 0; r * dim < x.size(); ++r) {
      double max = 0.0;
      for (int64_t c = 0; c < dim; ++c) max = std::max<double>(max, std::abs(x[r * dim + c]));
      e->push_back(max / 127 / 2 + 4 * testing::kF32Roundoff * max +
                   (bf16 ? testing::kBf16Roundoff * max : 0.0));
    }
  };
  testing::Operands operands;
  if (int8) {
    row_errors(l.k, config_.head_dim, &k_error);
    row_errors(l.v, config_.head_dim_v, &v_error);
    operands.k_error = &k_error;
    operands.v_error = &v_error;
  }
  operands.shape = *shape;
  operands.mask = options.mask;
  operands.scale = EffectiveScale(options, *shape);
  operands.q = rq.data();
  operands.k = rk.data();
  operands.v = rv.data();
  operands.bf16_probabilities = bf16;
  const testing::ErrorBound bound(operands);
  const testing::Mismatches out =
      testing::CompareOutput(result.output, reference->output, bound, *shape, DType::kFloat32);
  double& worst = (*margins_)[absl::StrCat(DTypeName(storage), " storage, ", bf16 ? "bf16" : "f32",
                                           " arithmetic")];
  worst = std::max(worst, out.worst);
  EXPECT_EQ(out.count, 0) << Describe() << "\n  " << out.count
                          << " output elements out of bounds; first: " << out.first;
  if (weights) {
    const testing::Mismatches w =
        testing::CompareWeights(result.weights, reference->weights, bound, *shape, options.mask);
    EXPECT_EQ(w.count, 0) << Describe() << "\n  " << w.count
                          << " weights out of bounds; first: " << w.first;
  }
}

TEST(KvCacheDifferential, CacheMatchesOneShotReference) {
  const uint64_t seed = static_cast<uint64_t>(EnvInt("ATTEND_DIFF_SEED", kDefaultSeed));
  const int64_t only = EnvInt("ATTEND_DIFF_CASE", -1);
  const int64_t cases = EnvInt("ATTEND_DIFF_CASES", kDefaultCases);
  std::map<std::string, int64_t> covered;
  std::map<std::string, double> margins;
  for (int64_t i = only >= 0 ? only : 0; i < (only >= 0 ? only + 1 : cases); ++i) {
    Walk(seed, i, &covered, &margins).Run();
    if (::testing::Test::HasFatalFailure()) break;
  }
  std::string tally;
  for (const auto& [what, count] : covered) absl::StrAppend(&tally, "\n  ", what, ": ", count);
  std::cout << "[ coverage ] seed " << seed << ", operations:" << tally << "\n";
  std::string margin;
  for (const auto& [what, worst] : margins) absl::StrAppend(&margin, "\n  ", what, ": ", worst);
  std::cout << "[ margins  ] largest output error / tolerance:" << margin << "\n";
  if (only < 0 && seed == kDefaultSeed && cases >= kDefaultCases) {
    for (const char* what :
         {"append on the vector kernels", "append on the matmuls",
          "append into a partly written block", "decode batch of several", "fork inside a block",
          "fork at a block boundary", "fork past the end refused", "fork behind the window refused",
          "truncate", "truncate refused", "window released a block", "release"}) {
      EXPECT_GT(covered[what], 0) << "no default case covers: " << what;
    }
    for (const std::string& set : simd::testing::RunnableKernels()) {
      EXPECT_GT(covered["kernels " + set], 0) << "no default case runs kernels " << set;
    }
  }
}

}  // namespace
}  // namespace attend::kv
