// The one adapter between attend and oneDNN: a cache of fixed-shape matmul primitives and the
// conversion of dnnl::error into absl::Status. Nothing outside core/kernels sees oneDNN: this
// header speaks attend's types (DType), and only onednn.cc includes dnnl.hpp.
//
// Why a cache of our own: fixed-shape primitives dispatch to the fast brgemm kernels, but
// creating one costs ~0.3 ms. Primitives are created once per distinct (dims, strides, dtypes)
// and reused from any thread. Creation refuses oneDNN's `ref` implementations (1000x slower) so
// a shape that would hit one fails loudly in tests instead of silently crawling in production.
//
// Thread-safety: every function is safe to call concurrently. A cached primitive is executed
// concurrently by many threads; each execution brings its own scratchpad (user mode), so no
// state is shared between executions.
#ifndef ATTEND_CORE_KERNELS_ONEDNN_H_
#define ATTEND_CORE_KERNELS_ONEDNN_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/base/tensor.h"

namespace attend::onednn {

// A 2-D operand: rows x cols with arbitrary element strides, so that one head's slice of an
// interleaved [tokens, heads, dim] tensor is described without copying. `type` is kFloat32 or
// kBFloat16.
struct Operand {
  int64_t rows = 0;
  int64_t cols = 0;
  int64_t row_stride = 0;
  int64_t col_stride = 1;
  DType type = DType::kFloat32;
  // Weights only: the data is in the primitive's own blocked layout, as PackWeights writes it
  // (the strides are then ignored). A matmul over plain weights copies them into that layout on
  // every call; weights used by many calls (a key tile against every query tile of a prefill)
  // can be packed once instead.
  bool packed = false;
};

// dst[M, N] = src[M, K] x weights[K, N], all f32 or bf16 inputs with an f32 or bf16 dst.
struct MatmulSpec {
  Operand src;
  Operand weights;
  Operand dst;
  std::string Key() const;
};

class ThreadMatmuls;
struct MatmulArguments;

// A created matmul primitive with its memory descriptors and scratchpad size.
class Matmul {
 public:
  Matmul();
  ~Matmul();
  Matmul(const Matmul&) = delete;
  Matmul& operator=(const Matmul&) = delete;

  // REQUIRES: pointers address memory laid out as the spec says. Runs on the calling thread's
  // oneDNN threading context (single-threaded inside an OpenMP parallel region).
  absl::Status Execute(const void* src, const void* weights, void* dst) const;
  // oneDNN's name for the implementation, e.g. "brg:avx512_core".
  const std::string& impl() const;

 private:
  friend absl::StatusOr<std::shared_ptr<const Matmul>> GetMatmul(const MatmulSpec& spec);
  friend absl::StatusOr<int64_t> PackedWeightsBytes(const MatmulSpec& spec);
  friend absl::Status PackWeights(const MatmulSpec& spec, const Operand& plain, const void* weights,
                                  void* packed);
  friend class ThreadMatmuls;
  struct Primitive;  // the oneDNN primitive and its descriptors (onednn.cc)
  // Makes the oneDNN memory objects and argument map for this primitive, with no data yet.
  void Bind(MatmulArguments* arguments) const;
  // Points `arguments` (made by Bind) at the operands and this thread's scratchpad, and runs.
  void Run(MatmulArguments& arguments, const void* src, const void* weights, void* dst) const;
  std::unique_ptr<Primitive> primitive_;
};

// The cached primitive for `spec`, created on first use. INVALID_ARGUMENT when the shapes do
// not agree; INTERNAL when oneDNN fails or offers only a reference implementation.
absl::StatusOr<std::shared_ptr<const Matmul>> GetMatmul(const MatmulSpec& spec);

// Executes dst = src x weights for `spec`. When oneDNN has no implementation for the strided
// layout (some ISAs accept only dense operands), packs the operands into dense per-thread
// buffers, runs the dense primitive and scatters the result: slower, never wrong. Packed
// weights (Operand::packed) have no such fallback: INTERNAL where oneDNN has no primitive. Each
// thread keeps its most recently used specs with their oneDNN arguments ready, so a repeated shape
// costs no key, lock or allocation.
absl::Status RunMatmul(const MatmulSpec& spec, const void* src, const void* weights, void* dst);

// Bytes PackWeights writes for `spec` (whose weights are `packed`): the primitive's own layout,
// padded. INVALID_ARGUMENT unless spec.weights.packed; INTERNAL as GetMatmul.
absl::StatusOr<int64_t> PackedWeightsBytes(const MatmulSpec& spec);

// Writes `weights`, laid out as `plain` says (spec.weights's shape and type, with strides; its
// `packed` unset), into `packed` (PackedWeightsBytes(spec) bytes) in the layout RunMatmul(spec)
// reads. Runs on the calling thread. The reorder primitives are cached as the matmuls are.
absl::Status PackWeights(const MatmulSpec& spec, const Operand& plain, const void* weights,
                         void* packed);

// Number of primitives created so far (cache misses), for tests and metrics.
int64_t MatmulCreations();

// The cache of created matmul primitives: least recently used ones are dropped past its
// capacity (and oneDNN's own primitive cache is kept to the same size), so that memory stays
// bounded however many shapes come and go. A prefill configuration (head sizes, layout, dtype)
// uses a few dozen primitives.
inline constexpr int64_t kDefaultMatmulCacheCapacity = 512;
struct MatmulCacheStats {
  int64_t entries = 0;
  int64_t capacity = 0;
  int64_t creations = 0;  // cache misses since start
  int64_t evictions = 0;
};
MatmulCacheStats GetMatmulCacheStats();
// REQUIRES: capacity >= 1 (smaller values are taken as 1).
void SetMatmulCacheCapacity(int64_t capacity);

// Caps the calling thread's OpenMP thread count at `threads` for the object's lifetime (no cap
// when threads <= 0 or the count is already lower), then restores it. oneDNN sizes its parallel
// regions from that setting, which is every CPU by default, so this is how a caller keeps
// oneDNN's matmuls to `threads` threads. Thread-safety: affects only the calling thread.
class ScopedThreadLimit {
 public:
  explicit ScopedThreadLimit(int threads);
  ~ScopedThreadLimit();
  ScopedThreadLimit(const ScopedThreadLimit&) = delete;
  ScopedThreadLimit& operator=(const ScopedThreadLimit&) = delete;

 private:
  int saved_;  // 0: nothing to restore
};

}  // namespace attend::onednn

#endif  // ATTEND_CORE_KERNELS_ONEDNN_H_
