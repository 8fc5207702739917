"""Each model's intake: its requests are validated and preprocessed on a bounded pool of its own.

Why: submitting a request decodes its input (tokenizing, WAV decoding and resampling, PNG/JPEG decoding),
which for a large image takes seconds of CPU. On asyncio's shared default executor (an unbounded queue in
front of a few threads, shielded from cancellation) 200 small PNGs that decode to 40 Mpx each kept both
cores busy for ~130 s after every client had given up, and a request to *another* model timed out at 60 s.
Here each model gets:

  * `workers` threads of its own, so one model's decoding never queues another model's requests;
  * a queue bound (`max_queued`): past it a request is refused (RESOURCE_EXHAUSTED, preprocess_queue_full)
    rather than waiting behind work it cannot overtake;
  * a budget of *decoded* bytes (`max_decoded_bytes`, server/engine/decoded_size.py, read from headers before
    anything is decoded) held from admission until its preprocessing ends: past it a request is refused
    (RESOURCE_EXHAUSTED, decoded_bytes); one request larger than the whole budget runs only alone;
  * a request whose caller gave up (cancelled, or its deadline passed) before its turn is dropped without
    being decoded; once decoding started it runs to its end (no decoder here can stop midway) and the
    request is then cancelled in its engine.

Used from the event loop: `submit` is called there; the jobs run on the pool.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import threading
import time
from collections.abc import Callable

from attnserve.server.engine.batcher import BatchingOptions
from attnserve.server.engine.decoded_size import decoded_bytes
from attnserve.server.model.option_fields import bounded, check, mirror
from attnserve.api.generation import GenerationRequest, OverloadedError


@dataclasses.dataclass(frozen=True)
class IntakeOptions:
    workers: int = bounded(1, least=1)  # preprocessing threads per model
    # Requests waiting for a preprocessing thread, per model; more are refused. As deep as the engine's own
    # queue behind it: a shallower one refused 64 concurrent clients of cheap text requests (a text waits
    # microseconds here) before the engine ever queued one. Big inputs are bounded by max_decoded_bytes.
    max_queued: int = mirror(BatchingOptions, "max_queue_size")
    max_decoded_bytes: int = bounded(512 << 20, least=1)  # decoded input bytes being or waiting to be preprocessed

    def __post_init__(self):
        check(self)


class Intake:
    """One model's preprocessing pool, queue bound and decoded-bytes budget (see the module docstring).

    Args:
        name: the model's name (thread names, messages).
        options: the pool's size and limits.
    """

    def __init__(self, name: str, options: IntakeOptions = IntakeOptions()):
        self.name = name
        self.options = options
        self._pool = concurrent.futures.ThreadPoolExecutor(options.workers, thread_name_prefix=f"intake-{name}")
        self._lock = threading.Lock()
        self._queued = 0  # jobs not started yet
        self._decoded = 0  # decoded bytes held by queued and running jobs

    @property
    def queued(self) -> int:
        with self._lock:
            return self._queued

    @property
    def decoded_bytes(self) -> int:
        with self._lock:
            return self._decoded

    def submit(self, submit: Callable, request: GenerationRequest, *args,
               deadline: float | None = None) -> concurrent.futures.Future:
        """Queues `submit(request, *args)` (the engine's submit) on the pool and returns its future.

        Args:
            deadline: time.monotonic() after which the job is dropped instead of started (TimeoutError).

        Raises:
            OverloadedError: the queue or the decoded-bytes budget is full.
        """
        size = decoded_bytes(request)
        self._reserve(size)
        job = _Job(self, size, deadline)
        try:
            future = self._pool.submit(job.run, submit, request, *args)
        except BaseException:
            job.finish()
            raise
        future.add_done_callback(job.dropped)  # a job cancelled before it started never runs its finish
        return future

    def _reserve(self, size: int) -> None:
        o = self.options
        with self._lock:
            if self._queued >= o.max_queued:
                raise OverloadedError(
                    f"model '{self.name}' has {self._queued} requests waiting for preprocessing, its most; retry later",
                    reason="preprocess_queue_full")
            if self._decoded and self._decoded + size > o.max_decoded_bytes:
                raise OverloadedError(
                    f"model '{self.name}' is decoding inputs of {self._decoded} bytes and this one decodes to {size}; "
                    f"it takes {o.max_decoded_bytes} at once (--max-decoded-mb); retry later",
                    reason="decoded_bytes")
            self._queued += 1
            self._decoded += size

    def _release(self, size: int, started: bool) -> None:
        with self._lock:
            self._decoded -= size
            if not started:
                self._queued -= 1

    def _started(self) -> None:
        with self._lock:
            self._queued -= 1

    def close(self) -> None:
        """Drops the queued jobs; running ones finish (their engines refuse them once closed)."""
        self._pool.shutdown(wait=False, cancel_futures=True)


class _Job:
    """One queued submission: runs it unless its caller left, and returns its budget exactly once."""

    def __init__(self, intake: Intake, size: int, deadline: float | None):
        self._intake, self._size, self._deadline = intake, size, deadline
        self._state = "queued"  # -> "running" -> "done", or "queued" -> "done" (dropped)
        self._lock = threading.Lock()

    def run(self, submit: Callable, request: GenerationRequest, *args):
        with self._lock:
            if self._state != "queued":
                raise concurrent.futures.CancelledError()
            self._state = "running"
        self._intake._started()
        try:
            if self._deadline is not None and time.monotonic() >= self._deadline:
                raise TimeoutError("the deadline passed while the request waited for preprocessing")
            return submit(request, *args)
        finally:
            self.finish()

    def finish(self) -> None:
        with self._lock:
            state, self._state = self._state, "done"
        if state != "done":
            self._intake._release(self._size, started=state == "running")

    def dropped(self, future: concurrent.futures.Future) -> None:
        if future.cancelled():
            self.finish()
