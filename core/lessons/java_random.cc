#include "core/lessons/java_random.h"

#include <cmath>
#include <cstring>

namespace attend {
namespace {
constexpr uint64_t kMultiplier = 0x5DEECE66DULL;
constexpr uint64_t kAddend = 0xBULL;
constexpr uint64_t kMask = (uint64_t{1} << 48) - 1;

double FromBits(uint64_t bits) {
  double d;
  std::memcpy(&d, &bits, sizeof(d));
  return d;
}

uint64_t ToBits(double d) {
  uint64_t bits;
  std::memcpy(&bits, &d, sizeof(bits));
  return bits;
}

int32_t High(double d) { return static_cast<int32_t>(ToBits(d) >> 32); }

double WithHigh(double d, int32_t high) {
  return FromBits((static_cast<uint64_t>(static_cast<uint32_t>(high)) << 32) |
                  (ToBits(d) & 0xffffffffULL));
}

}  // namespace

// fdlibm 5.3's e_log.c, transcribed statement for statement: Java's StrictMath.log is specified
// as this algorithm, and glibc's log differs from it in the last bit for some arguments, which
// changes nextGaussian for some seeds (draws of seed 1 in java_random_test among them). The
// original's notice:
//
//   Copyright (C) 1993 by Sun Microsystems, Inc. All rights reserved.
//   Developed at SunSoft, a Sun Microsystems, Inc. business.
//   Permission to use, copy, modify, and distribute this software is freely granted, provided
//   that this notice is preserved.
double FdlibmLog(double x) {
  const double ln2_hi = FromBits(0x3fe62e42fee00000ULL);
  const double ln2_lo = FromBits(0x3dea39ef35793c76ULL);
  const double two54 = FromBits(0x4350000000000000ULL);
  const double lg1 = FromBits(0x3fe5555555555593ULL);
  const double lg2 = FromBits(0x3fd999999997fa04ULL);
  const double lg3 = FromBits(0x3fd2492494229359ULL);
  const double lg4 = FromBits(0x3fcc71c51d8e78afULL);
  const double lg5 = FromBits(0x3fc7466496cb03deULL);
  const double lg6 = FromBits(0x3fc39a09d078c69fULL);
  const double lg7 = FromBits(0x3fc2f112df3e5244ULL);
  const double zero = 0.0;

  int32_t hx = High(x);
  const uint32_t lx = static_cast<uint32_t>(ToBits(x));
  int32_t k = 0;
  if (hx < 0x00100000) {                                      // x < 2**-1022
    if (((hx & 0x7fffffff) | lx) == 0) return -two54 / zero;  // log(+-0) = -inf
    if (hx < 0) return (x - x) / zero;                        // log(-#) = NaN
    k -= 54;
    x *= two54;  // subnormal: scale up
    hx = High(x);
  }
  if (hx >= 0x7ff00000) return x + x;
  k += (hx >> 20) - 1023;
  hx &= 0x000fffff;
  int32_t i = (hx + 0x95f64) & 0x100000;
  x = WithHigh(x, hx | (i ^ 0x3ff00000));  // normalize x or x/2
  k += (i >> 20);
  const double f = x - 1.0;
  double dk;
  if ((0x000fffff & (2 + hx)) < 3) {  // |f| < 2**-20
    if (f == zero) {
      if (k == 0) return zero;
      dk = static_cast<double>(k);
      return dk * ln2_hi + dk * ln2_lo;
    }
    const double r = f * f * (0.5 - 0.33333333333333333 * f);
    if (k == 0) return f - r;
    dk = static_cast<double>(k);
    return dk * ln2_hi - ((r - dk * ln2_lo) - f);
  }
  const double s = f / (2.0 + f);
  dk = static_cast<double>(k);
  const double z = s * s;
  i = hx - 0x6147a;
  const double w = z * z;
  const int32_t j = 0x6b851 - hx;
  const double t1 = w * (lg2 + w * (lg4 + w * lg6));
  const double t2 = z * (lg1 + w * (lg3 + w * (lg5 + w * lg7)));
  i |= j;
  const double r = t2 + t1;
  if (i > 0) {
    const double hfsq = 0.5 * f * f;
    if (k == 0) return f - (hfsq - s * (hfsq + r));
    return dk * ln2_hi - ((hfsq - (s * (hfsq + r) + dk * ln2_lo)) - f);
  }
  if (k == 0) return f - s * (f - r);
  return dk * ln2_hi - ((s * (f - r) - dk * ln2_lo) - f);
}

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
  // Java: StrictMath.sqrt(-2 * StrictMath.log(s) / s). sqrt is correctly rounded everywhere;
  // log must be fdlibm's.
  const double multiplier = std::sqrt(-2 * FdlibmLog(s) / s);
  next_gaussian_ = v2 * multiplier;
  have_next_gaussian_ = true;
  return v1 * multiplier;
}

}  // namespace attend
