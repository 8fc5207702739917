"""Where a batch's rows live: slots of tensors that rows take and leave without the other rows moving (numpy).

Every static decoder input (the encoder's cross-attention K/V, its mask), every replaced state (an LSTM's h, c)
and the appended state (server/decoding/kv_cache.py) holds `capacity` slots along its batch axis, of which the decoder
runs the first `size`. A batch (server/decoding/batch.py) maps its rows to slots. Under continuous batching rows
finish and newcomers arrive at almost every step; with one tensor per batch, each of those changes copied
every row's tensors (measured on translate-zh-en 4 under 32 clients: a third of the engine's time, as much
as the decoder call). Here a finished row only frees its slot, a newcomer is written into a free slot or
one past `size`, and when too many slots are free the last rows move into the holes: a step copies the rows
that change, not the ones that stay.

A free slot below `size` still runs through the decoder (it holds a finished row's finite tensors; its output
is dropped). Only a newcomer that does not fit (a longer source than the tensors' width, a longer cache than
the batch's, no slot left) makes the batch gather every row into fresh, larger tensors.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from attnserve.server.decoding.kv_cache import AppendCache
from attnserve.server.model.manifest import Manifest
from attnserve.server.model.residency import Residency
from attnserve.server.decoding.rows import axis_slice, copy_rows, row_view

# Tensors gathered to make room get this share of their rows again as spare slots (at least SPARE_SLOTS).
# Source positions get none: a decoder without a source mask (an image's fixed grid) attends every one.
SPARE_SHARE = 0.5
SPARE_SLOTS = 4


class Slots:
    """The decoder-side tensors of a batch's slots: the decoder runs slots 0 .. size - 1.

    Args:
        static: decoder input name -> tensor (slots along its spec's batch_axis, `width` along its source_axis).
        state: replaced state, decoder input name -> tensor.
        cache: the appended state, or None.
        size: slots in use (the tensors may hold more).
    """

    def __init__(self, manifest: Manifest, static: dict[str, np.ndarray], state: dict[str, np.ndarray],
                 cache: AppendCache | None, size: int):
        self._manifest = manifest
        self.static = static
        self.state = state
        self.cache = cache
        self.size = size
        # Device copies of these tensors (server/model/device_state.py) are kept under `_owner`, valid while the
        # revision stays as it was (a reallocated cache counts in the cache's own), with the row changes since
        # the last step (`_row_changes`, Residency.row_changes) done again on them.
        self._owner = object()
        self._revision = 0
        self._row_changes: list[tuple[tuple[int, ...] | None, tuple[int, ...]]] = []

    @property
    def capacity(self) -> int:
        spec = self._manifest.static[0]
        return self.static[spec.target].shape[spec.batch_axis]

    @property
    def width(self) -> int:
        """Source positions the static tensors hold per slot."""
        spec = self._manifest.static[0]
        return self.static[spec.target].shape[spec.source_axis]

    @property
    def position_bytes(self) -> int:
        """Bytes the decoder reads per slot and source position at every step (the static and replaced tensors
        with a source axis): what padding a row by one position costs."""
        total = 0
        for _, spec, x in self._tensors():
            if spec.source_axis is not None and x.shape[spec.batch_axis] and x.shape[spec.source_axis]:
                total += x.nbytes // (x.shape[spec.batch_axis] * x.shape[spec.source_axis])
        return total

    @classmethod
    def gather(cls, manifest: Manifest, parts: Sequence[tuple[Slots, np.ndarray]], width: int,
               spare: bool = False, max_rows: int | None = None) -> Slots:
        """Fresh tensors holding, in order, the given slots of each part (repeats allowed), each tensor written
        once; source axes cut or zero-padded to `width`, caches without leading slots no chosen row attends.

        Args:
            spare: leave room for more rows (SPARE_SHARE).
            max_rows: the most rows the batch may ever hold (the scheduler's limit): no spare slots past it,
                which no row could take (at 64 rows, a third of the tensors).
        """
        rows = [r for _, r in parts]
        size = sum(len(r) for r in rows)
        capacity = size
        if spare:
            capacity += max(SPARE_SLOTS, int(SPARE_SHARE * size))
            if max_rows is not None:
                capacity = max(size, min(capacity, max_rows))
        static = {s.target: _gather([p.static[s.target] for p, _ in parts], rows, s.batch_axis, s.source_axis,
                                    width, capacity) for s in manifest.static}
        state = {s.input: _gather([p.state[s.input] for p, _ in parts], rows, s.batch_axis, s.source_axis,
                                  width, capacity) for s in manifest.state if s.update == "replace"}
        cache = None
        if parts[0][0].cache is not None:
            cache = AppendCache.gather([(p.cache, r) for p, r in parts], capacity)
        return cls(manifest, static, state, cache, size)

    def feeds(self, live: np.ndarray) -> tuple[dict[str, np.ndarray], np.ndarray | None]:
        """The decoder's static and state inputs for the slots in use, and the cache's self-attention mask
        (None without a cache). `live`: the slots rows hold (the cache may drop slots only others attend)."""
        feeds = {}
        for name, spec, x in self._tensors():
            feeds[name] = axis_slice(x, spec.batch_axis, 0, self.size)
        if self.cache is None:
            return feeds, None
        buffers, mask = self.cache.feeds(live)
        for spec in self._manifest.state:
            if spec.update == "append":
                feeds[spec.input] = axis_slice(buffers[spec.input], spec.batch_axis, 0, self.size)
        return feeds, mask[: self.size]

    def residency(self) -> Residency:
        """The tensors the decoder's next step keeps from the last (call `feeds` first: it may reallocate the
        cache), and the rows that changed since the last call. Only tensors whose batch axis is the first are
        named: their slots in use are a prefix of their memory."""
        static = {s.target: self.static[s.target] for s in self._manifest.static
                  if s.batch_axis == 0 and self.static[s.target].dtype == np.float32}
        appended = {}
        if self.cache is not None:
            buffers = self.cache.buffers
            appended = {s.input: (buffers[s.input], s.output, s.time_axis) for s in self._manifest.state
                        if s.update == "append" and s.batch_axis == 0 and s.dtype == "float32"}
        changes, self._row_changes = tuple(self._row_changes), []
        return Residency(
            owner=self._owner,
            revision=self._revision,
            cache_revision=self.cache.revision if self.cache is not None else 0,
            cache_growth=self.cache.growth if self.cache is not None else None,
            cache_length=self.cache.length if self.cache is not None else 0,
            row_changes=changes,
            static=static,
            appended=appended,
        )

    def update(self, outputs: dict[str, np.ndarray]) -> None:
        """Keeps a step's new state: replaced state written over the slots in use, the cache's new slot."""
        for spec in self._manifest.state:
            if spec.update == "replace":
                axis_slice(self.state[spec.input], spec.batch_axis, 0, self.size)[...] = outputs[spec.output]
        if self.cache is not None:
            self.cache.append(outputs)

    def narrow(self, width: int) -> None:
        """Cuts the source axes to `width` positions (one copy of the slots in use): the rows that needed the
        rest have left, and the decoder attends every position the tensors hold."""
        for name, spec, x in list(self._tensors()):
            if spec.source_axis is None:
                continue
            shape = list(x.shape)
            shape[spec.source_axis] = width
            narrowed = np.empty(shape, dtype=x.dtype)
            source = axis_slice(axis_slice(x, spec.batch_axis, 0, self.size), spec.source_axis, 0, width)
            axis_slice(narrowed, spec.batch_axis, 0, self.size)[...] = source
            (self.static if name in self.static else self.state)[name] = narrowed
        self._revision += 1

    def take(self, count: int, used: np.ndarray) -> np.ndarray | None:
        """`count` free slots (those below `size` that no row in `used` holds first, then new ones past it,
        which `size` grows to cover), or None when the tensors have fewer."""
        holes = np.setdiff1d(np.arange(self.size), used)[:count]
        extra = count - len(holes)
        if self.size + extra > self.capacity:
            return None
        self.size += extra
        return np.concatenate([holes, np.arange(self.size - extra, self.size)])

    def compact(self, used: np.ndarray) -> np.ndarray:
        """Moves the rows of the last slots into the free ones below, so that the slots in use are exactly
        0 .. len(used) - 1; returns `used` with the moved rows' new slots."""
        count = len(used)
        moving = np.flatnonzero(used >= count)  # rows past the end, in row order
        holes = np.setdiff1d(np.arange(count), used)  # as many as `moving`
        if len(moving):
            self.copy(used[moving], holes)
            used = used.copy()
            used[moving] = holes
        self.size = count
        return used

    def copy(self, sources: np.ndarray, targets: np.ndarray) -> None:
        """Slot targets[i] becomes a copy of slot sources[i] (a beam kept twice, a row moving); no target is
        a source."""
        for _, spec, x in self._tensors():
            view = np.moveaxis(x, spec.batch_axis, 0)
            view[targets] = view[sources]
        if self.cache is not None:
            self.cache.copy(sources, targets)
        self._row_changes.append((tuple(sources.tolist()), tuple(targets.tolist())))

    def fits(self, other: Slots, rows: np.ndarray, width: int) -> bool:
        """Whether `rows` of `other` (needing `width` source positions) fit this batch's tensors."""
        if width > self.width:
            return False
        return self.cache is None or self.cache.fits(other.cache, rows)

    def place(self, targets: np.ndarray, other: Slots, rows: np.ndarray, width: int) -> None:
        """Writes slot rows[i] of `other` into (free) slot targets[i]; source positions past `width` are zeroed
        (padding, masked)."""
        for (_, spec, x), (_, _, y) in zip(self._tensors(), other._tensors()):
            for target, row in zip(targets.tolist(), rows.tolist()):
                into, source = row_view(x, spec.batch_axis, target), row_view(y, spec.batch_axis, row)
                if spec.source_axis is None:
                    into[...] = source
                    continue
                axis = spec.source_axis - (spec.source_axis > spec.batch_axis)
                axis_slice(into, axis, 0, width)[...] = axis_slice(source, axis, 0, width)
                axis_slice(into, axis, width, None)[...] = 0
        if self.cache is not None:
            self.cache.place(targets, other.cache, rows)
        self._row_changes.append((None, tuple(targets.tolist())))

    def _tensors(self):
        """(decoder input name, spec, tensor) of every static and replaced-state tensor, in manifest order."""
        for spec in self._manifest.static:
            yield spec.target, spec, self.static[spec.target]
        for spec in self._manifest.state:
            if spec.update == "replace":
                yield spec.input, spec, self.state[spec.input]


def _gather(tensors: list[np.ndarray], rows: list[np.ndarray], batch_axis: int, source_axis: int | None,
            width: int, capacity: int) -> np.ndarray:
    """One tensor of `capacity` rows whose first ones are, in order, the chosen rows of each tensor; its source
    axis (if it has one) cut or zero-padded to `width`. Rows past the chosen ones are left unset."""
    if source_axis is not None:
        tensors = [axis_slice(x, source_axis, 0, width) for x in tensors]
    shape = list(tensors[0].shape)
    shape[batch_axis] = capacity
    padded = False
    if source_axis is not None:
        shape[source_axis] = width
        padded = any(x.shape[source_axis] < width for x in tensors)
    out = (np.zeros if padded else np.empty)(shape, dtype=tensors[0].dtype)
    start = 0
    for x, r in zip(tensors, rows):
        target = axis_slice(out, batch_axis, start, start + len(r))
        if source_axis is not None:
            target = axis_slice(target, source_axis, 0, x.shape[source_axis])
        copy_rows(target, x, r, batch_axis)
        start += len(r)
    return out
