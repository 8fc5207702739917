"""Maps exceptions raised while serving an RPC to gRPC status codes, in one server interceptor.

Handlers and core code raise plain Python exceptions and never touch status codes. The interceptor turns
an exception's *type* into a status code and its text into the status details, so the same failure gets
the same code whichever RPC raised it. Only unexpected failures (INTERNAL) log a traceback, once, here.

A failed call's exception is released before the status is sent (`release`): its traceback's frames hold
the request (its bytes, the parsed message, the decoded input) and, through a local that refers back to the
exception or to the future that holds it, form reference cycles that only a full garbage collection frees,
which large payloads never trigger. Refusals made before the handler runs (unparsable bytes, size before
parsing, the in-flight budget) are counted here, with their code and reason; the servicer counts the rest.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import dataclasses
import inspect
import logging
import traceback
from collections.abc import Awaitable, Callable, Collection
from typing import Protocol

import grpc

from attnserve.api import generation
from attnserve.server.edge import logging_setup, memory, metrics
from attnserve.server.engine import limits

logger = logging.getLogger(__name__)

# First match wins, so a subclass must come before its base (NotImplementedError is a RuntimeError,
# TimeoutError an OSError). Anything not listed is INTERNAL.
STATUS_BY_TYPE: tuple[tuple[type[BaseException], grpc.StatusCode], ...] = (
    (asyncio.CancelledError, grpc.StatusCode.CANCELLED),
    (generation.OverloadedError, grpc.StatusCode.RESOURCE_EXHAUSTED),
    (generation.UnavailableError, grpc.StatusCode.UNAVAILABLE),
    (generation.ModelNotFoundError, grpc.StatusCode.NOT_FOUND),
    (generation.ModelNotServedError, grpc.StatusCode.FAILED_PRECONDITION),
    (TimeoutError, grpc.StatusCode.DEADLINE_EXCEEDED),
    (NotImplementedError, grpc.StatusCode.UNIMPLEMENTED),
    (generation.InputTooLargeError, grpc.StatusCode.OUT_OF_RANGE),  # a ValueError: must come first
    (ValueError, grpc.StatusCode.INVALID_ARGUMENT),
)


# The arrival check of the call whose task runs now (set by ErrorInterceptor for counted methods).
_ARRIVAL: contextvars.ContextVar = contextvars.ContextVar("attnserve_arrival")


class InternalError(RuntimeError):
    """A request failed after it passed validation: the server's fault, whatever the original error's type."""


def status_code(exc: BaseException) -> grpc.StatusCode:
    """Returns the status code an exception is reported with."""
    for exc_type, code in STATUS_BY_TYPE:
        if isinstance(exc, exc_type):
            return code
    return grpc.StatusCode.INTERNAL


def reason(exc: BaseException) -> str | None:
    """The reason a refusal is counted under (attnserve_rejected_requests_total), None for other failures."""
    explicit = getattr(exc, "reason", None)
    return explicit if isinstance(explicit, str) else metrics.REJECTION_REASONS.get(status_code(exc).name)


def release(exc: BaseException) -> None:
    """Frees what an exception keeps alive: the locals of every finished frame of its traceback (and of its
    cause's and context's), then the tracebacks themselves. Frames still running are left alone."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if exc.__traceback__ is not None:
            traceback.clear_frames(exc.__traceback__)
            exc.__traceback__ = None
        chained = exc.__cause__ or exc.__context__
        exc.__cause__ = exc.__context__ = None
        exc = chained


@dataclasses.dataclass(frozen=True)
class Failure:
    """What a failed call answers: its status and details, and its refusal reason; no reference to the error."""

    code: grpc.StatusCode
    details: str
    reason: str | None

    @classmethod
    def of(cls, exc: BaseException, method: str) -> Failure:
        """The failure of `exc`, logged (a traceback for INTERNAL, rate-limited lines otherwise), then released."""
        code = status_code(exc)
        if code == grpc.StatusCode.INTERNAL:
            logger.error("%s failed", method, exc_info=exc)
        else:  # the client's doing (or overload): rate-limited, so that a flood of bad calls cannot flood the log
            logging_setup.rejections.log("%s: %s: %s", method, code.name, exc)
        failure = cls(code, str(exc) or type(exc).__name__, reason(exc))
        release(exc)
        return failure


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
        admission: checks each request before it is parsed and while it is handled (server/engine/limits.py);
            None = every request is admitted.
        counted: methods whose refusals before their handler runs are counted in the request metrics.
        models: the served models' names, the metrics' `model` label (any other name counts as "").

    Client-streaming and bidirectional handlers (server reflection) pass through unchanged.
    """

    def __init__(self, admission: Admission | None = None, counted: Collection[str] = (),
                 models: Collection[str] = ()):
        self._admission = admission or _AdmitAll()
        self._counted = frozenset(counted)
        self._models = frozenset(models)

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(handler_call_details)
        if handler is None:
            return None
        method = handler_call_details.method
        arrival = _Arrival()
        if method in self._counted:
            # The call's task ends without the message ever reaching the deserializer when gRPC refused it
            # over its receive limit (or the client left before sending it): count that refusal too.
            asyncio.current_task().add_done_callback(arrival.count_if_unreceived)
            _ARRIVAL.set(arrival)
        wire = {
            "request_deserializer": self._tolerant(handler.request_deserializer, method, arrival),
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

    def _tolerant(self, deserializer: Callable | None, method: str, arrival: _Arrival) -> Callable | None:
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
            arrival.received = True
            try:
                admission.check(method, data)
            except Exception as exc:
                return _Refused(_bare(exc), len(data), limits.peek_string_field(data, field_number=1))
            try:
                return _Received(deserializer(data), len(data))
            except Exception as exc:  # protobuf's DecodeError
                error = ValueError(f"the request cannot be parsed: {exc}")
                error.reason = "unparsable"
                return _Refused(error, len(data), None)

        return deserialize

    def _guard_call(self, behavior: Callable, method: str) -> Callable:
        async def guarded(request, context: grpc.aio.ServicerContext):
            call = _Call(request)
            try:
                message = call.admit(self._admission, method)
                response = behavior(message, context)
                if inspect.isawaitable(response):
                    response = await response
                return response
            except grpc.aio.AbortError:
                raise  # the handler already chose a status
            except Exception as exc:
                failure = Failure.of(exc, method)
            finally:
                call.end()
            # Outside the except block, so that the AbortError carries no reference to the failed call.
            request = message = None
            await self._abort(context, failure, method, call)

        return guarded

    def _guard_generator(self, behavior: Callable, method: str) -> Callable:
        async def guarded(request, context: grpc.aio.ServicerContext):
            call = _Call(request)
            try:
                message = call.admit(self._admission, method)
                async for response in behavior(message, context):
                    yield response
                return
            except grpc.aio.AbortError:
                raise
            except Exception as exc:
                failure = Failure.of(exc, method)
            finally:
                call.end()
            request = message = None
            await self._abort(context, failure, method, call)

        return guarded

    async def _abort(self, context: grpc.aio.ServicerContext, failure: Failure, method: str, call: _Call) -> None:
        """Counts a refusal made before the handler ran, then ends the RPC (raises grpc.aio.AbortError)."""
        if not call.entered and method in self._counted:
            model = call.model if call.model in self._models else ""
            metrics.count_request(model, failure.code.name, failure.reason)
        await context.abort(failure.code, failure.details)


def note_received() -> None:
    """Tells the current call's arrival check that its message reached Python (a deserializer of another
    interceptor, e.g. the token check's, calls it)."""
    arrival = _ARRIVAL.get(None)
    if arrival is not None:
        arrival.received = True


class _Arrival:
    """Whether a call's request message reached Python."""

    received = False

    def count_if_unreceived(self, _task) -> None:
        if not self.received:
            metrics.count_request("", grpc.StatusCode.RESOURCE_EXHAUSTED.name, "receive_limit")


def _bare(exc: Exception) -> Exception:
    """`exc` without its traceback, whose frames hold the bytes it refused."""
    release(exc)
    return exc


class _Call:
    """One call's request as received, through admission, to its end (which frees the budget it held)."""

    def __init__(self, request):
        self.size = request.size if isinstance(request, _Received | _Refused) else 0
        self.model = request.model if isinstance(request, _Refused) else None
        self.entered = False  # the handler ran (it counts the call itself)
        self._request = request
        self._held: contextlib.AbstractContextManager | None = None

    def admit(self, admission: Admission, method: str):
        """The parsed message, once its bytes are held in the in-flight budget; raises a refusal."""
        request, self._request = self._request, None
        if isinstance(request, _Refused):
            raise request.error
        message = request.message if isinstance(request, _Received) else request
        self.model = getattr(message, "model", None)
        held = admission.hold(method, self.size)
        held.__enter__()
        self._held, self.entered = held, True
        return message

    def end(self) -> None:
        if self._held is not None:
            self._held.__exit__(None, None, None)
            self._held = None
        memory.RECLAIMER.released(self.size)


@dataclasses.dataclass(frozen=True)
class _Received:
    """A parsed request and the size of its serialized bytes."""

    message: object
    size: int


@dataclasses.dataclass(frozen=True)
class _Refused:
    """Stands in for a request that was refused or does not parse, so that its handler's guard reports it."""

    error: Exception  # released: no traceback
    size: int  # of the refused bytes
    model: str | None  # the model it names, if it could be read without parsing
