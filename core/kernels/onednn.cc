#include "core/kernels/onednn.h"

#include <omp.h>

#include <atomic>
#include <cstring>
#include <list>
#include <unordered_map>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "core/base/mutex.h"
#include "core/base/status_macros.h"
#include "core/kernels/cpu_features.h"
#include "oneapi/dnnl/dnnl.hpp"

namespace attend::onednn {
namespace {

using dt = dnnl::memory::data_type;

// Runs `fn`, turning dnnl::error (and std::exception) into INTERNAL naming `what`.
template <typename Fn>
absl::Status Call(const char* what, Fn&& fn) {
  try {
    fn();
    return absl::OkStatus();
  } catch (const dnnl::error& e) {
    return absl::InternalError(std::string("oneDNN ") + what + ": " + e.what());
  } catch (const std::exception& e) {
    return absl::InternalError(std::string(what) + ": " + e.what());
  }
}

// The process-wide CPU engine.
const dnnl::engine& CpuEngine() {
  static const auto* engine = new dnnl::engine(dnnl::engine::kind::cpu, 0);
  return *engine;
}

dt DnnlType(DType type) { return type == DType::kBFloat16 ? dt::bf16 : dt::f32; }

// The primitives created so far, least recently used evicted past the capacity: a workload
// of ever-changing shapes (a client creating sequences of a new shape each time) would
// otherwise keep every primitive, and its JIT code, for good.
class MatmulCache {
 public:
  std::shared_ptr<const Matmul> Find(const std::string& key) ABSL_LOCKS_EXCLUDED(mu_) {
    MutexLock lock(&mu_);
    auto it = index_.find(key);
    if (it == index_.end()) return nullptr;
    order_.splice(order_.end(), order_, it->second);  // now the most recently used
    return it->second->second;
  }
  // Layouts oneDNN rejected, remembered so that creation is not retried on every call.
  bool IsUnsupported(const std::string& key) ABSL_LOCKS_EXCLUDED(mu_) {
    MutexLock lock(&mu_);
    return unsupported_.contains(key);
  }
  void MarkUnsupported(const std::string& key) ABSL_LOCKS_EXCLUDED(mu_) {
    MutexLock lock(&mu_);
    if (unsupported_.size() < kMaxUnsupported) unsupported_.insert(key);
  }
  std::shared_ptr<const Matmul> Insert(const std::string& key, std::shared_ptr<const Matmul> m)
      ABSL_LOCKS_EXCLUDED(mu_) {
    MutexLock lock(&mu_);
    // Another thread may have created the same primitive meanwhile; keep the first.
    if (auto it = index_.find(key); it != index_.end()) return it->second->second;
    creations_++;
    order_.emplace_back(key, std::move(m));
    index_.emplace(key, std::prev(order_.end()));
    EvictOverCapacity();
    return order_.back().second;
  }
  void SetCapacity(int64_t capacity) ABSL_LOCKS_EXCLUDED(mu_) {
    MutexLock lock(&mu_);
    capacity_ = capacity;
    EvictOverCapacity();
  }
  MatmulCacheStats Stats() ABSL_LOCKS_EXCLUDED(mu_) {
    MutexLock lock(&mu_);
    return {static_cast<int64_t>(order_.size()), capacity_, creations_, evictions_};
  }

 private:
  // A dropped primitive lives on while executions (and threads' ready lists) hold it.
  void EvictOverCapacity() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    while (static_cast<int64_t>(order_.size()) > capacity_) {
      index_.erase(order_.front().first);
      order_.pop_front();
      evictions_++;
    }
  }

  static constexpr size_t kMaxUnsupported = 4096;
  Mutex mu_;
  int64_t capacity_ ABSL_GUARDED_BY(mu_) = kDefaultMatmulCacheCapacity;
  // Least recently used first.
  std::list<std::pair<std::string, std::shared_ptr<const Matmul>>> order_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, decltype(order_)::iterator> index_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_set<std::string> unsupported_ ABSL_GUARDED_BY(mu_);
  int64_t creations_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t evictions_ ABSL_GUARDED_BY(mu_) = 0;
};

MatmulCache& Cache() {
  static auto* cache = new MatmulCache();
  return *cache;
}

dnnl::memory::desc Describe(const Operand& op) {
  return dnnl::memory::desc({op.rows, op.cols}, DnnlType(op.type), {op.row_stride, op.col_stride});
}

absl::string_view TypeCode(DType type) { return type == DType::kBFloat16 ? "b" : "f"; }

// Scratchpad for one execution on this thread, grown as needed and reused.
void* ThreadScratchpad(size_t bytes) {
  thread_local std::vector<char> buffer;
  if (buffer.size() < bytes) buffer.resize(bytes);
  return buffer.data();
}

size_t ElementBytes(DType type) { return type == DType::kBFloat16 ? 2 : 4; }

bool IsDense(const Operand& op) { return op.col_stride == 1 && op.row_stride == op.cols; }

Operand Densified(const Operand& op) { return {op.rows, op.cols, op.cols, 1, op.type}; }

// Copies a strided operand into `dense` (rows x cols row-major), or back when `unpack`.
void Repack(const Operand& op, const void* strided, void* dense, bool unpack) {
  const size_t bytes = ElementBytes(op.type);
  for (int64_t r = 0; r < op.rows; ++r) {
    for (int64_t c = 0; c < op.cols; ++c) {
      char* packed = static_cast<char*>(dense) + (r * op.cols + c) * bytes;
      char* original = static_cast<char*>(const_cast<void*>(strided)) +
                       (r * op.row_stride + c * op.col_stride) * bytes;
      if (unpack) {
        std::memcpy(original, packed, bytes);
      } else {
        std::memcpy(packed, original, bytes);
      }
    }
  }
}

void* PackBuffer(std::vector<char>& buffer, const Operand& op) {
  const size_t bytes = static_cast<size_t>(op.rows * op.cols) * ElementBytes(op.type);
  if (buffer.size() < bytes) buffer.resize(bytes);
  return buffer.data();
}

}  // namespace

struct Matmul::Primitive {
  dnnl::matmul primitive;
  dnnl::memory::desc src_md, weights_md, dst_md;
  size_t scratchpad_bytes = 0;
  std::string impl;
};

Matmul::Matmul() : primitive_(std::make_unique<Primitive>()) {}
Matmul::~Matmul() = default;
const std::string& Matmul::impl() const { return primitive_->impl; }

std::string MatmulSpec::Key() const {
  return absl::StrCat(
      src.rows, "x", src.cols, ":", src.row_stride, ",", src.col_stride, TypeCode(src.type), "|",
      weights.rows, "x", weights.cols, ":",
      weights.packed ? "packed" : absl::StrCat(weights.row_stride, ",", weights.col_stride),
      TypeCode(weights.type), "|", dst.rows, "x", dst.cols, ":", dst.row_stride, ",",
      dst.col_stride, TypeCode(dst.type));
}

// One matmul's oneDNN arguments: memory objects made once, pointed at each call's operands.
struct MatmulArguments {
  dnnl::memory src, weights, dst, scratchpad;
  std::unordered_map<int, dnnl::memory> args;
};

void Matmul::Bind(MatmulArguments* a) const {
  const dnnl::engine& engine = CpuEngine();
  const Primitive& p = *primitive_;
  a->src = dnnl::memory(p.src_md, engine, nullptr);
  a->weights = dnnl::memory(p.weights_md, engine, nullptr);
  a->dst = dnnl::memory(p.dst_md, engine, nullptr);
  a->args = {{DNNL_ARG_SRC, a->src}, {DNNL_ARG_WEIGHTS, a->weights}, {DNNL_ARG_DST, a->dst}};
  if (p.scratchpad_bytes > 0) {
    dnnl::memory::desc pad_md({static_cast<int64_t>(p.scratchpad_bytes)}, dt::u8, {1});
    a->scratchpad = dnnl::memory(pad_md, engine, nullptr);
    a->args.emplace(DNNL_ARG_SCRATCHPAD, a->scratchpad);
  }
}

void Matmul::Run(MatmulArguments& a, const void* src, const void* weights, void* dst) const {
  a.src.set_data_handle(const_cast<void*>(src));
  a.weights.set_data_handle(const_cast<void*>(weights));
  a.dst.set_data_handle(dst);
  // The thread's scratchpad may have moved since the last call (grown for a larger primitive).
  const Primitive& p = *primitive_;
  if (p.scratchpad_bytes > 0) a.scratchpad.set_data_handle(ThreadScratchpad(p.scratchpad_bytes));
  thread_local dnnl::stream stream(CpuEngine());
  p.primitive.execute(stream, a.args);
  stream.wait();
}

absl::Status Matmul::Execute(const void* src, const void* weights, void* dst) const {
  return Call("matmul execute", [&] {
    MatmulArguments arguments;
    Bind(&arguments);
    Run(arguments, src, weights, dst);
  });
}

absl::StatusOr<std::shared_ptr<const Matmul>> GetMatmul(const MatmulSpec& spec) {
  if (spec.src.cols != spec.weights.rows || spec.src.rows != spec.dst.rows ||
      spec.weights.cols != spec.dst.cols) {
    return absl::InvalidArgumentError(absl::StrCat("matmul shapes do not agree: ", spec.Key()));
  }
  const std::string key = spec.Key();
  if (auto found = Cache().Find(key)) return found;

  auto matmul = std::make_shared<Matmul>();
  Matmul::Primitive& p = *matmul->primitive_;
  absl::Status status = Call("matmul create", [&] {
    p.src_md = Describe(spec.src);
    // Packed weights: the primitive picks its layout (format "any"), which PackWeights writes.
    p.weights_md = spec.weights.packed ? dnnl::memory::desc({spec.weights.rows, spec.weights.cols},
                                                            DnnlType(spec.weights.type),
                                                            dnnl::memory::format_tag::any)
                                       : Describe(spec.weights);
    p.dst_md = Describe(spec.dst);
    dnnl::primitive_attr attr;
    attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
    dnnl::matmul::desc desc(p.src_md, p.weights_md, p.dst_md);
    dnnl::matmul::primitive_desc pd(desc, attr, CpuEngine());
    p.weights_md = pd.weights_desc();
    p.impl = pd.impl_info_str();
    p.scratchpad_bytes = pd.scratchpad_desc().get_size();
    p.primitive = dnnl::matmul(pd);
  });
  if (!status.ok()) return status;
  if (absl::StartsWith(p.impl, "ref")) {
    return absl::InternalError(absl::StrCat("oneDNN offers only the reference implementation '",
                                            p.impl, "' for matmul ", key));
  }
  return Cache().Insert(key, std::move(matmul));
}

// One thread's recently used matmuls, each with its oneDNN arguments built once: a repeated
// spec costs a short scan and three set_data_handle calls. The general path builds a string
// key, takes the cache's lock twice and creates five oneDNN memory objects and a map per call,
// which was 3 of the 4.7 us a small matmul took here: several percent of a prefill over the
// KV cache, whose key tiles are blocks of 128-256 tokens. Entries hold their primitive, so a
// primitive the shared cache drops stays valid here.
class ThreadMatmuls {
 public:
  // The calling thread's instance.
  static ThreadMatmuls& Get() {
    thread_local ThreadMatmuls matmuls;
    return matmuls;
  }

  // Runs `spec` if this thread has it ready; returns false (and does nothing) otherwise.
  bool TryRun(const MatmulSpec& spec, const void* src, const void* weights, void* dst,
              absl::Status* status) {
    for (auto it = entries_.rbegin(); it != entries_.rend(); ++it) {
      Entry& e = **it;
      if (!SameSpec(e.spec, spec)) continue;
      *status = Call("matmul execute", [&] { e.matmul->Run(e.arguments, src, weights, dst); });
      return true;
    }
    return false;
  }

  void Add(const MatmulSpec& spec, std::shared_ptr<const Matmul> matmul) {
    const absl::Status status = Call("matmul arguments", [&] {
      auto e = std::make_unique<Entry>();
      e->spec = spec;
      matmul->Bind(&e->arguments);
      e->matmul = std::move(matmul);
      if (entries_.size() >= kCapacity) entries_.erase(entries_.begin());
      entries_.push_back(std::move(e));
    });
    (void)status;  // without an entry, the next call takes the general path again
  }

 private:
  struct Entry {
    MatmulSpec spec;
    std::shared_ptr<const Matmul> matmul;
    MatmulArguments arguments;
  };

  static bool SameOperand(const Operand& a, const Operand& b) {
    return a.rows == b.rows && a.cols == b.cols && a.row_stride == b.row_stride &&
           a.col_stride == b.col_stride && a.type == b.type && a.packed == b.packed;
  }
  static bool SameSpec(const MatmulSpec& a, const MatmulSpec& b) {
    return SameOperand(a.src, b.src) && SameOperand(a.weights, b.weights) &&
           SameOperand(a.dst, b.dst);
  }

  // A prefill's tiles use a few dozen shapes at most (query rows x key columns, two products).
  static constexpr size_t kCapacity = 32;
  std::vector<std::unique_ptr<Entry>> entries_;  // oldest first
};

absl::Status RunMatmul(const MatmulSpec& spec, const void* src, const void* weights, void* dst) {
  ThreadMatmuls& ready = ThreadMatmuls::Get();
  absl::Status status;
  if (ready.TryRun(spec, src, weights, dst, &status)) return status;
  const std::string key = spec.Key();
  if (!Cache().IsUnsupported(key)) {
    absl::StatusOr<std::shared_ptr<const Matmul>> strided = GetMatmul(spec);
    if (strided.ok()) {
      ready.Add(spec, *strided);
      return (*strided)->Execute(src, weights, dst);
    }
    if (strided.status().code() != absl::StatusCode::kInternal || spec.weights.packed) {
      return strided.status();
    }
    Cache().MarkUnsupported(key);
  }
  if (spec.weights.packed) {
    return absl::InternalError(absl::StrCat("oneDNN has no matmul for ", key));
  }
  MatmulSpec dense{Densified(spec.src), Densified(spec.weights), Densified(spec.dst)};
  if (IsDense(spec.src) && IsDense(spec.weights) && IsDense(spec.dst)) {
    return absl::InternalError(absl::StrCat("oneDNN has no matmul for ", key));
  }
  ATTEND_ASSIGN_OR_RETURN(auto matmul, GetMatmul(dense));
  thread_local std::vector<char> src_buffer, weights_buffer, dst_buffer;
  const void* packed_src = src;
  const void* packed_weights = weights;
  void* packed_dst = dst;
  if (!IsDense(spec.src)) {
    packed_src = PackBuffer(src_buffer, spec.src);
    Repack(spec.src, src, const_cast<void*>(packed_src), /*unpack=*/false);
  }
  if (!IsDense(spec.weights)) {
    packed_weights = PackBuffer(weights_buffer, spec.weights);
    Repack(spec.weights, weights, const_cast<void*>(packed_weights), /*unpack=*/false);
  }
  if (!IsDense(spec.dst)) packed_dst = PackBuffer(dst_buffer, spec.dst);
  ATTEND_RETURN_IF_ERROR(matmul->Execute(packed_src, packed_weights, packed_dst));
  if (!IsDense(spec.dst)) Repack(spec.dst, dst, packed_dst, /*unpack=*/true);
  return absl::OkStatus();
}

namespace {

// Reorders into packed weights, one per (plain layout, packed spec), created once.
class ReorderCache {
 public:
  absl::StatusOr<std::shared_ptr<const dnnl::reorder>> Get(const std::string& key,
                                                           const dnnl::memory::desc& from,
                                                           const dnnl::memory::desc& to)
      ABSL_LOCKS_EXCLUDED(mu_) {
    {
      MutexLock lock(&mu_);
      if (auto it = reorders_.find(key); it != reorders_.end()) return it->second;
    }
    std::shared_ptr<const dnnl::reorder> reorder;
    ATTEND_RETURN_IF_ERROR(Call("reorder create", [&] {
      reorder = std::make_shared<const dnnl::reorder>(
          dnnl::reorder::primitive_desc(CpuEngine(), from, CpuEngine(), to));
    }));
    MutexLock lock(&mu_);
    // Bounded as the matmuls are: past the capacity, the cache starts over.
    if (static_cast<int64_t>(reorders_.size()) >= kDefaultMatmulCacheCapacity) reorders_.clear();
    return reorders_.emplace(key, std::move(reorder)).first->second;
  }

 private:
  Mutex mu_;
  absl::flat_hash_map<std::string, std::shared_ptr<const dnnl::reorder>> reorders_
      ABSL_GUARDED_BY(mu_);
};

ReorderCache& Reorders() {
  static auto* cache = new ReorderCache();
  return *cache;
}

absl::StatusOr<std::shared_ptr<const Matmul>> PackedMatmul(const MatmulSpec& spec) {
  if (!spec.weights.packed) {
    return absl::InvalidArgumentError(
        absl::StrCat("packed weights asked for a spec whose weights are not packed: ", spec.Key()));
  }
  return GetMatmul(spec);
}

}  // namespace

absl::StatusOr<int64_t> PackedWeightsBytes(const MatmulSpec& spec) {
  ATTEND_ASSIGN_OR_RETURN(auto matmul, PackedMatmul(spec));
  return static_cast<int64_t>(matmul->primitive_->weights_md.get_size());
}

absl::Status PackWeights(const MatmulSpec& spec, const Operand& plain, const void* weights,
                         void* packed) {
  if (plain.packed || plain.rows != spec.weights.rows || plain.cols != spec.weights.cols ||
      plain.type != spec.weights.type) {
    return absl::InvalidArgumentError(
        absl::StrCat("weights of ", plain.rows, "x", plain.cols, " ", TypeCode(plain.type),
                     plain.packed ? " (packed)" : "", " cannot be packed for matmul ", spec.Key()));
  }
  ATTEND_ASSIGN_OR_RETURN(auto matmul, PackedMatmul(spec));
  const dnnl::memory::desc from = Describe(plain);
  const dnnl::memory::desc& to = matmul->primitive_->weights_md;
  const std::string key = absl::StrCat(spec.Key(), "<-", plain.row_stride, ",", plain.col_stride);
  ATTEND_ASSIGN_OR_RETURN(auto reorder, Reorders().Get(key, from, to));
  return Call("reorder execute", [&] {
    dnnl::memory src(from, CpuEngine(), const_cast<void*>(weights));
    dnnl::memory dst(to, CpuEngine(), packed);
    thread_local dnnl::stream stream(CpuEngine());
    reorder->execute(stream, src, dst);
    stream.wait();
  });
}

int64_t MatmulCreations() { return Cache().Stats().creations; }

MatmulCacheStats GetMatmulCacheStats() { return Cache().Stats(); }

void SetMatmulCacheCapacity(int64_t capacity) {
  capacity = std::max<int64_t>(capacity, 1);
  Cache().SetCapacity(capacity);
  // oneDNN keeps its own cache of primitive implementations (1024 by default), which would hold
  // the JIT code of primitives this cache dropped.
  (void)Call("set_primitive_cache_capacity", [&] {
    dnnl::set_primitive_cache_capacity(static_cast<int>(std::min<int64_t>(capacity, 1 << 20)));
  });
}

}  // namespace attend::onednn

namespace attend {

bool HasBf16Matmul() {
  static const bool available = [] {
    onednn::MatmulSpec probe;
    probe.src = {16, 32, 32, 1, DType::kBFloat16};
    probe.weights = {32, 16, 16, 1, DType::kBFloat16};
    probe.dst = {16, 16, 16, 1, DType::kFloat32};
    return onednn::GetMatmul(probe).ok();
  }();
  return available;
}

bool UseBf16Matmul() {
  static const bool use = [] {
    if (!HasBf16Matmul()) return false;
    if (dnnl::get_effective_cpu_isa() == dnnl::cpu_isa::avx512_core_amx) return true;
    __builtin_cpu_init();
    return !__builtin_cpu_is("intel");
  }();
  return use;
}

std::string CpuIsaName() {
  switch (dnnl::get_effective_cpu_isa()) {
    case dnnl::cpu_isa::avx512_core_amx:
      return "avx512_core_amx";
    case dnnl::cpu_isa::avx512_core_bf16:
      return "avx512_core_bf16";
    case dnnl::cpu_isa::avx512_core_vnni:
      return "avx512_core_vnni";
    case dnnl::cpu_isa::avx512_core:
      return "avx512_core";
    case dnnl::cpu_isa::avx2:
      return "avx2";
    default:
      return "other";
  }
}

}  // namespace attend

namespace attend::onednn {

ScopedThreadLimit::ScopedThreadLimit(int threads) : saved_(0) {
  const int current = omp_get_max_threads();
  if (threads > 0 && threads < current) {
    saved_ = current;
    omp_set_num_threads(threads);
  }
}

ScopedThreadLimit::~ScopedThreadLimit() {
  if (saved_ > 0) omp_set_num_threads(saved_);
}

}  // namespace attend::onednn
