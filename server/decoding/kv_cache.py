"""Appended decoder state (a Transformer's self-attention K/V cache) kept in buffers written in place.

Growing the cache by concatenation copies all of it at every step, so a step's cost rises with the position
(measured on translate-zh-en 2 at batch 32: the step at position 200 took 2.1x the step at position 10).
Here every appended state lives in a buffer with spare slots along its time axis; a step writes its new
slot in place, and the buffers are reallocated, SPARE_SLOTS longer, only when they are full.

Why a fixed number of spare slots rather than doubling: the decoder reads every slot of the buffer at every
step, spare ones included (they are masked, not skipped), and at batch 32 reading the cache is what makes a
late step dearer than an early one. Doubling leaves up to half the buffer spare (257 slots read at position
200); 16 spare slots leave at most 16 (209 read), for a copy of the cache every 16 steps.

The decoder is fed the whole buffer, spare slots included, with a self-attention mask that hides them:
mask columns 0..C-1 are the buffer's slots and column C is the step's own new token, which a decoder graph
appends after its past. A row's slots need not be contiguous or aligned with other rows' (rows merged in
later are left-padded); positions come from position_ids, never from slot indices. A decoder without a
self-attention mask input cannot skip spare slots, so its buffers are kept exactly as long as the cache.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from attnserve.server.model.manifest import StateSpec
from attnserve.server.decoding.rows import axis_slice, copy_rows, row_view

# Free slots a buffer gets beyond its used ones when it is allocated (first, full, or regathered).
SPARE_SLOTS = 16


class AppendCache:
    """The appended states of one batch: buffers of `capacity` slots, `length` of them used, and each
    row's (B, C + 1) mask over the slots plus the step's own token. Use `start` to make one."""

    def __init__(self, specs: Sequence[StateSpec], buffers: dict[str, np.ndarray], mask: np.ndarray, length: int,
                 spare_slots: bool):
        self._specs = tuple(specs)
        self._buffers = buffers
        self._mask = mask
        self._spare_slots = spare_slots
        self.length = length
        self.capacity = mask.shape[1] - 1
        # Counts reallocations of the buffers: device copies of them (server/model/device_state.py) follow appends
        # and rows rewritten (which the batch's slots report), and repeat the latest reallocation, described
        # by `growth`: (slots cut from the front, slots used before, the new capacity).
        self.revision = 0
        self.growth: tuple[int, int, int] | None = None

    @classmethod
    def start(cls, specs: Sequence[StateSpec], tensors: Mapping[str, np.ndarray], spare_slots: bool) -> AppendCache:
        """A cache whose every row may attend all of the given tensors' slots (usually none yet).

        Args:
            specs: the manifest's "append" states (they grow together, one slot per step).
            tensors: each spec's input name -> initial tensor.
            spare_slots: whether buffers may hold hidden spare slots (the decoder takes a self-attention mask).
        """
        specs = tuple(specs)
        first = tensors[specs[0].input]
        rows, length = first.shape[specs[0].batch_axis], first.shape[specs[0].time_axis]
        cache = cls._allocate(specs, tensors, rows, length, spare_slots)
        for spec in specs:
            cache._buffers[spec.input][_time_index(spec, slice(0, length), first.ndim)] = tensors[spec.input]
        cache._mask[:, :length] = 1
        return cache

    @property
    def buffers(self) -> dict[str, np.ndarray]:
        """Each spec's input name -> its whole buffer (every row and slot, used or not)."""
        return dict(self._buffers)

    @property
    def mask(self) -> np.ndarray:
        """(B, T) which of the used slots each row may attend."""
        return self._mask[:, : self.length]

    def feeds(self, live: np.ndarray | None = None) -> tuple[dict[str, np.ndarray], np.ndarray]:
        """The decoder's state inputs (whole buffers) and its (B, C + 1) self-attention mask, this step's
        token last. Makes room for the step's new slot first, dropping leading slots that no `live` row
        (None: every row) attends."""
        if self.length == self.capacity:
            self._grow(live)
        return dict(self._buffers), self._mask

    def attended(self, rows: np.ndarray) -> np.ndarray:
        """(len(rows), T') which slots the given rows may attend, without leading slots none of them attends."""
        return _kept(self.mask[rows])[0]

    def copy(self, sources: np.ndarray, targets: np.ndarray) -> None:
        """Row targets[i] becomes a copy of row sources[i], slots and mask; no target is a source."""
        for spec in self._specs:
            view = np.moveaxis(self._buffers[spec.input], spec.batch_axis, 0)
            view[targets] = view[sources]
        self._mask[targets] = self._mask[sources]

    def fits(self, other: AppendCache, rows: np.ndarray) -> bool:
        """Whether `place` can take these rows of `other`: they attend no more slots than this cache has, and
        this cache can hide slots (a decoder without a self-attention mask cannot)."""
        return self._spare_slots and self.length >= _kept(other.mask[rows])[1]

    def place(self, targets: np.ndarray, other: AppendCache, rows: np.ndarray) -> None:
        """Writes row rows[i] of `other` into row targets[i]: its slots right-aligned to this cache's used
        ones, every other slot of the row zeroed and hidden. Check `fits` first."""
        mask, kept = _kept(other.mask[rows])
        cut = other.length - kept
        for spec in self._specs:
            for target, row in zip(targets.tolist(), rows.tolist()):
                into = row_view(self._buffers[spec.input], spec.batch_axis, target)
                source = row_view(other._buffers[spec.input], spec.batch_axis, row)
                axis = spec.time_axis - (spec.time_axis > spec.batch_axis)
                into[...] = 0
                axis_slice(into, axis, self.length - kept, self.length)[...] = axis_slice(source, axis, cut, other.length)
        self._mask[targets, : self.capacity] = 0
        self._mask[targets, self.length - kept : self.length] = mask

    def append(self, outputs: Mapping[str, np.ndarray]) -> None:
        """Writes a step's new slot (each spec's output, one position along its time axis) in place. The
        outputs may cover only the first rows (a batch feeds the decoder the rows it uses)."""
        for spec in self._specs:
            new = np.take(outputs[spec.output], 0, axis=spec.time_axis)
            rows = new.shape[spec.batch_axis - (spec.batch_axis > spec.time_axis)]
            buffer = self._buffers[spec.input]
            axis_slice(buffer, spec.batch_axis, 0, rows)[_time_index(spec, self.length, buffer.ndim)] = new
        self._mask[:, self.length] = 1
        self.length += 1

    @classmethod
    def gather(cls, parts: Sequence[tuple[AppendCache, np.ndarray]], capacity: int = 0) -> AppendCache:
        """A new cache holding, in order, the chosen rows of each cache (repeats allowed), each buffer written
        once, in `capacity` rows (at least as many as chosen; the rest empty).
        Leading slots that none of a part's chosen rows attends are dropped; parts with fewer slots are
        left-padded with hidden ones."""
        first = parts[0][0]
        chosen = []  # (cache, rows, their mask over the kept slots, first kept slot)
        for cache, rows in parts:
            mask, kept = _kept(cache.mask[rows])
            chosen.append((cache, rows, mask, cache.length - kept))
        length = max(mask.shape[1] for _, _, mask, _ in chosen)
        total = sum(len(mask) for _, _, mask, _ in chosen)
        out = cls._allocate(first._specs, first._buffers, max(total, capacity), length, first._spare_slots)
        start = 0
        for cache, rows, mask, cut in chosen:
            stop, kept = start + len(mask), mask.shape[1]
            for spec in first._specs:
                target = axis_slice(axis_slice(out._buffers[spec.input], spec.batch_axis, start, stop),
                                    spec.time_axis, length - kept, length)
                source = axis_slice(cache._buffers[spec.input], spec.time_axis, cut, cache.length)
                copy_rows(target, source, rows, spec.batch_axis)
            out._mask[start:stop, length - kept : length] = mask
            start = stop
        return out

    def _grow(self, live: np.ndarray | None) -> None:
        cut = 0
        if self._spare_slots:  # slots no live row attends go (rows that are not live are never read)
            cut = self.length - _kept(self.mask if live is None else self.mask[live])[1]
        length = self.length - cut
        grown = self._allocate(self._specs, self._buffers, len(self._mask), length, self._spare_slots,
                               at_least=length + 1)
        for spec in self._specs:
            grown._buffers[spec.input][_time_index(spec, slice(0, length), self._buffers[spec.input].ndim)] = (
                axis_slice(self._buffers[spec.input], spec.time_axis, cut, self.length)
            )
        grown._mask[:, :length] = self.mask[:, cut:]
        self.growth = (cut, self.length, grown.capacity)
        self._buffers, self._mask, self.capacity, self.length = grown._buffers, grown._mask, grown.capacity, length
        self.revision += 1

    @classmethod
    def _allocate(cls, specs, like: Mapping[str, np.ndarray], rows: int, length: int, spare_slots: bool,
                  at_least: int = 0) -> AppendCache:
        """An empty cache of `rows` rows whose buffers (shaped and typed like `like`'s) hold `length` used
        slots and room to grow: SPARE_SLOTS more with spare slots, exactly `length` (or `at_least`) without."""
        capacity = max(length, at_least)
        if spare_slots and capacity:
            capacity = max(length + SPARE_SLOTS, at_least)
        buffers = {}
        for spec in specs:
            shape = list(like[spec.input].shape)
            shape[spec.batch_axis], shape[spec.time_axis] = rows, capacity
            buffers[spec.input] = np.zeros(shape, dtype=like[spec.input].dtype)
        mask = np.zeros((rows, capacity + 1), dtype=np.int64)
        mask[:, capacity] = 1  # the step's own token
        return cls(specs, buffers, mask, length, spare_slots)


def _kept(mask: np.ndarray) -> tuple[np.ndarray, int]:
    """(B, T) mask -> the mask without its leading slots that no row attends, and how many slots it keeps."""
    used = mask.any(axis=0)
    cut = int(np.argmax(used)) if used.any() else mask.shape[1]
    return mask[:, cut:], mask.shape[1] - cut


def _time_index(spec: StateSpec, where, ndim: int) -> tuple:
    index = [slice(None)] * ndim
    index[spec.time_axis] = where
    return tuple(index)

