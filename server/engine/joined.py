"""One request answered from several inner requests (reranking's rounds, speed readings): wait for all of
them, then answer or fail the outer request once."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future, InvalidStateError

from attnserve.api.generation import GenerationResult


def when_all_done(outer: Future, futures: Sequence[Future], then: Callable[[list[GenerationResult]], None]) -> None:
    """Calls `then` with the results of `futures` once every one is done, unless `outer` was answered or
    cancelled meanwhile. An inner request that was cancelled cancels `outer`; one that failed, or `then`
    raising, fails it (on whichever thread finished last: never the worker's loop)."""
    remaining = [len(futures)]
    lock = threading.Lock()

    def done(_future: Future) -> None:
        with lock:
            remaining[0] -= 1
            if remaining[0]:
                return
        if outer.done():
            return
        failed = next((f for f in futures if f.cancelled() or f.exception() is not None), None)
        if failed is not None and failed.cancelled():
            outer.cancel()
        elif failed is not None:
            settle(outer, error=failed.exception())
        else:
            try:
                then([f.result() for f in futures])
            except Exception as exc:  # the request fails, never the worker thread
                settle(outer, error=exc)

    for future in futures:
        future.add_done_callback(done)


def settle(future: Future, result: GenerationResult | None = None, error: BaseException | None = None) -> None:
    """Answers the request unless it was cancelled meanwhile (from another thread)."""
    try:
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)
    except InvalidStateError:
        pass


class InFlight:
    """The joined requests in flight, by their outer future: what `cancel` looks a future up in."""

    def __init__(self):
        self._lock = threading.Lock()
        self._jobs: dict[Future, object] = {}

    def add(self, outer: Future, job: object) -> None:
        """Keeps `job` until `outer` is done (answered, failed or cancelled)."""
        with self._lock:
            self._jobs[outer] = job
        outer.add_done_callback(self._forget)

    def get(self, future: Future):
        """The job of `future`; None if it is not an outer future in flight."""
        with self._lock:
            return self._jobs.get(future)

    def _forget(self, future: Future) -> None:
        with self._lock:
            self._jobs.pop(future, None)
