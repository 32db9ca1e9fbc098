"""Splitting a packed ragged batch into calls that fit the message limit (chunked prefill).

A batch is sequences 0..n-1 with token_counts[i] rows each, packed in that order. gRPC refuses a
request or a response over max_message_bytes, and attend-server refuses a response that would
pass its limit less 4096 bytes of framing; `plan_calls` cuts the batch into calls that stay
below both:

  - whole sequences, in order, as many as fit in a call;
  - a sequence too long for a call of its own is split into consecutive pieces (its first piece
    filling what the call it starts in has left), appended in order by consecutive calls.

Splitting a sequence's tokens is exact: its attention is causal with the queries aligned to the
end of the keys, so the rows of a later piece see exactly the keys they would have seen in one
call (the earlier pieces are in the cache by then). The calls keep the batch's row order, so
their outputs concatenated are the packed output of the whole batch.
"""
from .errors import InvalidArgument

__all__ = ["Piece", "plan_calls", "REQUEST_OVERHEAD_BYTES", "RESPONSE_OVERHEAD_BYTES"]

# Bytes a request holds besides the tensors' data and the per-sequence fields: layer, precision,
# output dtype and three tensor headers (tensors.tensor_field_bytes is at most 90 for 3-D).
REQUEST_OVERHEAD_BYTES = 1024
# attend-server refuses a response whose tensors leave less than 4096 bytes of the limit
# (kResponseFramingBytes); the stats and the per-sequence positions fit in that too.
RESPONSE_OVERHEAD_BYTES = 4096
# Per sequence in a request: its id (key, length, bytes) and its token count (a varint).
_REQUEST_SEQUENCE_BYTES = 1 + 2 + 10
# Per sequence in a response: first_positions and layer_tokens (varints).
_RESPONSE_SEQUENCE_BYTES = 2 * 10


class Piece:
    """Rows [start, start + count) of sequence `index`'s tokens."""

    __slots__ = ("index", "start", "count")

    def __init__(self, index, start, count):
        self.index, self.start, self.count = index, start, count

    def __eq__(self, other):
        return (self.index, self.start, self.count) == (other.index, other.start, other.count)

    def __repr__(self):
        return "Piece(%d, %d, %d)" % (self.index, self.start, self.count)


def plan_calls(token_counts, id_bytes, request_row_bytes, response_row_bytes, max_message_bytes):
    """The calls for a batch: a list of calls, each a list of Pieces in packed order.

    token_counts: rows of each sequence (each >= 1); id_bytes: the UTF-8 length of each id;
    request_row_bytes / response_row_bytes: bytes one row adds to a request (q, k and v) and to
    its response (the output; 0 without q). InvalidArgument when not even one row of one
    sequence fits a call.
    """
    calls = []
    current = []
    rows = 0
    request_fixed = REQUEST_OVERHEAD_BYTES  # this call's bytes besides the rows
    response_fixed = RESPONSE_OVERHEAD_BYTES

    def room(i, rows, request_fixed, response_fixed):
        """Rows that sequence i could add to a call holding `rows` rows and the fixed bytes."""
        request_left = (max_message_bytes - request_fixed - rows * request_row_bytes
                        - id_bytes[i] - _REQUEST_SEQUENCE_BYTES)
        response_left = (max_message_bytes - response_fixed - rows * response_row_bytes
                         - _RESPONSE_SEQUENCE_BYTES)
        fits = request_left // request_row_bytes
        if response_row_bytes:
            fits = min(fits, response_left // response_row_bytes)
        return max(fits, 0)

    for i, count in enumerate(token_counts):
        start = 0
        while start < count:
            left = count - start
            fits = room(i, rows, request_fixed, response_fixed)
            if fits < left:
                alone = room(i, 0, REQUEST_OVERHEAD_BYTES, RESPONSE_OVERHEAD_BYTES)
                if current and (fits == 0 or alone >= left):
                    # The rest of the sequence stays whole when a call of its own holds it;
                    # otherwise it is split anyway, and its first piece fills this call.
                    calls.append(current)
                    current, rows = [], 0
                    request_fixed, response_fixed = (REQUEST_OVERHEAD_BYTES,
                                                     RESPONSE_OVERHEAD_BYTES)
                    continue
                if fits == 0:
                    raise InvalidArgument(
                        "one token of sequence %d needs a request of about %d bytes and a "
                        "response of about %d, over the message limit of %d bytes "
                        "(max_message_bytes)"
                        % (i, REQUEST_OVERHEAD_BYTES + id_bytes[i] + _REQUEST_SEQUENCE_BYTES
                           + request_row_bytes,
                           RESPONSE_OVERHEAD_BYTES + _RESPONSE_SEQUENCE_BYTES
                           + response_row_bytes, max_message_bytes))
            take = min(fits, left)
            current.append(Piece(i, start, take))
            rows += take
            request_fixed += id_bytes[i] + _REQUEST_SEQUENCE_BYTES
            response_fixed += _RESPONSE_SEQUENCE_BYTES
            start += take
            if start < count:
                # A sequence appears at most once in a call: its next piece starts the next.
                calls.append(current)
                current, rows = [], 0
                request_fixed, response_fixed = REQUEST_OVERHEAD_BYTES, RESPONSE_OVERHEAD_BYTES
    if current:
        calls.append(current)
    return calls
