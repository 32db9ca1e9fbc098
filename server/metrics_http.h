// The /metrics HTTP endpoint: the Prometheus text format of a fixed set of collectables, served
// by civetweb. It takes the place of prometheus::Exposer, which always adds its own exposer_*
// families to the scrape (among them a summary whose quantiles print NaN while idle) and has
// no option to leave them out. Otherwise it answers as the Exposer did: GET /metrics (and
// paths below it) with "200 OK", "Content-Type: text/plain; charset=utf-8" and a
// Content-Length; other paths are civetweb's 404. No gzip.
//
// Thread-safety: scrapes run on civetweb's threads, concurrently with each other, so every
// collectable's Collect() must be thread-safe. The object's own methods are thread-safe.
#ifndef ATTEND_SERVER_METRICS_HTTP_H_
#define ATTEND_SERVER_METRICS_HTTP_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "prometheus/collectable.h"

class CivetServer;

namespace attend::server {

class MetricsHttpServer {
 public:
  // Serves `collectables`, in this order, with civetweb's `civetweb_options` (name, value,
  // name, value...: listening_ports, num_threads, request_timeout_ms...). UNAVAILABLE with
  // civetweb's reason when it cannot start (e.g. the port is taken).
  static absl::StatusOr<std::unique_ptr<MetricsHttpServer>> Start(
      const std::vector<std::string>& civetweb_options,
      std::vector<std::shared_ptr<prometheus::Collectable>> collectables);

  // Stops listening and waits for the scrapes in progress.
  ~MetricsHttpServer();

  MetricsHttpServer(const MetricsHttpServer&) = delete;
  MetricsHttpServer& operator=(const MetricsHttpServer&) = delete;

  std::vector<int> ListeningPorts() const;

 private:
  class Handler;
  MetricsHttpServer() = default;

  std::unique_ptr<Handler> handler_;  // outlives server_, which calls it
  std::unique_ptr<CivetServer> server_;
};

}  // namespace attend::server

#endif  // ATTEND_SERVER_METRICS_HTTP_H_
