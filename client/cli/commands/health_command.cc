// `attend health`: grpc.health.v1 for the server as a whole and each attend.v1 service.
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/attention_client.h"
#include "client/cli/commands/commands.h"
#include "client/cli/connect/report_error.h"
#include "client/cli/framework/command.h"
#include "client/cli/render/format.h"

namespace attend::cli {
namespace {

struct HealthOptions {
  std::optional<std::string> service;

  void Declare(Flags& f) {
    f.Add("service", &service, "check only this service (\"\" = the server as a whole)");
  }
};

int RunHealth(Context& c, const HealthOptions& o) {
  std::vector<std::string> services;
  if (o.service) {
    services.push_back(*o.service);
  } else {
    services = {"", "attend.v1.Attention", "attend.v1.KvCache", "attend.v1.Planner"};
  }
  Table table({"service", "status"});
  std::string json = "{";
  bool all_serving = true;
  for (const std::string& service : services) {
    absl::StatusOr<std::string> status =
        client::CheckHealth(c.Channel(), service, c.connection.deadline);
    if (!status.ok()) return ReportError(c, status.status());
    all_serving = all_serving && *status == "SERVING";
    table.AddRow({service.empty() ? "(server)" : service, *status});
    absl::StrAppend(&json, json.size() > 1 ? ", " : "",
                    JsonString(service.empty() ? "server" : service), ": ", JsonString(*status));
  }
  *c.out << (c.json ? json + "}\n" : table.Render(TableStyleFromFlags(c.no_headers, c.wide)));
  return all_serving ? kExitOk : kExitNotServing;
}

}  // namespace

std::vector<Command> HealthCommands() {
  Command health{"health", "report whether the server and each service is SERVING",
                 "attend health [--service=<name>]",
                 "Exits 0 when every service asked about is SERVING, 5 otherwise.\n"
                 "Examples:\n  attend health\n  attend health --service attend.v1.Attention\n"};
  health.define = Define(RunHealth);
  return {health};
}

}  // namespace attend::cli
