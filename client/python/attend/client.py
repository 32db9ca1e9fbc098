"""attend.Client: one connection to an attend server with the typed calls of its three services
(KvCache, Attention, Planner) and its health check.
"""
from .attention import AttentionMixin
from .connection import Connection
from .kv_cache import KvCacheMixin
from .planner import PlannerMixin

__all__ = ["Client"]


class Client(KvCacheMixin, AttentionMixin, PlannerMixin):
    """A client of one attend server (or a fleet's proxy).

    The options are attend.connection.Connection's (the C++ client's ConnectionOptions):
    deadline in seconds per call, max_message_bytes matching the server's
    --max_message_bytes, TLS with ca_cert / client_cert + client_key (PEM bytes or paths) /
    server_name, and a bearer token (or token_file) sent as "authorization: Bearer <token>".

    Calls raise attend.Error subclasses carrying the gRPC code and the server's message. Every
    call that names a sequence sends its routing key (attend.routing), so that the client works
    through a fleet's proxy as it does against one server. While a fleet moves a sequence
    between replicas (KvCache.HandOff: a replica added, removed or restarted), calls about it
    are refused in ways that apply nothing, and the unary calls send them again for up to
    `move_wait` seconds (0: never); see attend.connection.moving_refusal. A Client is
    thread-safe; close() it (or use `with`) to close its channel.
    """

    def __init__(self, target="localhost:50051", *, tls=False, ca_cert=None, client_cert=None,
                 client_key=None, server_name=None, token=None, token_file=None, deadline=30.0,
                 max_message_bytes=64 << 20, keepalive=None, retry=None, channel=None,
                 move_wait=10.0):
        self._connection = Connection(
            target, tls=tls, ca_cert=ca_cert, client_cert=client_cert, client_key=client_key,
            server_name=server_name, token=token, token_file=token_file, deadline=deadline,
            max_message_bytes=max_message_bytes, keepalive=keepalive, retry=retry,
            channel=channel, move_wait=move_wait)

    @property
    def connection(self):
        """The Connection: its channel, deadline and message limit."""
        return self._connection

    @property
    def channel(self):
        """The grpc.Channel, e.g. for stubs of attend.v1.*_pb2_grpc."""
        return self._connection.channel

    def health(self, service=""):
        """The server's health ("" = overall) or a service's ("attend.v1.KvCache", ...):
        "SERVING", "NOT_SERVING" (draining) or "SERVICE_UNKNOWN". Open without a token."""
        return self._connection.health(service)

    def close(self):
        self._connection.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        return "attend.Client(%r)" % self._connection.target
