// Where the tile loop (tile_job.cc) finds a tile's keys and values in the form a path
// needs: in place when the storage already fits, else converted (dequantized, rounded to bf16,
// zero-padded) into a thread-local copy or, for a prefill's matmuls, into a store shared by the
// jobs of one Run.
//
// Internal to attend::attention; not a public interface.
#ifndef ATTEND_CORE_ATTENTION_TILE_OPERANDS_H_
#define ATTEND_CORE_ATTENTION_TILE_OPERANDS_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <new>
#include <utility>
#include <vector>

#include "core/attention/tile_attention.h"
#include "core/kernels/onednn.h"
#include "core/kernels/simd.h"

namespace attend::tile {

// `buffer`'s storage, grown to at least `elements`.
template <typename T>
T* Buffer(std::vector<T>& buffer, int64_t elements) {
  if (buffer.size() < static_cast<size_t>(elements)) buffer.resize(static_cast<size_t>(elements));
  return buffer.data();
}

// Rows [0, rows) of `src` as dense f32 [out_rows, cols] at `out` (dequantized; rounded to bf16
// when `round`), zero past `rows`.
void ConvertRows(const simd::Rows& src, int64_t rows, int64_t out_rows, int64_t cols, bool round,
                 float* out);

// Key and value tiles converted to dense f32 once per Run, for the matmul path without a native
// bf16 matmul: a prefill's jobs for one head read the same tiles (once per query tile), and
// converting a bf16 or int8 tile on every read was 10% of a 2048-token prefill over bf16 blocks.
// A slot holds a whole tile (`width` rows, zero past the valid ones), so any job's cut serves.
// The first job to need a slot converts it; a job that finds it taken but not ready converts its
// own copy rather than wait. Memory is capped per Run (kMaxBytes); tiles past it are converted
// per job as before.
//
// The same store keeps whole tiles packed into the matmul primitives' own layout
// (onednn::PackWeights): a matmul over plain weights copies them into that layout on every call,
// and a causal prefill's key tile is read by every query tile after it. Which tiles are packed is
// decided (MarkPacked, in a fixed order) and they are packed (Pack) before the jobs run, so every
// job that reads a marked tile whole reads the same packed bytes: the output does not depend on
// the schedule.
//
// Thread-safety: Get may be called concurrently; each of its slots is written once. MarkPacked,
// then Pack (concurrently only for distinct slots), then PackedData, each phase finished before
// the next begins.
class ConvertedTiles {
 public:
  static constexpr int64_t kMaxBytes = int64_t{64} << 20;
  static constexpr int64_t kMaxPackedBytes = int64_t{64} << 20;

  explicit ConvertedTiles(const std::vector<Work>& works) {
    for (const Work& w : works) {
      first_slot_.push_back(static_cast<int64_t>(slots_size_));
      slots_size_ += static_cast<size_t>(2 * ((w.keys->keys + w.keys->width - 1) / w.keys->width));
    }
    slots_ = std::make_unique<Slot[]>(slots_size_);
    packed_ = std::make_unique<PackedSlot[]>(slots_size_);
  }

  // Marks tile `tile` of work `work` for packing, its keys into `key_bytes` and its values into
  // `value_bytes`. False, and no mark, when that would take the packed tiles past
  // kMaxPackedBytes.
  bool MarkPacked(int64_t work, int64_t tile, int64_t key_bytes, int64_t value_bytes) {
    if (packed_bytes_ + key_bytes + value_bytes > kMaxPackedBytes) return false;
    packed_bytes_ += key_bytes + value_bytes;
    PackedAt(work, tile, false).bytes = key_bytes;
    PackedAt(work, tile, true).bytes = value_bytes;
    return true;
  }

  // Whether tile `tile` of work `work` is marked for packing.
  bool Marked(int64_t work, int64_t tile) const { return PackedAt(work, tile, false).bytes > 0; }

  // Packs the marked tile's keys (values when `values`) with `pack(void* out)`, which writes the
  // marked bytes and returns whether it succeeded; after a failure the tile stays plain.
  template <typename PackFn>
  void Pack(int64_t work, int64_t tile, bool values, const PackFn& pack) {
    PackedSlot& slot = PackedAt(work, tile, values);
    slot.data.reset(static_cast<char*>(
        ::operator new (static_cast<size_t>(slot.bytes), std::align_val_t{kPackedAlignment})));
    if (!pack(static_cast<void*>(slot.data.get()))) {
      slot.data.reset();
      return;
    }
    packed_tiles_made.fetch_add(1, std::memory_order_relaxed);
  }

  // The packed keys (values when `values`) of tile `tile`; null when it is not marked or its
  // packing failed (jobs then read it plain).
  const void* PackedData(int64_t work, int64_t tile, bool values) const {
    return PackedAt(work, tile, values).data.get();
  }

  // Tiles' keys or values packed by every Run so far (for tests).
  static inline std::atomic<int64_t> packed_tiles_made{0};

  // Tile `tile` of work `work` (values when `values`) as dense f32 [width, cols], converted by
  // `convert` into the slot's memory the first time; null when another job is converting it or
  // the memory cap is reached.
  template <typename Convert>
  const float* Get(int64_t work, int64_t tile, bool values, int64_t width, int64_t cols,
                   const Convert& convert) {
    Slot& slot = slots_[Index(work, tile, values)];
    int state = slot.state.load(std::memory_order_acquire);
    if (state == kReady) return slot.data.get();
    if (state != kEmpty) return nullptr;
    const int64_t bytes = width * cols * static_cast<int64_t>(sizeof(float));
    if (bytes_.fetch_add(bytes, std::memory_order_relaxed) + bytes > kMaxBytes) {
      bytes_.fetch_sub(bytes, std::memory_order_relaxed);
      return nullptr;
    }
    if (!slot.state.compare_exchange_strong(state, kConverting, std::memory_order_acq_rel)) {
      bytes_.fetch_sub(bytes, std::memory_order_relaxed);
      return state == kReady ? slot.data.get() : nullptr;
    }
    slot.data.reset(new float[static_cast<size_t>(width * cols)]);  // written whole by `convert`
    convert(slot.data.get());
    slot.state.store(kReady, std::memory_order_release);
    return slot.data.get();
  }

 private:
  static constexpr int kEmpty = 0, kConverting = 1, kReady = 2;
  static constexpr size_t kPackedAlignment = 64;
  struct Slot {
    std::atomic<int> state{kEmpty};
    std::unique_ptr<float[]> data;
  };
  struct AlignedDelete {
    void operator()(char* p) const { ::operator delete (p, std::align_val_t{kPackedAlignment}); }
  };
  struct PackedSlot {
    int64_t bytes = 0;  // 0: not marked
    std::unique_ptr<char[], AlignedDelete> data;
  };
  size_t Index(int64_t work, int64_t tile, bool values) const {
    return static_cast<size_t>(first_slot_[static_cast<size_t>(work)] + 2 * tile +
                               (values ? 1 : 0));
  }
  PackedSlot& PackedAt(int64_t work, int64_t tile, bool values) {
    return packed_[Index(work, tile, values)];
  }
  const PackedSlot& PackedAt(int64_t work, int64_t tile, bool values) const {
    return packed_[Index(work, tile, values)];
  }
  std::vector<int64_t> first_slot_;
  size_t slots_size_ = 0;
  std::unique_ptr<Slot[]> slots_;
  std::atomic<int64_t> bytes_{0};
  std::unique_ptr<PackedSlot[]> packed_;
  int64_t packed_bytes_ = 0;
};

// A tile's two matmuls over `cols` keys, for `rows` query rows: q.k (the keys as weights, K^T,
// their rows `k_stride` apart) and p.v (the values, `v_stride` apart). Packed weights ignore
// the strides.
onednn::MatmulSpec ScoresSpec(int64_t rows, int64_t d, int64_t cols, int64_t k_stride, DType type);
onednn::MatmulSpec ValuesSpec(int64_t rows, int64_t cols, int64_t dv, int64_t v_stride, DType type);
// `spec` over packed weights.
onednn::MatmulSpec Packed(onednn::MatmulSpec spec);

// The bytes of a tile's keys and values packed for its two matmuls over kQueryTileRows query
// rows (0 where oneDNN has no packed primitive for the shapes), remembered per thread: every
// prefill call asks for each of its works, and the primitive cache's lookup builds a string key
// and takes a lock, twice per work. The first ask of a shape creates the packed primitives, in
// whichever call (the KV cache's warm-up) first plans packing for it.
std::pair<int64_t, int64_t> PackedTileBytes(int64_t width, int64_t d, int64_t dv, DType type);

// Packs tile `t`'s keys (values when `values`) of `job`'s work, whole, into `out`
// (PackedTileBytes' bytes) for the matmul over kQueryTileRows query rows that reads them; false
// when oneDNN fails. The operand is the one the plain path reads (TileOperand).
bool PackTile(const Job& job, int64_t t, bool values, void* out);

// Tile `t`'s keys (or values, with `values`; `valid` rows of `cols` at `src`) as its operand:
// for the f32 matmul path, from the Run's shared store when they need converting (bf16 or int8
// storage, or bf16 semantics over f32 that is not already rounded) and the store has them or
// can take them; otherwise as PrepareOperand makes them. `width` is the matmul's key count.
simd::Rows TileOperand(const Job& job, int64_t t, bool values, const simd::Rows& src, int64_t valid,
                       int64_t width, int64_t cols, bool kernels, std::vector<float>& f32,
                       std::vector<uint16_t>& bf16);

}  // namespace attend::tile

#endif  // ATTEND_CORE_ATTENTION_TILE_OPERANDS_H_
