"""CTC prefix scores for joint CTC/attention decoding (Watanabe et al. 2017, "Hybrid CTC/attention").

An attention decoder alone may loop, skip or stop early: nothing ties its output to the whole input. A CTC
head over the encoder states scores how well a *prefix* of the output explains the audio, summed over every
CTC alignment: prefix score(g) = log P(g is a prefix of the CTC labelling). Decoding then ranks each
candidate token c by

    (1 - w) * log p_attention(c | g)  +  w * (score(g + c) - score(g))

so a candidate that repeats a word already spoken, or an EOS while audio is still unexplained, loses.

`CTCPrefixScorer` keeps, per decoder row, the forward variables of its prefix g over the CTC frames
(r_n[t]: alignments of g ending in g's last label at frame t; r_b[t]: ending in blank) and the prefix score.
`score()` extends every row by every token at once, vectorized over (rows, vocabulary), one loop over frames;
`advance()` keeps the chosen token's column as the row's new state. Rows are gathered with `select()` and
joined with `concatenate()` as the decoder batch's rows are (`Batch.select` / `merge`, server/decoding.py), so
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
        self._pending: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None

    def __len__(self) -> int:
        return len(self.lengths)

    def score(self) -> np.ndarray:
        """(B, V) score(g + c) - score(g) for every row's prefix g and every token c.

        EOS scores the complete labelling g; the blank gets -inf. The
        new forward variables are kept until `advance()` picks one token per row.
        """
        x, b = self.x, len(self)
        if b == 0:
            return np.zeros((0, x.shape[2]), dtype=np.float32)
        t_max = int(self.lengths.max())
        rows = np.arange(b)
        # phi[t]: alignments of g by frame t after which c may start a new label (after blank only if c
        # repeats g's last label, which CTC would otherwise merge).
        either = np.logaddexp(self.r_n, self.r_b)  # (B, T)
        phi = np.repeat(either[:, :, None], x.shape[2], axis=2)  # (B, T, V)
        repeat = self.last >= 0
        phi[rows[repeat], :, self.last[repeat]] = self.r_b[repeat]
        r_n = np.full((b, t_max, x.shape[2]), NEG_INF, dtype=np.float32)
        r_b = np.full_like(r_n, NEG_INF)
        empty = self.last < 0
        r_n[empty, 0] = x[empty, 0]  # an empty prefix's first label may start at frame 0
        psi = r_n[:, 0].copy()  # (B, V) log P(g + c is a prefix), summed over the frame c starts at
        blank = x[:, :, self.blank_id]  # (B, T)
        # n labels cannot end before frame n - 1, so g + c cannot either: earlier frames stay -inf.
        for t in range(max(1, int(self.count.min(initial=0))), t_max):
            r_n[:, t] = np.logaddexp(r_n[:, t - 1], phi[:, t - 1]) + x[:, t]
            r_b[:, t] = np.logaddexp(r_n[:, t - 1], r_b[:, t - 1]) + blank[:, t, None]
            psi = np.logaddexp(psi, phi[:, t - 1] + x[:, t])  # x is -inf past the row's length
        end = self.lengths - 1
        psi[:, self.eos_id] = either[rows, end]  # g complete: every alignment of g over all frames
        psi[:, self.blank_id] = NEG_INF
        self._pending = (r_n, r_b, psi)
        return psi - self.prefix[:, None]

    def advance(self, tokens: np.ndarray, rows: np.ndarray | None = None) -> None:
        """Extends the prefixes of `rows` (default: all) by their chosen tokens (B,), scored by the last
        `score()`. EOS ends a row: its state is left as it was, and the row is expected to leave the batch."""
        tokens = np.asarray(tokens, dtype=np.int64).reshape(-1)
        rows = np.arange(len(self)) if rows is None else np.asarray(rows, dtype=np.intp)
        if not len(rows):
            return
        if self._pending is None:
            raise RuntimeError("advance() needs score() first")
        r_n, r_b, psi = self._pending
        rows = rows[tokens[rows] != self.eos_id]
        chosen = tokens[rows]
        self.r_n[rows] = NEG_INF  # frames past the scored ones (no row reaches them) stay impossible
        self.r_b[rows] = NEG_INF
        self.r_n[rows, : r_n.shape[1]] = r_n[rows, :, chosen]
        self.r_b[rows, : r_b.shape[1]] = r_b[rows, :, chosen]
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
            self._pending = tuple(a[rows] for a in self._pending)

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
            pending = [p._pending or (np.full((len(p), 1, v), NEG_INF, np.float32),) * 2
                       + (np.full((len(p), v), NEG_INF, np.float32),) for p in parts]
            out._pending = (joined([q[0] for q in pending], NEG_INF), joined([q[1] for q in pending], NEG_INF),
                            np.concatenate([q[2] for q in pending]))
        return out
