"""A lane: one running batch shared by groups of requests that joined it at different steps (numpy only).

Each group keeps its own `DecodeStrategy` (greedy, beam or sampled, any beam size) over a contiguous
range of the lane's rows, so strategies never need to merge: one decoder call computes every row, then
each group's strategy reads its own slice of the logits and attention and chooses its rows and tokens.
A group admitted mid-flight is encoded on its own and merged in (`Batch.merge`); rows are per-row in
position, self-attention mask and source length, so a row computes what it would alone.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:  # lanes only call batches and strategies they are handed
    from attnserve.server.decoding.batch import Batch
    from attnserve.server.decoding.search import DecodeStrategy, StepEvents


@dataclasses.dataclass(eq=False)
class Group:
    """The rows of one strategy inside a lane."""

    strategy: DecodeStrategy
    tag: Any  # the caller's record of the group's requests
    rows: int  # how many rows of the lane are this group's (contiguous)
    tokens: np.ndarray  # (rows,) each row's next input token
    row_steps: int = 0  # rows x decoder steps spent so far: the fairness budget's measure


class Lane:
    """A running batch and the groups whose rows it holds, in row order."""

    def __init__(self, max_rows: int | None = None):
        self.max_rows = max_rows  # the scheduler's row limit: the lane's batch keeps no spare slots past it
        self.batch: Batch | None = None
        self.groups: list[Group] = []

    @property
    def rows(self) -> int:
        return sum(g.rows for g in self.groups)

    def __bool__(self) -> bool:
        return bool(self.groups)

    @property
    def width(self) -> int:
        """Source positions its rows need (the longest row's source); 0 when empty."""
        return self.batch.source_width if self.groups else 0

    @property
    def position_bytes(self) -> int:
        """What its decoder call reads per row and source position (0 when empty)."""
        return self.batch.slots.position_bytes if self.groups else 0

    def group_widths(self) -> list[int]:
        """Each group's longest source, in group order."""
        widths, start = [], 0
        for g in self.groups:
            widths.append(int(self.batch.source_lengths[start : start + g.rows].max(initial=0)))
            start += g.rows
        return widths

    def move(self, group: Group, other: Lane) -> None:
        """Moves a group and its rows to another lane."""
        other.attach(self.detach(group), group)

    def absorb(self, other: Lane) -> None:
        """Takes every group of another lane, after its own, leaving that one empty."""
        groups, batch = other.groups, other.batch
        other.groups, other.batch = [], None
        if not self.groups:
            self.batch, batch.max_rows = batch, self.max_rows
        else:
            self.batch.merge(batch)
        self.groups += groups

    def add(self, batch: Batch, strategy: DecodeStrategy, tag: Any) -> Group:
        """Starts `strategy` on a freshly encoded batch (one row per request) and merges it in."""
        selection = strategy.start()
        batch.select(selection.rows)
        group = Group(strategy, tag, len(selection.rows), selection.tokens)
        self.attach(batch, group)
        return group

    def attach(self, batch: Batch, group: Group) -> None:
        """Appends a group already started elsewhere, with its batch rows."""
        if not self.groups:
            self.batch = batch
            batch.max_rows = self.max_rows
        else:
            self.batch.merge(batch)
        self.groups.append(group)

    def detach(self, group: Group) -> Batch:
        """Takes a group out; returns its rows as a batch of their own (to `attach` to another lane)."""
        start = 0
        for g in self.groups:
            if g is group:
                break
            start += g.rows
        self.groups.remove(group)
        return self.batch.split(np.arange(start, start + group.rows))

    def step(self) -> list[tuple[Group, StepEvents]]:
        """One decoder call for every row; each group's strategy then advances on its own slice.

        Groups whose rows are all gone (finished or cancelled) leave the lane.
        """
        out = self.batch.step(np.concatenate([g.tokens for g in self.groups]))
        keep, events, start = [], [], 0
        for g in self.groups:
            end = start + g.rows
            g.row_steps += g.rows
            selection, ev = g.strategy.advance(out.logits[start:end], out.attention[start:end])
            keep.append(selection.rows + start)
            g.rows, g.tokens = len(selection.rows), selection.tokens
            events.append((g, ev))
            start = end
        self.batch.select(np.concatenate(keep))
        self.groups = [g for g in self.groups if g.rows]
        if not self.groups:
            self.batch = None
        return events

    def clear(self) -> list[Group]:
        """Empties the lane (after a failed step); returns the groups it held."""
        groups, self.groups, self.batch = self.groups, [], None
        return groups
