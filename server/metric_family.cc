#include "server/metric_family.h"

#include <utility>

namespace attend::server {

prometheus::MetricFamily OneSampleFamily(std::string name, std::string help,
                                         prometheus::MetricType type, double value) {
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

}  // namespace attend::server
