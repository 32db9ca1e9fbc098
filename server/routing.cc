#include "server/routing.h"

#include "absl/strings/str_cat.h"
#include "common/sequence_key.h"
#include "core/kv_cache/sequence_registry.h"

namespace attend::server {
namespace {

// A key for a message: quoted and bounded like an id (it comes from the client).
std::string Quoted(absl::string_view key) { return kv::QuotedId(key); }

}  // namespace

Route RouteOf(const grpc::CallbackServerContext& context) {
  Route route;
  const auto& metadata = context.client_metadata();
  // An empty key is no key: the proxy cannot route by it (nginx sends it where keyless calls
  // go), so it must not make a generated id, nor pass for a key behind the proxy.
  if (auto it = metadata.find(kSequenceKeyMetadata); it != metadata.end() && !it->second.empty()) {
    route.key = std::string(it->second.data(), it->second.size());
  }
  route.proxied = metadata.find(kProxyMetadata) != metadata.end();
  return route;
}

absl::Status WithMovingHint(const Route& route, absl::Status status) {
  if (!route.proxied || !absl::IsNotFound(status)) return status;
  return absl::NotFoundError(absl::StrCat(status.message(), kMovingHint));
}

absl::Status CheckRoute(const Route& route, absl::string_view id, absl::string_view field) {
  const absl::string_view want = RoutingKey(id);
  if (route.key) {
    if (*route.key == want) return absl::OkStatus();
    return absl::InvalidArgumentError(absl::StrCat(
        field, ": sequence ", Quoted(id), " routes by key ", Quoted(want), ", but the call's ",
        kSequenceKeyMetadata, " is ", Quoted(*route.key),
        "; send the id's routing key (its part before the first '/', or the whole id), so that "
        "the fleet's proxy reaches the replica that holds it"));
  }
  if (!route.proxied) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      kSequenceKeyMetadata, ": missing; through the fleet's proxy a call that names sequence ",
      Quoted(id), " (", field, ") must send its routing key ", Quoted(want),
      ", or it reaches an arbitrary replica (a batch's steps, and a fork and its source, must "
      "share one key)"));
}

absl::Status CheckForkId(const Route& route, absl::string_view source, absl::string_view new_id) {
  // A direct call without a key may name the fork anything, as on one server.
  if (new_id.empty() || (!route.key && !route.proxied)) return absl::OkStatus();
  const absl::string_view want = RoutingKey(source);
  if (RoutingKey(new_id) == want) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "new_id: ", Quoted(new_id), " routes by key ", Quoted(RoutingKey(new_id)),
      ", but a fork lives on its source's replica, which key ", Quoted(want), " reaches; name it '",
      want, "/...' (or leave new_id empty for a generated one)"));
}

absl::Status CheckCreateWithoutId(const Route& route) {
  if (route.key || !route.proxied) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "sequence_id: empty and no ", kSequenceKeyMetadata,
      ": through the fleet's proxy give the id (and send its routing key), or send a key for "
      "the generated id to route by"));
}

}  // namespace attend::server
