// Where the tile loop (tile_attention.cc) finds a tile's keys and values in the form a path
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
#include <vector>

#include "core/attention/tile_attention.h"
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
// Thread-safety: Get may be called concurrently; each slot is written once.
class ConvertedTiles {
 public:
  static constexpr int64_t kMaxBytes = int64_t{64} << 20;

  explicit ConvertedTiles(const std::vector<Work>& works) {
    for (const Work& w : works) {
      first_slot_.push_back(static_cast<int64_t>(slots_size_));
      slots_size_ += static_cast<size_t>(2 * ((w.keys->keys + w.keys->width - 1) / w.keys->width));
    }
    slots_ = std::make_unique<Slot[]>(slots_size_);
  }

  // Tile `tile` of work `work` (values when `values`) as dense f32 [width, cols], converted by
  // `convert` into the slot's memory the first time; null when another job is converting it or
  // the memory cap is reached.
  template <typename Convert>
  const float* Get(int64_t work, int64_t tile, bool values, int64_t width, int64_t cols,
                   const Convert& convert) {
    Slot& slot = slots_[static_cast<size_t>(first_slot_[static_cast<size_t>(work)] + 2 * tile +
                                            (values ? 1 : 0))];
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
  struct Slot {
    std::atomic<int> state{kEmpty};
    std::unique_ptr<float[]> data;
  };
  std::vector<int64_t> first_slot_;
  size_t slots_size_ = 0;
  std::unique_ptr<Slot[]> slots_;
  std::atomic<int64_t> bytes_{0};
};

// Tile `t`'s keys (or values, with `values`; `valid` rows of `cols` at `src`) as its operand:
// for the f32 matmul path, from the Run's shared store when they need converting (bf16 or int8
// storage, or bf16 semantics over f32 that is not already rounded) and the store has them or
// can take them; otherwise as PrepareOperand makes them. `width` is the matmul's key count.
simd::Rows TileOperand(const Job& job, int64_t t, bool values, const simd::Rows& src, int64_t valid,
                       int64_t width, int64_t cols, bool kernels, std::vector<float>& f32,
                       std::vector<uint16_t>& bf16);

}  // namespace attend::tile

#endif  // ATTEND_CORE_ATTENTION_TILE_OPERANDS_H_
