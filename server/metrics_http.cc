#include "server/metrics_http.h"

#include <exception>
#include <utility>

#include "CivetServer.h"
#include "absl/status/status.h"
#include "civetweb.h"
#include "prometheus/metric_family.h"
#include "prometheus/text_serializer.h"

namespace attend::server {

class MetricsHttpServer::Handler : public CivetHandler {
 public:
  explicit Handler(std::vector<std::shared_ptr<prometheus::Collectable>> collectables)
      : collectables_(std::move(collectables)) {}

  bool handleGet(CivetServer*, mg_connection* connection) override {
    std::vector<prometheus::MetricFamily> families;
    for (const auto& collectable : collectables_) {
      std::vector<prometheus::MetricFamily> more = collectable->Collect();
      families.insert(families.end(), std::make_move_iterator(more.begin()),
                      std::make_move_iterator(more.end()));
    }
    const std::string body = prometheus::TextSerializer().Serialize(families);
    mg_printf(connection,
              "HTTP/1.1 200 OK\r\n"
              "Content-Type: text/plain; charset=utf-8\r\n"
              "Content-Length: %zu\r\n\r\n",
              body.size());
    mg_write(connection, body.data(), body.size());
    return true;
  }

 private:
  // Fixed at construction, so scrapes read it without a lock.
  const std::vector<std::shared_ptr<prometheus::Collectable>> collectables_;
};

absl::StatusOr<std::unique_ptr<MetricsHttpServer>> MetricsHttpServer::Start(
    const std::vector<std::string>& civetweb_options,
    std::vector<std::shared_ptr<prometheus::Collectable>> collectables) {
  std::unique_ptr<MetricsHttpServer> self(new MetricsHttpServer());
  self->handler_ = std::make_unique<Handler>(std::move(collectables));
  try {
    // Throws CivetException when civetweb cannot start (a bad option, a port in use).
    self->server_ = std::make_unique<CivetServer>(civetweb_options);
  } catch (const std::exception& e) {
    return absl::UnavailableError(e.what());
  }
  self->server_->addHandler("/metrics", self->handler_.get());
  return self;
}

MetricsHttpServer::~MetricsHttpServer() {
  // Stop first: civetweb's threads may be inside the handler until close() returns.
  if (server_) server_->close();
}

std::vector<int> MetricsHttpServer::ListeningPorts() const { return server_->getListeningPorts(); }

}  // namespace attend::server
