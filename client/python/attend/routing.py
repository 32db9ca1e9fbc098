"""Routing keys: how a fleet finds a sequence (docs/operations/fleet.md, common/sequence_key.h).

A fleet's proxy hashes each call's `x-attend-sequence-key` metadata to a replica. A sequence's
routing key is its id up to the first '/', or the whole id: "chat-1" and "chat-1/retry-2" both
route by "chat-1". The client sends, exactly as the C++ client does:

  - CreateSequence, Append, Truncate, Release, GetSequence: the sequence's key;
  - Fork: the source's key, unless new_id routes by another key (then none: one server serves
    it, and a fleet's replica refuses it saying why);
  - DecodeBatch, AppendBatch, DecodeStream (its first message): the key every sequence of the
    call shares, or none when they do not share one;
  - ListSequences, Stats, Attention, Planner: none.

A key that is not a valid header value (empty, or not printable ASCII) is not sent; the server
refuses such ids anyway, with a clearer message than gRPC's header check would give.
"""

SEQUENCE_KEY_METADATA = "x-attend-sequence-key"
ROUTING_KEY_SEPARATOR = "/"

__all__ = ["SEQUENCE_KEY_METADATA", "routing_key", "common_key", "fork_key", "key_metadata"]


def routing_key(sequence_id):
    """The routing key of `sequence_id`: its part before the first '/', or all of it."""
    return sequence_id.split(ROUTING_KEY_SEPARATOR, 1)[0]


def common_key(sequence_ids):
    """The key all of `sequence_ids` share, or None when they do not (or there are none)."""
    keys = {routing_key(i) for i in sequence_ids}
    return keys.pop() if len(keys) == 1 else None


def fork_key(source_id, new_id):
    """The key a Fork sends: the source's, unless new_id routes by another key."""
    if not new_id:
        return routing_key(source_id)
    return common_key([source_id, new_id])


def _is_header_value(value):
    return bool(value) and all(0x20 <= ord(c) <= 0x7E for c in value)


def key_metadata(key):
    """The metadata tuple list that sends `key`: empty when key is None or not a header value."""
    if key is None or not _is_header_value(key):
        return []
    return [(SEQUENCE_KEY_METADATA, key)]
