"""Which rows run next: admission at every step boundary, a bound on rows in flight, and fairness.

Requests join the *foreground* lane at the next step boundary while its rows fit under `max_rows` (a
request wider than the limit runs only on an empty lane), at most `max_admit` at one boundary (the
batcher's `max_batch_size`: those are encoded together). A group that has spent more than its fair share
(rows x steps) is moved, when a queued request does not fit, to the *background* lane; the two lanes take
one decoder step each in turn, so an expensive beam search keeps going while cheap requests keep flowing
past it instead of waiting for it to end. Nothing here touches the model: lanes and their batches do.

Optionally (`admission_hold_steps`), while a batch runs, a few queued requests are held back for up to that
many steps until `admission_hold_queue` of them wait (or as many as there are free rows): each admission
encodes the newcomers and copies the running batch's tensors to merge them in, so admitting them together
costs less than one at a time. It trades a little time to first token for throughput.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from attnserve.server.lane import Lane


@dataclasses.dataclass(frozen=True)
class SchedulingOptions:
    # Rows (beams count one row each) decoding together in one lane; more requests wait in the queue.
    max_rows: int = 64
    # Rows x steps a group may spend before it yields its place in the foreground to queued requests.
    fair_share_row_steps: int = 512
    # Steps queued requests may be held back while a batch runs, waiting for company; 0 = admit at once.
    admission_hold_steps: int = 0
    # Queued requests (or free rows, if fewer) that end a hold.
    admission_hold_queue: int = 8
    # Encode requests admitted while a batch runs on a second thread, during the running batch's next step;
    # they join it one step later. False: encode them on the worker, between steps (every row waits).
    overlap_encoding: bool = True

    def __post_init__(self):
        for name in ("max_rows", "fair_share_row_steps", "admission_hold_queue"):
            if getattr(self, name) < 1:
                raise ValueError(f"SchedulingOptions.{name} must be >= 1, got {getattr(self, name)}")
        if self.admission_hold_steps < 0:
            raise ValueError(f"SchedulingOptions.admission_hold_steps must be >= 0, got {self.admission_hold_steps}")


class Scheduler:
    """The running lanes and the policy that fills them.

    Args:
        options: the bound on rows and the fairness budget.
        max_admit: most requests admitted (and encoded together) at one step boundary.
    """

    def __init__(self, options: SchedulingOptions, max_admit: int):
        if max_admit < 1:
            raise ValueError(f"Scheduler max_admit must be >= 1, got {max_admit}")
        self.options = options
        self.max_admit = max_admit
        self.foreground = Lane(options.max_rows)
        self.background = Lane(options.max_rows)
        self._held = 0  # consecutive steps queued requests were held back
        self.encoding_rows = 0  # rows admitted whose encoding is still under way (not in a lane yet)

    @property
    def foreground_rows(self) -> int:
        """Rows the foreground holds or has promised: its groups' and those of newcomers still being encoded."""
        return self.foreground.rows + self.encoding_rows

    @property
    def running(self) -> bool:
        return bool(self.foreground or self.background)

    def lanes(self) -> list[Lane]:
        """The lanes to step this round, one step each: both take turns so neither starves."""
        return [lane for lane in (self.foreground, self.background) if lane]

    def make_room(self, rows: int) -> None:
        """Moves over-budget groups to the background until `rows` more fit in the foreground (or none can)."""
        over = [g for g in self.foreground.groups if g.row_steps > self.options.fair_share_row_steps]
        for group in sorted(over, key=lambda g: -g.row_steps):
            if self._fits(self.foreground_rows, rows):
                return
            if self.background and self.background.rows + group.rows > self.options.max_rows:
                continue
            self.background.attach(self.foreground.detach(group), group)

    def hold(self, queued: int) -> bool:
        """Whether to admit nobody at this step boundary although `queued` requests wait (see the module)."""
        free = self.options.max_rows - self.foreground_rows
        if (queued and self.running and self._held < self.options.admission_hold_steps
                and queued < min(self.options.admission_hold_queue, max(free, 1))):
            self._held += 1
            return True
        self._held = 0
        return False

    def admission(self) -> Callable[[int], bool]:
        """A predicate for the queue's head, called in order: does a request of `rows` rows fit now?"""
        taken = [0, 0]  # rows, requests accepted by this predicate so far

        def fits(rows: int) -> bool:
            if taken[1] >= self.max_admit or not self._fits(self.foreground_rows + taken[0], rows):
                return False
            taken[0] += rows
            taken[1] += 1
            return True

        return fits

    def _fits(self, used: int, rows: int) -> bool:
        return used == 0 or used + rows <= self.options.max_rows
