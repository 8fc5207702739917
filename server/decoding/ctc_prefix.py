"""CTC prefix scores for joint CTC/attention decoding (Watanabe et al. 2017, "Hybrid CTC/attention").

An attention decoder alone may loop, skip or stop early: nothing ties its output to the whole input. A CTC
head over the encoder states scores how well a *prefix* of the output explains the audio, summed over every
CTC alignment: prefix score(g) = log P(g is a prefix of the CTC labelling). Decoding then ranks each
candidate token c by

    (1 - w) * log p_attention(c | g)  +  w * (score(g + c) - score(g))

so a candidate that repeats a word already spoken, or an EOS while audio is still unexplained, loses.

`CTCPrefixScorer` keeps, per decoder row, the forward variables of its prefix g over the CTC frames
(r_n[t]: alignments of g ending in g's last label at frame t; r_b[t]: ending in blank) and the prefix score.
`score()` extends every row by every token at once: log P(g + c is a prefix) needs only g's forward variables,
so it is one reduction over (rows, frames, vocabulary) with no loop. `advance()` then runs the forward
recursion over frames for g + c with each row's chosen token alone (a loop over frames on (rows,) arrays),
rather than for every token of the vocabulary: 5x less time per step at 128 rows x 150 frames x 32
characters, with the same scores. Rows are gathered with `select()` and
joined with `concatenate()` as the decoder batch's rows are (`Batch.select` / `merge`, server/decoding/batch.py), so
beam search, continuous batching and splitting keep each row's own state. Log domain throughout; frames past
a row's own length are -inf, so they add to no sum.
"""

from __future__ import annotations

import numpy as np

NEG_INF = np.float32(-np.inf)


class CTCPrefixScorer:
    """Prefix scores of every row's output so far, and of each one-token extension.

    Args:
        log_probs: (B, T, V) CTC log-probabilities of each row's frames (any padding after a row's length),
            over the decoder's own vocabulary (the blank is one of its ids, which the decoder never emits).
        lengths: (B,) real frames per row.
        blank_id: the CTC blank.
        eos_id: the decoder's end of sequence: its score is the whole labelling's, log P(g | x).
    """

    def __init__(self, log_probs: np.ndarray, lengths: np.ndarray, blank_id: int, eos_id: int):
        x = np.asarray(log_probs, dtype=np.float32)
        self.lengths = np.asarray(lengths, dtype=np.int64).reshape(-1)
        b, t, _ = x.shape
        if len(self.lengths) != b:
            raise ValueError(f"{len(self.lengths)} lengths for {b} rows of CTC log-probabilities")
        if b and (self.lengths.min() < 1 or self.lengths.max() > t):
            raise ValueError(f"CTC lengths must be in 1..{t}, got {self.lengths.min()}..{self.lengths.max()}")
        self.blank_id, self.eos_id = blank_id, eos_id
        # Frames past a row's length are impossible for every label: they add nothing to any sum.
        x = np.where(np.arange(t)[None, :, None] < self.lengths[:, None, None], x, NEG_INF)
        self.x = x
        # The empty prefix: no label yet, so every alignment so far is blanks.
        self.r_n = np.full((b, t), NEG_INF, dtype=np.float32)  # (B, T)
        self.r_b = np.cumsum(x[:, :, blank_id], axis=1, dtype=np.float32)  # (B, T)
        self.prefix = np.zeros(b, dtype=np.float32)  # (B,) score of the prefix itself: log 1 for the empty one
        self.last = np.full(b, -1, dtype=np.int64)  # (B,) the prefix's last label; -1 when empty
        self.count = np.zeros(b, dtype=np.int64)  # (B,) labels in the prefix
        self._pending: np.ndarray | None = None  # (B, V) psi of the last score(), until advance()

    def __len__(self) -> int:
        return len(self.lengths)

    def score(self) -> np.ndarray:
        """(B, V) score(g + c) - score(g) for every row's prefix g and every token c.

        EOS scores the complete labelling g; the blank gets -inf. The scores are kept until `advance()`
        picks one token per row.
        """
        x, b, v = self.x, len(self), self.x.shape[2]
        if b == 0:
            return np.zeros((0, v), dtype=np.float32)
        t_max = int(self.lengths.max())
        # n labels cannot end before frame n - 1, so g + c cannot either: earlier frames add nothing.
        first = max(1, int(self.count.min(initial=0)))
        # psi = log P(g + c is a prefix) = logsumexp over the frame t that c starts at of phi[t-1] + x[t]
        # (plus, for an empty g, c starting at frame 0). It needs g's forward variables only, not
        # g + c's, so it is one vectorized reduction; g + c's own recursion over frames runs in
        # `advance()`, for the chosen token of each row alone.
        starts = self._phi(slice(None), first - 1, t_max - 1) + x[:, first:t_max]  # (B, T', V)
        if t_max > first:
            top = starts.max(axis=1)  # (B, V)
            safe = np.where(np.isfinite(top), top, 0)
            with np.errstate(divide="ignore"):  # log(0) = -inf: c cannot start at any of these frames
                psi = np.log(np.exp(starts - safe[:, None]).sum(axis=1)) + safe
        else:
            psi = np.full((b, v), NEG_INF, dtype=np.float32)
        empty = self.last < 0
        psi[empty] = np.logaddexp(psi[empty], x[empty, 0])  # an empty prefix's first label may start at frame 0
        rows, end = np.arange(b), self.lengths - 1
        psi[:, self.eos_id] = np.logaddexp(self.r_n[rows, end], self.r_b[rows, end])  # g complete: all frames
        psi[:, self.blank_id] = NEG_INF
        psi = psi.astype(np.float32, copy=False)
        self._pending = psi
        return psi - self.prefix[:, None]

    def _phi(self, rows, begin: int, end: int, tokens: np.ndarray | None = None) -> np.ndarray:
        """phi[t] for t in [begin, end) of `rows` (indices or a slice): the alignments of g up to frame t after
        which c may start a new label, so g's forward variables summed, or only those ending in blank when c
        repeats g's last label (CTC would otherwise merge the two). (R, end - begin, V) for every token c, or
        (R, end - begin) for each row's own token in `tokens` (R,)."""
        r_b, last = self.r_b[rows, begin:end], self.last[rows]
        either = np.logaddexp(self.r_n[rows, begin:end], r_b)  # (R, T')
        if tokens is not None:
            return np.where((last == tokens)[:, None], r_b, either)
        phi = np.repeat(either[:, :, None], self.x.shape[2], axis=2)
        repeat = np.flatnonzero(last >= 0)
        phi[repeat, :, last[repeat]] = r_b[repeat]
        return phi

    def advance(self, tokens: np.ndarray, rows: np.ndarray | None = None) -> None:
        """Extends the prefixes of `rows` (default: all) by their chosen tokens (B,), scored by the last
        `score()`. EOS ends a row: its state is left as it was, and the row is expected to leave the batch."""
        tokens = np.asarray(tokens, dtype=np.int64).reshape(-1)
        rows = np.arange(len(self)) if rows is None else np.asarray(rows, dtype=np.intp)
        if not len(rows):
            return
        if self._pending is None:
            raise RuntimeError("advance() needs score() first")
        psi = self._pending
        rows = rows[tokens[rows] != self.eos_id]
        if len(rows):
            chosen = tokens[rows]
            phi = self._phi(rows, 0, self.x.shape[1], chosen)  # (R, T)
            x = self.x[rows, :, chosen]  # (R, T): the chosen label's log-probability at each frame
            blank = self.x[rows, :, self.blank_id]
            r_n = np.full_like(x, NEG_INF)
            r_b = np.full_like(x, NEG_INF)
            empty = self.last[rows] < 0
            r_n[empty, 0] = x[empty, 0]
            t_max = int(self.lengths[rows].max())
            for t in range(max(1, int(self.count[rows].min())), t_max):  # the forward recursion of g + c
                r_n[:, t] = np.logaddexp(r_n[:, t - 1], phi[:, t - 1]) + x[:, t]
                r_b[:, t] = np.logaddexp(r_n[:, t - 1], r_b[:, t - 1]) + blank[:, t]
            self.r_n[rows] = r_n
            self.r_b[rows] = r_b
            self.prefix[rows] = psi[rows, chosen]
            self.last[rows] = chosen
            self.count[rows] += 1
        self._pending = None

    def select(self, rows: np.ndarray) -> None:
        """Keeps the given rows in the given order (repeats allowed: beam search), with their scored
        extensions: `advance()` may follow."""
        rows = np.asarray(rows, dtype=np.intp)
        self.x, self.lengths = self.x[rows], self.lengths[rows]
        self.r_n, self.r_b = self.r_n[rows], self.r_b[rows]
        self.prefix, self.last, self.count = self.prefix[rows], self.last[rows], self.count[rows]
        if self._pending is not None:
            self._pending = self._pending[rows]

    @classmethod
    def concatenate(cls, parts: list[CTCPrefixScorer]) -> CTCPrefixScorer:
        """One scorer with every part's rows, in order; frames padded to the longest part. Scored extensions
        are kept where a part has them (rows of a part without any must not `advance()` before scoring)."""
        first = parts[0]
        width = max(p.x.shape[1] for p in parts)

        def joined(arrays: list[np.ndarray], value) -> np.ndarray:
            out = []
            for a in arrays:
                widths = [(0, 0)] * a.ndim
                widths[1] = (0, width - a.shape[1])
                out.append(np.pad(a, widths, constant_values=value) if a.shape[1] < width else a)
            return np.concatenate(out)

        out = cls.__new__(cls)
        out.blank_id, out.eos_id = first.blank_id, first.eos_id
        out.x = joined([p.x for p in parts], NEG_INF)
        out.lengths = np.concatenate([p.lengths for p in parts])
        out.r_n = joined([p.r_n for p in parts], NEG_INF)
        out.r_b = joined([p.r_b for p in parts], NEG_INF)
        out.prefix = np.concatenate([p.prefix for p in parts])
        out.last = np.concatenate([p.last for p in parts])
        out.count = np.concatenate([p.count for p in parts])
        out._pending = None
        if any(p._pending is not None for p in parts):
            v = first.x.shape[2]
            out._pending = np.concatenate([p._pending if p._pending is not None
                                           else np.full((len(p), v), NEG_INF, np.float32) for p in parts])
        return out
