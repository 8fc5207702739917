"""Long sources decode apart (SchedulingOptions.length_split, server/engine/scheduler.py).

Every row of a lane is padded to its longest source and the decoder reads every position at every step, so
a group whose source is much longer than the others' decodes in a lane of its own when that padding would
cost more than the second decoder call, and the lanes join again once it would not.

The decisive comparison: requests split into two lanes give what they give alone, on the Transformer, the
recurrent translator and the speech recognizer, fed host arrays or with IO binding. Then the policy itself,
on lanes of stand-in batches: where a newcomer goes, when the foreground splits and when the lanes rejoin.
"""

from __future__ import annotations

import numpy as np
import pytest

from attnserve.server.decoding.batch import Batch
from attnserve.server.engine.batcher import BatchingOptions
from attnserve.server.engine.lane import Group, Lane
from attnserve.server.engine.scheduler import CALL_OVERHEAD_POSITIONS, Scheduler, SchedulingOptions
from conftest import TINY_MODEL_NAME
from fakes import WAIT
from test_continuous_batching import FEEDS, architecture, assert_same, parse_serve_flags, submit_after
from test_continuous_batching import recurrent_repo  # noqa: F401  (a fixture)

# Any padding is worth a lane of its own: the smallest difference in length splits.
ALWAYS = SchedulingOptions(length_split_padding=1)
NEVER = SchedulingOptions(length_split=False)

# Per architecture: (a short source, a long one, another short one), as the request maker's index.
SOURCES = {"transformer": (3, 4, 5), "recurrent": (3, 4, 5), "speech": (3, 2, 1)}


def decoder_widths(monkeypatch) -> list[int]:
    """Records the source width the decoder reads at each call, from here on."""
    widths, step = [], Batch.step

    def recording(batch, input_ids):
        widths.append(batch.slots.width)
        return step(batch, input_ids)

    monkeypatch.setattr(Batch, "step", recording)
    return widths


def interleaved(widths: list[int]) -> bool:
    """Whether a narrower call ran between two calls at the widest width: two lanes taking turns."""
    widest = [i for i, w in enumerate(widths) if w == max(widths)]
    return any(w < max(widths) for w in widths[widest[0] : widest[-1]])


@pytest.mark.parametrize("feeds", FEEDS)
@pytest.mark.parametrize("kind", SOURCES)
def test_long_sources_decode_apart_and_every_request_gets_what_it_gets_alone(
        kind, feeds, monkeypatch, tiny_model_repo, tiny_speech_repo, recurrent_repo):  # noqa: F811
    repos = (tiny_model_repo, tiny_speech_repo, recurrent_repo, None)
    short, long, other = SOURCES[kind]
    for scheduling, split in [(ALWAYS, True), (NEVER, False)]:
        continuous, alone, make = architecture(kind, repos, FEEDS[feeds], BatchingOptions(continuous=scheduling))
        widths = decoder_widths(monkeypatch)
        try:
            trigger = make(short, new=12, at_least=12)
            late = [make(long, beam=2, new=8, at_least=8), make(other, new=6)]  # a beam goes apart
            first, futures = submit_after(continuous, trigger, late, tokens=2)
            results = [future.result(WAIT) for future in [first, *futures]]
            shared = list(widths)  # the continuous engine's calls only
            for request, result in zip([trigger, *late], results):
                assert_same(result, alone.generate(request, WAIT))
        finally:
            continuous.close()
            alone.close()
            monkeypatch.undo()
        assert interleaved(shared) == split, shared


def test_the_serve_flag_turns_the_split_off(tiny_model_repo):
    from attnserve.server.edge import app

    assert parse_serve_flags().length_split and not parse_serve_flags("--no-length-split").length_split
    engines, _ = app.load_models(app.ServeOptions(models=str(tiny_model_repo), length_split=False))
    try:
        assert not engines[TINY_MODEL_NAME]._batcher.options.continuous.length_split
    finally:
        for engine in engines.values():
            engine.close()


# ---- the policy, on lanes of stand-in batches ----


class SourceBatch:
    """What a lane asks of its batch, for rows of given source lengths (each reading `position_bytes` bytes
    per source position)."""

    def __init__(self, lengths, position_bytes: int = 10):
        self.source_lengths = np.asarray(lengths, dtype=np.int64)
        self.slots = type("Slots", (), {"position_bytes": position_bytes})()
        self.max_rows = None

    @property
    def source_width(self) -> int:
        return int(self.source_lengths.max(initial=0))

    def merge(self, *others):
        self.source_lengths = np.concatenate([self.source_lengths, *(o.source_lengths for o in others)])

    def split(self, rows):
        other = SourceBatch(self.source_lengths[rows], self.slots.position_bytes)
        self.source_lengths = np.delete(self.source_lengths, rows)
        return other


def join(lane: Lane, *lengths: int) -> Group:
    """A group of one row per source length, attached to `lane`."""
    group = Group(strategy=None, tag=None, rows=len(lengths), tokens=np.zeros(len(lengths), dtype=np.int64))
    lane.attach(SourceBatch(lengths), group)
    return group


def scheduler(padding: int | None = None, weight_bytes: int = 0, **options) -> Scheduler:
    return Scheduler(SchedulingOptions(length_split_padding=padding, **options), max_admit=8,
                     weight_bytes=weight_bytes)


def test_a_newcomer_goes_apart_when_the_padding_it_brings_costs_more_than_a_decoder_call():
    s = scheduler(padding=500)
    join(s.foreground, *[10] * 10)
    # Ten rows padded from 10 to 60 positions: 500, not more than the call costs.
    assert s.lane_for(width=60, rows=1, position_bytes=10) is s.foreground
    assert s.lane_for(width=61, rows=1, position_bytes=10) is s.long_sources
    assert s.lane_for(width=8, rows=4, position_bytes=10) is s.foreground  # narrower: 8 positions padding
    join(s.long_sources, 100)
    # With the long lane running, the cheaper padding decides: 10 x 40 here, 1 x 50 there.
    assert s.lane_for(width=50, rows=1, position_bytes=10) is s.long_sources
    assert s.lane_for(width=12, rows=1, position_bytes=10) is s.foreground
    assert scheduler(padding=500, length_split=False).lane_for(1000, 1, 10).rows == 0  # the (empty) foreground


def test_the_break_even_is_the_decoders_weights_over_what_a_row_reads_per_position_and_the_loops_share():
    s = scheduler(weight_bytes=6000)  # 600 rows x positions at 10 bytes each, and the loop's
    join(s.foreground, *[10] * 10)
    width = 10 + (600 + CALL_OVERHEAD_POSITIONS) // 10  # ten rows padded to it: the break-even
    assert s.lane_for(width=width, rows=1, position_bytes=10) is s.foreground
    assert s.lane_for(width=width + 1, rows=1, position_bytes=10) is s.long_sources
    assert s.lane_for(width=width + 1, rows=1, position_bytes=5) is s.foreground  # 1,200 now
    unknown = scheduler(weight_bytes=0)
    join(unknown.foreground, *[10] * 10)
    assert unknown.lane_for(width=10_000, rows=1, position_bytes=10) is unknown.foreground


def test_the_foreground_splits_when_its_widest_groups_cost_the_others_more_than_a_call():
    for padding, splits in [(899, True), (900, False)]:
        s = scheduler(padding=padding)
        long = join(s.foreground, 100)  # joined an empty foreground first
        short = join(s.foreground, *[10] * 10)
        s.balance_lengths()  # moving it apart spares ten rows 90 positions each
        assert (s.long_sources.groups == [long]) == splits
        assert short in s.foreground.groups and s.foreground_rows == 11
        assert s.foreground.width == (10 if splits else 100)


def test_the_widest_groups_move_together_where_that_spares_the_most():
    s = scheduler(padding=100)
    short = join(s.foreground, *[5] * 20)
    wide = [join(s.foreground, 90), join(s.foreground, 80, 85)]
    s.balance_lengths()
    assert s.long_sources.groups == wide and s.foreground.groups == [short]
    assert s.long_sources.width == 90 and s.foreground.width == 5


def test_the_lanes_join_again_once_padding_costs_less_than_half_a_call():
    s = scheduler(padding=1000)
    long = join(s.foreground, 100)
    short = [join(s.foreground, 10, 10, 10) for _ in range(4)]
    s.balance_lengths()
    assert s.long_sources.rows == 1 and s.foreground.rows == 12  # 12 x 90 = 1,080 spared
    s.foreground.groups.remove(short[0])  # rows finish: 9 x 90 = 810, more than half a call
    s.foreground.batch.source_lengths = s.foreground.batch.source_lengths[3:]
    s.balance_lengths()
    assert s.long_sources.rows == 1
    for group in short[1:3]:  # 3 x 90 = 270: one lane again
        s.foreground.groups.remove(group)
    s.foreground.batch.source_lengths = s.foreground.batch.source_lengths[6:]
    s.balance_lengths()
    assert not s.long_sources and s.foreground.rows == 4 and s.foreground.width == 100
    assert s.foreground.groups == [short[3], long] and s.foreground.group_widths() == [10, 100]  # rows in order
    assert s.lanes() == [s.foreground]


def test_an_over_budget_long_source_group_yields_to_the_background_like_any_other():
    s = scheduler(padding=1, max_rows=4, fair_share_row_steps=10)
    join(s.foreground, 5, 5)
    long = join(s.long_sources, 50, 50)
    long.row_steps = 11
    assert s.foreground_rows == 4  # both lanes of the foreground count against max_rows
    s.make_room(2)
    assert s.background.groups == [long] and not s.long_sources
    assert s.rows == 4 and s.foreground_rows == 2
