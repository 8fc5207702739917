"""Maps exceptions raised while serving an RPC to gRPC status codes, in one server interceptor.

Handlers and core code raise plain Python exceptions and never touch status codes. The interceptor turns
an exception's *type* into a status code and its text into the status details, so the same failure gets
the same code whichever RPC raised it. Only unexpected failures (INTERNAL) log a traceback, once, here.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import inspect
import logging
from collections.abc import Awaitable, Callable
from typing import Protocol

import grpc

from attnserve.server import generation, logging_setup

logger = logging.getLogger(__name__)

# First match wins, so a subclass must come before its base (NotImplementedError is a RuntimeError,
# TimeoutError an OSError). Anything not listed is INTERNAL.
STATUS_BY_TYPE: tuple[tuple[type[BaseException], grpc.StatusCode], ...] = (
    (asyncio.CancelledError, grpc.StatusCode.CANCELLED),
    (generation.OverloadedError, grpc.StatusCode.RESOURCE_EXHAUSTED),
    (generation.UnavailableError, grpc.StatusCode.UNAVAILABLE),
    (TimeoutError, grpc.StatusCode.DEADLINE_EXCEEDED),
    (NotImplementedError, grpc.StatusCode.UNIMPLEMENTED),
    (generation.InputTooLargeError, grpc.StatusCode.OUT_OF_RANGE),  # a ValueError: must come first
    (ValueError, grpc.StatusCode.INVALID_ARGUMENT),
)


class InternalError(RuntimeError):
    """A request failed after it passed validation: the server's fault, whatever the original error's type."""


def status_code(exc: BaseException) -> grpc.StatusCode:
    """Returns the status code an exception is reported with."""
    for exc_type, code in STATUS_BY_TYPE:
        if isinstance(exc, exc_type):
            return code
    return grpc.StatusCode.INTERNAL


class Admission(Protocol):
    """Checks a request's raw bytes before parsing, and holds its size while it is handled."""

    def check(self, method: str, data: bytes) -> None:
        """Raises (e.g. InputTooLargeError) to refuse the serialized request of `method` unparsed."""

    def hold(self, method: str, size: int) -> contextlib.AbstractContextManager:
        """Counts a request of `size` bytes while its handler runs; raises to refuse it."""


class _AdmitAll:
    def check(self, method: str, data: bytes) -> None:
        pass

    def hold(self, method: str, size: int) -> contextlib.AbstractContextManager:
        return contextlib.nullcontext()


class ErrorInterceptor(grpc.aio.ServerInterceptor):
    """Wraps every unary-response and server-streaming handler so that exceptions become statuses.

    Args:
        admission: checks each request before it is parsed and while it is handled (server/limits.py);
            None = every request is admitted.

    Client-streaming and bidirectional handlers (server reflection) pass through unchanged.
    """

    def __init__(self, admission: Admission | None = None):
        self._admission = admission or _AdmitAll()

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(handler_call_details)
        if handler is None:
            return None
        method = handler_call_details.method
        wire = {
            "request_deserializer": self._tolerant(handler.request_deserializer, method),
            "response_serializer": handler.response_serializer,
        }
        if handler.unary_unary is not None:
            return grpc.unary_unary_rpc_method_handler(self._guard_call(handler.unary_unary, method), **wire)
        if handler.unary_stream is not None:
            behavior = handler.unary_stream
            # Async-generator handlers yield their messages; coroutine handlers write them with
            # context.write (the health servicer's Watch). The wrapper must keep the same shape.
            guard = self._guard_generator if inspect.isasyncgenfunction(behavior) else self._guard_call
            return grpc.unary_stream_rpc_method_handler(guard(behavior, method), **wire)
        return handler

    def _tolerant(self, deserializer: Callable | None, method: str) -> Callable | None:
        """Wraps a request deserializer so that refused or corrupt bytes become a `_Refused`, not an exception.

        gRPC would answer an exception raised while parsing with UNKNOWN and log a traceback; a client that
        sends bytes which are not the request message (bad UTF-8 in a string, a truncated message) made a
        bad request, which the guards report as INVALID_ARGUMENT. Admission checks the raw bytes first, so
        an oversized request is refused before protobuf copies it.
        """
        if deserializer is None:
            return None
        admission = self._admission

        def deserialize(data: bytes):
            try:
                admission.check(method, data)
            except Exception as exc:
                return _Refused(exc)
            try:
                return _Received(deserializer(data), len(data))
            except Exception as exc:  # protobuf's DecodeError
                return _Refused(ValueError(f"the request cannot be parsed: {exc}"))

        return deserialize

    def _guard_call(self, behavior: Callable, method: str) -> Callable:
        async def guarded(request, context: grpc.aio.ServicerContext):
            try:
                request, size = _unwrap(request)
                with self._admission.hold(method, size):
                    response = behavior(request, context)
                    if inspect.isawaitable(response):
                        response = await response
                return response
            except grpc.aio.AbortError:
                raise  # the handler already chose a status
            except Exception as exc:
                await _abort(context, exc, method)

        return guarded

    def _guard_generator(self, behavior: Callable, method: str) -> Callable:
        async def guarded(request, context: grpc.aio.ServicerContext):
            try:
                request, size = _unwrap(request)
                with self._admission.hold(method, size):
                    async for response in behavior(request, context):
                        yield response
            except grpc.aio.AbortError:
                raise
            except Exception as exc:
                await _abort(context, exc, method)

        return guarded


@dataclasses.dataclass(frozen=True)
class _Received:
    """A parsed request and the size of its serialized bytes."""

    message: object
    size: int


@dataclasses.dataclass(frozen=True)
class _Refused:
    """Stands in for a request that was refused or does not parse, so that its handler's guard reports it."""

    error: Exception


def _unwrap(request) -> tuple[object, int]:
    if isinstance(request, _Refused):
        raise request.error
    return request.message, request.size


async def _abort(context: grpc.aio.ServicerContext, exc: Exception, method: str) -> None:
    """Ends the RPC with the status for `exc`; raises grpc.aio.AbortError as context.abort does."""
    code = status_code(exc)
    if code == grpc.StatusCode.INTERNAL:
        logger.error("%s failed", method, exc_info=exc)
    else:  # the client's doing (or overload): rate-limited, so that a flood of bad calls cannot flood the log
        logging_setup.rejections.log("%s: %s: %s", method, code.name, exc)
    await context.abort(code, str(exc) or type(exc).__name__)
