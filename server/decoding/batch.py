"""A `Batch`: the model-side tensors of the rows decoded together, and the one decoder step they take.

A batch holds the static decoder inputs the encoder produced once, the recurrent state (a Transformer's K/V
cache, an LSTM's h/c) and per-row positions and masks. It knows a model only through its manifest: every
tensor is gathered along the batch axis the manifest names, appended state grows along its time axis,
replaced state is fed back. What the encoder reads (text, audio, an image) is the input kind's
preprocessor's business (server/inputs/preprocessing.py): the batch gets the encoder's feeds ready-made, with each
row's number of encoder positions.

Rows live in slots of the decoder's tensors (server/decoding/slots.py). `merge` and `split` let continuous batching
(server/engine/lane.py) add rows that start later and move rows between running batches without changing what
any row computes.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Mapping

import numpy as np

from attnserve.server.decoding.kv_cache import AppendCache
from attnserve.server.decoding.logit_processors import LogitProcessor, processors_for
from attnserve.server.model.manifest import Manifest, StateSpec
from attnserve.server.decoding.ngram_lm import NgramLanguageModel
from attnserve.server.inputs.preprocessing import EncoderBatch
from attnserve.server.model.runtime import Runtime
from attnserve.server.decoding.slots import Slots


@dataclasses.dataclass(frozen=True)
class StepOutput:
    logits: np.ndarray  # (B, V)
    attention: np.ndarray  # (B, L, H, S): this step's cross-attention


def _initial_state(spec: StateSpec, batch: int, width: int, tensors: Mapping[str, np.ndarray]) -> np.ndarray:
    if spec.init_from is not None:
        return tensors[spec.init_from].astype(spec.dtype, copy=False)
    sizes = {"batch": batch, "source": width}
    shape = tuple(sizes.get(d, d) for d in spec.shape)
    return np.zeros(shape, dtype=spec.dtype)


class Batch:
    """The model-side tensors of rows decoded together, with explicit operations: build, step, select.

    Rows are independent: each has its own position, self-attention mask and source length, so dropping
    or reordering rows never changes what a row computes.

    Rows live in slots of the decoder's tensors (server/decoding/slots.py): a row that leaves frees its slot, a row
    that joins takes a free one, and only when that cannot be done are the rows gathered into fresh tensors.
    Each step's logits go through the manifest's logit processors in order (server/decoding/logit_processors.py);
    their per-row state follows the rows through select, merge and split.
    """

    # The last rows move into free slots when more than this share of the rows' number is free: free slots
    # still cost decoder work (a lone row left in two slots costs it more), moving copies a row per hole.
    FREE_SLOT_SHARE = 0.25
    # The source axes are cut when the rows need less than this share of their positions: the decoder attends
    # every one (measured at 28 rows: 96 positions 9.7 ms a step, 64 positions 8.7 ms).
    NARROW_SHARE = 2 / 3

    def __init__(
        self,
        manifest: Manifest,
        runtime: Runtime,
        static: dict[str, np.ndarray],
        state: dict[str, np.ndarray],
        source_lengths: np.ndarray,
    ):
        self._manifest = manifest
        self._runtime = runtime
        appended = [s for s in manifest.state if s.update == "append"]
        in_cache = {s.input for s in appended}
        replaced = {name: x for name, x in state.items() if name not in in_cache}
        spare_slots = manifest.decoder.self_attention_mask is not None
        cache = AppendCache.start(appended, state, spare_slots) if appended else None
        b = len(source_lengths)
        self._slots = Slots(manifest, static, replaced, cache, b)
        self._row_slots = np.arange(b)  # (B,) each row's slot, all different
        self.source_lengths = source_lengths  # (B,) real source tokens per row
        self.positions = np.zeros(b, dtype=np.int64)  # (B,) position of each row's next input token
        # The most rows this batch will hold at once (continuous batching's max_rows; set by its lane), or None.
        self.max_rows: int | None = None
        # (B,) most new tokens per row from the encoder's length hint (manifest encoder.length_hint), or None.
        self.length_budget: np.ndarray | None = None
        # The manifest's changes to each step's logits, in order, with the per-row state they keep.
        self._processors: list[LogitProcessor] = []

    @classmethod
    def build(cls, manifest: Manifest, runtime: Runtime, inputs: EncoderBatch,
              language_model: NgramLanguageModel | None = None) -> Batch:
        """Runs the encoder once and prepares static inputs and initial state.

        Args:
            inputs: the encoder's feeds for every row (the preprocessor's `collate`).
            language_model: the manifest's LM (loaded), when it names one.

        Raises:
            RuntimeError: a static tensor's source axis is not as long as the longest row's encoder
                positions: the encoder and the manifest's `input` disagree (e.g. on the time reduction).
        """
        tensors = {**inputs.feeds, **runtime.encode(inputs.feeds)}
        static = {s.target: tensors[s.source] for s in manifest.static}
        width = int(inputs.lengths.max()) if len(inputs.lengths) else 0
        for spec in manifest.static:
            got = static[spec.target].shape[spec.source_axis]
            if got != width:
                raise RuntimeError(
                    f"{spec.source!r} has {got} positions on its source axis {spec.source_axis}; the model's "
                    f"{manifest.input.kind} input gives {width} for this batch (does the encoder reduce time as "
                    f"the manifest says?)"
                )
        state = {s.input: _initial_state(s, len(inputs.lengths), width, tensors) for s in manifest.state}
        batch = cls(manifest, runtime, static, state, np.asarray(inputs.lengths, dtype=np.int64))
        hint = manifest.encoder.length_hint
        if hint is not None:
            estimate = np.asarray(tensors[hint.output], dtype=np.float64).reshape(-1)
            batch.length_budget = np.ceil(hint.scale * estimate).astype(np.int64) + hint.offset
        batch._processors = processors_for(manifest, tensors, len(batch), language_model)
        return batch

    def __len__(self) -> int:
        return len(self.source_lengths)

    @property
    def self_mask(self) -> np.ndarray:
        """(B, T) which cache slots the rows may attend, without leading slots none of them attends (T = 0
        without a K/V cache)."""
        cache = self._slots.cache
        return cache.attended(self._row_slots) if cache is not None else np.zeros((len(self), 0), dtype=np.int64)

    @property
    def slots(self) -> Slots:
        """The tensors the rows live in (`slot_of_rows` says where)."""
        return self._slots

    @property
    def slot_of_rows(self) -> np.ndarray:
        """(B,) the slot of each row."""
        return self._row_slots

    def step(self, input_ids: np.ndarray) -> StepOutput:
        """Runs one decoder step for every row and advances positions, masks and state.

        Args:
            input_ids: (B,) the newest token of each row.
        """
        d, slots, rows = self._manifest.decoder, self._slots, self._row_slots
        in_order = len(rows) == slots.size and bool(np.all(rows == np.arange(len(rows))))  # row i in slot i
        feeds, self_mask = slots.feeds(live=rows)
        ids = np.zeros((slots.size, 1), dtype=np.int64)  # a free slot decodes token 0 at position 0
        ids[rows, 0] = input_ids
        feeds[d.input_ids] = ids
        if d.position_ids is not None:
            positions = np.zeros((slots.size, 1), dtype=np.int64)
            positions[rows, 0] = self.positions
            feeds[d.position_ids] = positions
        if d.self_attention_mask is not None:
            # (S, C + 1): spare and hidden cache slots masked, this step's token last
            feeds[d.self_attention_mask] = self_mask if self_mask is not None else np.ones((slots.size, 1), np.int64)
        for processor in self._processors:
            processor.advance(input_ids, self.positions)
        out = self._runtime.decode_step(feeds, slots.residency())
        slots.update(out)
        self.positions = self.positions + 1
        logits, attention = out[d.logits], out[self._manifest.attention.output]  # (S, V), (S, L, H, width)
        if not in_order:
            logits, attention = logits[rows], attention[rows]
        attention = attention[..., : self._width()]  # the tensors may be wider than the rows' sources
        for processor in self._processors:  # joint CTC scores, LM fusion, suppressed tokens
            logits = processor(logits)
        return StepOutput(logits, attention)

    def select(self, rows: np.ndarray) -> None:
        """Keeps the given rows, in the given order; a row may appear more than once (beam search).

        The rows that leave free their slots; a row kept again gets a copy in a free slot. Too many free slots
        (or too few for the copies) and the rows are gathered into fresh tensors, along each tensor's manifest
        batch axis, without source padding that no remaining row needs.

        Args:
            rows: (B',) indices into the current rows.
        """
        rows = np.asarray(rows, dtype=np.intp)
        if len(rows) == len(self) and np.array_equal(rows, np.arange(len(self))):
            return
        for processor in self._processors:
            processor.select(rows)
        self.source_lengths = self.source_lengths[rows]
        self.positions = self.positions[rows]
        slots = self._row_slots[rows]
        _, first = np.unique(slots, return_index=True)
        repeated = np.setdiff1d(np.arange(len(slots)), first)  # copies of a row kept before them
        if len(repeated):
            targets = self._slots.take(len(repeated), slots)
            if targets is None:  # no room for the copies: every row into fresh tensors
                self._regather(slots, spare=True)
                return
            self._slots.copy(slots[repeated], targets)
            slots[repeated] = targets
        if self._slots.size - len(slots) > self.FREE_SLOT_SHARE * len(slots):
            slots = self._slots.compact(slots)
        self._row_slots = slots
        if self._width() < self.NARROW_SHARE * self._slots.width:
            self._slots.narrow(self._width())

    def merge(self, *others: Batch) -> None:
        """Appends the other batches' rows, in order (continuous batching: requests admitted while this
        batch runs; requests encoded in several length buckets). The other batches are left empty.

        The newcomers are written into free slots (static tensors and source-shaped state zero-padded along
        their source axis; appended state, a K/V cache, aligned to the newest slot, earlier ones hidden by
        the self-attention mask), so every row computes what it would alone. Where they do not fit, every row
        is gathered into fresh tensors, each copied once.
        """
        parts = (self, *others)
        targets = None
        if all(self._slots.fits(b._slots, b._row_slots, b._width()) for b in others):
            targets = self._slots.take(sum(len(b) for b in others), self._row_slots)
        if targets is not None:
            start = 0
            for b in others:
                self._slots.place(targets[start : start + len(b)], b._slots, b._row_slots, b._width())
                start += len(b)
            self._row_slots = np.concatenate([self._row_slots, targets])
        else:  # every row into fresh tensors, with room for the next newcomers
            width = max(b._width() for b in parts)
            self._slots = Slots.gather(self._manifest, [(b._slots, b._row_slots) for b in parts], width, spare=True,
                                       max_rows=self.max_rows)
            self._row_slots = np.arange(self._slots.size)
        # The same model's batches: the same processors, one of each kind per batch.
        self._processors = [type(kind[0]).concatenate(kind) for kind in zip(*(b._processors for b in parts))]
        self.positions = np.concatenate([b.positions for b in parts])
        self.source_lengths = np.concatenate([b.source_lengths for b in parts])
        for b in others:
            b._row_slots, b.positions, b.source_lengths = b._row_slots[:0], b.positions[:0], b.source_lengths[:0]

    def split(self, rows: np.ndarray) -> Batch:
        """Moves the given rows (ascending) out into a new batch; this one keeps the others, in order."""
        rows = np.asarray(rows, dtype=np.intp)
        other = copy.copy(self)
        other._processors = [p.copy() for p in self._processors]  # select() gathers in place: each side its own
        other._row_slots = self._row_slots[rows]
        other.source_lengths, other.positions = self.source_lengths[rows], self.positions[rows]
        other._regather(other._row_slots)  # its own tensors
        for processor in other._processors:
            processor.select(rows)
        self.select(np.setdiff1d(np.arange(len(self)), rows))
        return other

    @property
    def source_width(self) -> int:
        """Source positions the rows need: the longest row's (0 without rows)."""
        return self._width()

    def _width(self) -> int:
        return int(self.source_lengths.max()) if len(self) else 0

    def _regather(self, slots: np.ndarray, spare: bool = False) -> None:
        """The rows (already selected: row i is slot slots[i]) move into fresh tensors of their size (with
        `spare`: room for more rows, Slots.gather)."""
        self._slots = Slots.gather(self._manifest, [(self._slots, slots)], self._width(), spare=spare,
                                   max_rows=self.max_rows)
        self._row_slots = np.arange(len(slots))
