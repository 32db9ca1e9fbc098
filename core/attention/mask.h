// Which keys a query may see: the causal mask and the sliding window.
//
// Queries are aligned to the end of the keys: query i of n_q sits at position
// p(i) = n_kv - n_q + i. A decode step (n_q = 1) therefore sees every cached key, a prefill
// (n_q = n_kv) sees the usual lower triangle, and when n_q > n_kv the first n_q - n_kv queries
// come before every key and see nothing (their attention output is defined as 0).
//
// Thread-safety: pure functions.
#ifndef ATTEND_CORE_ATTENTION_MASK_H_
#define ATTEND_CORE_ATTENTION_MASK_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"

namespace attend {

struct MaskSpec {
  // Hide keys after the query's position.
  bool causal = false;
  // 0 = unlimited. Causal: keys in (p - window, p]. Not causal: keys with |p - j| < window.
  int64_t window = 0;
};

// INVALID_ARGUMENT when the window is negative.
absl::Status ValidateMask(const MaskSpec& mask);

// Position of query i among n_kv keys (may be negative when n_q > n_kv).
inline int64_t QueryPosition(int64_t n_q, int64_t n_kv, int64_t i) { return n_kv - n_q + i; }

// Whether query i may see key j: the definition every faster path is tested against.
bool IsVisible(const MaskSpec& mask, int64_t n_q, int64_t n_kv, int64_t i, int64_t j);

// The keys query i may see form one contiguous range [begin, end); empty when begin >= end.
struct KeyRange {
  int64_t begin = 0;
  int64_t end = 0;
  int64_t size() const { return end > begin ? end - begin : 0; }
};
KeyRange VisibleKeys(const MaskSpec& mask, int64_t n_q, int64_t n_kv, int64_t i);

// Number of visible (query, key) pairs for one head, in O(n_q).
int64_t VisiblePairs(const MaskSpec& mask, int64_t n_q, int64_t n_kv);

// The n_q x n_kv table of IsVisible (row-major, 1 = visible), for display and tests.
std::vector<uint8_t> MaskTable(const MaskSpec& mask, int64_t n_q, int64_t n_kv);

}  // namespace attend

#endif  // ATTEND_CORE_ATTENTION_MASK_H_
