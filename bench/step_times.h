// Per-iteration times of a benchmark case, for figures that hold up on a shared, noisy machine.
//
// The limits a case is compared with (bench/machine_limits.h) are each the best of several
// short runs: what the machine does when nothing else is running. A case's mean over its
// iterations mixes in whatever other tenants did meanwhile, so a mean-based ratio understates
// the engine by as much as the noise. Cases therefore report two ratios: best iteration against
// best probe (like with like), and median iteration against the same probe (a floor that a
// single lucky iteration cannot lift).
#ifndef ATTEND_BENCH_STEP_TIMES_H_
#define ATTEND_BENCH_STEP_TIMES_H_

#include <algorithm>
#include <vector>

namespace attend::bench {

// Not thread-safe; one per benchmark case.
class StepTimes {
 public:
  void Add(double seconds) { seconds_.push_back(seconds); }
  bool empty() const { return seconds_.empty(); }
  // REQUIRES: !empty().
  double Best() const { return *std::min_element(seconds_.begin(), seconds_.end()); }
  // The upper median for an even count (the less flattering of the two middle times).
  double Median() const {
    std::vector<double> sorted = seconds_;
    std::sort(sorted.begin(), sorted.end());
    return sorted[sorted.size() / 2];
  }

 private:
  std::vector<double> seconds_;
};

}  // namespace attend::bench

#endif  // ATTEND_BENCH_STEP_TIMES_H_
