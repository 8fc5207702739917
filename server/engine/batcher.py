"""Dynamic batching: a bounded queue per model and the worker thread that serves it.

By default (`BatchingOptions.continuous`) the worker hands itself to a loop the engine supplies (continuous
batching, server/engine/continuous.py), which takes queued items at every decode step boundary with `take` and
answers them with `resolve`: a request joins the running batch at the next step and never waits for a
window, even when it arrives at an idle worker.

With `continuous=None` the worker runs windowed batches instead: it takes the first queued request, waits up
to a short window for more (never past `max_batch_size`), and hands the group to a processor that yields
each request's outcome as soon as it is known, so a request that finishes early is answered while the rest
of its batch continues. If the processor raises, the requests it had not answered are retried one at a time,
so only the bad one fails. (The continuous loop uses the same path to retry requests alone.)

A caller may cancel an item. A queued item is dropped before it runs; a running one is marked
`cancelled`, and the processor, which checks the mark between its steps, ends it with CancelledError
while its neighbours go on.

The batcher knows nothing about models: the engine supplies the processor (server/engine/windowed.py) and the
loop (server/engine/continuous.py).
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import CancelledError, Future
from typing import Any

from attnserve.api.generation import OverloadedError, UnavailableError
from attnserve.server.model.option_fields import bounded, check
from attnserve.server.engine.scheduler import SchedulingOptions

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class BatchingOptions:
    # Most requests that start together: encoded in one encoder call (continuous: admitted at one step
    # boundary; windowed: one batch).
    max_batch_size: int = bounded(16, least=1)
    # Windowed batches only: how long the worker waits, after a batch's first request arrived, for others
    # to join it, in milliseconds (the unit of --batch-window-ms). Continuous batching never waits for one.
    window_ms: float = bounded(5.0, least=0)
    # Requests waiting beyond the running batch; one more raises OverloadedError.
    max_queue_size: int = bounded(256, least=1)
    # Most attention weights one response may carry (an admission limit, like the queue's); 0 = no limit
    # beyond max_new_tokens x source columns per sequence.
    max_attention_values: int = bounded(0, least=0)
    # Largest DecodingOptions.beam_size accepted (each beam is a row of the batch).
    max_beam_size: int = bounded(16, least=1)
    # Continuous batching (requests join the running batch at every decode step) with these row and
    # fairness limits; None = windowed batches (requests join a batch only when it starts).
    continuous: SchedulingOptions | None = SchedulingOptions()

    def __post_init__(self):
        check(self)


class WorkItem:
    """One queued request: its payload, its future, its optional token callback and its cancel mark.

    Args:
        payload: whatever the processor consumes (the engine's PreparedRequest).
        on_token: called from the worker thread with each streamed token, or None.
        on_start: called from the worker thread when the item leaves the queue to run, or None.
    """

    def __init__(self, payload: Any, on_token: Callable[[Any], None] | None = None,
                 on_start: Callable[[], None] | None = None):
        self.payload = payload
        self.on_token = on_token
        self.on_start = on_start
        self.future: Future = Future()
        self.accepted_at = time.perf_counter()
        # Set from any thread when the caller gives up; read by the processor between steps.
        self.cancelled = False
        self._streamed = 0  # tokens the callback has received, over every attempt
        self._seen = 0  # tokens offered during the current attempt

    def emit(self, token: Any) -> None:
        """Passes a token to the callback, skipping tokens it already got in an earlier, failed attempt.

        Raises:
            Whatever the callback raises; the processor fails this request alone.
        """
        self._seen += 1
        if self.on_token is None or self._seen <= self._streamed:
            return
        self._streamed += 1
        self.on_token(token)

    def start(self) -> bool:
        """Marks the future running and calls on_start; False if the caller cancelled it while it waited."""
        if not self.future.set_running_or_notify_cancel():
            return False
        if self.on_start is not None:
            self.on_start()
        return True

    def cancel(self) -> None:
        """Marks the item cancelled, and cancels its future if it is still queued."""
        # Mark first: if the worker starts the item between these two lines, the processor sees the mark.
        self.cancelled = True
        self.future.cancel()  # succeeds only while queued; a running item is the processor's to end

    def _new_attempt(self) -> None:
        self._seen = 0


# The processor runs a group of items as one batch and yields (index into the group, result or exception)
# for each item as soon as its outcome is known.
Processor = Callable[[Sequence[WorkItem]], Iterable[tuple[int, Any]]]


class Batcher:
    """A bounded queue and one worker thread that runs queued items in dynamic batches.

    Args:
        process: runs a group of items as one batch (see `Processor`): the windowed batches, and the
            continuous loop's retries of single items.
        options: window, batch size and queue bound.
        name: used for the thread name and logs.
        loop: serves the queue instead of windowed batches (the engine's continuous batching loop, given
            when `options.continuous` is set); None = windowed batches.
    """

    def __init__(
        self,
        process: Processor,
        options: BatchingOptions = BatchingOptions(),
        name: str = "model",
        loop: Callable[[Batcher], None] | None = None,
    ):
        self._process = process
        self._loop = loop
        self.options = options
        self.name = name
        self._queue: collections.deque[WorkItem] = collections.deque()
        self._items: dict[Future, WorkItem] = {}  # every item not yet answered, queued or running
        self._cond = threading.Condition()
        self._closed = False
        self._worker = threading.Thread(target=self._run, name=f"batcher-{name}", daemon=True)
        self._worker.start()

    def submit(self, payload: Any, on_token: Callable[[Any], None] | None = None,
               on_start: Callable[[], None] | None = None, admitted: bool = False) -> Future:
        """Queues one item; returns the future its result (or exception) will be set on.

        Args:
            admitted: the item continues a request already accepted: a full queue does not refuse it.

        Raises:
            OverloadedError: the queue is full (and the item is not `admitted`).
            UnavailableError: the batcher is closed.
        """
        item = WorkItem(payload, on_token, on_start)
        item.future.add_done_callback(self._forget)
        with self._cond:
            if self._closed:
                raise UnavailableError(f"model '{self.name}' is shutting down")
            if len(self._queue) >= self.options.max_queue_size and not admitted:
                raise OverloadedError(
                    f"model '{self.name}' has {len(self._queue)} requests queued (the limit); retry later"
                )
            self._queue.append(item)
            self._items[item.future] = item
            self._cond.notify()
        return item.future

    def cancel(self, future: Future) -> None:
        """Cancels the item of a future `submit` returned; a no-op once it is answered.

        A queued item's future is cancelled at once. A running item's future ends with CancelledError
        when the processor next checks `WorkItem.cancelled` (the engine: after the current decode step).
        """
        with self._cond:
            item = self._items.get(future)
        if item is not None:
            item.cancel()

    def queued(self) -> int:
        """Items waiting for a batch (not counting the running one)."""
        with self._cond:
            return len(self._queue)

    def close(self, timeout: float | None = None) -> None:
        """Stops accepting work, fails queued items with UnavailableError and lets the running batch finish."""
        with self._cond:
            self._closed = True
            dropped = list(self._queue)
            self._queue.clear()
            self._cond.notify_all()
        for item in dropped:
            if item.future.set_running_or_notify_cancel():
                item.future.set_exception(UnavailableError(f"model '{self.name}' shut down before the request ran"))
        if threading.current_thread() is not self._worker:
            self._worker.join(timeout)

    def take(self, fits: Callable[[WorkItem], bool], block: bool) -> list[WorkItem] | None:
        """Continuous batching: pops queued items from the front while `fits` accepts them, in order.

        Args:
            fits: called under the queue's lock with the head item; must be quick.
            block: wait for a first item (the caller has nothing running).

        Returns:
            The items to start (cancelled ones already dropped); None once closed with nothing queued.
        """
        with self._cond:
            while block and not self._queue and not self._closed:
                self._cond.wait()
            if self._closed and not self._queue:
                return None
            items = []
            while self._queue and fits(self._queue[0]):
                items.append(self._queue.popleft())
        return [item for item in items if item.start()]

    def peek(self) -> WorkItem | None:
        """The item at the head of the queue, or None."""
        with self._cond:
            return self._queue[0] if self._queue else None

    def run_alone(self, items: Sequence[WorkItem]) -> None:
        """Runs items through the windowed path, one batch each (a continuous loop's fallback after a failure)."""
        for item in items:
            self._run_batch([item])

    def _run(self) -> None:
        if self._loop is not None:
            self._loop(self)
            return
        while True:
            items = self._next_batch()
            if items is None:
                return
            # Skip items whose caller cancelled them while they waited.
            items = [item for item in items if item.start()]
            if items:
                self._run_batch(items)

    def _next_batch(self) -> list[WorkItem] | None:
        """Blocks for a first item, then gathers more until the window closes or the batch is full."""
        with self._cond:
            while not self._queue and not self._closed:
                self._cond.wait()
            if not self._queue:
                return None
            items = [self._queue.popleft()]
            # The window counts from the first item's arrival: work that queued up while the previous batch
            # ran starts at once.
            window = self.options.window_ms / 1000
            deadline = time.monotonic() + window - (time.perf_counter() - items[0].accepted_at)
            while len(items) < self.options.max_batch_size and not self._closed:
                if self._queue:
                    items.append(self._queue.popleft())
                    continue
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                self._cond.wait(remaining)
            return items

    def _run_batch(self, items: list[WorkItem]) -> None:
        """Runs items together; on a failure, retries the ones still unanswered one by one."""
        # Items cancelled since they left the queue (or before a retry) end before any model work.
        for item in items:
            if item.cancelled:
                resolve(item, CancelledError("the caller cancelled the request"))
        items = [item for item in items if not item.cancelled]
        if not items:
            return
        unanswered = dict(enumerate(items))
        for item in items:
            item._new_attempt()
        try:
            for index, outcome in self._process(items):
                if index in unanswered:
                    resolve(unanswered.pop(index), outcome)
        except Exception as exc:
            if len(items) == 1:
                resolve(items[0], exc)
                return
            log.warning("batch of %d on %s failed (%r); retrying %d alone", len(items), self.name, exc, len(unanswered))
            for item in unanswered.values():
                self._run_batch([item])
            return
        except BaseException:
            for item in unanswered.values():
                resolve(item, UnavailableError(f"model '{self.name}' worker stopped"))
            raise
        # A processor that ends without answering someone must not leave that caller waiting forever.
        for item in unanswered.values():
            resolve(item, RuntimeError("the batch ended without an answer for this request"))

    def _forget(self, future: Future) -> None:
        """Done-callback of every item's future: an answered item can no longer be cancelled."""
        with self._cond:
            self._items.pop(future, None)


def resolve(item: WorkItem, outcome: Any) -> None:
    """Sets an item's result, or its exception if `outcome` is one; a no-op once it is answered."""
    if item.future.done():
        return
    if isinstance(outcome, BaseException):
        item.future.set_exception(outcome)
    else:
        item.future.set_result(outcome)
