// The generator of java.util.Random: a 48-bit linear congruential generator with the polar
// (Marsaglia) method for Gaussians. attend uses it where a seed must give the same numbers as the
// lessons' programs, so that their seeded tables reproduce through the API exactly; it is not a
// good generator for anything else.
//
// Thread-safety: not thread-safe; use one instance per thread.
#ifndef ATTEND_CORE_LESSONS_JAVA_RANDOM_H_
#define ATTEND_CORE_LESSONS_JAVA_RANDOM_H_

#include <cstdint>

namespace attend {

class JavaRandom {
 public:
  explicit JavaRandom(int64_t seed);

  // The next `bits` (1..32) pseudo-random bits, as Java's protected next(bits).
  int32_t Next(int bits);
  // Uniform in [0, 1) with 53 random bits.
  double NextDouble();
  // Standard normal; values come in pairs, the second cached for the next call.
  double NextGaussian();

 private:
  uint64_t seed_;
  bool have_next_gaussian_ = false;
  double next_gaussian_ = 0.0;
};

// Natural logarithm exactly as Java's StrictMath.log (fdlibm 5.3 e_log.c), bit for bit.
double FdlibmLog(double x);

}  // namespace attend

#endif  // ATTEND_CORE_LESSONS_JAVA_RANDOM_H_
