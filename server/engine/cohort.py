"""A cohort: requests encoded together and searched by one strategy, and who of them is answered yet.

Both worker loops (server/engine/continuous.py, server/engine/windowed.py) answer requests the same way, step by step:
a callback that raised fails its request, a finished hypothesis becomes its request's result, and a
request the caller cancelled ends with CancelledError; each leaves the batch at the next step (the
strategy drops its rows) and is answered exactly once. That bookkeeping is `Cohort.answers`, here alone.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence
from concurrent.futures import CancelledError

import numpy as np

from attnserve.server.engine.batcher import WorkItem
from attnserve.server.engine.results import BatchClock, ResultBuilder
from attnserve.server.decoding.search import DecodeStrategy, StepEvents


@dataclasses.dataclass(eq=False)
class Cohort:
    """Requests admitted together: one encoder call, one strategy."""

    items: list[WorkItem]
    clock: BatchClock
    streaming: np.ndarray  # (N,) which items have a token callback
    streamed: list[list[int]]  # ids passed to each item's callback so far
    answered: set[int] = dataclasses.field(default_factory=set)
    peak: int = 0  # most requests that shared a decoder call with these (reported as batch_size)

    @classmethod
    def start(cls, items: Sequence[WorkItem], clock: BatchClock, peak: int = 0) -> Cohort:
        """A cohort of `items`, none of them streamed or answered yet."""
        items = list(items)
        streaming = np.array([item.on_token is not None for item in items])
        return cls(items, clock, streaming, [[] for _ in items], peak=peak)

    @property
    def open(self) -> list[int]:
        """The items not answered yet."""
        return [i for i in range(len(self.items)) if i not in self.answered]

    def answers(self, events: StepEvents, strategy: DecodeStrategy,
                builder: ResultBuilder) -> Iterator[tuple[int, object]]:
        """The answers one step produced: (item index, result or exception), each item once.

        Failed callbacks and cancellations leave the search at the next step. Cancellations are checked
        last, just before the next step, so that a cancel made while this step ran (or by a callback just
        now) counts at once.
        """
        self.clock.stepped()
        for i, error in builder.stream(self.items, events, self.streaming, self.streamed):
            yield self._leave(i, strategy), error
        for hyp in events.finished:
            if hyp.index not in self.answered:
                self.answered.add(hyp.index)
                yield hyp.index, builder.answer(self.items[hyp.index], hyp, self.streamed, self.clock, self.peak)
        for i in [i for i in self.open if self.items[i].cancelled]:
            yield self._leave(i, strategy), CancelledError("the caller cancelled the request")

    def _leave(self, i: int, strategy: DecodeStrategy) -> int:
        """Marks item i answered; its rows leave the batch at the next step."""
        strategy.cancel(i)
        self.answered.add(i)
        return i
