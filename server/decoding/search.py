"""Search strategies: how each step's logits become the next tokens, and which rows continue.

A `DecodeStrategy` (greedy search, beam search, and sampling in server/decoding/sampling.py) turns each step's
logits into the next tokens and tells the batch which rows to keep: finished rows are dropped, beams are
reordered. Before it chooses, the requests' output rules (minimum length, repetition guard:
server/decoding/output_rules.py) take the tokens they forbid out of the logits; log-probabilities are those of the
distribution that remains. A `History` of back-pointers rebuilds each sequence once, when it finishes.
Strategies never see the model: only logits, attention and their own requests.
"""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Sequence

import numpy as np

from attnserve.api.generation import FinishReason
from attnserve.server.decoding.log_softmax import log_softmax
from attnserve.server.decoding.output_rules import OutputRules
from attnserve.server.decoding.prepared import PreparedRequest


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
    # (L, H, S) the attention of the step that wrote EOS (the last text token's own attention as input,
    # which word timing by DTW reads); None when the sequence did not end with EOS or kept no attention.
    eos_attention: np.ndarray | None = None


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
        # Forced prompt tokens (Whisper's) count in no length normalisation, as generate's decoder_input_ids.
        self._prompt = np.array([r.forced_start.prompt_length if r.forced_start else 0 for r in self.requests],
                                dtype=np.int64)  # (N,)
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
            weights = eos_weights = None
            if attention is not None and self._wants_attention[index]:
                weights = attention[j, :n, ..., : self._source_lengths[index]]
                eos_weights = attention[j, n, ..., : self._source_lengths[index]] if n < tokens.shape[1] else None
            score = float(logprobs[j].sum(dtype=np.float64) / tokens.shape[1]) if scores is None else scores[j]
            out.append(Hypothesis(int(index), tokens[j, :n], logprobs[j, :n], reason, weights, float(score),
                                  eos_attention=eos_weights))
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
    beam, normalised the same way, cannot beat the worst of them (the usual heuristic; with the request's
    early_stopping, as soon as it has them: transformers' early_stopping=True), or at max_new_tokens, where
    running beams compete too. Beams finish only as a whole request, so beam requests stream nothing while
    decoding: their tokens and attention come with their hypothesis.
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
        self._early = np.array([r.early_stopping for r in self.requests], dtype=bool)  # (N,)
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
            found.append((scores[i, j] / self._length(self._alive[i], step), step, i * 2 * self.k + j))
            found.sort(key=lambda f: -f[0])
            del found[self.k :]
            self._n_finished[self._alive[i]] = len(found)
            self._worst[self._alive[i]] = found[-1][0]

    def _done(self, scores: np.ndarray, step: int) -> np.ndarray:
        """(R,) requests that stop now: at their length limit, or unable to improve on k finished ones."""
        at_limit = step + 1 >= self._max_new[self._alive]
        full = self._n_finished[self._alive] >= self.k
        beaten = self._early[self._alive] | (scores[:, 0] / self._length(self._alive, step) <= self._worst[self._alive])
        return at_limit | (full & beaten)

    def _length(self, index, step: int):
        """The length a sequence of request(s) `index` ending at `step` is normalised by: its tokens after
        the prompt, EOS included (at least 1)."""
        return np.maximum(step + 1 - self._prompt[index], 1)

    def _best(self, i: int, entries: np.ndarray, scores: np.ndarray, step: int) -> Hypothesis:
        """The best finished sequence of alive request i, with the next best as its alternatives when the
        request asked for more than one; its running beams compete at the length limit."""
        index = int(self._alive[i])
        options = [(s, st, e, FinishReason.EOS) for s, st, e in self._finished[index]]
        if step + 1 >= self._max_new[index]:
            options += [(s / self._length(index, step), step, e, FinishReason.LENGTH) for s, e in zip(scores, entries)]
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
