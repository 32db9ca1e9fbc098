#include "server/metrics_http.h"

#include <cstring>
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
    return Serve(connection, /*with_body=*/true);
  }
  bool handleHead(CivetServer*, mg_connection* connection) override {
    return Serve(connection, /*with_body=*/false);
  }

 private:
  // civetweb routes "/metrics/anything" here too, and compares paths without case: anything
  // but the exact path is not found.
  bool Serve(mg_connection* connection, bool with_body) const {
    const mg_request_info* info = mg_get_request_info(connection);
    if (info == nullptr || info->local_uri_raw == nullptr ||
        std::strcmp(info->local_uri_raw, "/metrics") != 0) {
      mg_printf(connection,
                "HTTP/1.1 404 Not Found\r\nContent-Type: text/plain\r\n"
                "Content-Length: 0\r\n\r\n");
      return true;
    }
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
    if (with_body) mg_write(connection, body.data(), body.size());
    return true;
  }

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
