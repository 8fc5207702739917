"""Windowed batches (`--batching window`): the requests of one window decode together, start to end.

The batcher (server/engine/batcher.py) gathers a window of requests and hands them here; they are encoded in one
encoder call per beam size and decoded until each is answered, with no newcomer joining. It is also how
the continuous loop reruns requests alone after a failed encoder call or step, so that only the bad one
fails: this path shares no lane or scheduler state with the loop it rescues. Answers are the cohort's
(server/engine/cohort.py), the same bookkeeping the continuous loop uses.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence

from attnserve.server.engine.batcher import WorkItem
from attnserve.server.engine.cohort import Cohort
from attnserve.server.decoding.decoding import decode
from attnserve.server.engine.model_handle import ModelHandle
from attnserve.server.engine.results import BatchClock, ResultBuilder


class WindowedBatches:
    """The batcher's processor for one model: runs a window's items and yields each one's answer.

    Args:
        model: the model the items run on.
        results: builds their streamed tokens and results.
    """

    def __init__(self, model: ModelHandle, results: ResultBuilder):
        self._model = model
        self._results = results

    def __call__(self, items: Sequence[WorkItem]) -> Iterator[tuple[int, object]]:
        """Runs a batch; requests with different beam sizes decode in separate groups, one after another."""
        groups: dict[int, list[int]] = {}
        for index, item in enumerate(items):
            groups.setdefault(item.payload.beam_size, []).append(index)
        for indices in groups.values():
            yield from self._run_group([items[i] for i in indices], indices)

    def _run_group(self, items: Sequence[WorkItem], indices: Sequence[int]) -> Iterator[tuple[int, object]]:
        # Encode once for the whole group.
        clock = BatchClock.started()
        batch = self._model.encode([item.payload.source for item in items])
        clock.encoded = time.perf_counter()
        strategy = self._model.strategy([item.payload for item in items], batch.length_budget)
        cohort = Cohort.start(items, clock, peak=len(items))
        try:
            # Step until every row is done; answer each request in the step it finishes or leaves.
            for events in decode(batch, strategy):
                for i, outcome in cohort.answers(events, strategy, self._results):
                    yield indices[i], outcome
        finally:
            # Release the batch's tensors and the decode history now, not when the generator is collected.
            del batch, strategy
