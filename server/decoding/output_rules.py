"""Rules a request sets on its output, applied to each step's logits before a strategy chooses (numpy only).

- **Minimum length** (`min_new_tokens`): end-of-sequence gets -inf until the row has generated that many
  tokens.
- **Forced start** (server/decoding/prompt.py: NLLB's forced first token, Whisper's decoder prompt): at
  each of the first steps every token but the forced one gets -inf, as transformers' `forced_bos_token_id`
  does (its log-probability is then 0); a position to detect keeps only the best of its language tokens;
  at the first step after the forced ones, the begin-suppressed tokens get -inf.
- **Repetition guard** (`no_repeat_ngram_size` n): a token that would complete an n-gram the row has
  already generated gets -inf (n = 1 forbids every token already used).
- **Hotwords** (`hotwords`, server/decoding/hotwords.py): a token that continues one of the request's
  words gains boost x the letters of it that it leaves written; the break after a whole one, its length.

A forbidden token gets -inf in place, so the log-probabilities a strategy reports are those of the
distribution that remains (as for the manifest's suppressed tokens). If the rules would leave a row no
token at all, that row's step is left as the model gave it. Requests without rules cost nothing: no
per-row tokens are kept unless some request of the batch has a repetition guard or hotwords.
"""

from __future__ import annotations

from collections.abc import Sequence
import numpy as np

from attnserve.server.decoding.prepared import PreparedRequest
from attnserve.server.decoding.prompt import DETECT, ForcedStart


class OutputRules:
    """The output rules of the requests of one batch.

    Args:
        requests: the batch's requests (index = request index of the strategy).
        eos: the end-of-sequence id.
    """

    def __init__(self, requests: Sequence[PreparedRequest], eos: int):
        self.eos = eos
        self._min_new = np.array([r.min_new_tokens for r in requests], dtype=np.int64)  # (N,)
        self._ngram = np.array([r.no_repeat_ngram_size for r in requests], dtype=np.int64)  # (N,)
        self._hotwords = [r.hotwords for r in requests]  # per request: a HotwordBias or None
        self._has_hotwords = np.array([h is not None for h in self._hotwords], dtype=bool)  # (N,)
        self._tracks_tokens = bool((self._ngram > 0).any() or self._has_hotwords.any())
        starts = [r.forced_start or ForcedStart() for r in requests]
        self._forced = [np.array(f.tokens, dtype=np.int64) for f in starts]  # per request, DETECT = choose
        self._detect_from = [np.array(f.detect_from, dtype=np.int64) for f in starts]
        self._begin_suppress = [np.array(f.begin_suppress, dtype=np.int64) for f in starts]
        self._forced_length = np.array([len(f.tokens) for f in starts], dtype=np.int64)  # (N,)
        self._any_start = any(len(f.tokens) or len(f.begin_suppress) for f in starts)
        self._row_tokens = np.zeros((0, 0), dtype=np.int64)  # (B, t) tokens each row generated so far

    def start(self, rows: int) -> None:
        """Begins with `rows` batch rows that have generated nothing yet."""
        self._row_tokens = np.zeros((rows, 0), dtype=np.int64)

    def apply(self, logits: np.ndarray, row_request: np.ndarray, step: int) -> None:
        """Sets the logits of forbidden tokens to -inf, in place.

        Args:
            logits: (B, V) this step's logits.
            row_request: (B,) the request of each row.
            step: tokens every row has generated so far (rows of one batch advance together).
        """
        if self._any_start and step <= self._forced_length.max():
            self._force_start(logits, row_request, step)
        if self._tracks_tokens:
            for row in np.flatnonzero(self._has_hotwords[row_request]):
                logits[row] += self._hotwords[row_request[row]].deltas(self._row_tokens[row])
        short = np.flatnonzero(step < self._min_new[row_request])
        guarded = np.flatnonzero(self._ngram[row_request] > 0) if self._tracks_tokens else short[:0]
        if not len(short) and not len(guarded):
            return
        touched = np.union1d(short, guarded)
        before = logits[touched].copy()  # (T, V)
        logits[short, self.eos] = -np.inf
        for row in guarded:
            banned = repeated_ngram_completions(self._row_tokens[row], int(self._ngram[row_request[row]]))
            logits[row, banned] = -np.inf
        empty = touched[~np.isfinite(logits[touched]).any(axis=1)]
        if len(empty):
            logits[empty] = before[np.searchsorted(touched, empty)]

    def _force_start(self, logits: np.ndarray, row_request: np.ndarray, step: int) -> None:
        """Forces step `step` of the rows whose requests force it; begin-suppresses the step after."""
        for row in np.flatnonzero(step <= self._forced_length[row_request]):
            index = row_request[row]
            if step == self._forced_length[index]:
                logits[row, self._begin_suppress[index]] = -np.inf
                continue
            token = self._forced[index][step]
            if token == DETECT:
                candidates = self._detect_from[index]
                token = candidates[np.argmax(logits[row, candidates])]
            kept = logits[row, token]
            logits[row] = -np.inf
            logits[row, token] = kept

    def extend(self, rows: np.ndarray, tokens: np.ndarray) -> None:
        """Follows the strategy's selection: keeps `rows` (in order, repeats allowed) and appends `tokens`."""
        if self._tracks_tokens:
            self._row_tokens = np.concatenate([self._row_tokens[rows], tokens[:, None]], axis=1)


def repeated_ngram_completions(tokens: np.ndarray, n: int) -> np.ndarray:
    """The tokens that would complete an n-gram already present in `tokens`.

    Args:
        tokens: (t,) the tokens generated so far.
        n: n-gram size, >= 1.

    Returns:
        (K,) token ids, possibly repeated.
    """
    t = len(tokens)
    if n == 1 or t < n:
        return tokens if n == 1 else tokens[:0]
    prefix = tokens[t - n + 1 :]  # the last n-1 tokens: the start of the n-gram the next token completes
    windows = np.lib.stride_tricks.sliding_window_view(tokens, n)  # (t-n+1, n)
    match = (windows[:, :-1] == prefix).all(axis=1)
    return windows[match, -1]
