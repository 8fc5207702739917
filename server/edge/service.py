"""The AttnServe gRPC servicer: checks a request's shape, converts it, and hands it to the model's engine.

Handlers never block the event loop: submitting a request (validating and preprocessing its input) runs on
its model's intake pool (server/edge/intake.py: bounded, per model, dropped if the caller left first), and an
engine runs the model on its own worker thread and returns a `concurrent.futures.Future`, which handlers await through `asyncio.wrap_future`. Tokens of a stream
cross from that thread into the loop through `loop.call_soon_threadsafe`. A handler that leaves before
its request finished (client cancelled, deadline passed) cancels the request in its engine, which frees
its batch row. Handlers raise plain exceptions; `errors.ErrorInterceptor` turns them into status codes.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import dataclasses
import functools
import logging
import time
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from typing import Protocol

import grpc

from attnserve.api import convert, generation
from attnserve.server.edge import client_keys, errors, intake, lifecycle, logging_setup, metrics
from attnserve.server.engine import cost, longform
from attnserve.v1 import attnserve_pb2 as pb
from attnserve.v1 import attnserve_pb2_grpc as pb_grpc

logger = logging.getLogger(__name__)

# The most tokens a GenerateStream message may batch (GenerateRequest.stream_interval).
MAX_STREAM_INTERVAL = 256


class Engine(Protocol):
    """What the server needs from a model engine: server/engine/engine.py's ModelEngine, in this process, or
    server/edge/engine_process.py's ProcessEngine, in a child process (an audio model's wrapped in
    server/engine/longform.py's LongFormEngine, whose submit also takes the caller's `client` key)."""

    # Called (from any thread) with the reason if the engine ends on its own; set by the server. An
    # in-process engine never does.
    on_exit: Callable[[str], None] | None

    @property
    def info(self) -> generation.ModelInfo: ...

    @property
    def providers(self) -> list[str]:
        """The ONNX Runtime execution providers its graphs run on, best first."""

    def submit(
        self,
        request: generation.GenerationRequest,
        on_token: Callable[[generation.StreamedToken], None] | None = None,
    ) -> concurrent.futures.Future[generation.GenerationResult]: ...

    def cancel(self, future: concurrent.futures.Future[generation.GenerationResult]) -> None: ...

    def close(self, timeout: float | None = None) -> None: ...


class AttnServeServicer(pb_grpc.AttnServeServicer):
    """Serves every model of `engines` (model name -> engine) under one service."""

    def __init__(
        self,
        engines: Mapping[str, Engine],
        drain: lifecycle.Drain | None = None,
        broken: Mapping[str, str] | None = None,
        intake_options: intake.IntakeOptions = intake.IntakeOptions(),
        deadline_admission: bool = True,
        client_by_token: bool = False,
    ):
        """
        Args:
            engines: model name -> its engine.
            drain: counts generation requests in progress and refuses new ones while the server stops.
            broken: model name -> why it failed to load (served with --skip-broken-models); calls naming
                one are FAILED_PRECONDITION (the reason, which names server paths, is only logged).
            intake_options: each model's preprocessing pool and limits (server/edge/intake.py).
            deadline_admission: refuse at once what cannot finish before its deadline (server/engine/cost.py).
            client_by_token: the server takes bearer tokens: a client is its token, not its IP address
                (server/edge/client_keys.py).
        """
        self._engines = engines
        self._drain = drain or lifecycle.Drain()
        self._broken = dict(broken or {})
        self.intakes = {name: intake.Intake(name, intake_options) for name in engines}
        # Windowed batching states no row bound: its batches hold the 16 rows of its default batch size.
        self.costs = {name: cost.CostModel(e.info, getattr(e, "max_rows", None) or 16) for name, e in engines.items()}
        self._deadline_admission = deadline_admission
        self._client_by_token = client_by_token

    async def Generate(self, request: pb.GenerateRequest, context: grpc.aio.ServicerContext) -> pb.GenerateResponse:
        with self._drain.track(), self._counted(request, "Generate", context) as access:
            engine, gen_request = self._prepare(request)
            async with self._admitted(engine, gen_request, context) as (future, ticket):
                result = await _result(future, _deadline(context))
                self.costs[request.model].observe(gen_request, result, ticket)
            access.tokens = len(result.tokens)
        metrics.observe_result(result)
        return convert.result_to_proto(result)

    async def GenerateStream(
        self, request: pb.GenerateRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.GenerateStreamResponse]:
        deadline = _deadline(context)
        with self._drain.track(), self._counted(request, "GenerateStream", context) as access:
            if request.stream_interval > MAX_STREAM_INTERVAL:
                raise ValueError(
                    f"stream_interval {request.stream_interval} is out of range: use 0..{MAX_STREAM_INTERVAL}"
                )
            engine, gen_request = self._prepare(request)
            stream = _TokenStream(asyncio.get_running_loop())
            async with self._admitted(engine, gen_request, context, stream.on_token) as (future, ticket):
                # Runs on the worker thread after its last on_token call, so the end marker queues last.
                future.add_done_callback(stream.finish)
                async for events in stream.groups(deadline, request.stream_interval):
                    yield convert.token_events_to_proto(events)
                result = await _result(future, deadline)
                self.costs[request.model].observe(gen_request, result, ticket)
            access.tokens = len(result.tokens)
        metrics.observe_result(result)
        yield convert.final_to_proto(result)

    async def ListModels(
        self, request: pb.ListModelsRequest, context: grpc.aio.ServicerContext
    ) -> pb.ListModelsResponse:
        infos = [self._engines[name].info for name in sorted(self._engines)]
        return pb.ListModelsResponse(models=[convert.model_info_to_proto(info) for info in infos])

    async def GetModel(self, request: pb.GetModelRequest, context: grpc.aio.ServicerContext) -> pb.ModelInfo:
        return convert.model_info_to_proto(self._engine(request.name).info)

    def _engine(self, name: str) -> Engine:
        engine = self._engines.get(name)
        if engine is None and name in self._broken:
            # The reason names the server's files: it is in the server's log, not in the answer.
            raise generation.ModelNotServedError(f"model {name!r} failed to load on this server and is not served")
        if engine is None:
            available = ", ".join(sorted(self._engines)) or "none"
            raise generation.ModelNotFoundError(f"unknown model {name!r}; available: {available}")
        return engine

    def _prepare(self, request: pb.GenerateRequest) -> tuple[Engine, generation.GenerationRequest]:
        """Checks what the core cannot see (the oneof, the wire-only source language) and converts.

        Raises:
            ModelNotFoundError, ModelNotServedError: an unknown model, or one that failed to load.
            ValueError: no input, an input of another kind than the model reads, or a source
                language the model does not read. The engine checks the rest (the input itself, languages,
                lengths, ranges) when the request is submitted.
        """
        engine = self._engine(request.model)
        kind = request.WhichOneof("input")
        if kind is None:
            raise ValueError("missing input: set one of text, audio, image, video")
        wanted = engine.info.input_kind.value
        if kind != wanted:
            raise ValueError(f"model {request.model!r} takes {wanted} input, not {kind}")
        languages = engine.info.source_languages
        language = request.text.source_language if kind == "text" and request.text.HasField("source_language") else None
        if language is not None and language not in languages:
            raise ValueError(
                f"unknown source language {request.text.source_language!r} for model {request.model!r}; "
                f"available: {', '.join(languages)}"
            )
        logger.debug("request %r for model %r", request.request_id, request.model)
        return engine, convert.request_from_proto(request)

    @contextlib.asynccontextmanager
    async def _admitted(self, engine: Engine, request: generation.GenerationRequest,
                         context: grpc.aio.ServicerContext, on_token=None):
        """`_submitted` on the model's intake, once its cost model admits it before its deadline; yields its
        future and its admission ticket, whose rows count as admitted until the block ends."""
        # Only the long-form wrapper bounds each client (its long recordings); the other engines take no key.
        bounds_clients = isinstance(engine, longform.LongFormEngine)
        client = client_keys.client_key(context, self._client_by_token) if bounds_clients else None
        remaining = context.time_remaining() if self._deadline_admission else None
        costs = self.costs[request.model]
        ticket = costs.admit(request, remaining)
        try:
            async with _submitted(engine, request, self.intakes[request.model], context, on_token, client) as future:
                yield future, ticket
        finally:
            costs.finished(ticket)

    @contextlib.contextmanager
    def _counted(
        self, request: pb.GenerateRequest, method: str, context: grpc.aio.ServicerContext
    ) -> Iterator[_Access]:
        """Counts the request under its final status code (unknown model names share one label) and writes
        its access line."""
        code, reason = grpc.StatusCode.OK, None
        model = request.model
        request.request_id = request.request_id or logging_setup.new_request_id()  # every log line names one
        access = _Access(started=time.perf_counter())
        try:
            yield access
        except GeneratorExit:  # the client went away in the middle of a stream
            code = grpc.StatusCode.CANCELLED
            raise
        except BaseException as exc:
            code, reason = errors.status_code(exc), errors.reason(exc)
            raise
        finally:
            if code == grpc.StatusCode.CANCELLED and _deadline_passed(context):
                code = grpc.StatusCode.DEADLINE_EXCEEDED  # gRPC cancels the handler when the deadline passes
            metrics.count_request(model if model in self._engines else "", code.name, reason)
            seconds = time.perf_counter() - access.started
            logging_setup.log_access(method, model, code.name, access.tokens, seconds, request.request_id)


@dataclasses.dataclass
class _Access:
    """What a request's access line reports beside its status."""

    started: float  # perf_counter() when the handler began
    tokens: int = 0  # output tokens of a successful request


@contextlib.asynccontextmanager
async def _submitted(
    engine: Engine,
    request: generation.GenerationRequest,
    pool: intake.Intake,
    context: grpc.aio.ServicerContext,
    on_token: Callable[[generation.StreamedToken], None] | None = None,
    client: str | None = None,
) -> AsyncIterator[concurrent.futures.Future[generation.GenerationResult]]:
    """Submits `request` to `engine` (with the caller's `client` key, where given) on its model's intake pool
    and cancels it when the block is left.

    Submitting validates and preprocesses the input (tokenizes text, decodes audio and images): microseconds
    for a sentence, up to seconds for the megabytes a message may carry, which on the loop would stall every
    other call (health checks included).

    Cancelling a finished request does nothing; a handler that leaves early (the client cancelled, the
    deadline passed, the stream was closed) drops its submission if it has not started, else its queued
    request or its running request's batch row once it is submitted.
    """
    remaining = context.time_remaining()
    deadline = None if remaining is None else time.monotonic() + remaining
    submit = engine.submit if client is None else functools.partial(engine.submit, client=client)
    submitting = pool.submit(submit, request, on_token, deadline=deadline)
    try:
        future = await asyncio.wrap_future(submitting)  # cancelling this cancels a job not yet started
        metrics.track_request(request, future, engine.info.default_beam_size)
    except asyncio.CancelledError:
        submitting.add_done_callback(functools.partial(_cancel_submitted, engine))
        raise
    finally:
        del submitting  # its exception's traceback holds this frame: no cycle through the local
    try:
        yield future
    finally:
        engine.cancel(future)


def _cancel_submitted(engine: Engine, submitting: concurrent.futures.Future) -> None:
    """Done-callback of a submission its handler left: cancels the request once it is queued."""
    if not submitting.cancelled() and submitting.exception() is None:
        engine.cancel(submitting.result())


class _TokenStream:
    """Carries `on_token` calls from an engine's worker thread into the event loop, in order."""

    _END = object()

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self._loop = loop
        self._queue: asyncio.Queue = asyncio.Queue()

    def on_token(self, event: generation.StreamedToken) -> None:
        """Engine callback (worker thread)."""
        self._put(event)

    def finish(self, _future: concurrent.futures.Future) -> None:
        """Future done-callback: marks the end of the stream."""
        self._put(self._END)

    def _put(self, item: object) -> None:
        try:
            self._loop.call_soon_threadsafe(self._queue.put_nowait, item)
        except RuntimeError:
            pass  # the loop is closed: the server is gone and nobody reads this stream; the worker goes on

    async def groups(self, deadline: float | None, interval: int) -> AsyncIterator[list[generation.StreamedToken]]:
        """Yields the tokens in groups: the first alone, then `interval` at a time (the last group may be
        shorter), until the engine finishes. Raises TimeoutError as `events` does."""
        group, size = [], 1
        async for event in self.events(deadline):
            if isinstance(event, generation.TranscriptSegment):  # long-form: every segment in a message of its own
                yield [event]
                continue
            group.append(event)
            if len(group) == size:
                yield group
                group, size = [], max(interval, 1)
        if group:
            yield group

    async def events(self, deadline: float | None) -> AsyncIterator[generation.StreamedToken]:
        """Yields the tokens until the engine finishes.

        Raises:
            TimeoutError: the deadline passed first.
        """
        while True:
            async with asyncio.timeout_at(deadline):
                item = await self._queue.get()
            if item is self._END:
                return
            yield item


def _deadline_passed(context: grpc.aio.ServicerContext) -> bool:
    # A client whose deadline passes cancels the call. The server's copy of the deadline was set when the
    # call's headers arrived, one transit later than the client's; the cancel arrives one transit after the
    # client's deadline too, so the two meet within the jitter of that transit: allow for the jitter only,
    # so that a caller who cancels shortly before the deadline is counted CANCELLED (100 ms allowed that).
    remaining = context.time_remaining()
    return remaining is not None and remaining <= _DEADLINE_SLACK_SECONDS


_DEADLINE_SLACK_SECONDS = 0.02


def _deadline(context: grpc.aio.ServicerContext) -> float | None:
    """The RPC's deadline in event-loop time, or None without one."""
    remaining = context.time_remaining()
    return None if remaining is None else asyncio.get_running_loop().time() + remaining


async def _result(
    future: concurrent.futures.Future[generation.GenerationResult], deadline: float | None
) -> generation.GenerationResult:
    """Awaits the engine's future without blocking the loop (the caller cancels the request if it leaves).

    Raises:
        TimeoutError: the deadline passed first.
        generation.UnavailableError: the engine cancelled the request itself, e.g. while closing.
        errors.InternalError: the engine failed the request in any other way (after it passed validation).
    """
    timeout = asyncio.timeout_at(deadline)
    try:
        async with timeout:
            return await asyncio.wrap_future(future)
    except TimeoutError as exc:
        if timeout.expired():  # ours, not a TimeoutError the engine raised
            raise TimeoutError("deadline exceeded while waiting for the model") from None
        raise errors.InternalError(f"the model failed: {exc!r}") from exc
    except asyncio.CancelledError:
        if future.cancelled() and asyncio.current_task().cancelling() == 0:
            raise generation.UnavailableError("the model dropped the request (is it shutting down?)") from None
        raise
    except _PASSED_THROUGH:
        raise
    except Exception as exc:
        # The request passed validation before it was queued: whatever fails now is the server's fault,
        # even a ValueError (a shape error deep in numpy), and must not read as the client's.
        raise errors.InternalError(f"the model failed: {exc!r}") from exc


# What an engine's future may end with that is not a server fault: it is closing, or it shed load.
_PASSED_THROUGH = (generation.UnavailableError, generation.OverloadedError)
