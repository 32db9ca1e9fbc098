"""Errors of the attend client: one exception class per canonical gRPC code.

Every failed call raises an `Error` (or a subclass named after its code) carrying the gRPC status
code (`grpc.StatusCode`) and the server's message unchanged, so that code written against the
C++ client's absl::Status codes reads the same. Input the client refuses before sending anything
raises `InvalidArgument` (also a `ValueError`), the class the server's refusal of the same input
would raise.
"""
import grpc

__all__ = [
    "Error", "Cancelled", "Unknown", "InvalidArgument", "DeadlineExceeded", "NotFound",
    "AlreadyExists", "PermissionDenied", "ResourceExhausted", "FailedPrecondition", "Aborted",
    "OutOfRange", "Unimplemented", "Internal", "Unavailable", "DataLoss", "Unauthenticated",
    "from_rpc_error", "error_for_code",
]


class Error(Exception):
    """A failed call: `code` (grpc.StatusCode) and `message` (the server's text).

    `partial` is set only by calls that the client split into several RPCs (KvCache.append_batch
    and append over the message limit) when a later RPC failed: {sequence_id: tokens appended by
    the RPCs that succeeded}. Those tokens stay appended; every other failed call changed nothing.
    """

    code = grpc.StatusCode.UNKNOWN

    def __init__(self, message, code=None):
        super().__init__(message)
        if code is not None:
            self.code = code
        self.message = message
        self.partial = None

    def __str__(self):
        text = "%s: %s" % (self.code.name, self.message)
        if self.partial:
            text += " (earlier calls of the same batch appended %s)" % ", ".join(
                "%s: %d tokens" % item for item in self.partial.items())
        return text

    def __repr__(self):
        return "%s(%r)" % (type(self).__name__, self.message)


class Cancelled(Error):
    code = grpc.StatusCode.CANCELLED


class Unknown(Error):
    code = grpc.StatusCode.UNKNOWN


class InvalidArgument(Error, ValueError):
    code = grpc.StatusCode.INVALID_ARGUMENT


class DeadlineExceeded(Error):
    code = grpc.StatusCode.DEADLINE_EXCEEDED


class NotFound(Error, LookupError):
    code = grpc.StatusCode.NOT_FOUND


class AlreadyExists(Error):
    code = grpc.StatusCode.ALREADY_EXISTS


class PermissionDenied(Error):
    code = grpc.StatusCode.PERMISSION_DENIED


class ResourceExhausted(Error):
    code = grpc.StatusCode.RESOURCE_EXHAUSTED


class FailedPrecondition(Error):
    code = grpc.StatusCode.FAILED_PRECONDITION


class Aborted(Error):
    code = grpc.StatusCode.ABORTED


class OutOfRange(Error):
    code = grpc.StatusCode.OUT_OF_RANGE


class Unimplemented(Error):
    code = grpc.StatusCode.UNIMPLEMENTED


class Internal(Error):
    code = grpc.StatusCode.INTERNAL


class Unavailable(Error):
    code = grpc.StatusCode.UNAVAILABLE


class DataLoss(Error):
    code = grpc.StatusCode.DATA_LOSS


class Unauthenticated(Error):
    code = grpc.StatusCode.UNAUTHENTICATED


_BY_CODE = {cls.code: cls for cls in (
    Cancelled, Unknown, InvalidArgument, DeadlineExceeded, NotFound, AlreadyExists,
    PermissionDenied, ResourceExhausted, FailedPrecondition, Aborted, OutOfRange, Unimplemented,
    Internal, Unavailable, DataLoss, Unauthenticated)}
_BY_NUMBER = {code.value[0]: code for code in grpc.StatusCode}


def error_for_code(code, message):
    """The exception for `code`: a grpc.StatusCode, or a canonical code number (as in
    ItemError.code); OK and numbers outside the canonical codes become UNKNOWN, since a failure
    reported with them still failed."""
    if not isinstance(code, grpc.StatusCode):
        code = _BY_NUMBER.get(int(code), grpc.StatusCode.UNKNOWN)
    if code == grpc.StatusCode.OK:
        code = grpc.StatusCode.UNKNOWN
    return _BY_CODE.get(code, Error)(message, code)


def from_rpc_error(error):
    """The Error for a grpc.RpcError raised by a stub (a grpc.Call: code() and details())."""
    code = error.code() if hasattr(error, "code") else grpc.StatusCode.UNKNOWN
    details = error.details() if hasattr(error, "details") else str(error)
    return error_for_code(code or grpc.StatusCode.UNKNOWN, details or "")
