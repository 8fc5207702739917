"""The client's exceptions: one class per gRPC status code a server sends, all under `AttnServeError`.

Callers catch the kind of failure they can act on without comparing status codes:

    try:
        result = client.translate(text)
    except InvalidArgument as exc:      # the request is wrong: fix it, don't retry
        print(exc.details)
    except Unavailable:                 # no server answered, even after the client's retries
        ...

Every class keeps `code` (the grpc.StatusCode) and `details` (the server's message), so code written
against the single `AttnServeError` of earlier versions keeps working.
"""

from __future__ import annotations

import grpc


class AttnServeError(Exception):
    """A failed RPC: `code` is the grpc.StatusCode, `details` the server's message."""

    code: grpc.StatusCode = grpc.StatusCode.UNKNOWN

    def __init__(self, code: grpc.StatusCode, details: str):
        super().__init__(f"{code.name}: {details}")
        self.code = code
        self.details = details


class InvalidArgument(AttnServeError):
    """The request is malformed: unknown model or language, empty text, bad audio (INVALID_ARGUMENT)."""


class OutOfRange(AttnServeError):
    """The input exceeds a limit the model states: too many tokens, too long a clip (OUT_OF_RANGE)."""


class NotFound(AttnServeError):
    """NOT_FOUND."""


class ResourceExhausted(AttnServeError):
    """The server is overloaded or the message too large; retried by the client (RESOURCE_EXHAUSTED)."""


class Unavailable(AttnServeError):
    """No server answered, or it is shutting down; retried by the client (UNAVAILABLE)."""


class DeadlineExceeded(AttnServeError):
    """The call's deadline passed (DEADLINE_EXCEEDED)."""


class Unauthenticated(AttnServeError):
    """A missing or wrong bearer token (UNAUTHENTICATED)."""


class PermissionDenied(AttnServeError):
    """PERMISSION_DENIED."""


class Unimplemented(AttnServeError):
    """The server does not serve this yet, e.g. an input kind it cannot decode (UNIMPLEMENTED)."""


class Cancelled(AttnServeError):
    """The call was cancelled (CANCELLED)."""


class Internal(AttnServeError):
    """The server failed on a valid request (INTERNAL, UNKNOWN, DATA_LOSS)."""


_CLASS_BY_CODE: dict[grpc.StatusCode, type[AttnServeError]] = {
    grpc.StatusCode.INVALID_ARGUMENT: InvalidArgument,
    grpc.StatusCode.FAILED_PRECONDITION: InvalidArgument,
    grpc.StatusCode.OUT_OF_RANGE: OutOfRange,
    grpc.StatusCode.NOT_FOUND: NotFound,
    grpc.StatusCode.RESOURCE_EXHAUSTED: ResourceExhausted,
    grpc.StatusCode.UNAVAILABLE: Unavailable,
    grpc.StatusCode.DEADLINE_EXCEEDED: DeadlineExceeded,
    grpc.StatusCode.UNAUTHENTICATED: Unauthenticated,
    grpc.StatusCode.PERMISSION_DENIED: PermissionDenied,
    grpc.StatusCode.UNIMPLEMENTED: Unimplemented,
    grpc.StatusCode.CANCELLED: Cancelled,
    grpc.StatusCode.INTERNAL: Internal,
    grpc.StatusCode.UNKNOWN: Internal,
    grpc.StatusCode.DATA_LOSS: Internal,
}


def from_status(code: grpc.StatusCode, details: str) -> AttnServeError:
    """The exception of the class that matches `code` (AttnServeError itself for codes without one)."""
    return _CLASS_BY_CODE.get(code, AttnServeError)(code, details)


def from_rpc_error(exc: grpc.RpcError) -> AttnServeError:
    """Converts a failed call of either gRPC API (grpc.RpcError, grpc.aio.AioRpcError)."""
    return from_status(exc.code(), exc.details() or "")
