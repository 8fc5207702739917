"""Maps exceptions raised while serving an RPC to gRPC status codes, in one server interceptor.

Handlers and core code raise plain Python exceptions and never touch status codes. The interceptor turns
an exception's *type* into a status code and its text into the status details, so the same failure gets
the same code whichever RPC raised it. Only unexpected failures (INTERNAL) log a traceback, once, here.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Awaitable, Callable

import grpc

from attnserve.server import generation

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


def status_code(exc: BaseException) -> grpc.StatusCode:
    """Returns the status code an exception is reported with."""
    for exc_type, code in STATUS_BY_TYPE:
        if isinstance(exc, exc_type):
            return code
    return grpc.StatusCode.INTERNAL


class ErrorInterceptor(grpc.aio.ServerInterceptor):
    """Wraps every unary-response and server-streaming handler so that exceptions become statuses.

    Client-streaming and bidirectional handlers (server reflection) pass through unchanged.
    """

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
            "request_deserializer": _tolerant(handler.request_deserializer),
            "response_serializer": handler.response_serializer,
        }
        if handler.unary_unary is not None:
            return grpc.unary_unary_rpc_method_handler(_guard_call(handler.unary_unary, method), **wire)
        if handler.unary_stream is not None:
            behavior = handler.unary_stream
            # Async-generator handlers yield their messages; coroutine handlers write them with
            # context.write (the health servicer's Watch). The wrapper must keep the same shape.
            guard = _guard_generator if inspect.isasyncgenfunction(behavior) else _guard_call
            return grpc.unary_stream_rpc_method_handler(guard(behavior, method), **wire)
        return handler


class _Undecodable:
    """Stands in for a request whose bytes do not parse, so that its handler's guard reports it."""

    def __init__(self, error: Exception):
        self.error = error


def _tolerant(deserializer: Callable | None) -> Callable | None:
    """Wraps a request deserializer so that corrupt bytes become an `_Undecodable`, not an exception.

    gRPC would answer an exception raised while parsing with UNKNOWN and log a traceback; a client that
    sends bytes which are not the request message (bad UTF-8 in a string, a truncated message) made a bad
    request, which the guards report as INVALID_ARGUMENT.
    """
    if deserializer is None:
        return None

    def deserialize(data: bytes):
        try:
            return deserializer(data)
        except Exception as exc:  # protobuf's DecodeError
            return _Undecodable(exc)

    return deserialize


def _check_decoded(request) -> None:
    if isinstance(request, _Undecodable):
        raise ValueError(f"the request cannot be parsed: {request.error}")


def _guard_call(behavior: Callable, method: str) -> Callable:
    async def guarded(request, context: grpc.aio.ServicerContext):
        try:
            _check_decoded(request)
            response = behavior(request, context)
            if inspect.isawaitable(response):
                response = await response
            return response
        except grpc.aio.AbortError:
            raise  # the handler already chose a status
        except Exception as exc:
            await _abort(context, exc, method)

    return guarded


def _guard_generator(behavior: Callable, method: str) -> Callable:
    async def guarded(request, context: grpc.aio.ServicerContext):
        try:
            _check_decoded(request)
            async for response in behavior(request, context):
                yield response
        except grpc.aio.AbortError:
            raise
        except Exception as exc:
            await _abort(context, exc, method)

    return guarded


async def _abort(context: grpc.aio.ServicerContext, exc: Exception, method: str) -> None:
    """Ends the RPC with the status for `exc`; raises grpc.aio.AbortError as context.abort does."""
    code = status_code(exc)
    if code == grpc.StatusCode.INTERNAL:
        logger.error("%s failed", method, exc_info=exc)
    else:
        logger.info("%s: %s: %s", method, code.name, exc)
    await context.abort(code, str(exc) or type(exc).__name__)
