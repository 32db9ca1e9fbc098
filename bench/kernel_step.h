// One decode step of attend's vector kernels alone (simd::DotRows then simd::AccumulateRows),
// for the benchmarks that time the kernels apart from the KV cache: decode_bench's
// BM_DecodeKernel, BM_DecodeKernelPart and BM_KernelChoice.
//
// Thread-safety: a KernelStep is used by one thread at a time; RandomNormal is thread-safe.
#ifndef ATTEND_BENCH_KERNEL_STEP_H_
#define ATTEND_BENCH_KERNEL_STEP_H_

#include <cstdint>
#include <vector>

#include "core/base/tensor.h"
#include "core/kernels/simd.h"

namespace attend::bench {

// n draws of a standard normal distribution from a generator seeded with `seed`.
std::vector<float> RandomNormal(int64_t n, uint64_t seed);

// q.k for a GQA group of `group` query heads (kGroup unless given), then p.v, over kRows cached
// tokens of one KV head
// in `storage`, dense rows (as the KV cache's blocks hold them), heads of `dim` columns (d 128:
// K and V, 256 KiB for f32, stay in L2). bf16 storage runs as under bf16 arithmetic (q rounded
// to bf16, the bf16 sets' dot product instructions allowed); int8 has one scale per row.
class KernelStep {
 public:
  static constexpr int64_t kGroup = 4, kRows = 256;

  KernelStep(DType storage, int64_t dim, int64_t group = kGroup);

  // Which of a step's kernels Run runs.
  enum class Part { kBoth, kDot, kAccumulate };

  // Runs `steps` steps on the kernel set in use: q.k then p.v, or one of them.
  void Run(int steps, Part part = Part::kBoth);

  // The weights p.v runs with (positive, as a softmax's): uniform (1 / kRows, the default); a
  // softmax of scores of standard deviation 2; or an attention sink among a tail 10 below it.
  // Only the int8 kernels' speed depends on them: their int16 weights need finer steps where the
  // weights spread over more than 2^16, and a sink's block is summed exactly.
  enum class Weights { kUniform, kSharp, kSink };
  void SetWeights(Weights weights);

  // K and V bytes a step reads (K or V alone: half).
  double Bytes() const;

 private:
  DType storage_;
  int64_t dim_, group_;
  std::vector<float> q_, scales_, scores_, out_, weights_;
  std::vector<char> kv_;
  simd::Rows k_, v_;
};

}  // namespace attend::bench

#endif  // ATTEND_BENCH_KERNEL_STEP_H_
