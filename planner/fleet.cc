#include "planner/fleet.h"

#include <algorithm>
#include <cmath>

namespace attend::planner {
namespace {

// The standard normal quantile of p in (0, 1), by bisection on erfc: 100 halvings of [-40, 40]
// reach double precision, and this runs a few dozen times per plan.
double NormalQuantile(double p) {
  double lo = -40.0, hi = 40.0;
  for (int i = 0; i < 100; ++i) {
    const double mid = 0.5 * (lo + hi);
    if (0.5 * std::erfc(-mid / std::sqrt(2.0)) < p) {
      lo = mid;
    } else {
      hi = mid;
    }
  }
  return 0.5 * (lo + hi);
}

}  // namespace

// Means up to this are summed term by term (exact, and the skewed small counts are where an
// expansion is poor); above it p^k underflows towards 0 and the expansion is accurate.
constexpr double kMaxSummedMean = 4096.0;

int64_t BusiestReplicaSequences(int64_t sequences, int64_t replicas, double quantile) {
  if (replicas <= 1 || sequences == 0) return sequences;
  const double n = static_cast<double>(sequences);
  const double r = static_cast<double>(replicas);
  const double k = kRingPointsPerReplica;
  const double mean = n / r;
  const int64_t even = (sequences + replicas - 1) / replicas;
  // P(max <= c) = F(c)^R >= quantile  <=>  F(c) >= quantile^(1/R). Negative binomial with shape
  // k and mean `mean`: success probability p = k / (k + mean).
  const double target = std::pow(quantile, 1.0 / r);
  const double p = k / (k + mean);
  if (mean <= kMaxSummedMean) {
    // P(0) = p^k, P(c + 1) = P(c) (k + c) / (c + 1) (1 - p).
    double pmf = std::exp(k * std::log(p));
    double cdf = pmf;
    int64_t c = 0;
    while (cdf < target && c < sequences) {
      pmf *= (k + static_cast<double>(c)) / static_cast<double>(c + 1) * (1.0 - p);
      ++c;
      cdf += pmf;
    }
    return std::max(even, c);
  }
  const double sd = std::sqrt(mean + mean * mean / k);
  const double skew = (2.0 - p) / std::sqrt(k * (1.0 - p));
  const double z = NormalQuantile(target);
  const double busiest = mean + sd * (z + (z * z - 1.0) * skew / 6.0);
  if (!(busiest < n)) return sequences;  // also catches NaN
  return std::max(even, static_cast<int64_t>(std::ceil(busiest)));
}

FleetSizing SizeFleet(int64_t sequences, int64_t per_replica) {
  FleetSizing s;
  if (per_replica <= 0) return s;
  s.even_replicas = (sequences + per_replica - 1) / per_replica;
  const auto fits = [&](int64_t replicas) {
    return BusiestReplicaSequences(sequences, replicas) <= per_replica;
  };
  if (s.even_replicas > kMaxReplicas) return s;
  // The busiest replica's load falls as replicas are added: grow the count until it fits, then
  // bisect between the last miss and the first fit.
  int64_t miss = s.even_replicas - 1, fit = s.even_replicas;
  while (!fits(fit)) {
    if (fit >= kMaxReplicas) return s;
    miss = fit;
    fit = std::min(kMaxReplicas, std::max(fit + 1, fit * 2));
  }
  while (fit - miss > 1) {
    const int64_t mid = miss + (fit - miss) / 2;
    (fits(mid) ? fit : miss) = mid;
  }
  s.replicas = fit;
  s.busiest_sequences = BusiestReplicaSequences(sequences, fit);
  return s;
}

}  // namespace attend::planner
