// KV-cache metrics, read from the cache at scrape time so that they are never stale and cost
// nothing between scrapes:
//   attend_kv_cache_capacity_bytes, attend_kv_cache_used_bytes, attend_kv_cache_usage_ratio,
//   attend_kv_cache_block_bytes, attend_kv_cache_blocks (blocks in the pool; a gauge, so not
//   named _total), attend_kv_cache_blocks_used, attend_kv_cache_blocks_free,
//   attend_kv_cache_sequences, attend_kv_cache_tokens, attend_kv_cache_warmed_shapes,
//   attend_kv_cache_bookkeeping_bytes, attend_kv_cache_bookkeeping_limit_bytes (gauges),
//   attend_kv_cache_evictions_total, attend_kv_cache_rejections_total (counters).
// And the engine's cache of oneDNN primitives, which grows with the shapes seen:
//   attend_matmul_cache_primitives, attend_matmul_cache_capacity (gauges),
//   attend_matmul_primitive_creations_total, attend_matmul_cache_evictions_total (counters).
//
// Thread-safety: Collect() may run concurrently with cache operations.
#ifndef ATTEND_SERVER_KV_CACHE_METRICS_H_
#define ATTEND_SERVER_KV_CACHE_METRICS_H_

#include <vector>

#include "core/kv_cache/kv_cache.h"
#include "prometheus/collectable.h"
#include "prometheus/metric_family.h"

namespace attend::server {

class KvCacheCollector : public prometheus::Collectable {
 public:
  // `cache` must outlive the collector's registration.
  explicit KvCacheCollector(kv::KvCache* cache) : cache_(cache) {}
  std::vector<prometheus::MetricFamily> Collect() const override;

 private:
  kv::KvCache* cache_;
};

class MatmulCacheCollector : public prometheus::Collectable {
 public:
  std::vector<prometheus::MetricFamily> Collect() const override;
};

}  // namespace attend::server

#endif  // ATTEND_SERVER_KV_CACHE_METRICS_H_
