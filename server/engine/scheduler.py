"""Which rows run next: admission at every step boundary, a bound on rows in flight, and fairness.

Requests join the *foreground* lane at the next step boundary while its rows fit under `max_rows` (a
request wider than the limit runs only on an empty lane), at most `max_admit` at one boundary (the
batcher's `max_batch_size`: those are encoded together). A group that has spent more than its fair share
(rows x steps) is moved, when a queued request does not fit, to the *background* lane, so an expensive
beam search keeps going while cheap requests keep flowing past it instead of waiting for it to end. The
lanes share the decoder's *time*, not its calls: the background steps only while it has had no more decode
time than the foreground (`turn`). A step of 64 beam rows of long sources costs many times a step of a few
short rows, so one call each in turn left a short greedy request beside 4 beam-16 searches waiting for a
background step per token (12-33x its idle time); sharing time halves its speed at most. Nothing here
touches the model: lanes and their batches do.

Every row of a lane's batch is padded to its longest source, and the decoder reads every position at every
step (the cross-attention K/V). One long source among short ones multiplies that work: in 128 test
sentences a lone source of 125 tokens (the median is 7) left 85% of the positions read padding. So a group
whose source is much longer than the foreground's rows decodes in a lane of its own, *long sources*, when
the padding it would add costs more than that lane's decoder call (`length_split`); the two are the
foreground split in two, under one `max_rows`. Both costs are memory-bound on a CPU: the extra call reads
the decoder's weights once more, the padding reads its positions again at every step; so the padding
worth a call, in rows x positions, is about the decoder's weight bytes over the bytes a row reads per
source position (translate-zh-en: 29 MB / 6 KB, 4,800; its int8 variant: 12 MB / 6 KB, 2,000; timed on the
decoder graph alone, 3,600 and 1,000). The extra call also costs the decode loop's own work around it
(feeds, the search's step, row bookkeeping: CALL_OVERHEAD_POSITIONS), so the break-even is 5,800 and 3,000.
Measured on a burst of 128 test sentences (bench/length_split.py), splitting at 4,800 / 2,000 spared about
5,700 rows x positions: the int8 variant ran 12-17% faster, float32 -8..+1%.

Optionally (`admission_hold_steps`), while a batch runs, a few queued requests are held back for up to that
many steps until `admission_hold_queue` of them wait (or as many as there are free rows): each admission
encodes the newcomers and copies the running batch's tensors to merge them in, so admitting them together
costs less than one at a time. It trades a little time to first token for throughput.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from attnserve.server.engine.lane import Lane
from attnserve.server.model.option_fields import bounded, check

# What one decoder call costs the decode loop besides ONNX Runtime (about 0.7 ms: feeds, the search's step,
# row bookkeeping), in rows x source positions of padding that take as long to read (0.64 us each, measured
# at 63 rows on translate-zh-en on a 2-core AVX2 VM).
CALL_OVERHEAD_POSITIONS = 1000


@dataclasses.dataclass(frozen=True)
class SchedulingOptions:
    # Rows (beams count one row each) decoding together in one lane; more requests wait in the queue.
    max_rows: int = bounded(64, least=1)
    # Rows x steps a group may spend before it yields its place in the foreground to queued requests. 64: a
    # beam of 16 yields after 4 steps, a greedy request after 64 tokens. At 512 (32 steps of a beam of 16,
    # each of 64 rows of long sources) a short greedy request beside 4 such searches waited 17x its idle
    # time; at 64, 2.7x, for the same throughput under 16 clients with beams of 4 (bench/head_of_line.py).
    fair_share_row_steps: int = bounded(64, least=1)
    # Steps queued requests may be held back while a batch runs, waiting for company; 0 = admit at once.
    admission_hold_steps: int = bounded(0, least=0)
    # Queued requests (or free rows, if fewer) that end a hold.
    admission_hold_queue: int = bounded(8, least=1)
    # Encode requests admitted while a batch runs on a second thread, during the running batch's next step;
    # they join it one step later. False: encode them on the worker, between steps (every row waits).
    overlap_encoding: bool = True
    # Decode groups whose sources are much longer than the foreground's in a lane of their own when padding
    # every row to their length would cost more than one more decoder call (see the module docstring).
    length_split: bool = True
    # The padding (rows x source positions) worth one more decoder call; None: the decoder's weight bytes
    # over the bytes a row reads per source position, plus CALL_OVERHEAD_POSITIONS.
    length_split_padding: int | None = bounded(None, least=0)

    def __post_init__(self):
        check(self)


class Scheduler:
    """The running lanes and the policy that fills them.

    Args:
        options: the bound on rows and the fairness budget.
        max_admit: most requests admitted (and encoded together) at one step boundary.
        weight_bytes: the decoder's weights (the size of its graph), for the long-source lane's break-even;
            0 = unknown: no lane of long sources unless `options.length_split_padding` sets the break-even.
    """

    def __init__(self, options: SchedulingOptions, max_admit: int, weight_bytes: int = 0):
        if max_admit < 1:
            raise ValueError(f"Scheduler max_admit must be >= 1, got {max_admit}")
        self.options = options
        self.max_admit = max_admit
        self.weight_bytes = weight_bytes
        self.foreground = Lane(options.max_rows)
        self.long_sources = Lane(options.max_rows)  # the foreground's groups of much longer sources
        self.background = Lane(options.max_rows)
        self._held = 0  # consecutive steps queued requests were held back
        # Decode seconds of the foreground (both its lanes) and the background since both last ran (`turn`).
        self._seconds = {"foreground": 0.0, "background": 0.0}
        self.encoding_rows = 0  # rows admitted whose encoding is still under way (not in a lane yet)

    @property
    def foreground_rows(self) -> int:
        """Rows the foreground holds or has promised: its groups' (in both its lanes) and those of newcomers
        still being encoded."""
        return self.foreground.rows + self.long_sources.rows + self.encoding_rows

    @property
    def rows(self) -> int:
        """Rows decoding in every lane."""
        return self.foreground.rows + self.long_sources.rows + self.background.rows

    @property
    def running(self) -> bool:
        return bool(self.foreground or self.long_sources or self.background)

    def lanes(self) -> list[Lane]:
        """Every lane that holds rows."""
        return [lane for lane in (self.foreground, self.long_sources, self.background) if lane]

    def turn(self) -> list[Lane]:
        """The lanes to step this round, one step each: the foreground's every round, the background's while
        it has had no more decode time than the foreground's (`stepped` counts it)."""
        front = [lane for lane in (self.foreground, self.long_sources) if lane]
        if not self.background or not front:
            self._seconds = {"foreground": 0.0, "background": 0.0}  # one side idle: nothing to share
            return front or self.lanes()
        behind = self._seconds["background"] <= self._seconds["foreground"]
        return [*front, self.background] if behind else front

    def stepped(self, lane: Lane, seconds: float) -> None:
        """Counts a lane's step of `seconds` towards its side's share of the decode time."""
        self._seconds["background" if lane is self.background else "foreground"] += seconds

    def make_room(self, rows: int) -> None:
        """With a request of `rows` rows waiting that does not fit, moves every over-budget group to the
        background (while it has rows for them): the newcomer then decodes beside the groups still within
        their share, not at the pace of a step of every expensive row (`turn` shares the time)."""
        if self._fits(self.foreground_rows, rows):
            return
        over = [(lane, g) for lane in (self.foreground, self.long_sources) for g in lane.groups
                if g.row_steps > self.options.fair_share_row_steps]
        for lane, group in sorted(over, key=lambda pair: -pair[1].row_steps):
            if self.background and self.background.rows + group.rows > self.options.max_rows:
                continue
            lane.move(group, self.background)

    def lane_for(self, width: int, rows: int, position_bytes: int) -> Lane:
        """The lane a newly encoded group (`rows` rows, sources up to `width` positions, `position_bytes` read
        per row and position) joins: of the foreground and the long-source lane, the one where it costs the
        least padding, an empty long-source lane costing the break-even (one more decoder call)."""
        if not self.options.length_split or not self.foreground:
            return self.foreground
        costs = {}
        for lane in (self.foreground, self.long_sources):
            if lane:
                costs[lane] = lane.rows * max(0, width - lane.width) + rows * max(0, lane.width - width)
            else:
                costs[lane] = self._break_even(position_bytes)
        return min(costs, key=lambda lane: (costs[lane], lane is not self.foreground))

    def balance_lengths(self) -> None:
        """Splits the foreground by source length, or joins its two lanes again, as the padding now weighs
        against the second decoder call (`length_split`)."""
        if not self.options.length_split:
            return
        if self.long_sources:
            self._rejoin()
        else:
            self._split()

    def _rejoin(self) -> None:
        """Merges the long-source lane back once padding every row to one width costs less than half the
        second call (rows left, sources finished): with hysteresis, so lanes do not split and join in turn."""
        short, long = self.foreground, self.long_sources
        padding = short.rows * max(0, long.width - short.width) + long.rows * max(0, short.width - long.width)
        if padding < self._break_even(long.position_bytes) / 2:
            short.absorb(long)

    def _split(self) -> None:
        """Moves the foreground's widest groups to the long-source lane when the padding the other rows are
        spared is worth the extra decoder call: a long source that joined an empty foreground before short
        ones (`lane_for` sends later long ones apart as they join)."""
        lane = self.foreground
        break_even = self._break_even(lane.position_bytes)
        # It runs every round: no split can spare more than every row's whole width, so most rounds stop here.
        if len(lane.groups) < 2 or lane.rows * lane.width <= break_even:
            return
        widths = lane.group_widths()
        widest = sorted(range(len(widths)), key=lambda i: -widths[i])
        rest, best, best_saving = lane.rows, 0, 0
        for k in range(1, len(widest)):  # the k widest groups apart: the others need widths[widest[k]]
            rest -= lane.groups[widest[k - 1]].rows
            saving = rest * (widths[widest[0]] - widths[widest[k]])
            if saving > best_saving:
                best, best_saving = k, saving
        if best and best_saving > break_even:
            for group in [lane.groups[i] for i in widest[:best]]:
                lane.move(group, self.long_sources)

    def _break_even(self, position_bytes: int) -> float:
        """Padding (rows x positions) that costs the decoder as much as one more call."""
        if self.options.length_split_padding is not None:
            return self.options.length_split_padding
        if not self.weight_bytes or not position_bytes:
            return float("inf")
        return self.weight_bytes / position_bytes + CALL_OVERHEAD_POSITIONS

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
