// AttendServer::Start's checks of its options: addresses it cannot listen on are refused before
// anything listens, naming the option.
#include "server/server.h"

#include "tests/server/server_fixture.h"
#include "tests/test_util.h"

namespace attend {
namespace {

using ::attend::testing::StatusIs;

TEST(AttendServer, RefusesPortsOutsideTheirRange) {
  // 99999 used to be taken modulo 65536 (and the server listened on 34463).
  for (const char* address : {"127.0.0.1:99999", "127.0.0.1:65536", "127.0.0.1:-1",
                              "127.0.0.1:http", "127.0.0.1:", "127.0.0.1"}) {
    server::ServerOptions options = ::attend::testing::SmallServerOptions();
    options.address = address;
    EXPECT_THAT(server::AttendServer::Start(options).status(),
                StatusIs(absl::StatusCode::kInvalidArgument, {"address", address}));
    options = ::attend::testing::SmallServerOptions();
    options.metrics_address = address;
    EXPECT_THAT(server::AttendServer::Start(options).status(),
                StatusIs(absl::StatusCode::kInvalidArgument, {"metrics_address", address}));
  }
  server::ServerOptions options = ::attend::testing::SmallServerOptions();
  options.address = "[::1]:0";
  auto started = server::AttendServer::Start(options);
  if (started.ok()) {  // IPv6 loopback may be unavailable here
    EXPECT_GT((*started)->port(), 0);
  }
}

}  // namespace
}  // namespace attend
