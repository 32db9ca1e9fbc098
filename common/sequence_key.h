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

#include <cstddef>

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

// The longest sequence id, in bytes.
inline constexpr size_t kMaxSequenceIdBytes = 128;

// What keeps a string from being a sequence id, or the name of a saved sequence's file, which
// follows the same rule (the server's kv::CheckSequenceId words its errors; the CLI checks a
// name before sending it): 1 to kMaxSequenceIdBytes characters of [A-Za-z0-9._:/-] whose parts
// between '/'s are not empty, "." or ".." (the first part is the routing key, and an id must
// not read as a relative path wherever it is written).
enum class SequenceIdProblem { kNone, kLength, kCharacter, kPart };

inline SequenceIdProblem CheckSequenceIdSyntax(absl::string_view id) {
  if (id.empty() || id.size() > kMaxSequenceIdBytes) return SequenceIdProblem::kLength;
  for (char c : id) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '.' || c == '_' || c == ':' || c == '-' || c == kRoutingKeySeparator;
    if (!ok) return SequenceIdProblem::kCharacter;
  }
  size_t start = 0;
  while (true) {
    const size_t end = id.find(kRoutingKeySeparator, start);
    const absl::string_view part = id.substr(start, end - start);
    if (part.empty() || part == "." || part == "..") return SequenceIdProblem::kPart;
    if (end == absl::string_view::npos) return SequenceIdProblem::kNone;
    start = end + 1;
  }
}

}  // namespace attend

#endif  // ATTEND_COMMON_SEQUENCE_KEY_H_
