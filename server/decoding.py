"""The one decode loop, for every model the manifest can describe (numpy only).

A `Batch` holds the model-side tensors of the requests decoded together: the static decoder inputs the
encoder produced once, the recurrent state (a Transformer's K/V cache, an LSTM's h/c) and per-row
positions and masks. It knows a model only through its manifest: every tensor is gathered along the batch
axis the manifest names, appended state grows along its time axis, replaced state is fed back. What the
encoder reads (text, audio, an image) is the input kind's preprocessor's business (server/preprocessing.py):
the batch gets the encoder's feeds ready-made, with each row's number of encoder positions.

A `DecodeStrategy` (greedy search, beam search, sampling in server/sampling.py) turns each step's logits
into the next tokens and tells the batch which rows to keep: finished rows are dropped, beams are reordered.
Before it chooses, the requests' output rules (minimum length, repetition guard: server/output_rules.py)
take the tokens they forbid out of the logits; log-probabilities are those of the distribution that remains.
A model with a CTC head (manifest encoder.ctc) has its logits replaced by joint CTC/attention scores before
that (server/ctc_prefix.py), and a model with an n-gram LM (manifest language_model) adds the LM's scores
to them (shallow fusion, server/ngram_lm.py), so every strategy ranks candidates by all of them.
Finished requests come out of `decode()` at the step they finish, so a caller can answer them while the rest
of the batch continues. `Batch.merge` and `Batch.split` let continuous batching (server/lane.py) add rows
that start later and move rows between running batches without changing what any row computes.
"""

from __future__ import annotations

import abc
import copy
import dataclasses
from collections.abc import Iterator, Mapping, Sequence

import numpy as np

from attnserve.server.ctc_prefix import CTCPrefixScorer
from attnserve.server.generation import AttentionReduction, FinishReason, GenerationRequest, SamplingOptions
from attnserve.server.kv_cache import AppendCache
from attnserve.server.log_softmax import log_softmax
from attnserve.server.manifest import Manifest, StateSpec
from attnserve.server.ngram_lm import LanguageModelState, NgramLanguageModel
from attnserve.server.output_rules import OutputRules
from attnserve.server.preprocessing import EncoderBatch, Source
from attnserve.server.runtime import Runtime
from attnserve.server.slots import Slots


@dataclasses.dataclass(frozen=True)
class PreparedRequest:
    """A validated request, its input preprocessed and resolved against its model; what the decode loop consumes."""

    request: GenerationRequest
    # The input as its kind's preprocessor prepared it (token ids, log-mel frames, pixels).
    source: Source
    # The resolved target language and the decoder start token for it.
    target_language: str
    start_id: int
    # Resolved limit on generated tokens (EOS not counted), >= 1.
    max_new_tokens: int
    beam_size: int
    # Non-negative decoder layer of the returned attention; None when no attention was asked for.
    attention_layer: int | None
    # Decoder layer whose attention gives word timestamps (audio input); None when there are none.
    timestamp_layer: int | None = None
    # How many of the best sequences to return (<= beam_size).
    num_return_sequences: int = 1
    # EOS is forbidden before this many tokens; 0 = no minimum.
    min_new_tokens: int = 0
    # No n-gram of this size repeats in the output; 0 = no guard.
    no_repeat_ngram_size: int = 0
    # Sample each token (beam_size 1); its seed is always set here. None = greedy or beam search.
    sampling: SamplingOptions | None = None
    # Non-negative heads of attention_layer to combine (empty = all), and how.
    attention_heads: tuple[int, ...] = ()
    attention_reduction: AttentionReduction = AttentionReduction.MEAN
    # Tokens every step takes, EOS last (greedy rows only): the request scores this output instead of
    # searching one (server/reranking.py builds such requests). None = search.
    forced_ids: tuple[int, ...] | None = None
    # DecodingOptions.reverse_weight > 0: the language to translate the candidates back into.
    reverse_language: str | None = None
    # Glossary terms the output must contain (server/glossary.py Constraint); () = none.
    constraints: tuple = ()

    @property
    def keeps_attention(self) -> bool:
        """Whether decoding must keep this request's attention (returned, or read for timestamps)."""
        return self.attention_layer is not None or self.timestamp_layer is not None


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

    Rows are independent: each has its own position, self-attention mask and source length, so filtering
    or reordering rows never changes what a row computes.

    Rows live in slots of the decoder's tensors (server/slots.py): a row that leaves frees its slot, a row
    that joins takes a free one, and only when that cannot be done are the rows gathered into fresh tensors.
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
        # Joint CTC/attention decoding (manifest encoder.ctc): each row's CTC prefix scores, or None.
        self._ctc: CTCPrefixScorer | None = None
        # Shallow fusion (manifest language_model): each row's recent tokens for the n-gram LM, or None.
        self._lm: LanguageModelState | None = None

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
        ctc = manifest.encoder.ctc
        if ctc is not None and ctc.weight > 0:
            batch._ctc = CTCPrefixScorer(tensors[ctc.log_probs], tensors[ctc.lengths], ctc.blank_id,
                                         manifest.special_tokens.eos)
        lm = manifest.language_model
        if language_model is not None and lm is not None and lm.weight > 0:
            batch._lm = LanguageModelState.start(language_model, len(batch))
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
        if self._ctc is not None:  # the tokens chosen last step extend the CTC prefixes (not the start token)
            self._ctc.advance(input_ids, np.flatnonzero(self.positions > 0))
        if self._lm is not None:  # the LM's context includes the start token
            self._lm.advance(input_ids)
        out = self._runtime.decode_step(feeds, slots.residency())
        slots.update(out)
        self.positions = self.positions + 1
        logits, attention = out[d.logits], out[self._manifest.attention.output]  # (S, V), (S, L, H, width)
        if not in_order:
            logits, attention = logits[rows], attention[rows]
        attention = attention[..., : self._width()]  # the tensors may be wider than the rows' sources
        if self._ctc is not None:
            logits = self._joint_scores(logits)
        if self._lm is not None:
            logits = self._fused_scores(logits)
        if self._manifest.special_tokens.suppress:
            logits[:, list(self._manifest.special_tokens.suppress)] = -np.inf  # tokens never to emit
        return StepOutput(logits, attention)

    def _joint_scores(self, logits: np.ndarray) -> np.ndarray:
        """(B, V) logits -> (1 - w) log p_decoder + w x CTC prefix score of each extension (Watanabe et al.
        2017); strategies normalise them like any logits. A row whose every extension the CTC head rules out
        (more characters than its frames can hold) keeps its decoder scores."""
        w = self._manifest.encoder.ctc.weight
        ctc = self._ctc.score()  # (B, V)
        joint = (1 - w) * log_softmax(logits) + w * ctc
        stuck = ~np.isfinite(joint.max(axis=-1))
        joint[stuck] = logits[stuck]
        return joint.astype(np.float32, copy=False)

    def _fused_scores(self, scores: np.ndarray) -> np.ndarray:
        """(B, V) decoder (or joint) scores -> their log-probabilities + weight x the LM's log p of each token
        after the row's tokens so far (shallow fusion)."""
        fused = log_softmax(scores) + self._manifest.language_model.weight * self._lm.score()
        return fused.astype(np.float32, copy=False)

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
        if self._ctc is not None:
            self._ctc.select(rows)
        if self._lm is not None:
            self._lm.select(rows)
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

    def filter(self, keep_rows: np.ndarray) -> None:
        """Drops every row not in `keep_rows` (ascending, unique): finished requests leave the batch."""
        keep_rows = np.asarray(keep_rows, dtype=np.intp)
        if np.any(np.diff(keep_rows) <= 0):
            raise ValueError("filter() takes ascending, unique rows; use select() to reorder or repeat")
        self.select(keep_rows)

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
        if self._ctc is not None:
            self._ctc = CTCPrefixScorer.concatenate([b._ctc for b in parts])
        if self._lm is not None:
            self._lm = LanguageModelState.concatenate([b._lm for b in parts])
        self.positions = np.concatenate([b.positions for b in parts])
        self.source_lengths = np.concatenate([b.source_lengths for b in parts])
        for b in others:
            b._row_slots, b.positions, b.source_lengths = b._row_slots[:0], b.positions[:0], b.source_lengths[:0]

    def split(self, rows: np.ndarray) -> Batch:
        """Moves the given rows (ascending) out into a new batch; this one keeps the others, in order."""
        rows = np.asarray(rows, dtype=np.intp)
        other = copy.copy(self)
        if self._ctc is not None:  # select() gathers in place: each side needs its own scorer
            other._ctc = copy.copy(self._ctc)
        if self._lm is not None:
            other._lm = copy.copy(self._lm)
        other._row_slots = self._row_slots[rows]
        other.source_lengths, other.positions = self.source_lengths[rows], self.positions[rows]
        other._regather(other._row_slots)  # its own tensors
        if other._ctc is not None:
            other._ctc.select(rows)
        if other._lm is not None:
            other._lm.select(rows)
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


@dataclasses.dataclass(frozen=True)
class Hypothesis:
    """A finished output sequence for one request."""

    # The request's index in the list the strategy was built with.
    index: int
    token_ids: np.ndarray  # (n,) EOS excluded
    logprobs: np.ndarray  # (n,) of each token
    finish_reason: FinishReason
    # (n, L, H, S) attention of each output token on the request's own S source tokens; None if not asked.
    attention: np.ndarray | None
    # Summed log-probability / length in tokens (EOS included when it ended the sequence).
    score: float = float("nan")
    # Beam search with num_return_sequences > 1: the next best sequences, best first (no attention).
    alternatives: tuple[Hypothesis, ...] = ()


@dataclasses.dataclass(frozen=True)
class StepEvents:
    """What one step produced: tokens ready to stream, and requests that finished."""

    requests: np.ndarray  # (E,) request indices that got a final, streamable token this step
    token_ids: np.ndarray  # (E,)
    logprobs: np.ndarray  # (E,)
    finished: list[Hypothesis]
    # (E, L, H, S) the step's attention of those rows (S: the batch's source width this step); None when
    # no request of the batch asked for attention.
    attention: np.ndarray | None = None


@dataclasses.dataclass(frozen=True)
class Selection:
    """The strategy's answer to a step: which rows go on, and what each is fed next."""

    rows: np.ndarray  # (B',) rows of the current batch, in their new order
    tokens: np.ndarray  # (B',) next input token of each


def chosen_logprobs(logits: np.ndarray, tokens: np.ndarray) -> np.ndarray:
    """(B, V) logits, (B,) or (B, m) tokens of each row -> the log-probabilities of those tokens only, shaped
    as `tokens` (the entries of log_softmax)."""
    picked = np.take_along_axis(log_softmax(logits), tokens.reshape(len(logits), -1), axis=1)
    return picked.reshape(tokens.shape)


@dataclasses.dataclass(frozen=True)
class _Record:
    """The candidates one step produced."""

    parents: np.ndarray  # (E,) entry of the previous record each candidate extends
    tokens: np.ndarray  # (E,)
    logprobs: np.ndarray  # (E,)
    rows: np.ndarray | None  # (E,) batch row each candidate came from; None = entry i is row i
    attention: np.ndarray | None  # (B_step, L, H, S_step) the step's attention, by batch row


class History:
    """Back-pointers to every step's candidates, so a sequence is rebuilt once, when it finishes.

    Nothing is copied per row per step; tracing costs one gather per step for all sequences that finish
    together.

    Args:
        keep_attention: store each step's attention (needed when any request asks for it).
    """

    def __init__(self, keep_attention: bool):
        self.keep_attention = keep_attention
        self._records: list[_Record] = []

    def __len__(self) -> int:
        return len(self._records)

    def append(self, parents, tokens, logprobs, attention, rows=None) -> None:
        attention = attention if self.keep_attention else None
        self._records.append(_Record(parents, tokens, logprobs, rows, attention))

    def trace(self, entries: np.ndarray, step: int = -1) -> tuple[np.ndarray, np.ndarray, list]:
        """Follows back-pointers from `entries` of record `step` to the first record.

        Returns:
            tokens (F, n), logprobs (F, n), and per record (record, entries): the chain for attention().
        """
        step = step % len(self._records)
        chain = []
        for record in reversed(self._records[: step + 1]):
            chain.append((record, entries))
            entries = record.parents[entries]
        chain.reverse()
        tokens = np.stack([r.tokens[e] for r, e in chain], axis=1)  # (F, n)
        logprobs = np.stack([r.logprobs[e] for r, e in chain], axis=1)  # (F, n)
        return tokens, logprobs, chain

    @staticmethod
    def attention(chain: list, width: int) -> np.ndarray:
        """(F, n, L, H, width) attention along a traced chain, cut to `width` source columns."""
        steps = [r.attention[e if r.rows is None else r.rows[e], ..., :width] for r, e in chain]
        return np.stack(steps, axis=1)


class DecodeStrategy(abc.ABC):
    """Chooses the next tokens from each step's logits and which batch rows continue.

    Args:
        requests: the requests of the batch, one row each when the batch is built.
        eos: the end-of-sequence id.
    """

    def __init__(self, requests: Sequence[PreparedRequest], eos: int, length_budget: np.ndarray | None = None):
        self.requests = list(requests)
        self.eos = eos
        self._cancelled = np.zeros(len(self.requests), dtype=bool)
        self._max_new = np.array([r.max_new_tokens for r in self.requests], dtype=np.int64)  # (N,)
        if length_budget is not None:  # the encoder's estimate, never below what the request insists on
            floor = np.array([r.min_new_tokens if r.forced_ids is None else len(r.forced_ids) for r in self.requests],
                             dtype=np.int64)
            self._max_new = np.minimum(self._max_new, np.maximum(length_budget, np.maximum(floor, 1)))
        self._source_lengths = np.array([r.source.length for r in self.requests], dtype=np.int64)  # (N,)
        self._wants_attention = np.array([r.keeps_attention for r in self.requests], dtype=bool)
        self.history = History(keep_attention=bool(self._wants_attention.any()))
        self.rules = OutputRules(self.requests, eos)

    def cancel(self, index: int) -> None:
        """Drops request `index` at the next step; it gets no hypothesis and streams no more tokens."""
        self._cancelled[index] = True

    @abc.abstractmethod
    def start(self) -> Selection:
        """Rows of the freshly built batch (one per request) to decode, and their start tokens."""

    @abc.abstractmethod
    def advance(self, logits: np.ndarray, attention: np.ndarray) -> tuple[Selection, StepEvents]:
        """Consumes one step's (B, V) logits and (B, L, H, S) attention."""

    def _hypotheses(self, indices, entries, reasons, step: int = -1, scores=None) -> list[Hypothesis]:
        """Rebuilds the sequences ending at `entries` of record `step` (EOS ones lose their last token).

        Args:
            scores: the search's own score of each sequence; None = summed log-probability / length.
        """
        if not len(entries):
            return []
        tokens, logprobs, chain = self.history.trace(np.asarray(entries), step)
        attention = None
        if self.history.keep_attention and self._wants_attention[indices].any():
            attention = History.attention(chain, int(self._source_lengths[indices].max()))
        out = []
        for j, (index, reason) in enumerate(zip(indices, reasons)):
            n = tokens.shape[1] - (reason is FinishReason.EOS)
            weights = None
            if attention is not None and self._wants_attention[index]:
                weights = attention[j, :n, ..., : self._source_lengths[index]]
            score = float(logprobs[j].sum(dtype=np.float64) / tokens.shape[1]) if scores is None else scores[j]
            out.append(Hypothesis(int(index), tokens[j, :n], logprobs[j, :n], reason, weights, float(score)))
        return out


class GreedySearch(DecodeStrategy):
    """Takes the most likely token at every step; each request is one row."""

    def start(self) -> Selection:
        self._row_request = np.arange(len(self.requests))  # (B,) request of each row
        self._parents = self._row_request  # (B,) entry of the previous record each row continues
        self._forced = [r.forced_ids for r in self.requests]
        self._any_forced = any(f is not None for f in self._forced)
        self.rules.start(len(self.requests))
        return Selection(self._row_request, np.array([r.start_id for r in self.requests], dtype=np.int64))

    def advance(self, logits: np.ndarray, attention: np.ndarray) -> tuple[Selection, StepEvents]:
        req = self._row_request
        self.rules.apply(logits, req, len(self.history))
        tokens = self._choose(logits, req)  # (B,)
        if self._any_forced:
            self._force(tokens, req)
        logprobs = chosen_logprobs(logits, tokens)  # (B,)
        self.history.append(self._parents, tokens, logprobs, attention)
        eos = tokens == self.eos
        length = ~eos & (len(self.history) >= self._max_new[req])
        cancelled = self._cancelled[req]
        done = np.flatnonzero((eos | length) & ~cancelled)
        reasons = [FinishReason.EOS if eos[row] else FinishReason.LENGTH for row in done]
        finished = self._hypotheses(req[done], done, reasons)
        keep = np.flatnonzero(~(eos | length | cancelled))
        emit = ~eos & ~cancelled
        streamed = attention[emit] if self.history.keep_attention else None
        events = StepEvents(req[emit], tokens[emit], logprobs[emit], finished, streamed)
        self._row_request, self._parents = req[keep], keep
        self.rules.extend(keep, tokens[keep])
        return Selection(keep, tokens[keep]), events

    def _choose(self, logits: np.ndarray, row_request: np.ndarray) -> np.ndarray:
        """(B, V) logits -> (B,) the next token of each row: the most likely one."""
        return logits.argmax(axis=-1)

    def _force(self, tokens: np.ndarray, row_request: np.ndarray) -> None:
        """Overwrites, in place, the tokens of rows whose request gives its output (forced_ids)."""
        step = len(self.history)
        for row, index in enumerate(row_request):
            forced = self._forced[index]
            if forced is not None:
                tokens[row] = forced[step]


class BeamSearch(DecodeStrategy):
    """Keeps the `beam_size` best partial sequences of each request (all requests share one beam size).

    A sequence's score is its summed log-probability; finished sequences are ranked by score / length
    (tokens, EOS included). A request stops once it has `beam_size` finished sequences and its best running
    beam, normalised the same way, cannot beat the worst of them (the usual heuristic), or at
    max_new_tokens, where running beams compete too. Beams finish only as a whole request, so beam
    requests stream nothing while decoding: their tokens and attention come with their hypothesis.
    """

    def start(self) -> Selection:
        n, self.k = len(self.requests), self.requests[0].beam_size
        self._alive = np.arange(n)  # (R,) requests still decoding; request r owns rows r*k .. r*k+k-1
        self._scores = np.full((n, self.k), -np.inf)  # (R, k) summed log-probabilities
        self._scores[:, 0] = 0.0  # all beams start equal: expand only the first at step 0
        self._parents = np.arange(n * self.k)  # (R*k,) entry of the previous record each row continues
        self._finished: list[list[tuple[float, int, int]]] = [[] for _ in range(n)]  # (score, step, entry)
        self._n_finished = np.zeros(n, dtype=np.int64)  # (N,) len(self._finished[i])
        self._worst = np.full(n, np.inf)  # (N,) normalised score of the worst kept finished sequence
        start = np.array([r.start_id for r in self.requests], dtype=np.int64)
        self.rules.start(n * self.k)
        return Selection(np.repeat(np.arange(n), self.k), np.repeat(start, self.k))

    def advance(self, logits: np.ndarray, attention: np.ndarray) -> tuple[Selection, StepEvents]:
        k, r, step = self.k, len(self._alive), len(self.history)
        self.rules.apply(logits, np.repeat(self._alive, k), step)
        rows, tokens, scores, logprobs = self._candidates(logits)  # (R, 2k) each
        parents, logprobs = self._parents[rows].ravel(), logprobs.ravel()
        self.history.append(parents, tokens.ravel(), logprobs, attention, rows.ravel())
        self._collect_eos(tokens == self.eos, scores, step)
        # Each beam offers EOS at most once, so the 2k best hold at least k non-EOS continuations.
        go_on = tokens != self.eos
        go_on &= np.cumsum(go_on, axis=1) <= k  # (R, 2k), exactly k per request
        entries = np.flatnonzero(go_on).reshape(r, k)  # into this step's record
        scores = scores[go_on].reshape(r, k)
        done = self._done(scores, step)
        cancelled = self._cancelled[self._alive]
        finished = [self._best(i, entries[i], scores[i], step) for i in np.flatnonzero(done & ~cancelled)]
        keep = ~(done | cancelled)
        entries = entries[keep].ravel()
        self._alive, self._scores, self._parents = self._alive[keep], scores[keep], entries
        none = np.zeros(0, dtype=np.int64)
        events = StepEvents(none, none, np.zeros(0, dtype=np.float32), finished)
        self.rules.extend(rows.ravel()[entries], tokens.ravel()[entries])
        return Selection(rows.ravel()[entries], tokens.ravel()[entries]), events

    def _candidates(self, logits: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """The 2k best (beam, token) extensions per request: batch rows, tokens, summed scores and the
        tokens' own log-probabilities, best first.

        A request's 2k best are among each beam's 2k most likely tokens, so only those (R*k, 2k) get a
        log-probability and a summed score; the (R*k, V) log-softmax and sums are never materialised (at
        128 rows of a 17k vocabulary, three passes of 9 MB each per step).
        """
        k, r, v = self.k, len(self._alive), logits.shape[1]
        m = min(2 * k, v)
        best = np.argpartition(logits, v - m, axis=1)[:, v - m :]  # (R*k, m) each beam's m likeliest, unordered
        lp = chosen_logprobs(logits, best)  # (R*k, m)
        total = (self._scores.reshape(-1, 1) + lp).reshape(r, k * m)  # (R, k*m)
        order = np.argsort(-total, axis=1, kind="stable")[:, : 2 * k]  # (R, 2k)
        rows = np.arange(r)[:, None] * k + order // m  # (R, 2k)
        within = order % m
        return rows, best[rows, within], np.take_along_axis(total, order, 1), lp[rows, within]

    def _collect_eos(self, eos: np.ndarray, scores: np.ndarray, step: int) -> None:
        """Keeps EOS candidates ranked among a request's k best as finished sequences (the best k)."""
        for i, j in zip(*np.nonzero(eos[:, : self.k])):
            found = self._finished[self._alive[i]]
            found.append((scores[i, j] / (step + 1), step, i * 2 * self.k + j))
            found.sort(key=lambda f: -f[0])
            del found[self.k :]
            self._n_finished[self._alive[i]] = len(found)
            self._worst[self._alive[i]] = found[-1][0]

    def _done(self, scores: np.ndarray, step: int) -> np.ndarray:
        """(R,) requests that stop now: at their length limit, or unable to improve on k finished ones."""
        at_limit = step + 1 >= self._max_new[self._alive]
        full = self._n_finished[self._alive] >= self.k
        return at_limit | (full & (scores[:, 0] / (step + 1) <= self._worst[self._alive]))

    def _best(self, i: int, entries: np.ndarray, scores: np.ndarray, step: int) -> Hypothesis:
        """The best finished sequence of alive request i, with the next best as its alternatives when the
        request asked for more than one; its running beams compete at the length limit."""
        index = int(self._alive[i])
        options = [(s, st, e, FinishReason.EOS) for s, st, e in self._finished[index]]
        if step + 1 >= self._max_new[index]:
            options += [(s / (step + 1), step, e, FinishReason.LENGTH) for s, e in zip(scores, entries)]
        options.sort(key=lambda o: -o[0])  # stable: among equal scores the first found wins, as max() did
        wanted = self.requests[index].num_return_sequences
        # Sequences a rule or suppression made impossible (score -inf) are no candidates.
        chosen = options[:1] + [o for o in options[1:] if np.isfinite(o[0])][: wanted - 1]
        found = [
            self._hypotheses(np.array([index]), np.array([entry]), [reason], at, [score])[0]
            for score, at, entry, reason in chosen
        ]
        alternatives = tuple(dataclasses.replace(h, attention=None) for h in found[1:])
        return dataclasses.replace(found[0], alternatives=alternatives)


def decode(batch: Batch, strategy: DecodeStrategy) -> Iterator[StepEvents]:
    """The decode loop: step the batch, let the strategy pick tokens and rows, until no row is left.

    Yields:
        One StepEvents per step; finished requests appear in the step they finish.
    """
    selection = strategy.start()
    batch.select(selection.rows)
    while len(batch):
        out = batch.step(selection.tokens)
        selection, events = strategy.advance(out.logits, out.attention)
        batch.select(selection.rows)
        yield events


def make_strategy(
    requests: Sequence[PreparedRequest], eos: int, length_budget: np.ndarray | None = None
) -> DecodeStrategy:
    """The strategy for requests that share one beam size (sampling and greedy rows share one batch).

    `length_budget` (N,): most new tokens per request from the encoder's length hint (Batch.length_budget).

    Raises:
        ValueError: the requests have different beam sizes (the caller batches them apart).
    """
    from attnserve.server.sampling import SampledSearch  # it builds on GreedySearch, defined here

    sizes = {r.beam_size for r in requests}
    if len(sizes) != 1:
        raise ValueError(f"one batch needs one beam size, got {sorted(sizes)}")
    size = sizes.pop()
    if size > 1:
        from attnserve.server.constrained_search import ConstrainedBeamSearch  # it builds on BeamSearch

        constrained = any(r.constraints for r in requests)
        return (ConstrainedBeamSearch if constrained else BeamSearch)(requests, eos, length_budget)
    if any(r.sampling is not None for r in requests):
        return SampledSearch(requests, eos, length_budget)
    return GreedySearch(requests, eos, length_budget)
