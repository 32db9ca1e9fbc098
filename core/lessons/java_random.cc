#include "core/lessons/java_random.h"

#include <cmath>

namespace attend {
namespace {
constexpr uint64_t kMultiplier = 0x5DEECE66DULL;
constexpr uint64_t kAddend = 0xBULL;
constexpr uint64_t kMask = (uint64_t{1} << 48) - 1;
}  // namespace

JavaRandom::JavaRandom(int64_t seed) : seed_((static_cast<uint64_t>(seed) ^ kMultiplier) & kMask) {}

int32_t JavaRandom::Next(int bits) {
  seed_ = (seed_ * kMultiplier + kAddend) & kMask;
  // Java shifts the 48-bit state right and truncates to int (two's complement).
  return static_cast<int32_t>(static_cast<uint32_t>(seed_ >> (48 - bits)));
}

double JavaRandom::NextDouble() {
  const int64_t high = Next(26);
  const int64_t low = Next(27);
  return static_cast<double>((high << 27) + low) * 0x1.0p-53;
}

double JavaRandom::NextGaussian() {
  if (have_next_gaussian_) {
    have_next_gaussian_ = false;
    return next_gaussian_;
  }
  double v1, v2, s;
  do {
    v1 = 2 * NextDouble() - 1;
    v2 = 2 * NextDouble() - 1;
    s = v1 * v1 + v2 * v2;
  } while (s >= 1 || s == 0);
  const double multiplier = std::sqrt(-2 * std::log(s) / s);
  next_gaussian_ = v2 * multiplier;
  have_next_gaussian_ = true;
  return v1 * multiplier;
}

}  // namespace attend
