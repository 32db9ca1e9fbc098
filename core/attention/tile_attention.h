// The inner loop shared by the stateless engine and the paged KV cache: a block of query rows
// against one key/value head's keys, tile by tile, with an online softmax.
//
// Why one loop for both: the keys of a stateless call (a strided view of the caller's tensor)
// and of a cached sequence (a list of blocks) differ only in where each tile's rows live. A
// KeyTiles says that; everything else — masks, the running max and sum, the rescaled
// accumulator, the weights — is the same code.
//
// Two ways through a tile, chosen by the number of folded query rows m:
//   - m >= kMatmulRows (prefill): fixed-shape oneDNN matmuls. Queries are padded to a multiple of
//     kQueryTileRows and partial key tiles are copied into a zero-padded buffer, so the
//     primitive shapes depend only on (head sizes, strides, tile width) and are created once.
//   - m < kMatmulRows (decode): the memory-bound vector kernels of core/kernels/simd.h, which
//     read each key and value row once for all m rows straight from where it lives (f32, bf16 or
//     int8).
//
// Thread-safety: RunTileJob and RunKernelJobs may run concurrently on different states; buffers
// are thread-local.
#ifndef ATTEND_CORE_ATTENTION_TILE_ATTENTION_H_
#define ATTEND_CORE_ATTENTION_TILE_ATTENTION_H_

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "core/attention/mask.h"
#include "core/base/cancellation.h"
#include "core/base/tensor.h"

namespace attend::tile {

// Which of a prefill's shared key and value tiles are packed into the matmul primitive's own
// layout once, instead of being copied into it by every matmul that reads them.
//   - kBf16 (the default): on native bf16 matmuls. Zen 4 (2026-12-07): a 512-key tile's bf16
//     matmuls run 5-10% faster on packed weights, which about pays for packing in a prefill
//     (2048 and 8192 tokens within 1-2%); on AMX, whose tiles take their own layout, it is the
//     copy a plain matmul makes on every call that packing saves.
//   - kAll: f32 matmuls too. On Zen 4 they ran 1-9% slower for it (the f32 p.v gains nothing
//     from packed weights, and the packed copies take cache); for tests and comparisons.
//   - kNone: every matmul reads its tiles plain.
enum class TilePacking { kNone, kBf16, kAll };

// Folded query rows from which oneDNN matmuls pay off; below, the vector kernels run.
inline constexpr int64_t kMatmulRows = 16;
// RunKernelJobs reads the f32 tiles of several jobs in pieces of this many rows, job by job.
inline constexpr int64_t kInterleavedRows = 16;
// The matmul path pads the folded query rows to a multiple of this.
inline constexpr int64_t kQueryTileRows = 64;
// Decode-sized calls that read fewer bytes of keys and values than this run on the calling
// thread. Waking an idle OpenMP thread and joining it costs tens of microseconds on a small VM,
// about what one thread takes to read a megabyte: on a 2-vCPU Zen 4, `attend bench --rpc decode`
// with 32/8 heads, d 128, bf16, ~200 tokens (800 KB) computed a step in 49 us on one thread and
// 66 on two; at ~2,100 tokens (8.6 MB), 406-482 on one and 391-441 on two.
inline constexpr int64_t kSerialDecodeBytes = int64_t{1} << 20;

// Where one key/value head's keys and values are: tile i covers keys [i * width, ...).
class KeyTiles {
 public:
  virtual ~KeyTiles() = default;
  int64_t width = 0;  // keys per tile
  int64_t keys = 0;   // keys in all
  int64_t head_dim = 0;
  int64_t head_dim_v = 0;
  DType dtype = DType::kFloat32;  // kFloat32, kBFloat16 or kInt8
  // Start of tile i's keys and values and their row strides (in elements). Tile memory holds
  // `width` readable rows when `padded`, else only the tile's valid rows.
  virtual const void* Keys(int64_t tile) const = 0;
  virtual const void* Values(int64_t tile) const = 0;
  // kInt8: tile i's per-row scales.
  virtual const float* KeyScales(int64_t) const { return nullptr; }
  virtual const float* ValueScales(int64_t) const { return nullptr; }
  int64_t key_stride = 0;
  int64_t value_stride = 0;
  bool padded = false;
  // kFloat32 keys and values that already hold bfloat16 values (rounded once by the caller):
  // bf16 semantics then read them as they are instead of rounding a copy of every tile.
  bool bf16_exact = false;
};

// How the products are computed.
struct Arithmetic {
  DType matmul = DType::kFloat32;  // bf16 when native
  bool round_bf16 = false;         // bf16 semantics: operands and probabilities rounded to bf16
};

// The running softmax of a job's rows: max and sum per row, and the unnormalised output.
struct State {
  std::vector<float> max;  // [m]
  std::vector<float> sum;  // [m]
  std::vector<float> acc;  // [m, head_dim_v]
  // [m]: 1 when one of the row's visible scores was not finite (q.k * scale overflowed, or a key
  // held a NaN or an infinity): Finish writes NaN to the row's output, for the callers' check of
  // the output to report. A -inf score would otherwise get weight 0 and drop out unnoticed.
  std::vector<uint8_t> overflowed;
  void Reset(int64_t m, int64_t head_dim_v);
};

class ConvertedTiles;  // tiles converted or packed once per Run and shared by its jobs
                       // (tile_operands.h)

struct Job {
  const float* q = nullptr;  // [m, head_dim]: folded rows (token r, head j) at r * group + j
                             // (values already rounded to bf16 under bf16 semantics)
  // Multiplies q.k before the softmax; applied to the f32 scores, so bf16 operands stay exactly
  // the caller's values.
  float scale = 1.0f;
  // q holds the caller's rows already multiplied by `scale` (f32 arithmetic only): the scores
  // come out scaled, which saves a pass over every score tile.
  bool q_scaled = false;
  int64_t m = 0;
  int64_t group = 1;
  int64_t first_token = 0;  // index among the call's n_q queries of row 0's token
  int64_t n_q = 0;          // the mask's geometry: queries aligned to the end of the keys
  MaskSpec mask;
  int64_t key_begin = 0;  // only keys in [key_begin, key_end) (a split of the key range)
  int64_t key_end = 0;
  const KeyTiles* keys = nullptr;
  Arithmetic arithmetic;
  // Optional: for each folded row, where its raw scaled scores go ([keys] floats, written only at
  // visible keys; the caller zeroes the rest and normalises with Finish).
  float* const* weight_rows = nullptr;
  // Optional (set by Run): where the matmul path finds its tiles already converted to f32, by
  // `work` index. Null: each job converts the tiles it reads.
  ConvertedTiles* converted = nullptr;
  int64_t work = 0;
  // Optional: checked before every tile; when set, the job stops (its state is then partial).
  const Cancellation* cancel = nullptr;
};

// Adds the job's keys to `state` (which must be Reset for job.m rows, or hold an earlier
// range of the same rows). CANCELLED, with `state` partial, when job.cancel is set.
absl::Status RunTileJob(const Job& job, State* state);

// RunTileJob for n decode-sized jobs (m < kMatmulRows) whose keys have the same tile width,
// each adding its keys to its own *states[j] (Reset, or holding an earlier range). Tile by tile,
// every job's share of the tile in turn; f32 tiles in pieces of kInterleavedRows rows, so that
// jobs over neighbouring memory (the heads of one token row) read it together. CANCELLED, with
// the states partial, when jobs[0].cancel is set.
absl::Status RunKernelJobs(const Job* jobs, State* const* states, int64_t n);

// Combines `part` (a later key range of the same rows) into `into`.
void Merge(const State& part, State* into);

// Writes output row i (acc / sum; 0 for rows that saw nothing; NaN for overflowed rows) to
// out_rows[i], and turns the raw scores in weight_rows (if any) into probabilities over each
// row's visible keys. Returns whether every output value it wrote is finite.
bool Finish(const Job& job, const State& state, float* const* out_rows, float* const* weight_rows);

// The keys row `row` of the job may see.
KeyRange RowKeys(const Job& job, int64_t row);

// The first and one-past-last key any row of the job sees: rows see monotonically later keys.
KeyRange JobKeys(const Job& job);

// The key columns of tile `t` a matmul job over `range` (its JobKeys) computes: up to the range's
// last key, rounded up to 64 so that the shapes come from a small fixed set, at most the tile's
// width. PlanPacking counts a tile as read whole where this is the width.
int64_t MatmulColumns(const KeyTiles& keys, const KeyRange& range, int64_t t);

// A whole call's worth of work: the query tokens of one call (or one cached sequence) against
// one key/value head. Run() folds each head's group, cuts the tokens into jobs of at most
// kQueryTileRows folded rows, splits the keys across threads when there are fewer jobs than
// threads, runs everything in parallel, merges the splits and writes outputs and weights.
struct Work {
  const KeyTiles* keys = nullptr;
  // [n_q, n_head, head_dim] (all query heads), float32 or bfloat16: each job converts its own
  // rows as it packs them, so a caller's bf16 queries need no float32 copy of the whole tensor
  // (a serial pass, plus zeroing its buffer, took 3% of a 2048-token bf16 prefill's two threads).
  const void* q = nullptr;
  DType q_dtype = DType::kFloat32;  // kFloat32 or kBFloat16
  int64_t n_q = 0;
  int64_t n_head = 0;
  int64_t head_kv = 0;  // this work's key/value head; its query heads are head_kv * group ...
  int64_t group = 1;
  MaskSpec mask;
  float scale = 1.0f;
  Arithmetic arithmetic;
  float* output = nullptr;   // [n_q, n_head, head_dim_v]
  float* weights = nullptr;  // [n_head, n_q, keys] (zeroed by the caller) or nullptr
  // For works whose keys interleave in memory, as the heads of a caller's [n, heads, d] tensor
  // do. When every work of a Run has key_span > 0 and is decode-sized, the keys are cut into
  // spans of about this many keys, the tasks are ordered span by span across works (every
  // work's span 0, then span 1, ...), and each thread takes one contiguous run of spans: its own
  // range of tokens. A span's tasks run as one (RunKernelJobs), which reads f32 rows of all
  // heads 16 token rows at a time. Run head by head instead, each pass reads a 512-byte piece of
  // every 4 KiB row a page apart, which the hardware prefetchers do not follow
  // (bench/decode_bench.cc, BM_DecodeLayout: 1.6-1.8x slower than one head's rows in a row).
  int64_t key_span = 0;
  // Which matmul tiles that enough of this work's query tiles read whole are packed once into
  // the primitive's layout and shared (tile_operands.h, ConvertedTiles).
  TilePacking packing = TilePacking::kBf16;
};

// Runs every work item with up to `threads` OpenMP threads (0 = all), oneDNN's own threads
// included (one, when every work is decode-sized and they read under kSerialDecodeBytes); the
// calling thread's OpenMP setting is the same afterwards. When `cancel` is set (polled between
// tiles) it stops soon after and returns CANCELLED; the outputs are then partial. When
// `outputs_finite` is set and the call succeeds, it says whether every output value written is
// finite (checked as they are written), so that a caller need not read the output again to
// find out.
absl::Status Run(const std::vector<Work>& works, int threads, const Cancellation* cancel = nullptr,
                 bool* outputs_finite = nullptr);

// Whether bf16 arithmetic may run on a native bf16 matmul with this scale. Native bf16 products
// flush subnormal results to zero; each lost product is under 2^-126, so a score loses less
// than head_dim * 2^-126 * scale, nothing that matters up to 2^64. Larger scales, which only
// make sense for inputs that small, take the f32 matmul on bf16-rounded operands instead.
inline bool NativeBf16Scale(float scale) { return std::fabs(scale) <= 0x1p64f; }

// Whether the jobs of a call with n_q queries and `group` query heads per key/value head take
// the vector-kernel path (decode-sized) rather than matmuls.
inline bool UsesKernels(int64_t n_q, int64_t group) {
  const int64_t tokens = std::max<int64_t>(1, kQueryTileRows / group);
  return std::min(n_q, tokens) * group < kMatmulRows;
}

}  // namespace attend::tile

#endif  // ATTEND_CORE_ATTENTION_TILE_ATTENTION_H_
