"""Connecting to an attend server: the channel, TLS or mutual TLS, a bearer token, message limits
and keepalive, with the semantics of the C++ client's ConnectionOptions (client/connection.h),
and the calls every service shares (deadline, routing key, error conversion, retries).
"""
import collections
import os
import re
import time

import grpc

from . import errors
from .routing import key_metadata

__all__ = ["Connection", "RetryPolicy", "MIN_KEEPALIVE_SECONDS"]

# attend-server closes connections that ping more often, as gRPC servers do.
MIN_KEEPALIVE_SECONDS = 10.0
# Certificates, keys and tokens are a few KiB: a bigger file is not one of them.
_MAX_CREDENTIAL_FILE_BYTES = 1 << 20
_MAX_INT32 = (1 << 31) - 1


class _CallDetails(
        collections.namedtuple("_CallDetails", ("method", "timeout", "metadata", "credentials",
                                                "wait_for_ready", "compression")),
        grpc.ClientCallDetails):
    pass


class _BearerToken(grpc.UnaryUnaryClientInterceptor, grpc.UnaryStreamClientInterceptor,
                   grpc.StreamUnaryClientInterceptor, grpc.StreamStreamClientInterceptor):
    """Adds "authorization: Bearer <token>" to every call's metadata."""

    def __init__(self, token):
        self._header = ("authorization", "Bearer " + token)

    def _details(self, details):
        return _CallDetails(details.method, details.timeout,
                            list(details.metadata or ()) + [self._header], details.credentials,
                            details.wait_for_ready, details.compression)

    def intercept_unary_unary(self, continuation, details, request):
        return continuation(self._details(details), request)

    def intercept_unary_stream(self, continuation, details, request):
        return continuation(self._details(details), request)

    def intercept_stream_unary(self, continuation, details, requests):
        return continuation(self._details(details), requests)

    def intercept_stream_stream(self, continuation, details, requests):
        return continuation(self._details(details), requests)


def moving_refusal(error):
    """Whether `error` says the call's sequence is moving between a fleet's replicas
    (KvCache.HandOff), so that the call applied nothing and finds the sequence when sent again
    a moment later: UNAVAILABLE from the replica it is leaving ("is moving to another
    replica"), or NOT_FOUND through the proxy from the one it is going to ("moving between
    replicas", which only proxied calls carry)."""
    if isinstance(error, errors.Unavailable):
        return "is moving to another replica" in error.message
    if isinstance(error, errors.NotFound):
        return "moving between replicas" in error.message
    return False


class RetryPolicy:
    """How the idempotent reads (get_sequence, each page of list_sequences, stats) are retried on
    UNAVAILABLE: attempt i + 1 waits b = min(initial_backoff * multiplier^(i - 1), max_backoff)
    seconds after attempt i, then up to b more for the channel to reconnect. All attempts share
    the call's deadline. Calls that change the cache are never retried: an UNAVAILABLE one may
    have been applied before the connection broke."""

    def __init__(self, max_attempts=3, initial_backoff=0.05, multiplier=2.0, max_backoff=1.0):
        self.max_attempts = max_attempts
        self.initial_backoff = initial_backoff
        self.multiplier = multiplier
        self.max_backoff = max_backoff


def _read_file(path, what):
    try:
        with open(path, "rb") as f:
            data = f.read(_MAX_CREDENTIAL_FILE_BYTES + 1)
    except OSError as e:
        raise errors.NotFound("%s: cannot open '%s' (%s)" % (what, path, e.strerror)) from None
    if len(data) > _MAX_CREDENTIAL_FILE_BYTES:
        raise errors.InvalidArgument(
            "%s: '%s' is more than %d bytes; certificate, key and token files are a few KiB: is "
            "it the right file?" % (what, path, _MAX_CREDENTIAL_FILE_BYTES))
    return data


def _pem(value, what):
    """PEM bytes from `value`: bytes are the PEM text itself, a str or path-like names a file."""
    if value is None:
        return None
    if isinstance(value, (bytes, bytearray)):
        data, source = bytes(value), "the PEM given"
    else:
        data, source = _read_file(os.fspath(value), what), "'%s'" % os.fspath(value)
    if b"-----BEGIN " not in data:
        raise errors.InvalidArgument("%s: %s is not PEM (no -----BEGIN line)" % (what, source))
    return data


def _token_from_file(path):
    text = _read_file(os.fspath(path), "token_file").decode("utf-8", "replace").strip()
    if not text:
        raise errors.InvalidArgument("token_file: '%s' is empty" % os.fspath(path))
    if "\n" in text:
        raise errors.InvalidArgument("token_file: '%s' has more than one line"
                                     % os.fspath(path))
    return text


class Connection:
    """A channel to one attend server (or a fleet's proxy) and the options of its calls.

    target: "host:port" (gRPC target syntax). deadline: seconds each call may take (a
    DecodeStream: the whole stream, unless given its own). max_message_bytes: the largest message
    sent or received; match the server's --max_message_bytes (append_batch and append split
    their work to stay below it, and learn a lower server limit from the server's refusal).

    TLS (tls=True): ca_cert is the CA that signed the server's certificate (default: the
    system's roots); client_cert and client_key, both or neither, make it mutual TLS;
    server_name is the name checked against the server's certificate instead of the target's
    host (e.g. when dialling an IP address). Each of the three PEM options is bytes (the PEM
    text) or a path. token (or token_file: a file holding it on one line) is sent on every call
    as "authorization: Bearer <token>" (what the C++ client's AccessTokenCredentials sends); it
    needs TLS, since a token must not travel in the clear.

    keepalive: seconds between HTTP/2 pings on an open connection (None or 0: none; at least
    10, which attend-server accepts), to notice a dead peer or keep a NAT or proxy mapping
    open during long streams.

    channel: an existing grpc.Channel to use instead of making one (the TLS, token, limit and
    keepalive options must then be left out: they belong to the channel).

    InvalidArgument for options that cannot work together (a token, CA, client certificate or
    server name without TLS; a certificate without its key; a token that is not printable ASCII
    without spaces; keepalive below 10 s; a non-positive deadline or message limit). A
    Connection is thread-safe; close() (or `with`) closes the channel it made.
    """

    def __init__(self, target="localhost:50051", *, tls=False, ca_cert=None, client_cert=None,
                 client_key=None, server_name=None, token=None, token_file=None, deadline=30.0,
                 max_message_bytes=64 << 20, keepalive=None, retry=None, channel=None,
                 move_wait=10.0):
        if not tls:
            for given, what in ((token is not None or token_file is not None, "a bearer token"),
                                (ca_cert is not None, "a CA certificate"),
                                (client_cert is not None, "a client certificate"),
                                (client_key is not None, "a client key"),
                                (server_name, "a TLS server name")):
                if given:
                    raise errors.InvalidArgument(
                        "%s needs TLS (tls=True)%s" % (what, ": a token must not travel in clear "
                                                       "text" if what == "a bearer token" else ""))
        if (client_cert is None) != (client_key is None):
            raise errors.InvalidArgument(
                "mutual TLS needs both the client certificate (client_cert) and its key "
                "(client_key)")
        if token is not None and token_file is not None:
            raise errors.InvalidArgument("give the bearer token or token_file, not both")
        if token_file is not None:
            token = _token_from_file(token_file)
        if token is not None and (not token or any(ord(c) <= 0x20 or ord(c) >= 0x7F
                                                   for c in token)):
            raise errors.InvalidArgument(
                "the bearer token must be printable ASCII without spaces (it travels in a header)")
        if keepalive and keepalive < MIN_KEEPALIVE_SECONDS:
            raise errors.InvalidArgument(
                "keepalive must be 0 (off) or at least %g s (servers close connections that ping "
                "more often), got %g s" % (MIN_KEEPALIVE_SECONDS, keepalive))
        if not deadline or deadline <= 0:
            raise errors.InvalidArgument("the deadline must be positive")
        if max_message_bytes < 1:
            raise errors.InvalidArgument("the message limit must be positive")
        if move_wait is None or move_wait < 0:
            raise errors.InvalidArgument("move_wait must be 0 (off) or a number of seconds")

        self.target = target
        self.deadline = float(deadline)
        self.max_message_bytes = int(max_message_bytes)
        self.retry = retry or RetryPolicy()
        self.move_wait = float(move_wait)
        # A lower limit the server revealed by refusing a message (see effective_message_limit).
        self._server_limit = None
        self._methods = {}
        if channel is not None:
            if tls or keepalive:
                raise errors.InvalidArgument("tls and keepalive belong to the channel given")
            self.channel, self._owns_channel = channel, False
            return
        options = [("grpc.max_send_message_length", min(self.max_message_bytes, _MAX_INT32)),
                   ("grpc.max_receive_message_length", min(self.max_message_bytes, _MAX_INT32))]
        if keepalive:
            interval_ms = int(keepalive * 1000)
            options += [("grpc.keepalive_time_ms", interval_ms),
                        # A ping unanswered for this long (or the interval) means a dead peer.
                        ("grpc.keepalive_timeout_ms", min(interval_ms, 20000)),
                        # Also between calls: the point is to watch a connection that may idle.
                        ("grpc.keepalive_permit_without_calls", 1),
                        ("grpc.http2.max_pings_without_data", 0)]
        if tls:
            if server_name:
                options.append(("grpc.ssl_target_name_override", server_name))
            credentials = grpc.ssl_channel_credentials(
                root_certificates=_pem(ca_cert, "ca_cert"),
                private_key=_pem(client_key, "client_key"),
                certificate_chain=_pem(client_cert, "client_cert"))
            self.channel = grpc.secure_channel(target, credentials, options)
            if token is not None:
                # Sends "authorization: Bearer <token>" on every call, as the C++ client's
                # AccessTokenCredentials does, but from the calling thread: grpc's
                # access_token_call_credentials is a Python plugin that gRPC's own threads call
                # and release, and a release during interpreter exit crashed the process
                # (SIGSEGV in PyGILState_Ensure) after a clean close.
                self.channel = grpc.intercept_channel(self.channel, _BearerToken(token))
        else:
            self.channel = grpc.insecure_channel(target, options)
        self._owns_channel = True

    # --- lifetime ---------------------------------------------------------------------------

    def close(self):
        """Closes the channel this connection made (not one it was given)."""
        if self._owns_channel:
            self.channel.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # --- calls ------------------------------------------------------------------------------

    def effective_message_limit(self):
        """max_message_bytes, or the server's limit when a refusal revealed a lower one."""
        if self._server_limit is not None:
            return min(self._server_limit, self.max_message_bytes)
        return self.max_message_bytes

    _LIMIT_PATTERNS = (
        # gRPC's own refusal of a request over the server's limit, before attend sees it.
        re.compile(r"Received message larger than max \(\d+ vs\. (\d+)\)"),
        # attend-server's refusal of a response over its limit, before anything is applied.
        re.compile(r"over the maximum message size of (\d+) bytes"),
    )

    def learn_limit(self, error):
        """True when `error` is a refusal of a message over the server's size limit that
        happened before the server applied anything, and names a limit lower than the one in
        use (then remembered): the call may be split further and sent again."""
        if not isinstance(error, errors.ResourceExhausted):
            return False
        for pattern in self._LIMIT_PATTERNS:
            match = pattern.search(error.message)
            if match:
                limit = int(match.group(1))
                if limit < self.effective_message_limit():
                    self._server_limit = limit
                    return True
        return False

    def method(self, path, response_class, request_class=None, kind="unary_unary"):
        """A cached multi-callable for `path`. Without request_class it takes the request's
        serialized bytes (serialize_with_tensors writes them)."""
        key = (path, kind, request_class is None)
        m = self._methods.get(key)
        if m is None:
            serializer = request_class.SerializeToString if request_class else None
            m = getattr(self.channel, kind)(path, request_serializer=serializer,
                                            response_deserializer=response_class.FromString)
            self._methods[key] = m
        return m

    def call(self, method, request, key=None, timeout=None):
        """Runs a unary call with the deadline and `key`'s routing metadata; Error on failure
        (Cancelled when the client was closed first). A call refused because its sequence is
        moving between a fleet's replicas (moving_refusal) is sent again, for up to move_wait
        seconds within the deadline: such a refusal applied nothing."""
        now = time.monotonic()
        deadline = now + (timeout or self.deadline)
        give_up = min(deadline, now + self.move_wait)
        backoff = 0.02
        while True:
            try:
                return method(request, timeout=max(0.001, deadline - time.monotonic()),
                              metadata=key_metadata(key))
            except grpc.RpcError as e:
                error = errors.from_rpc_error(e)
            except ValueError as e:  # grpc's "Cannot invoke RPC on closed channel!"
                if "closed channel" not in str(e):
                    raise
                raise errors.Cancelled(
                    "the client was closed: no call can be made on it") from None
            if not moving_refusal(error) or time.monotonic() + backoff >= give_up:
                raise error
            time.sleep(backoff)
            backoff = min(backoff * 2, 0.5)

    def call_retried(self, method, request, key=None):
        """call() for idempotent reads: retried on UNAVAILABLE under the RetryPolicy, all
        attempts within one deadline."""
        deadline = time.monotonic() + self.deadline
        backoff = self.retry.initial_backoff
        attempt = 1
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise errors.DeadlineExceeded("the deadline passed before the call could be retried")
            try:
                return self.call(method, request, key, timeout=left)
            except errors.Unavailable:
                if attempt >= self.retry.max_attempts or time.monotonic() + backoff >= deadline:
                    raise
            time.sleep(backoff)
            # A channel whose connection attempt failed waits out gRPC's reconnect backoff and
            # fails calls at once meanwhile; ask it to connect and give that up to another
            # backoff, so that a server that came back is reached.
            ready = grpc.channel_ready_future(self.channel)
            try:
                ready.result(timeout=max(0.0, min(backoff, deadline - time.monotonic())))
            except grpc.FutureTimeoutError:
                # Unsubscribes from the channel's connectivity: a subscription left behind
                # outlives close() on gRPC's polling thread.
                ready.cancel()
            backoff = min(backoff * self.retry.multiplier, self.retry.max_backoff)
            attempt += 1

    # --- health -----------------------------------------------------------------------------

    _HEALTH_STATUS = {0: "UNKNOWN", 1: "SERVING", 2: "NOT_SERVING", 3: "SERVICE_UNKNOWN"}

    def health(self, service="", timeout=None):
        """grpc.health.v1 Check of `service` ("" = the server; "attend.v1.KvCache" ...):
        "SERVING", "NOT_SERVING" or "SERVICE_UNKNOWN". Open without a token on servers that
        need one. The two tiny messages are written by hand, so that no grpc.health.v1 module
        (which other packages may register in the same process) is generated."""
        name = service.encode()
        request = (b"\x0a" + _varint(len(name)) + name) if name else b""
        m = self.channel.unary_unary("/grpc.health.v1.Health/Check",
                                     request_serializer=None, response_deserializer=None)
        try:
            response = m(request, timeout=timeout or self.deadline)
        except grpc.RpcError as e:
            raise errors.from_rpc_error(e) from None
        status = 0
        if response[:1] == b"\x08":  # field 1, varint: the status enum (0-3: one byte)
            status = response[1]
        return self._HEALTH_STATUS.get(status, "UNKNOWN")


def _varint(n):
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)
