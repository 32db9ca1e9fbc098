// The fleet's routing rule, enforced where the calls arrive (common/sequence_key.h states it):
// a call's x-attend-sequence-key must be the routing key of every sequence its body names, and
// a call that the proxy forwarded must send one. A replica cannot see where the proxy would
// have sent another key; it can refuse every call whose key and body disagree, which is what
// keeps one id from naming two sequences in a fleet, and a fork or a generated id reachable.
//
// Thread-safety: Route is a value; the functions are pure.
#ifndef ATTEND_SERVER_ROUTING_H_
#define ATTEND_SERVER_ROUTING_H_

#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "grpcpp/server_context.h"

namespace attend::server {

// What a call says about its routing, read from its metadata.
struct Route {
  std::optional<std::string> key;  // x-attend-sequence-key, when sent and not empty
  bool proxied = false;            // x-attend-proxy was set (by the fleet's proxy)
};

Route RouteOf(const grpc::CallbackServerContext& context);

// OK when a call with `route` may name sequence `id` (in body field `field`): its key is id's
// routing key, or it sent none and did not come through the proxy. INVALID_ARGUMENT saying
// which key to send otherwise.
absl::Status CheckRoute(const Route& route, absl::string_view id, absl::string_view field);

// The text a NOT_FOUND of a proxied call ends with: a sequence moving between replicas
// (server/hand_off.h) is not found on the replica its key now maps to until its move ends, and
// clients (client/python's move_wait) retry such a NOT_FOUND for a bounded time.
inline constexpr char kMovingHint[] =
    " (through the fleet's proxy: a sequence moving between replicas is not found until its move "
    "ends; retry for a few seconds before taking this as final)";

// `status` with kMovingHint added when it is NOT_FOUND and the call came through the proxy.
absl::Status WithMovingHint(const Route& route, absl::Status status);

// OK when `new_id` (empty: generated) may name a fork of `source`: a routed call (keyed or
// proxied) must name it under its source's routing key, since the fork lives on the source's
// replica and later calls for it are routed by its own id.
absl::Status CheckForkId(const Route& route, absl::string_view source, absl::string_view new_id);

// For a CreateSequence without an id: the key a generated id routes by (empty when the call sent
// none). A call the proxy forwarded without a key is refused: the id generated here would route
// to another replica.
absl::Status CheckCreateWithoutId(const Route& route);

}  // namespace attend::server

#endif  // ATTEND_SERVER_ROUTING_H_
