"""A model's engine in a process of its own (`attnserve serve --engine-process`).

Why: in one process, the gRPC event loop and a model's decode loop share one GIL. Under many streaming
clients the loop spends about half a millisecond of CPU per generated token on gRPC's per-message work, and
the decode worker waits for the GIL between ONNX Runtime calls: measured on 2 cores, 32 streaming clients
got 451-530 tokens/s over gRPC against 665-745 for the same engine in process (bench/README.md). With the
engine in a child process the two loops run truly side by side; the cost is a pipe message per event.

The child loads the model with the server's options and runs an ordinary `ModelEngine`. The parent's
`ProcessEngine` offers what the servicer uses (`info`, `submit`, `cancel`, `close`) with the same
semantics: `submit` raises the engine's own validation errors, the future is marked running when the
request leaves the queue (so the load gauges stay right), tokens reach `on_token` in order, a queued request
cancelled is dropped at once and a running one ends with CancelledError after the current step.

The child is `python -m attnserve.server.edge.engine_process FD`, FD its end of a socket pair. Messages over it
(pickled, multiprocessing's framing):
    parent -> child   (repository, name, runtime options, batching options, log options), once at start;
                      ("submit", id, request, stream) · ("cancel", id) · ("close",)
    child -> parent   ("ready", info, providers) or ("failed", reason), once at start;
                      ("accepted", id) or ("rejected", id, exception), before anything else about the
                      request; ("started", id); ("token", id, event);
                      ("done", id, result) · ("error", id, exception) · ("cancelled", id)
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import logging
import multiprocessing.connection
import pathlib
import pickle
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Callable
from concurrent.futures import CancelledError, Future

from attnserve.server.engine.batcher import BatchingOptions
from attnserve.api.generation import GenerationRequest, GenerationResult, ModelInfo, StreamedToken, UnavailableError
from attnserve.server.model.repository import find_models
from attnserve.server.model.runtime_options import RuntimeOptions

logger = logging.getLogger(__name__)

# How long a child may take to load and build its ONNX Runtime sessions.
START_TIMEOUT_SECONDS = 300.0


@dataclasses.dataclass
class _Pending:
    """A submitted request as the parent tracks it."""

    future: Future
    on_token: Callable[[StreamedToken], None] | None
    answered: threading.Event = dataclasses.field(default_factory=threading.Event)  # accepted or rejected
    rejection: BaseException | None = None


class ProcessEngine:
    """The engine of one model, running in a child process; see the module docstring.

    Raises:
        ValueError: the model failed to load in the child (the child's message), or it did not start in time.
    """

    def __init__(self, repository: str | pathlib.Path, name: str, runtime_options: RuntimeOptions = RuntimeOptions(),
                 batching_options: BatchingOptions = BatchingOptions(), log_options: tuple[str, str] | None = None):
        # A plain subprocess, not multiprocessing's spawn: that also starts its resource tracker, one more
        # Python process (13 MB) that nothing here uses. The child learns its job from the first message.
        parent_end, child_end = socket.socketpair()
        with child_end:
            self._process = subprocess.Popen(
                [sys.executable, "-m", "attnserve.server.edge.engine_process", str(child_end.fileno())],
                pass_fds=[child_end.fileno()],
            )
        self._conn = multiprocessing.connection.Connection(parent_end.detach())
        self._conn.send((str(repository), name, runtime_options, batching_options, log_options))
        self.info, self.providers = self._wait_ready(name)
        self.max_rows = batching_options.continuous.max_rows if batching_options.continuous else None
        self._send_lock = threading.Lock()
        self._lock = threading.Lock()
        self._pending: dict[int, _Pending] = {}
        self._ids_by_future: dict[Future, int] = {}
        self._next_id = itertools.count()
        self._closed = False  # no more submissions: closing, or the child is gone
        self._close_requested = False
        # Called (from the reader thread) with the reason if the child ends without being asked to: the
        # server marks the model NOT_SERVING (server/edge/app.py).
        self.on_exit: Callable[[str], None] | None = None
        self._reader = threading.Thread(target=self._read, name=f"engine-{name}-reader", daemon=True)
        self._reader.start()

    def _wait_ready(self, name: str) -> tuple[ModelInfo, list[str]]:
        """The child's model info and execution providers, once it has loaded the model.

        Raises:
            ValueError: it failed to load (its reason), died, or took longer than START_TIMEOUT_SECONDS.
        """
        if not self._conn.poll(START_TIMEOUT_SECONDS):
            self._process.kill()
            self._process.wait()
            raise ValueError(f"model {name!r}: its engine process did not start in {START_TIMEOUT_SECONDS:.0f} s")
        try:
            kind, *payload = self._conn.recv()
        except (EOFError, OSError):
            kind, payload = "died", []
        if kind == "ready":
            return payload[0], payload[1]
        reason = payload[0] if kind == "failed" else f"its engine process exited (code {_wait(self._process, 10)})"
        raise ValueError(f"model {name!r}: {reason}")

    def submit(self, request: GenerationRequest,
               on_token: Callable[[StreamedToken], None] | None = None) -> Future[GenerationResult]:
        """As `ModelEngine.submit`: the child validates and queues the request before this returns.

        Raises:
            ValueError, OverloadedError, UnavailableError: as the engine raises them.
        """
        pending = _Pending(Future(), on_token)
        with self._lock:
            if self._closed:
                raise UnavailableError(f"model '{self.info.name}' is shutting down")
            request_id = next(self._next_id)
            self._pending[request_id] = pending
            self._ids_by_future[pending.future] = request_id
        pending.future.add_done_callback(self._forget)
        self._send(("submit", request_id, request, on_token is not None))
        pending.answered.wait()
        if pending.rejection is not None:
            raise pending.rejection
        return pending.future

    def generate(self, request: GenerationRequest, timeout: float | None = None) -> GenerationResult:
        """Blocking submit(), as `ModelEngine.generate`."""
        future = self.submit(request)
        try:
            return future.result(timeout)
        finally:
            self.cancel(future)

    def cancel(self, future: Future[GenerationResult]) -> None:
        """As `ModelEngine.cancel`; safe from any thread."""
        with self._lock:
            request_id = self._ids_by_future.get(future)
        if request_id is None:
            return
        future.cancel()  # succeeds only while it waits in the child's queue, as in process
        self._send(("cancel", request_id))

    def close(self, timeout: float | None = 30.0) -> None:
        """Stops the child: queued requests fail with UnavailableError, running ones are cancelled (they end
        after their current step); past `timeout` s the child is killed."""
        with self._lock:
            if self._close_requested:
                return
            self._close_requested = self._closed = True
        self._send(("close",))  # nobody reads it if the child died: then the wait below just reaps it
        if _wait(self._process, timeout) is None:
            logger.warning("model %r: engine process did not stop in %s s; killing it", self.info.name, timeout)
            self._process.kill()
            self._process.wait()
        self._reader.join(timeout)

    def kill(self) -> None:
        """Ends the child at once (what was pending fails as UnavailableError)."""
        with self._lock:
            self._close_requested = self._closed = True
        self._process.kill()

    def _send(self, message: tuple) -> None:
        try:
            with self._send_lock:
                self._conn.send(message)
        except (OSError, ValueError):
            pass  # the child is gone; the reader fails what was pending

    def _forget(self, future: Future) -> None:
        with self._lock:
            request_id = self._ids_by_future.pop(future, None)
            pending = self._pending.get(request_id)
            if pending is not None and pending.answered.is_set():
                del self._pending[request_id]

    def _read(self) -> None:
        """The reader thread: applies the child's messages to the parent's futures until the pipe closes."""
        try:
            while True:
                message = self._conn.recv()
                try:
                    self._apply(*message)
                except Exception:  # one bad message must not strand every other request
                    logger.exception("model %r: could not apply the engine's %r message", self.info.name, message[0])
        except (EOFError, OSError):
            pass
        finally:
            self._fail_all(UnavailableError(f"model '{self.info.name}': its engine process ended"))
            if not self._close_requested:
                reason = f"its engine process ended unexpectedly (exit code {_wait(self._process, 5)})"
                logger.error("model %r: %s", self.info.name, reason)
                if self.on_exit is not None:
                    self.on_exit(reason)

    def _apply(self, kind: str, request_id: int, *payload) -> None:
        with self._lock:
            pending = self._pending.get(request_id)
        if pending is None:
            return
        future = pending.future
        if kind == "accepted" or kind == "rejected":
            pending.rejection = payload[0] if kind == "rejected" else None
            pending.answered.set()
            if kind == "rejected" or future.done():
                with self._lock:
                    self._pending.pop(request_id, None)
                    self._ids_by_future.pop(future, None)
        elif kind == "started":
            if not future.done():  # the caller may have cancelled it meanwhile: then nothing to do
                future.set_running_or_notify_cancel()
        elif kind == "token":
            if pending.on_token is not None and not future.done():
                try:
                    pending.on_token(payload[0])
                except Exception as exc:  # as in process: the request fails with it and leaves its batch
                    self._send(("cancel", request_id))
                    _settle(future, exc)
        elif kind == "done":
            _settle(future, result=payload[0])
        elif kind == "error":
            _settle(future, payload[0])
        elif kind == "cancelled":
            _settle(future, CancelledError("the caller cancelled the request"))

    def _fail_all(self, error: BaseException) -> None:
        with self._lock:
            pending, self._pending = list(self._pending.values()), {}
            self._closed = True
        for p in pending:
            if not p.answered.is_set():
                p.rejection = error
                p.answered.set()
            _settle(p.future, error)


def _wait(process: subprocess.Popen, timeout: float | None) -> int | None:
    """The process's exit code once it ends, or None if it is still running after timeout seconds."""
    try:
        return process.wait(timeout)
    except subprocess.TimeoutExpired:
        return None


def _settle(future: Future, error: BaseException | None = None, result: GenerationResult | None = None) -> None:
    """Ends a parent future unless it already ended (e.g. cancelled while queued)."""
    if future.done():
        return
    if isinstance(error, CancelledError) and future.cancel():
        return
    try:
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)
    except Exception:  # InvalidStateError: it ended on another thread just now
        pass


def load_process_engines(repository: str | pathlib.Path, runtime_options: RuntimeOptions,
                         batching_options: BatchingOptions, broken: dict[str, str] | None = None,
                         only=(), log_options: tuple[str, str] | None = None) -> dict[str, ProcessEngine]:
    """`engine.load_engines`, each model's engine in its own process.

    Raises:
        ValueError: as `load_engines` (engines already started are closed first).
    """
    engines: dict[str, ProcessEngine] = {}
    try:
        for name in find_models(repository, broken, only):
            try:
                engines[name] = ProcessEngine(repository, name, runtime_options, batching_options, log_options)
            except ValueError as exc:
                if broken is None:
                    raise
                broken[name] = str(exc)
    except BaseException:
        for engine in engines.values():
            engine.close()
        raise
    return engines


# ---- the child ----

def _child_entry(fd: int) -> None:
    """`python -m attnserve.server.edge.engine_process FD`: FD is the child's end of the parent's socket pair."""
    conn = multiprocessing.connection.Connection(fd)
    try:
        repository, name, runtime_options, batching_options, log_options = conn.recv()
    except (EOFError, OSError):
        return  # the parent went away before saying what to load
    _child_main(conn, repository, name, runtime_options, batching_options, log_options)


def _child_main(conn, repository: str, name: str, runtime_options: RuntimeOptions,
                batching_options: BatchingOptions, log_options: tuple[str, str] | None) -> None:
    """Loads the model and serves the parent's messages until it says close or goes away."""
    # The parent decides when to stop (it drains first); a terminal's Ctrl-C reaches the whole group.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    loaded = _load_in_child(conn, repository, name, runtime_options, batching_options, log_options)
    if loaded is None:
        return
    registry, engine = loaded
    try:
        _Child(conn, engine).serve()
    finally:
        registry.close()  # queued requests fail (their outcomes are sent), the running batch finishes
        conn.close()


def _load_in_child(conn, repository: str, name: str, runtime_options: RuntimeOptions,
                   batching_options: BatchingOptions, log_options: tuple[str, str] | None):
    """The registry holding just `name` and its engine, or None once the parent has been told why not."""
    from attnserve.server.edge import logging_setup
    from attnserve.server.engine.registry import load_engines

    if log_options is not None:
        logging_setup.configure(*log_options)
    try:
        registry = load_engines(repository, runtime_options, batching_options, only=[name])
        return registry, registry.get(name)
    except Exception as exc:
        conn.send(("failed", str(exc)))
        conn.close()
        return None


class _Child:
    """The child's end of the pipe: its engine, the requests running there, and the lock that orders what it
    sends (a request's "accepted" before its "started" and tokens)."""

    def __init__(self, conn, engine):
        self.conn, self.engine = conn, engine
        self.futures: dict[int, Future] = {}
        self.send_lock = threading.Lock()

    def send(self, message: tuple) -> None:
        try:
            with self.send_lock:
                self.conn.send(message)
        except (OSError, ValueError):
            pass  # the parent is gone; the main loop sees EOF and stops

    def serve(self) -> None:
        """Says ready, then handles submit, cancel and close messages until close or EOF."""
        from attnserve.server.edge import memory

        memory.release_free_heap()  # what building the sessions parsed and freed (the parent's trim is not ours)
        self.send(("ready", self.engine.info, self.engine.providers))
        while True:
            try:
                message = self.conn.recv()
            except (EOFError, OSError):
                return
            if message[0] == "close":
                # What still runs is cut off (the parent drained first): cancelled, its rows end at the next
                # step, so that closing takes a step, not the rest of the running batch.
                for future in list(self.futures.values()):
                    self.engine.cancel(future)
                return
            if message[0] == "cancel":
                future = self.futures.get(message[1])
                if future is not None:
                    self.engine.cancel(future)
                continue
            self.submit(*message[1:])

    def submit(self, request_id: int, request, stream: bool) -> None:
        send = self.send
        on_token = functools.partial(_send_token, send, request_id) if stream else None
        try:
            prepared = self.engine.prepare(request)  # outside the lock: decoding a long recording takes a while
        except Exception as exc:
            send(("rejected", request_id, _transportable(exc)))
            return
        # Holding the pipe until "accepted" is out makes it the first message about the request: the
        # worker may start it at once, but its "started" and tokens wait for the lock.
        with self.send_lock:
            try:
                on_start = functools.partial(send, ("started", request_id))
                future = self.engine.submit_prepared(prepared, on_token, on_start)
            except Exception as exc:
                self.conn.send(("rejected", request_id, _transportable(exc)))
                return
            self.futures[request_id] = future
            self.conn.send(("accepted", request_id))
        future.add_done_callback(functools.partial(_send_outcome, send, self.futures, request_id))


def _send_token(send, request_id: int, event: StreamedToken) -> None:
    send(("token", request_id, event))


def _send_outcome(send, futures: dict[int, Future], request_id: int, future: Future) -> None:
    futures.pop(request_id, None)
    if future.cancelled():
        send(("cancelled", request_id))
    elif future.exception() is not None:
        send(("error", request_id, _transportable(future.exception())))
    else:
        send(("done", request_id, future.result()))


def _transportable(exc: BaseException) -> BaseException:
    """The exception itself if it survives pickling, else a RuntimeError that names it."""
    try:
        pickle.loads(pickle.dumps(exc))
        return exc
    except Exception:
        return RuntimeError(repr(exc))


if __name__ == "__main__":
    _child_entry(int(sys.argv[1]))
