"""Typed calls of attend.v1.KvCache: per-sequence paged KV caches held by the server, and the
attention of each layer's new queries over everything cached for that layer.

Layouts (docs/api.md, "Semantics"): q [n, n_head, head_dim], k [n, n_head_kv, head_dim],
v [n, n_head_kv, head_dim_v], output [n, n_head, head_dim_v]; in the batch calls the sequences'
rows are packed one after the other. Every call that names a sequence sends its routing key
(attend.routing). Only get_sequence, list_sequences and stats are retried (on UNAVAILABLE);
after DEADLINE_EXCEEDED, CANCELLED or UNAVAILABLE on a call that appends, read the sequence's
layer_tokens (get_sequence) before sending the step again: the server may have applied it.
Refusals that say the sequence is moving between a fleet's replicas applied nothing; the unary
calls send those again for up to the Client's move_wait seconds.
"""
import collections
import itertools
import os
import queue
import sys

import grpc
import numpy as np

from . import errors
from .batching import Piece, plan_calls
from .routing import common_key, fork_key, key_metadata, routing_key
from .tensors import (Encoded, dtype_enum, encode, from_proto, precision_enum,
                      serialize_with_tensors, tensor_field_bytes, element_bytes)
from .v1 import kv_cache_pb2, tensor_pb2

__all__ = ["KvCacheMixin", "AppendResult", "AppendBatchResult", "PendingAppendBatch",
           "DecodeBatchResult",
           "DecodeMessage", "DecodeStreamReply", "DecodeStream", "generate_sequence_id",
           "snapshot_sequence_id"]

_SERVICE = "/attend.v1.KvCache/"


def snapshot_sequence_id(data):
    """The sequence id in the header of snapshot bytes (export_sequence's, or a SaveSequence
    file's). InvalidArgument when `data` does not start as a snapshot does."""
    if len(data) < 20 or bytes(data[:8]) != b"ATTNSNAP":
        raise errors.InvalidArgument("not an attend snapshot (it does not start with \"ATTNSNAP\")")
    length = int.from_bytes(data[16:20], "little")
    if length < 1 or length > 128 or len(data) < 20 + length:
        raise errors.InvalidArgument("the snapshot's header holds no valid sequence id")
    return bytes(data[20:20 + length]).decode("ascii", errors="replace")


def generate_sequence_id():
    """A new sequence id, "seq-" and 16 random hex digits, as the C++ client makes for a
    CreateSequence that names none (so that the call can send the id's routing key)."""
    return "seq-" + os.urandom(8).hex()


class AppendResult:
    """What append returns. output: [n, n_head, head_dim_v], the causal attention of the new
    queries over the layer's cached tokens (new ones included); None without q. weights:
    [n_head, n, layer_tokens] float32 when asked for. first_position: position of the first
    appended token; layer_tokens: tokens in the layer after the append; stats: ComputeStats
    (summed over the calls when the append was split)."""

    def __init__(self, output, weights, first_position, layer_tokens, stats, calls=1):
        self.output = output
        self.weights = weights
        self.first_position = first_position
        self.layer_tokens = layer_tokens
        self.stats = stats
        self.calls = calls

    def __repr__(self):
        return ("AppendResult(output=%s, first_position=%d, layer_tokens=%d)"
                % (_shape_text(self.output), self.first_position, self.layer_tokens))


class AppendBatchResult:
    """What append_batch returns. output: [sum(counts), n_head, head_dim_v] packed like the
    input (None without q); first_positions[i] / layer_tokens[i]: sequence i's first new
    position and its tokens in the layer afterwards; stats: ComputeStats summed over the calls;
    calls: how many AppendBatch RPCs carried the batch (more than 1 when it was split to fit
    the message limit)."""

    def __init__(self, output, first_positions, layer_tokens, stats, calls):
        self.output = output
        self.first_positions = first_positions
        self.layer_tokens = layer_tokens
        self.stats = stats
        self.calls = calls

    def __repr__(self):
        return ("AppendBatchResult(output=%s, first_positions=%s, layer_tokens=%s, calls=%d)"
                % (_shape_text(self.output), self.first_positions, self.layer_tokens,
                   self.calls))


class PendingAppendBatch:
    """An append_batch in flight (append_batch_async). result(timeout=None) waits and returns
    the AppendBatchResult or raises the call's attend.errors.Error (DeadlineExceeded when
    `timeout` seconds pass first: the call goes on); done() says whether it finished;
    cancel() cancels a call that has not finished (the server may have applied it: read the
    sequences' layer_tokens before sending the tokens again)."""

    def __init__(self, future=None, finish=None, again=None, worker=None, stop=None):
        import threading
        self._future = future
        self._finish = finish
        self._again = again
        self._worker = worker
        self._stop = stop
        self._lock = threading.Lock()
        self._result = None
        self._error = None
        self._settled = False

    def done(self):
        return self._settled or (self._future or self._worker).done()

    def cancel(self):
        """Cancels the call: True when it had not finished. A batch of one call is cancelled
        in flight; a split batch sends none of its calls after the one in flight, and result()
        raises Cancelled whose `partial` says what the earlier calls appended."""
        if self._settled or self.done():
            return False
        if self._stop is not None:
            self._stop.set()
            self._worker.cancel()  # when it has not started yet
            return True
        return self._future.cancel()

    def result(self, timeout=None):
        with self._lock:
            if not self._settled:
                self._settle(timeout)
        if self._error is not None:
            raise self._error
        return self._result

    def _settle(self, timeout):
        import concurrent.futures
        try:
            if self._worker is not None:
                try:
                    self._result = self._worker.result(timeout)
                except concurrent.futures.TimeoutError:
                    raise _WaitTimedOut() from None
            else:
                try:
                    response = self._future.result(timeout)
                except grpc.FutureTimeoutError:
                    raise _WaitTimedOut() from None
                except grpc.FutureCancelledError:
                    raise concurrent.futures.CancelledError() from None
                except grpc.RpcError as e:
                    self._result = self._again(errors.from_rpc_error(e))
                else:
                    self._result = self._finish(response)
        except _WaitTimedOut:
            # The wait ran out, not the call: it goes on, and result() may be asked again.
            raise errors.DeadlineExceeded("append_batch_async: no answer within %g s; the call "
                                          "goes on" % timeout) from None
        except concurrent.futures.CancelledError:
            self._error = errors.Cancelled("append_batch_async: cancelled by the client")
        except errors.Error as e:
            self._error = e
        except ValueError as e:  # grpc's "Cannot invoke RPC on closed channel!"
            if "closed channel" not in str(e):
                raise
            self._error = errors.Cancelled("append_batch_async: the client was closed before "
                                           "the call finished; read the sequences' "
                                           "layer_tokens to see what was appended")
        self._settled = True


class _WaitTimedOut(Exception):
    pass


class DecodeBatchResult:
    """One decode step's answer. output: [n, n_head, head_dim_v], row i for sequence_ids[i];
    layer_tokens[i]: sequence i's tokens in the layer afterwards; stats: ComputeStats;
    request_id: echoed from the request."""

    def __init__(self, sequence_ids, output, layer_tokens, stats, request_id):
        self.sequence_ids = sequence_ids
        self.output = output
        self.layer_tokens = layer_tokens
        self.stats = stats
        self.request_id = request_id

    def __repr__(self):
        return ("DecodeBatchResult(request_id=%d, output=%s, layer_tokens=%s)"
                % (self.request_id, _shape_text(self.output), self.layer_tokens))


class DecodeMessage:
    """One message of a decode stream: one layer's decode step for sequences `sequence_ids`
    (each at most once), q/k/v with one row per sequence, as decode_batch takes them.
    request_id 0 means "number it" (1, 2, 3, ... in the order sent)."""

    def __init__(self, layer, sequence_ids, q, k, v, *, precision=None, output_dtype=None,
                 request_id=0):
        self.layer = layer
        self.sequence_ids = sequence_ids
        self.q, self.k, self.v = q, k, v
        self.precision = precision
        self.output_dtype = output_dtype
        self.request_id = request_id


class DecodeStreamReply:
    """One response of a decode stream: `result` (a DecodeBatchResult) when its message was
    applied, or `error` (an attend.Error) when it failed; a failed message applied nothing and
    the stream goes on."""

    def __init__(self, request_id, result=None, error=None):
        self.request_id = request_id
        self.result = result
        self.error = error

    @property
    def ok(self):
        return self.error is None

    def unwrap(self):
        """The result, or the message's error raised."""
        if self.error is not None:
            raise self.error
        return self.result

    def __repr__(self):
        return "DecodeStreamReply(request_id=%d, %s)" % (
            self.request_id, repr(self.result) if self.error is None else repr(self.error))


def _shape_text(a):
    return "None" if a is None else "%s %s" % (list(a.shape), a.dtype)


def _sum_stats(stats):
    """One ComputeStats for several calls' (counts and times added, engines listed once)."""
    if len(stats) == 1:
        return stats[0]
    total = tensor_pb2.ComputeStats()
    engines = []
    for s in stats:
        total.attended_pairs += s.attended_pairs
        total.attention_flops += s.attention_flops
        total.compute_seconds += s.compute_seconds
        total.queue_seconds += s.queue_seconds
        total.prepare_seconds += s.prepare_seconds
        total.cache_seconds += s.cache_seconds
        total.respond_seconds += s.respond_seconds
        if s.engine and s.engine not in engines:
            engines.append(s.engine)
    total.engine = ",".join(engines)
    return total


def _concat(parts, like):
    if len(parts) == 1:
        return parts[0]
    if like.torch_device is not None:
        return sys.modules["torch"].cat(parts, 0)
    return np.concatenate(parts, 0)


def _check_ids(ids, what="sequence_ids"):
    ids = [ids] if isinstance(ids, str) else list(ids)
    if not ids:
        raise errors.InvalidArgument("%s: empty; name at least one sequence" % what)
    seen = set()
    for i, sid in enumerate(ids):
        if not isinstance(sid, str) or not sid:
            raise errors.InvalidArgument("%s[%d]: %s" % (
                what, i, "empty" if isinstance(sid, str) else "not a string: %r" % (sid,)))
        if sid in seen:
            raise errors.InvalidArgument(
                "%s[%d]: '%s' appears twice; a sequence may appear once per call (append its "
                "tokens as one run)" % (what, i, sid))
        seen.add(sid)
    return ids


def _check_str(value, what, optional=False):
    """`value` when it is a str (None too when optional), else InvalidArgument naming `what`:
    a wrong type would otherwise surface as protobuf's TypeError or an AttributeError."""
    if value is None and optional:
        return value
    if not isinstance(value, str):
        raise errors.InvalidArgument("%s: %r is not a string" % (what, value))
    return value


def _check_int(value, what, limit=2 ** 31):
    """`value` as an int in [0, limit), else InvalidArgument naming `what` (protobuf would
    raise TypeError for a str or float, and take True as 1)."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or \
            not 0 <= int(value) < limit:
        raise errors.InvalidArgument("%s: %r; must be an integer between 0 and %s"
                                     % (what, value, "2^31 - 1" if limit == 2 ** 31 else
                                        "2^63 - 1"))
    return int(value)


def _check_tokens(value, what="tokens"):
    """A token count as an int (an int64 field >= 0 on the wire), else InvalidArgument."""
    return _check_int(value, what, 2 ** 63)


def _check_layer(layer):
    """The layer as an int, or InvalidArgument (an int32 field on the wire)."""
    return _check_int(layer, "layer")


def _check_3d(e, what):
    if e is not None and len(e.shape) != 3:
        raise errors.InvalidArgument("%s: shape %s; expected 3 dimensions [tokens, heads, dim]"
                                     % (what, list(e.shape)))


def _output_dtype(output_dtype, q):
    """The output dtype asked for: the given one, else q's (as the C++ client answers in the
    dtype the inputs travel in), else FLOAT32."""
    if output_dtype is not None:
        return dtype_enum(output_dtype, "output_dtype")
    return q.dtype if q is not None else tensor_pb2.FLOAT32


class KvCacheMixin:
    """The KvCache calls of attend.Client (which provides `_connection`)."""

    # --- sequences --------------------------------------------------------------------------

    def create_sequence(self, sequence_id=None, *, layers=None, n_head=None, n_head_kv=None,
                        head_dim=None, head_dim_v=None, kv_dtype=None, scale=None,
                        window_tokens=0, reserve_tokens=0, config=None):
        """Creates a sequence and returns its SequenceInfo.

        The shape is `config` (a SequenceConfig) or the keywords: layers, n_head, n_head_kv
        (default n_head; must divide it), head_dim, head_dim_v (default head_dim), kv_dtype
        (storage: "bfloat16" by default on the server, "float32" or "int8"), scale (default
        1/sqrt(head_dim)), window_tokens (0 = unlimited). sequence_id: 1-128 characters of
        [A-Za-z0-9._:/-]; None generates "seq-<16 hex>" here, so that the call routes by it.
        reserve_tokens: tokens every layer reserves up front (appends up to that length cannot
        then fail for lack of memory).
        AlreadyExists for an id in use; InvalidArgument for a bad shape or id;
        ResourceExhausted when the sequence limit or the reservation does not fit.
        """
        if config is None:
            shape = {name: _check_int(value or 0, name) for name, value in (
                ("layers", layers), ("n_head", n_head), ("n_head_kv", n_head_kv),
                ("head_dim", head_dim), ("head_dim_v", head_dim_v))}
            if n_head_kv is None:
                shape["n_head_kv"] = shape["n_head"]
            config = kv_cache_pb2.SequenceConfig(
                **shape, kv_dtype=dtype_enum(kv_dtype, "kv_dtype", allow_int8=True),
                window_tokens=_check_tokens(window_tokens, "window_tokens"))
            if scale is not None:
                config.scale = scale
        sid = _check_str(sequence_id, "sequence_id", optional=True) or generate_sequence_id()
        request = kv_cache_pb2.CreateSequenceRequest(
            config=config, sequence_id=sid,
            reserve_tokens=_check_tokens(reserve_tokens, "reserve_tokens"))
        return self._kv_call("CreateSequence", request, kv_cache_pb2.SequenceInfo,
                             routing_key(sid))

    def fork(self, source_id, new_id=None, tokens=None):
        """A new sequence sharing the first `tokens` of source_id (default: all that every
        layer holds) copy-on-write; returns its SequenceInfo. new_id None: generated by the
        server as "<source's key>/<16 hex>". Name forks under the source's key ("chat-1/alt"):
        a fork lives on its source's replica. OutOfRange past a layer's end."""
        request = kv_cache_pb2.ForkRequest(source_id=_check_str(source_id, "source_id"),
                                           new_id=_check_str(new_id, "new_id", True) or "")
        if tokens is not None:
            request.tokens = _check_tokens(tokens)
        return self._kv_call("Fork", request, kv_cache_pb2.SequenceInfo,
                             fork_key(source_id, new_id))

    def truncate(self, sequence_id, tokens):
        """Drops every token at or after `tokens` in every layer; returns the SequenceInfo.
        OutOfRange when a layer holds fewer."""
        return self._kv_call("Truncate", kv_cache_pb2.TruncateRequest(
            sequence_id=_check_str(sequence_id, "sequence_id"), tokens=_check_tokens(tokens)), kv_cache_pb2.SequenceInfo,
            routing_key(sequence_id))

    def release(self, sequence_id):
        """Removes the sequence; returns the bytes given back to the pool (blocks shared with
        a fork are freed by their last user)."""
        _check_str(sequence_id, "sequence_id")
        return self._kv_call("Release", kv_cache_pb2.ReleaseRequest(sequence_id=sequence_id),
                             kv_cache_pb2.ReleaseResponse, routing_key(sequence_id)).freed_bytes

    def save_sequence(self, sequence_id, name=None):
        """SaveSequence: writes the sequence to the server's snapshot directory as `name`
        (default: the id), whole and checksummed; it keeps serving meanwhile. Returns the
        SaveSequenceResponse (name, bytes, seconds). FailedPrecondition when the server runs
        without --snapshot_dir."""
        return self._kv_call("SaveSequence", kv_cache_pb2.SaveSequenceRequest(
            sequence_id=_check_str(sequence_id, "sequence_id"),
            name=_check_str(name, "name", optional=True) or ""), kv_cache_pb2.SaveSequenceResponse,
            routing_key(sequence_id))

    def load_sequence(self, name, sequence_id=None):
        """LoadSequence: adds the sequence saved as `name`, exactly as saved, under
        `sequence_id` (default: the id it was saved from). Returns its SequenceInfo. NotFound
        without such a file, DataLoss for a damaged one, AlreadyExists, ResourceExhausted.
        The call routes by sequence_id's key; through a fleet's proxy give sequence_id (a call
        without a key is refused there: the saved id is only known once the file is read)."""
        return self._kv_call("LoadSequence", kv_cache_pb2.LoadSequenceRequest(
            name=_check_str(name, "name"),
            sequence_id=_check_str(sequence_id, "sequence_id", optional=True) or ""), kv_cache_pb2.SequenceInfo,
            routing_key(sequence_id) if sequence_id else None)

    def export_sequence(self, sequence_id):
        """ExportSequence: the sequence as snapshot bytes (SaveSequence's file format,
        checksummed), for import_sequence on another server; it keeps serving meanwhile.
        NotFound for an unknown id."""
        _check_str(sequence_id, "sequence_id")
        method = self._connection.method(_SERVICE + "ExportSequence", kv_cache_pb2.SequenceChunk,
                                         kv_cache_pb2.ExportSequenceRequest, kind="unary_stream")
        try:
            # Chunks that fit this client's receive limit, whatever it was set to.
            chunk_bytes = max(4 << 10, min(1 << 20, self._connection.max_message_bytes // 2))
            request = kv_cache_pb2.ExportSequenceRequest(sequence_id=sequence_id,
                                                         chunk_bytes=chunk_bytes)
            chunks = method(request,
                            timeout=self._connection.deadline,
                            metadata=key_metadata(routing_key(sequence_id)))
            return b"".join(chunk.data for chunk in chunks)
        except grpc.RpcError as e:
            raise errors.from_rpc_error(e) from None

    def import_sequence(self, data, sequence_id=None, share_with_source=True):
        """ImportSequence: adds the sequence of export_sequence's bytes `data`, under
        `sequence_id` (default: the id it was exported from), its leading tokens sharing the
        blocks of the sequence it was forked from when that one is here with the same rows
        (share_with_source). Returns its SequenceInfo. All or nothing: DataLoss for damaged or
        truncated bytes, InvalidArgument for bytes that are no snapshot, AlreadyExists,
        ResourceExhausted. Routes by the new id's key (read from the bytes when not given)."""
        _check_str(sequence_id, "sequence_id", optional=True)
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise errors.InvalidArgument("data: a %s; give the snapshot's bytes (bytes, "
                                         "bytearray or memoryview, as export_sequence returns)"
                                         % type(data).__name__)
        if not isinstance(share_with_source, bool):
            raise errors.InvalidArgument("share_with_source: %r; must be True or False"
                                         % (share_with_source,))
        data = bytes(data)
        key = routing_key(sequence_id or snapshot_sequence_id(data))
        piece = max(4 << 10, min(1 << 20, self._connection.effective_message_limit() // 2))

        def messages():
            first = kv_cache_pb2.ImportSequenceRequest(sequence_id=sequence_id or "",
                                                       data=data[:piece])
            if not share_with_source:
                first.share_with_source = False
            yield first
            for at in range(piece, len(data), piece):
                yield kv_cache_pb2.ImportSequenceRequest(data=data[at:at + piece])

        method = self._connection.method(_SERVICE + "ImportSequence", kv_cache_pb2.SequenceInfo,
                                         kv_cache_pb2.ImportSequenceRequest, kind="stream_unary")
        try:
            return method(messages(), timeout=self._connection.deadline,
                          metadata=key_metadata(key))
        except grpc.RpcError as e:
            raise errors.from_rpc_error(e) from None

    def hand_off(self):
        """HandOff, on the one replica this client is connected to (not through the proxy):
        moves each of its sequences to the replica the fleet's proxy (its --handoff_target) now
        maps the sequence's key to. Returns the HandOffResponse (moved, kept, failed with each
        sequence's reason, bytes, seconds). FailedPrecondition without --handoff_target."""
        return self._kv_call("HandOff", kv_cache_pb2.HandOffRequest(),
                             kv_cache_pb2.HandOffResponse, None)

    def get_sequence(self, sequence_id):
        """The sequence's SequenceInfo (layer_tokens, blocks, ...). NotFound for an unknown or
        evicted one. Retried on UNAVAILABLE."""
        return self._kv_call("GetSequence", kv_cache_pb2.GetSequenceRequest(
            sequence_id=_check_str(sequence_id, "sequence_id")), kv_cache_pb2.SequenceInfo, routing_key(sequence_id),
            retried=True)

    def list_sequences(self, page_size=0):
        """Every sequence of the server the calls reach, in id order: a generator that reads
        page after page (page_size 0: the server's default of 100). Each page is a call with
        its own deadline and retries; sequences changed meanwhile appear as they were when
        their page was read, each at most once."""
        token = ""
        seen = set()
        while True:
            page = self._kv_call("ListSequences", kv_cache_pb2.ListSequencesRequest(
                page_size=page_size, page_token=token), kv_cache_pb2.ListSequencesResponse,
                None, retried=True)
            for info in page.sequences:
                yield info
            token = page.next_page_token
            if not token:
                return
            if token in seen:
                # A server that hands out a token twice would keep this loop going for ever.
                raise errors.Internal("ListSequences: the server returned page token '%s' twice"
                                      % token)
            seen.add(token)

    def stats(self):
        """The cache's CacheStats: capacity, usage, blocks, sequences, evictions. Retried on
        UNAVAILABLE."""
        return self._kv_call("Stats", kv_cache_pb2.StatsRequest(), kv_cache_pb2.CacheStats,
                             None, retried=True)

    # --- appending --------------------------------------------------------------------------

    def append(self, sequence_id, layer, q, k, v, *, precision=None, return_weights=False,
               output_dtype=None):
        """Appends one layer's new tokens to one sequence (prefill when many, decode when one)
        and returns an AppendResult with the attention of their queries.

        q may be None to only append k/v (then no output). precision: None (bf16 when q, k
        and v are all bf16), "float32" or "bfloat16". output_dtype: default q's dtype.
        A request over the message limit is split into consecutive Append calls (exact: see
        attend.batching), unless return_weights asks for the weights over the whole sequence;
        if a later call of a split append fails, the error's `partial` says what the earlier
        ones appended. NotFound for an unknown sequence; InvalidArgument for shapes that do not
        match it; ResourceExhausted when the cache has no room (nothing changed).
        """
        _check_str(sequence_id, "sequence_id")
        layer = _check_layer(layer)
        qe = encode(q, "q") if q is not None else None
        ke, ve = encode(k, "k"), encode(v, "v")
        out_dtype = _output_dtype(output_dtype, qe)
        request = kv_cache_pb2.AppendRequest(
            sequence_id=sequence_id, layer=layer, precision=precision_enum(precision),
            return_weights=return_weights, output_dtype=out_dtype)
        key = routing_key(sequence_id)
        method = self._connection.method(_SERVICE + "Append", kv_cache_pb2.AppendResponse)
        like = qe.like if qe is not None else None
        rows = ke.shape[0] if ke.shape else 0
        if return_weights or rows < 1 or len(ke.shape) != 3 or len(ve.shape) != 3 or (
                qe is not None and (len(qe.shape) != 3 or qe.shape[0] != rows)) or \
                ve.shape[0] != rows:
            # Cannot be split (or malformed: the server says what is wrong): one call.
            response = self._connection.call(
                method, serialize_with_tensors(request, {3: qe, 4: ke, 5: ve}), key)
            return AppendResult(
                from_proto(response.output, like) if response.HasField("output") else None,
                from_proto(response.weights) if response.HasField("weights") else None,
                response.first_position, response.layer_tokens, response.stats)

        def send(pieces, r0, r1):
            response = self._connection.call(method, serialize_with_tensors(request, {
                3: qe.rows(r0, r1) if qe is not None else None, 4: ke.rows(r0, r1),
                5: ve.rows(r0, r1)}), key)
            return response, [response.first_position], [response.layer_tokens]

        output, first, tokens, stats, calls = self._split_calls(
            [sequence_id], [rows], qe, ke, ve, out_dtype, send, "Append")
        return AppendResult(output, None, first[0], tokens[0], stats, calls)

    def append_batch(self, layer, sequence_ids, q, k, v, counts=None, *, precision=None,
                     output_dtype=None):
        """Appends one layer's new tokens of several sequences and returns an AppendBatchResult.

        The tokens are packed: sequence i's rows are [sum(counts[:i]), sum(counts[:i+1])) of q,
        k and v (q [sum, n_head, head_dim], k [sum, n_head_kv, head_dim], v [sum, n_head_kv,
        head_dim_v]); prompts of different lengths and decode steps may share a call. counts
        default to one token per sequence. Every sequence has the same head shape and appears
        once. q may be None to only append (then output is None). output_dtype: default q's.

        One AppendBatch call is all or nothing. A batch over the message limit (the client's
        max_message_bytes, or the server's lower one once a refusal revealed it) is split into
        several calls: whole sequences per call where they fit, and a sequence too long for
        one call into consecutive chunks appended in order (chunked prefill, exact for causal
        attention). Before a split batch the client checks that every sequence exists and has
        the tensors' shape, so that those mistakes fail before anything is appended; if a later
        call still fails (the cache ran out of room, a sequence was released meanwhile), the
        error's `partial` says what the earlier calls appended, which stays appended.

        InvalidArgument (before any call) for a sequence named twice, counts that do not add
        up to the tensors' rows, or tensors that are not 3-D; NotFound for an unknown sequence.
        """
        return self._append_batch(layer, sequence_ids, q, k, v, counts, precision,
                                  output_dtype, wait=True)

    def append_batch_async(self, layer, sequence_ids, q, k, v, counts=None, *, precision=None,
                           output_dtype=None):
        """append_batch, started and not waited for: returns a PendingAppendBatch at once,
        whose result() is the AppendBatchResult (or raises what append_batch would have).

        For overlap: a model keeps one half of its batch's layer call in flight while the
        accelerator works on the other half (attend.llama's generate(overlap=True) does so).
        The arguments are checked and the request is encoded before this returns, so q, k and
        v may be changed afterwards. A batch that fits one message is one asynchronous gRPC
        call (no thread); a batch that must be split runs its calls in order on a worker thread
        of the client. Calls started together run together in the server when they name
        different sequences; two in flight for the same sequence and layer append in the order
        the server receives them, which is not defined: wait for one before starting the other.
        """
        return self._append_batch(layer, sequence_ids, q, k, v, counts, precision,
                                  output_dtype, wait=False)

    def _append_batch(self, layer, sequence_ids, q, k, v, counts, precision, output_dtype,
                      wait):
        """append_batch and append_batch_async (wait=False)."""
        layer = _check_layer(layer)
        ids = _check_ids(sequence_ids)
        qe = encode(q, "q") if q is not None else None
        ke, ve = encode(k, "k"), encode(v, "v")
        for e, what in ((qe, "q"), (ke, "k"), (ve, "v")):
            _check_3d(e, what)
        if counts is None:
            counts = [1] * len(ids)
        elif isinstance(counts, (str, bytes)) or not hasattr(counts, "__iter__"):
            raise errors.InvalidArgument("counts: %r; give one count per sequence (a list)"
                                         % (counts,))
        else:
            counts = list(counts)
        if len(counts) != len(ids):
            raise errors.InvalidArgument("counts: %d counts for %d sequences"
                                         % (len(counts), len(ids)))
        for i, c in enumerate(counts):
            if isinstance(c, bool) or not isinstance(c, (int, np.integer)):
                raise errors.InvalidArgument("counts[%d]: %r is not an integer" % (i, c))
            if c < 1:
                raise errors.InvalidArgument("counts[%d]: %r; each sequence appends at least one "
                                             "token" % (i, c))
        counts = [int(c) for c in counts]
        rows = sum(counts)
        for e, what in ((qe, "q"), (ke, "k"), (ve, "v")):
            if e is not None and e.shape[0] != rows:
                raise errors.InvalidArgument(
                    "%s: %d rows, but counts add up to %d (%s)"
                    % (what, e.shape[0], rows, ", ".join(
                        "%s: %d" % (sid, c) for sid, c in zip(ids[:8], counts[:8]))
                       + (", ..." if len(ids) > 8 else "")))
        out_dtype = _output_dtype(output_dtype, qe)
        request = kv_cache_pb2.AppendBatchRequest(layer=layer, precision=precision_enum(precision),
                                                  output_dtype=out_dtype)
        method = self._connection.method(_SERVICE + "AppendBatch",
                                         kv_cache_pb2.AppendBatchResponse)
        key = common_key(ids)

        # The tensors the calls read: the caller's, or (asynchronous) copies of them.
        source = [qe, ke, ve]

        def send(pieces, r0, r1):
            request.ClearField("sequence_ids")
            request.ClearField("token_counts")
            request.sequence_ids.extend(ids[p.index] for p in pieces)
            request.token_counts.extend(p.count for p in pieces)
            q_, k_, v_ = source
            response = self._connection.call(method, serialize_with_tensors(request, {
                4: q_.rows(r0, r1) if q_ is not None else None, 5: k_.rows(r0, r1),
                6: v_.rows(r0, r1)}), key)
            if len(response.first_positions) != len(pieces) or \
                    len(response.layer_tokens) != len(pieces):
                raise errors.Internal("AppendBatch: %d positions for %d sequences"
                                      % (len(response.first_positions), len(pieces)))
            return response, list(response.first_positions), list(response.layer_tokens)

        def run(tensors=(qe, ke, ve), stop=None):
            q_, k_, v_ = tensors
            source[:] = tensors
            sender = send
            if stop is not None:
                def sender(pieces, r0, r1):
                    # Between the calls of a split batch: cancel() stops the rest.
                    if stop.is_set():
                        raise errors.Cancelled("append_batch_async: cancelled by the client "
                                               "between the calls of a split batch")
                    return send(pieces, r0, r1)
            output, first, tokens, stats, calls = self._split_calls(
                ids, counts, q_, k_, v_, out_dtype, sender, "AppendBatch", layer=layer)
            return AppendBatchResult(output, first, tokens, stats, calls)

        if wait:
            return run()
        conn = self._connection
        request_row = sum(e.nbytes // max(e.shape[0], 1) for e in (qe, ke, ve) if e is not None)
        response_row = (qe.shape[1] * ve.shape[2] * element_bytes(out_dtype)
                        if qe is not None else 0)
        plan = plan_calls(counts, [len(sid.encode()) for sid in ids], request_row, response_row,
                          conn.effective_message_limit())
        if len(plan) > 1:
            # The calls go out after this returns: they read copies, so that the caller may
            # change its arrays at once, as for a batch of one call.
            private = tuple(None if e is None else Encoded(e.dtype, e.shape, e.array.copy(),
                                                           e.like) for e in (qe, ke, ve))
            import threading
            stop = threading.Event()
            return PendingAppendBatch(
                worker=self._async_worker().submit(run, private, stop), stop=stop)
        request.sequence_ids.extend(ids)
        request.token_counts.extend(counts)
        body = serialize_with_tensors(request, {4: qe, 5: ke, 6: ve})
        future = method.future(body, timeout=conn.deadline, metadata=key_metadata(key))

        def finish(response):
            if len(response.first_positions) != len(ids) or \
                    len(response.layer_tokens) != len(ids):
                raise errors.Internal("AppendBatch: %d positions for %d sequences"
                                      % (len(response.first_positions), len(ids)))
            output = from_proto(response.output, qe.like) if qe is not None else None
            return AppendBatchResult(output, list(response.first_positions),
                                     list(response.layer_tokens), response.stats, 1)

        def again(error):
            # Refused for its size before anything was applied: the limit is learnt, and the
            # batch goes again in calls that fit, now, on the caller's thread, from the bytes
            # that were sent (the caller's arrays may have changed since).
            if conn.learn_limit(error):
                sent = kv_cache_pb2.AppendBatchRequest.FromString(body)
                request.ClearField("sequence_ids")
                request.ClearField("token_counts")
                return run(tuple(
                    None if e is None else Encoded(e.dtype, e.shape,
                                                   from_proto(getattr(sent, name)), e.like)
                    for e, name in ((qe, "q"), (ke, "k"), (ve, "v"))))
            raise error

        return PendingAppendBatch(future=future, finish=finish, again=again)

    def _async_worker(self):
        """The client's worker threads for asynchronous calls that need several RPCs."""
        worker = getattr(self, "_async_pool", None)
        if worker is None:
            import concurrent.futures
            worker = self._async_pool = concurrent.futures.ThreadPoolExecutor(
                max_workers=4, thread_name_prefix="attend-async")
        return worker

    def _split_calls(self, ids, counts, qe, ke, ve, out_dtype, send, rpc, layer=None):
        """Sends a packed batch in as many calls as the message limit needs (attend.batching):
        send(pieces, first_row, end_row) makes one call and returns (response, first
        positions, layer tokens) of its pieces. Returns (output, first_positions,
        layer_tokens, summed stats, calls)."""
        conn = self._connection
        n_head = qe.shape[1] if qe is not None else 0
        head_dim_v = ve.shape[2]
        request_row = sum(e.nbytes // max(e.shape[0], 1) for e in (qe, ke, ve) if e is not None)
        response_row = n_head * head_dim_v * element_bytes(out_dtype) if qe is not None else 0
        id_bytes = [len(sid.encode()) for sid in ids]
        offsets = list(itertools.accumulate([0] + counts))
        tensor_overhead = sum(tensor_field_bytes(e) for e in (qe, ke, ve) if e is not None)
        assert tensor_overhead < 1024  # batching.REQUEST_OVERHEAD_BYTES covers it

        first = [None] * len(ids)
        tokens = [None] * len(ids)
        outputs, stats = [], []
        applied = collections.OrderedDict()
        index, start = 0, 0  # the first row not yet appended: sequence `index`, its row `start`
        checked = False
        while index < len(ids):
            rest = [counts[index] - start] + counts[index + 1:]
            plan = plan_calls(rest, id_bytes[index:], request_row, response_row,
                              conn.effective_message_limit())
            if len(plan) > 1 and not checked and not applied and layer is not None:
                self._check_before_split(ids, layer, qe, ke, ve)
                checked = True
            replanned = False
            base_index, base_start = index, start  # where this plan's numbering starts
            for call in plan:
                pieces = [_shift(p, base_index, base_start) for p in call]
                r0 = offsets[pieces[0].index] + pieces[0].start
                r1 = r0 + sum(p.count for p in pieces)
                try:
                    response, positions, layer_tokens = send(pieces, r0, r1)
                except errors.Error as e:
                    if conn.learn_limit(e):
                        # Refused for its size before anything was applied: split smaller.
                        index, start = pieces[0].index, pieces[0].start
                        replanned = True
                        break
                    if applied:
                        e.partial = dict(applied)
                    raise
                for p, position, n in zip(pieces, positions, layer_tokens):
                    if first[p.index] is None:
                        first[p.index] = position
                    tokens[p.index] = n
                    applied[ids[p.index]] = applied.get(ids[p.index], 0) + p.count
                if qe is not None:
                    outputs.append(from_proto(response.output, qe.like))
                stats.append(response.stats)
                last = pieces[-1]
                index, start = last.index, last.start + last.count
                if start == counts[index]:
                    index, start = index + 1, 0
            if not replanned and index < len(ids):
                raise errors.Internal("%s: the batch's plan ended before its last row" % rpc)
        output = _concat(outputs, qe.like) if qe is not None else None
        return output, first, tokens, _sum_stats(stats), len(stats)

    def _check_before_split(self, ids, layer, qe, ke, ve):
        """Before a batch that needs several calls: every sequence exists and takes these
        tensors, so that the usual mistakes fail before the first call appends anything."""
        for sid in ids:
            c = self.get_sequence(sid).config
            head_dim_v = c.head_dim_v or c.head_dim
            problems = []
            if not 0 <= layer < c.layers:
                problems.append("layer %d is not below its %d layers" % (layer, c.layers))
            if qe is not None and qe.shape[1] != c.n_head:
                problems.append("q has %d heads, it has n_head %d" % (qe.shape[1], c.n_head))
            if ke.shape[1:] != (c.n_head_kv, c.head_dim):
                problems.append("k rows are %s, it takes [%d, %d] (n_head_kv, head_dim)"
                                % (list(ke.shape[1:]), c.n_head_kv, c.head_dim))
            if ve.shape[1:] != (c.n_head_kv, head_dim_v):
                problems.append("v rows are %s, it takes [%d, %d] (n_head_kv, head_dim_v)"
                                % (list(ve.shape[1:]), c.n_head_kv, head_dim_v))
            if qe is not None and qe.shape[2] != c.head_dim:
                problems.append("q's head_dim is %d, it takes %d" % (qe.shape[2], c.head_dim))
            if problems:
                raise errors.InvalidArgument("sequence '%s': %s (nothing was appended)"
                                             % (sid, "; ".join(problems)))

    # --- decoding ---------------------------------------------------------------------------

    def decode_batch(self, layer, sequence_ids, q, k, v, *, precision=None, output_dtype=None,
                     request_id=0):
        """One layer's decode step for several sequences (each at most once), computed as one
        batch, all or nothing: row i of q [n, n_head, head_dim], k and v [n, n_head_kv, ...] is
        sequence_ids[i]'s new token. Returns a DecodeBatchResult. The call sends the key the
        sequences share (batch sequences of one key together for a fleet), else none."""
        message = DecodeMessage(layer, sequence_ids, q, k, v, precision=precision,
                                output_dtype=output_dtype, request_id=request_id)
        request, like = _decode_request(message)
        response = self._kv_call("DecodeBatch", request, kv_cache_pb2.DecodeBatchResponse,
                                 common_key(message.sequence_ids))
        return _decode_result(response, like)

    def decode_stream(self, messages, *, deadline=None):
        """A DecodeStream over `messages` (an iterable of DecodeMessage, or of (layer,
        sequence_ids, q, k, v) tuples): returns an iterator of DecodeStreamReply, one per
        message, in order. The call starts when the first message is available and sends the
        key of its sequences. A message the server refuses gets a reply with `error` and the
        stream goes on; the stream's own failure (e.g. ResourceExhausted when the server's
        stream limit is reached, Unavailable, DeadlineExceeded) is raised by the iterator. A
        message the client cannot encode ends the stream: the iterator raises its error after
        the replies to the messages before it. `deadline` bounds the
        whole stream (default: the connection's). The iterator's cancel() ends it early.

        gRPC reads `messages` on its own thread, so a generator may wait for the previous
        reply before yielding the next step; open_decode_stream wraps that in write/read.
        """
        it = iter(messages)
        try:
            first = next(it)
        except StopIteration:
            return iter(())
        return _DecodeReplies(self._connection, first, it, deadline or self._connection.deadline)

    def open_decode_stream(self, *, deadline=None):
        """A DecodeStream to write decode messages to and read their replies from, one at a
        time (see DecodeStream)."""
        return DecodeStream(self, deadline)

    # --- plumbing ---------------------------------------------------------------------------

    def _kv_call(self, name, request, response_class, key, retried=False):
        method = self._connection.method(_SERVICE + name, response_class, type(request))
        if retried:
            return self._connection.call_retried(method, request, key)
        return self._connection.call(method, request, key)


def _shift(piece, index, start):
    """A piece planned for the rest of a batch (from sequence `index`'s row `start`) in the
    whole batch's numbering."""
    return Piece(piece.index + index, piece.start + (start if piece.index == 0 else 0),
                 piece.count)


class _Prepared:
    """A decode message encoded: its DecodeBatchRequest and how to hand its outputs back."""

    __slots__ = ("request", "like")

    def __init__(self, request, like):
        self.request, self.like = request, like


def _prepare(m):
    """A DecodeMessage, a dict of its arguments, a (layer, ids, q, k, v) tuple or a _Prepared,
    encoded."""
    if isinstance(m, _Prepared):
        return m
    if isinstance(m, dict):
        m = DecodeMessage(**m)
    elif not isinstance(m, DecodeMessage):
        m = DecodeMessage(*m)
    return _Prepared(*_decode_request(m))


def _decode_request(message):
    """The DecodeBatchRequest of `message` and how to hand its outputs back."""
    ids = _check_ids(message.sequence_ids)
    # The type here; the value is the server's to refuse, so that a stream's bad layer is an
    # item error of its own reply, as any other the server finds.
    layer = message.layer
    if isinstance(layer, bool) or not isinstance(layer, (int, np.integer)) or \
            not -2 ** 31 <= int(layer) < 2 ** 31:
        raise errors.InvalidArgument("layer: %r; must be an integer between 0 and 2^31 - 1"
                                     % (layer,))
    layer = int(layer)
    qe, ke, ve = encode(message.q, "q"), encode(message.k, "k"), encode(message.v, "v")
    for e, what in ((qe, "q"), (ke, "k"), (ve, "v")):
        _check_3d(e, what)
        if e.shape[0] != len(ids):
            raise errors.InvalidArgument("%s: %d rows for %d sequences; a decode step is one "
                                         "token (row) per sequence" % (what, e.shape[0], len(ids)))
    request = kv_cache_pb2.DecodeBatchRequest(
        layer=layer, precision=precision_enum(message.precision),
        output_dtype=_output_dtype(message.output_dtype, qe), request_id=message.request_id)
    for i, sid in enumerate(ids):
        step = request.steps.add(sequence_id=sid)
        for field, e in (("q", qe), ("k", ke), ("v", ve)):
            # Small (one token): protobuf's copy costs nothing worth avoiding here.
            getattr(step, field).CopyFrom(tensor_pb2.Tensor(
                dtype=e.dtype, shape=(1,) + e.shape[1:], data=e.array[i:i + 1].tobytes()))
    return request, qe.like


def _decode_result(response, like):
    outputs = [from_proto(r.output, like) for r in response.results]
    output = _concat(outputs, like) if outputs else None
    return DecodeBatchResult([r.sequence_id for r in response.results], output,
                             [r.layer_tokens for r in response.results], response.stats,
                             response.request_id)


class _DecodeReplies:
    """The iterator decode_stream returns."""

    def __init__(self, connection, first, rest, deadline):
        self._likes = collections.deque()  # responses come in order: one entry per message
        self._failure = None  # an exception raised while encoding a later message
        self._count = 0
        self._call = None
        # The first message is encoded here, so that its mistakes raise to the caller; its
        # sequences give the call's routing key.
        first = _prepare(first)
        method = connection.method(_SERVICE + "DecodeStream", kv_cache_pb2.DecodeBatchResponse,
                                   kv_cache_pb2.DecodeBatchRequest, kind="stream_stream")
        self._call = method(self._requests(itertools.chain([first], rest)), timeout=deadline,
                            metadata=key_metadata(common_key(
                                s.sequence_id for s in first.request.steps)))

    def _requests(self, messages):
        # Runs on gRPC's thread. An exception here would only be logged by gRPC: keep it for
        # the reader, who gets it after the replies to the messages before it (the stream is
        # half-closed here, so the server finishes those and ends the call).
        try:
            for m in messages:
                prepared = _prepare(m)
                self._count += 1
                if not prepared.request.request_id:
                    prepared.request.request_id = self._count
                self._likes.append(prepared.like)
                yield prepared.request
        except Exception as e:  # noqa: BLE001  (handed to the reader)
            self._failure = e

    def __iter__(self):
        return self

    def __next__(self):
        try:
            response = next(self._call)
        except StopIteration:
            if self._failure is not None:
                raise self._failure from None
            raise
        except grpc.RpcError as e:
            if self._failure is not None:
                raise self._failure from None
            raise errors.from_rpc_error(e) from None
        like = self._likes.popleft() if self._likes else None
        if response.HasField("error"):
            return DecodeStreamReply(response.request_id, error=errors.error_for_code(
                response.error.code, response.error.message))
        return DecodeStreamReply(response.request_id, result=_decode_result(response, like))

    def cancel(self):
        """Ends the stream now (the server stops; replies not read are lost)."""
        self._call.cancel()


_END = object()


class DecodeStream:
    """A decode stream used a message at a time: write() sends one (returns its request id),
    read() returns the reply to the oldest message not yet answered. Writing a few messages
    ahead of reading (e.g. every layer of one step) pipelines them. close() (or leaving a `with`
    block) ends the stream after the replies still owed; cancel() ends it at once.

    Not for use by several threads at once.
    """

    def __init__(self, client, deadline=None):
        self._client = client
        self._deadline = deadline
        self._outbox = queue.Queue()
        self._replies = None
        self._written = 0
        self._read = 0
        self._closed = False

    @property
    def pending(self):
        """Messages written whose replies were not read yet."""
        return self._written - self._read

    def write(self, layer, sequence_ids, q, k, v, *, precision=None, output_dtype=None,
              request_id=0):
        """Sends one decode message (as decode_batch takes it); returns its request id
        (numbered 1, 2, 3, ... when 0). InvalidArgument when it cannot be encoded (nothing
        sent); FailedPrecondition after close()."""
        if self._closed:
            raise errors.FailedPrecondition("DecodeStream: write after close")
        # Encoded here, so that bad input raises in the writer's thread with nothing sent.
        prepared = _prepare(DecodeMessage(layer, sequence_ids, q, k, v, precision=precision,
                                          output_dtype=output_dtype,
                                          request_id=request_id or self._written + 1))
        self._written += 1
        if self._replies is None:
            # The call starts with the first message, whose sequences give its routing key.
            self._replies = self._client.decode_stream(
                itertools.chain([prepared], iter(self._outbox.get, _END)),
                deadline=self._deadline)
        else:
            self._outbox.put(prepared)
        return prepared.request.request_id

    def read(self):
        """The reply to the oldest unanswered message (a DecodeStreamReply). Raises the
        stream's failure; FailedPrecondition when no message awaits a reply."""
        if self.pending <= 0:
            raise errors.FailedPrecondition(
                "DecodeStream: no message awaits a reply (write one first)")
        try:
            reply = next(self._replies)
        except StopIteration:
            raise errors.Internal("DecodeStream: the server ended the stream with %d messages "
                                  "unanswered" % self.pending) from None
        self._read += 1
        return reply

    def close(self):
        """Ends the stream: reads the replies still owed and returns them (a list)."""
        if self._closed:
            return []
        self._closed = True
        self._outbox.put(_END)
        rest = []
        if self._replies is not None:
            for reply in self._replies:
                rest.append(reply)
                self._read += 1
        return rest

    def cancel(self):
        """Ends the stream at once; replies not read are lost."""
        self._closed = True
        self._outbox.put(_END)
        if self._replies is not None:
            self._replies.cancel()

    def __enter__(self):
        return self

    def __exit__(self, exc_type, *exc):
        if exc_type is None:
            self.close()
        else:
            self.cancel()
