// How many replicas a fleet needs when a consistent-hash proxy places the sequences.
//
// attend keeps each sequence's KV cache in one replica, and the proxy picks the replica by
// hashing the sequence key: nginx's `hash $http_x_attend_sequence_key consistent` (deploy/nginx/)
// puts 160 points per replica on a ring of 2^32 and sends a key to the first point after its
// hash. So replicas own unequal shares of the keys (about 1/sqrt(160) = 8% apart), and the keys
// that arrive fall unevenly on top of that: the busiest replica holds more than the mean.
//
// Model: a replica's share of the ring is the sum of the 160 gaps before its points, close to a
// Gamma(160, 1/(160 R)) variable; with N keys hashed independently its sequence count is then
// negative binomial with mean mu = N / R and variance mu + mu^2 / 160. The busiest of R replicas
// at quantile q is where that distribution's CDF reaches q^(1/R) (replicas taken as
// independent, which overstates the spread of very few replicas: safe), summed term by term for
// means up to 4096 and from the Cornish-Fisher expansion above (the count is right-skewed, which
// a plain normal quantile underestimates). A simulation of nginx's ring in the test checks it: at
// the replica count this plans, the busiest replica stays within capacity in at least 97% of random
// rings and key sets, and the planned load is within a few percent of the simulated 99th
// percentile.
//
// Thread-safety: pure functions.
#ifndef ATTEND_PLANNER_FLEET_H_
#define ATTEND_PLANNER_FLEET_H_

#include <cstdint>

namespace attend::planner {

// nginx's ketama ring: points per replica of weight 1 (ngx_http_upstream_hash_module).
inline constexpr int kRingPointsPerReplica = 160;
// The quantile the fleet is sized at: the busiest replica fits in 99 of 100 fleets.
inline constexpr double kFleetQuantile = 0.99;
// Most replicas a plan considers.
inline constexpr int64_t kMaxReplicas = int64_t{1} << 20;

// The sequence count of the busiest of `replicas` replicas when `sequences` keys are placed by
// the ring above, at `quantile`: between ceil(sequences / replicas) and sequences; exactly
// `sequences` for one replica. Requires sequences >= 0, 1 <= replicas, 0 < quantile < 1.
int64_t BusiestReplicaSequences(int64_t sequences, int64_t replicas,
                                double quantile = kFleetQuantile);

struct FleetSizing {
  // ceil(sequences / per_replica): the replicas if the proxy spread sequences evenly.
  int64_t even_replicas = 0;
  // The fewest replicas whose busiest (at kFleetQuantile) holds at most per_replica; 0 when no
  // count up to kMaxReplicas does (per_replica too small for hashing's spread) or per_replica is 0.
  int64_t replicas = 0;
  int64_t busiest_sequences = 0;  // BusiestReplicaSequences at `replicas` (0 when replicas is 0)
};

// Sizes the fleet for `sequences` concurrent sequences when one replica holds `per_replica`.
// Requires sequences >= 1, per_replica >= 0.
FleetSizing SizeFleet(int64_t sequences, int64_t per_replica);

}  // namespace attend::planner

#endif  // ATTEND_PLANNER_FLEET_H_
