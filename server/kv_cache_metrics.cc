#include "server/kv_cache_metrics.h"

#include <string>

#include "core/kernels/onednn.h"
#include "server/metric_family.h"

namespace attend::server {

std::vector<prometheus::MetricFamily> KvCacheCollector::Collect() const {
  const kv::CacheStats s = cache_->Stats();
  using prometheus::MetricType;
  const double capacity = static_cast<double>(s.capacity_bytes);
  return {
      OneSampleFamily("attend_kv_cache_capacity_bytes",
                      "Bytes the KV cache may use (--kv_cache_bytes, whole blocks)",
                      MetricType::Gauge, capacity),
      OneSampleFamily("attend_kv_cache_used_bytes", "Bytes of KV-cache blocks in use",
                      MetricType::Gauge, static_cast<double>(s.used_bytes)),
      OneSampleFamily("attend_kv_cache_usage_ratio", "Used over capacity", MetricType::Gauge,
                      capacity > 0 ? s.used_bytes / capacity : 0.0),
      OneSampleFamily("attend_kv_cache_block_bytes", "Bytes per block", MetricType::Gauge,
                      static_cast<double>(s.block_bytes)),
      OneSampleFamily("attend_kv_cache_blocks", "Blocks in the pool", MetricType::Gauge,
                      static_cast<double>(s.blocks_total)),
      OneSampleFamily("attend_kv_cache_blocks_used", "Blocks in use", MetricType::Gauge,
                      static_cast<double>(s.blocks_used)),
      OneSampleFamily("attend_kv_cache_blocks_free", "Blocks free", MetricType::Gauge,
                      static_cast<double>(s.blocks_free)),
      OneSampleFamily("attend_kv_cache_sequences", "Sequences held", MetricType::Gauge,
                      static_cast<double>(s.sequences)),
      OneSampleFamily("attend_kv_cache_tokens", "Tokens cached, summed over sequences and layers",
                      MetricType::Gauge, static_cast<double>(s.tokens)),
      OneSampleFamily("attend_kv_cache_evictions_total", "Sequences evicted by the eviction policy",
                      MetricType::Counter, static_cast<double>(s.evictions)),
      OneSampleFamily("attend_kv_cache_rejections_total",
                      "Requests refused because the cache (or its sequence limit) was full",
                      MetricType::Counter, static_cast<double>(s.rejections)),
      OneSampleFamily("attend_kv_cache_bookkeeping_bytes",
                      "Bytes the sequences' bookkeeping takes outside the blocks (block tables)",
                      MetricType::Gauge, static_cast<double>(s.bookkeeping_bytes)),
      OneSampleFamily("attend_kv_cache_bookkeeping_limit_bytes",
                      "Most bytes the sequences' bookkeeping may take (--kv_bookkeeping_bytes)",
                      MetricType::Gauge, static_cast<double>(s.bookkeeping_limit_bytes)),
      OneSampleFamily("attend_kv_cache_warmed_shapes",
                      "Sequence shapes whose prefill primitives were created at their first Create",
                      MetricType::Gauge, static_cast<double>(s.warmed_shapes)),
  };
}

std::vector<prometheus::MetricFamily> MatmulCacheCollector::Collect() const {
  using prometheus::MetricType;
  const onednn::MatmulCacheStats s = onednn::GetMatmulCacheStats();
  return {
      OneSampleFamily(
          "attend_matmul_cache_primitives",
          "oneDNN matmul primitives kept for reuse (least recently used dropped past the "
          "capacity)",
          MetricType::Gauge, static_cast<double>(s.entries)),
      OneSampleFamily("attend_matmul_cache_capacity",
                      "Most matmul primitives kept (--matmul_cache_entries)", MetricType::Gauge,
                      static_cast<double>(s.capacity)),
      OneSampleFamily("attend_matmul_primitive_creations_total",
                      "Matmul primitives created (cache misses; each costs about 0.3 ms)",
                      MetricType::Counter, static_cast<double>(s.creations)),
      OneSampleFamily("attend_matmul_cache_evictions_total",
                      "Matmul primitives dropped to stay within the capacity", MetricType::Counter,
                      static_cast<double>(s.evictions)),
  };
}

}  // namespace attend::server
