// How a fleet finds a sequence: the routing rule that the clients, the proxy and the server
// share (header-only, so that the core can name it without linking anything).
//
// A fleet is several replicas behind a proxy that hashes each call's `x-attend-sequence-key`
// metadata to a replica. A sequence lives on one replica, so every call about it must carry the
// same key, and the key must follow from the id alone: a client that only knows an id (a CLI
// invocation, another process) must be able to route to it. Hence:
//
//   - A sequence's routing key is its id up to the first '/', or the whole id when it has none:
//     "chat-1" and "chat-1/retry-2" both route by "chat-1".
//   - A call that names a sequence sends its routing key (Fork: the source's; DecodeBatch and
//     DecodeStream: their steps', which must all share one key). The server refuses a call whose
//     key contradicts an id in its body, so one id never names two sequences in a fleet.
//   - A fork lives on its source's replica, so its id must route by its source's key: fork
//     "chat-1" as "chat-1/<anything>". A fork's generated id does.
//   - A CreateSequence without an id but with a key gets an id that routes by the key
//     ("<key>/<16 hex digits>"); our client libraries generate an id themselves instead.
//   - Behind the proxy (which marks each call it forwards with `x-attend-proxy`), a call that
//     names a sequence without sending a key is refused: it would reach an arbitrary replica.
//
// Thread-safety: pure functions and constants.
#ifndef ATTEND_COMMON_SEQUENCE_KEY_H_
#define ATTEND_COMMON_SEQUENCE_KEY_H_

#include "absl/strings/string_view.h"

namespace attend {

// The metadata that carries a call's routing key.
inline constexpr char kSequenceKeyMetadata[] = "x-attend-sequence-key";
// The metadata the fleet's proxy sets on every call it forwards (nginx: grpc_set_header), so
// that a replica knows the call was routed by its key.
inline constexpr char kProxyMetadata[] = "x-attend-proxy";

// The separator between a routing key and the rest of an id.
inline constexpr char kRoutingKeySeparator = '/';

// The routing key of sequence `id`: its part before the first '/', or all of it.
inline absl::string_view RoutingKey(absl::string_view id) {
  return id.substr(0, id.find(kRoutingKeySeparator));
}

}  // namespace attend

#endif  // ATTEND_COMMON_SEQUENCE_KEY_H_
