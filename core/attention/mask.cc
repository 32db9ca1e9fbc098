#include "core/attention/mask.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace attend {

absl::Status ValidateMask(const MaskSpec& mask) {
  if (mask.window < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("mask.window_tokens: ", mask.window, "; must be >= 0 (0 = unlimited)"));
  }
  return absl::OkStatus();
}

namespace {

// The window as far as it matters: no query is n_q + n_kv or more positions from a key, so a
// longer window hides nothing, and clamping it keeps p +- window from overflowing int64.
int64_t EffectiveWindow(const MaskSpec& mask, int64_t n_q, int64_t n_kv) {
  return std::min(mask.window, n_q + n_kv);
}

}  // namespace

bool IsVisible(const MaskSpec& mask, int64_t n_q, int64_t n_kv, int64_t i, int64_t j) {
  const int64_t p = QueryPosition(n_q, n_kv, i);
  if (mask.causal && j > p) return false;
  if (mask.window > 0) {
    const int64_t distance = p >= j ? p - j : j - p;
    if (distance >= EffectiveWindow(mask, n_q, n_kv)) return false;
  }
  return true;
}

KeyRange VisibleKeys(const MaskSpec& mask, int64_t n_q, int64_t n_kv, int64_t i) {
  const int64_t p = QueryPosition(n_q, n_kv, i);
  int64_t begin = 0;
  int64_t end = n_kv;
  if (mask.causal) end = std::min(end, p + 1);
  if (mask.window > 0) {
    const int64_t window = EffectiveWindow(mask, n_q, n_kv);
    begin = std::max(begin, p - window + 1);
    if (!mask.causal) end = std::min(end, p + window);
  }
  return KeyRange{begin, std::max(begin, end)};
}

int64_t VisiblePairs(const MaskSpec& mask, int64_t n_q, int64_t n_kv) {
  int64_t pairs = 0;
  for (int64_t i = 0; i < n_q; ++i) pairs += VisibleKeys(mask, n_q, n_kv, i).size();
  return pairs;
}

std::vector<uint8_t> MaskTable(const MaskSpec& mask, int64_t n_q, int64_t n_kv) {
  std::vector<uint8_t> table(static_cast<size_t>(n_q * n_kv));
  for (int64_t i = 0; i < n_q; ++i) {
    for (int64_t j = 0; j < n_kv; ++j) table[i * n_kv + j] = IsVisible(mask, n_q, n_kv, i, j);
  }
  return table;
}

}  // namespace attend
