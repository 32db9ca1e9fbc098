#include "server/kv_cache_metrics.h"

#include <string>

namespace attend::server {
namespace {

prometheus::MetricFamily Family(std::string name, std::string help, prometheus::MetricType type,
                                double value) {
  prometheus::MetricFamily family;
  family.name = std::move(name);
  family.help = std::move(help);
  family.type = type;
  prometheus::ClientMetric metric;
  if (type == prometheus::MetricType::Counter) {
    metric.counter.value = value;
  } else {
    metric.gauge.value = value;
  }
  family.metric.push_back(metric);
  return family;
}

}  // namespace

std::vector<prometheus::MetricFamily> KvCacheCollector::Collect() const {
  const kv::CacheStats s = cache_->Stats();
  using prometheus::MetricType;
  const double capacity = static_cast<double>(s.capacity_bytes);
  return {
      Family("attend_kv_cache_capacity_bytes",
             "Bytes the KV cache may use (--kv_cache_bytes, whole blocks)", MetricType::Gauge,
             capacity),
      Family("attend_kv_cache_used_bytes", "Bytes of KV-cache blocks in use", MetricType::Gauge,
             static_cast<double>(s.used_bytes)),
      Family("attend_kv_cache_usage_ratio", "Used over capacity", MetricType::Gauge,
             capacity > 0 ? s.used_bytes / capacity : 0.0),
      Family("attend_kv_cache_block_bytes", "Bytes per block", MetricType::Gauge,
             static_cast<double>(s.block_bytes)),
      Family("attend_kv_cache_blocks_total", "Blocks in the pool", MetricType::Gauge,
             static_cast<double>(s.blocks_total)),
      Family("attend_kv_cache_blocks_used", "Blocks in use", MetricType::Gauge,
             static_cast<double>(s.blocks_used)),
      Family("attend_kv_cache_blocks_free", "Blocks free", MetricType::Gauge,
             static_cast<double>(s.blocks_free)),
      Family("attend_kv_cache_sequences", "Sequences held", MetricType::Gauge,
             static_cast<double>(s.sequences)),
      Family("attend_kv_cache_tokens", "Tokens cached, summed over sequences and layers",
             MetricType::Gauge, static_cast<double>(s.tokens)),
      Family("attend_kv_cache_evictions_total", "Sequences evicted by the eviction policy",
             MetricType::Counter, static_cast<double>(s.evictions)),
      Family("attend_kv_cache_rejections_total",
             "Requests refused because the cache (or its sequence limit) was full",
             MetricType::Counter, static_cast<double>(s.rejections)),
  };
}

}  // namespace attend::server
