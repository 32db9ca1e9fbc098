// A metric family of one unlabelled sample, for the collectors that read their values at scrape
// time (server/kv_cache_metrics.h, server/process_metrics.h).
#ifndef ATTEND_SERVER_METRIC_FAMILY_H_
#define ATTEND_SERVER_METRIC_FAMILY_H_

#include <string>

#include "prometheus/metric_family.h"
#include "prometheus/metric_type.h"

namespace attend::server {

// `type` is Counter or Gauge; the value goes in the matching field.
prometheus::MetricFamily OneSampleFamily(std::string name, std::string help,
                                         prometheus::MetricType type, double value);

}  // namespace attend::server

#endif  // ATTEND_SERVER_METRIC_FAMILY_H_
