"""Continuous (iteration-level) batching: the worker loop that admits requests at every step boundary.

The default worker loop (`BatchingOptions.continuous`; None there selects server/engine/batcher.py's windowed
batches instead). Each round: take what fits from the queue (waiting only when nothing runs, and then only
for a first request, never for a window), encode the newcomers together (an encoder call per beam size and
source length bucket) and merge each bucket, as a group, into the foreground (or, for much longer sources,
the foreground's second lane), then take one decoder step in each lane (server/engine/lane.py; which lanes and who
is admitted is server/engine/scheduler.py's policy). Every request is answered in the step it finishes, fails or
is cancelled; its rows leave at the next step.

Newcomers admitted while a batch runs are encoded on a second thread during the batch's next step (ONNX
Runtime releases the GIL), and join at the first step boundary after their encoding ends; their rows count
against `max_rows` from admission on. Encoding between steps instead made every running row wait for it:
the encoder was 22% of the worker's time under 32 clients. With a core to spare, the in-process engine made
14-41% more tokens/s (bench/README.md). A request that arrives when nothing runs is encoded at once, on the
worker. `SchedulingOptions.overlap_encoding=False` (`--inline-encoding`) encodes between steps.

A failed encoder call or step reruns the affected requests one at a time through the windowed path, so
only the bad one fails (with the error it raises: INTERNAL at the service).
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import time
from collections.abc import Sequence
from concurrent.futures import CancelledError, Future, ThreadPoolExecutor

from attnserve.server.decoding.batch import Batch
from attnserve.server.engine.batcher import Batcher, WorkItem, resolve
from attnserve.server.engine.cohort import Cohort
from attnserve.server.engine.lane import Lane
from attnserve.server.engine.model_handle import ModelHandle
from attnserve.server.inputs.preprocessing import Source
from attnserve.server.engine.results import BatchClock, ResultBuilder
from attnserve.server.engine.scheduler import Scheduler

log = logging.getLogger(__name__)


# A length bucket's longest source is at most this many times its shortest (plus SHORT_SOURCE): padding
# past it costs the encoder more than another call does. Measured on translate-zh-en 2, 128 test sentences
# admitted together: the encoder took 46% of the worker's time, much of it on padding.
BUCKET_SPREAD = 1.5
SHORT_SOURCE = 8


def length_buckets(lengths: Sequence[int]) -> list[slice]:
    """Runs of `lengths` (ascending) to encode together, so that little of each encoder batch is padding."""
    buckets: list[slice] = []
    start = 0
    for i, length in enumerate(lengths):
        if length > BUCKET_SPREAD * lengths[start] + SHORT_SOURCE:
            buckets.append(slice(start, i))
            start = i
    if len(lengths):
        buckets.append(slice(start, len(lengths)))
    return buckets


def encode_in_buckets(model: ModelHandle, sources: Sequence[Source]) -> list[tuple[slice, Batch]]:
    """The sources (ascending by length) encoded one length bucket at a time: each bucket's slice of
    `sources` and its batch. Each joins as a group of its own, so a long bucket can decode apart."""
    return [(bucket, model.encode(sources[bucket])) for bucket in length_buckets([s.length for s in sources])]


def _encode(model: ModelHandle, sources: Sequence[Source]) -> tuple[list[tuple[slice, Batch]], float]:
    """The sources' buckets (`encode_in_buckets`) and when their encoding ended."""
    buckets = encode_in_buckets(model, sources)
    return buckets, time.perf_counter()


@dataclasses.dataclass(eq=False)
class _Encoding:
    """Newcomers whose encoding runs on the encoder thread while the running batch takes a step."""

    members: list[WorkItem]
    clock: BatchClock
    future: Future  # -> (Batch, when its encoding ended)
    rows: int  # rows they will take (beams count one each)


class ContinuousLoop:
    """The worker loop of one model under continuous batching (runs on its batcher's thread).

    Args:
        model: the model the loop encodes and decodes with.
        results: builds each request's streamed tokens and result (a `Cohort` of some lane is each
            `Group`'s tag).
    """

    def __init__(self, model: ModelHandle, results: ResultBuilder):
        self._model = model
        self._results = results
        self.scheduler: Scheduler | None = None  # set once the loop runs
        self._encoder: ThreadPoolExecutor | None = None  # started at the first overlapped encoding
        self._encoding: collections.deque[_Encoding] = collections.deque()  # in admission order

    def run(self, batcher: Batcher) -> None:
        """Serves the batcher's queue until it is closed and everything admitted has finished."""
        self.scheduler = Scheduler(batcher.options.continuous, batcher.options.max_batch_size,
                                   self._model.decoder_bytes)
        try:
            while self._round(self.scheduler, batcher):
                pass
        finally:
            if self._encoder is not None:
                self._encoder.shutdown()

    def _round(self, scheduler: Scheduler, batcher: Batcher) -> bool:
        """One round; False once closed with nothing left to run."""
        try:
            # Newcomers encoded during the last step join now; with nothing running, wait for them.
            self._join_encoded(scheduler, batcher, wait=not scheduler.running)
            # Admission: wait only when nothing runs; make room by moving over-budget groups aside.
            head = batcher.peek()
            if head is not None:
                scheduler.make_room(head.payload.beam_size)
            if scheduler.hold(batcher.queued()):
                items = []
            else:
                fits = scheduler.admission()
                items = batcher.take(lambda item: fits(item.payload.beam_size), block=not scheduler.running)
            if items is None and not scheduler.running:
                return False
            self._admit(items or [], scheduler, batcher)
            scheduler.balance_lengths()
            # One decoder step per lane whose turn it is; each request is answered in the step it finishes.
            for lane in scheduler.turn():
                started = time.perf_counter()
                self._step(lane, batcher)
                scheduler.stepped(lane, time.perf_counter() - started)
        except Exception as exc:  # a broken invariant: fail what runs, keep serving the queue
            log.exception("continuous batching on %s failed", batcher.name)
            for lane in scheduler.lanes():
                for group in lane.clear():
                    for i in group.tag.open:
                        resolve(group.tag.items[i], exc)
        return True

    def _admit(self, items: list[WorkItem], scheduler: Scheduler, batcher: Batcher) -> None:
        """Encodes newcomers together (one group per beam size and length bucket) and merges them into the
        foreground's lanes; while a batch runs, on the encoder thread (SchedulingOptions.overlap_encoding), and
        they join at the next round."""
        overlap = scheduler.options.overlap_encoding and scheduler.running
        for item in [item for item in items if item.cancelled]:
            resolve(item, CancelledError("the caller cancelled the request"))
        groups: dict[int, list[WorkItem]] = {}
        for item in items:
            if not item.cancelled:
                groups.setdefault(item.payload.beam_size, []).append(item)
        for members in groups.values():
            members.sort(key=lambda item: item.payload.source.length)  # the order length buckets need
            for item in members:
                item._new_attempt()
            clock = BatchClock.started()
            sources = [item.payload.source for item in members]
            if overlap:
                if self._encoder is None:
                    self._encoder = ThreadPoolExecutor(1, thread_name_prefix=f"{batcher.name}-encoder")
                future = self._encoder.submit(_encode, self._model, sources)
                rows = sum(item.payload.beam_size for item in members)
                self._encoding.append(_Encoding(members, clock, future, rows))
                scheduler.encoding_rows += rows
                continue
            try:
                buckets, clock.encoded = _encode(self._model, sources)
            except Exception as exc:
                self._admission_failed(members, batcher, exc)
                continue
            self._join(members, clock, buckets, scheduler, batcher)

    def _join_encoded(self, scheduler: Scheduler, batcher: Batcher, wait: bool) -> None:
        """Merges the newcomers whose encoding has finished (with `wait`, all of them) into the foreground."""
        while self._encoding and (wait or self._encoding[0].future.done()):
            encoding = self._encoding.popleft()
            scheduler.encoding_rows -= encoding.rows
            try:
                buckets, encoding.clock.encoded = encoding.future.result()
            except Exception as exc:
                self._admission_failed(encoding.members, batcher, exc)
                continue
            self._join(encoding.members, encoding.clock, buckets, scheduler, batcher)

    def _join(self, members: list[WorkItem], clock: BatchClock, buckets: list[tuple[slice, Batch]],
              scheduler: Scheduler, batcher: Batcher) -> None:
        """Starts the newcomers' search, one group per length bucket, and merges each into the lane the
        scheduler picks for its sources' length."""
        for bucket, batch in buckets:
            cohort = members[bucket]
            try:
                prepared = [item.payload for item in cohort]
                strategy = self._model.strategy(prepared, batch.length_budget)
                rows = sum(p.beam_size for p in prepared)
                lane = scheduler.lane_for(batch.source_width, rows, batch.slots.position_bytes)
                lane.add(batch, strategy, Cohort.start(cohort, clock))
            except Exception as exc:
                self._admission_failed(cohort, batcher, exc)

    @staticmethod
    def _admission_failed(members: list[WorkItem], batcher: Batcher, exc: Exception) -> None:
        log.warning("admitting %d requests on %s failed (%r); running them alone", len(members), batcher.name, exc)
        batcher.run_alone(members)

    def _step(self, lane: Lane, batcher: Batcher) -> None:
        """One decoder step of a lane; a failed step reruns its unanswered requests alone."""
        try:
            stepped = lane.step()
        except Exception as exc:
            groups = lane.clear()
            log.warning("a continuous batch on %s failed (%r); retrying its requests alone", batcher.name, exc)
            batcher.run_alone([g.tag.items[i] for g in groups for i in g.tag.open])
            return
        sharing = sum(len(g.tag.open) for g, _ in stepped)
        for group, events in stepped:
            cohort: Cohort = group.tag
            cohort.peak = max(cohort.peak, sharing)
            for i, outcome in cohort.answers(events, group.strategy, self._results):
                resolve(cohort.items[i], outcome)
