"""Word timestamps of a transcript, read from the speller's attention over time.

A speech model writes one character per step and attends to a few encoder columns while it does, each
column a fixed span of audio. Per-step argmax columns jitter (a character may glance back at the previous
word), so the columns are read along the single **monotonic path** through the (characters x columns)
attention matrix that maximises the summed log attention: character k sits at column p_k with
p_0 <= p_1 <= ... (dynamic programming, O(characters x columns)). A word spans from the start of its first
character's column to the end of its last character's column; the space that opens a word is not part of
it (it is written while the model looks at the gap between words).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from attnserve.api.generation import WordTiming
from attnserve.server.model.tokenization import METASPACE, Words

# Attention weights are floored here before the log, so a path may cross a zero-weight cell if it must.
_FLOOR = 1e-12


def monotonic_path(attention: np.ndarray) -> np.ndarray:
    """The non-decreasing column of each row that maximises the summed log attention.

    Args:
        attention: (R, C) weights, R >= 1 output rows over C >= 1 columns.

    Returns:
        (R,) int column per row, each >= the previous row's.
    """
    scores = np.log(np.maximum(attention, _FLOOR))
    rows, cols = scores.shape
    best = scores[0].copy()  # best[c]: best total of a path whose current row sits at column c
    came_from = np.zeros((rows, cols), dtype=np.intp)  # came_from[r, c]: row r-1's column on that path
    columns = np.arange(cols)
    for r in range(1, rows):
        running = np.maximum.accumulate(best)  # best total of any path at a column <= c
        came_from[r] = np.maximum.accumulate(np.where(best == running, columns, 0))  # where that best sits
        best = running + scores[r]
    path = np.empty(rows, dtype=np.intp)
    path[-1] = int(np.argmax(best))
    for r in range(rows - 1, 0, -1):
        path[r - 1] = came_from[r, path[r]]
    return path


def word_timings(
    attention: np.ndarray, pieces: Sequence[str], words: Words, column_starts: np.ndarray, column_ends: np.ndarray,
    confidences: Sequence[float] | None = None,
) -> list[WordTiming]:
    """Each word's text and time span.

    Args:
        attention: (R, C) attention of the R output pieces (characters) over the C columns of one clip.
        pieces: the R output pieces; words: their grouping into words (tokenization.Tokenizer.words).
        column_starts, column_ends: (C,) seconds each column covers.
        confidences: one per word of `words` (server/decoding/word_confidence.py), or None.

    Returns:
        One timing per word that holds anything but spaces, in order; start < end, both within the clip.
    """
    if len(pieces) == 0 or attention.shape[1] == 0:
        return []
    path = monotonic_path(attention)
    ends = [*words.starts[1:], len(pieces)]
    timings = []
    for w, (label, first, last) in enumerate(zip(words.labels, words.starts, ends)):
        rows = [r for r in range(first, last) if pieces[r].strip(METASPACE)]  # the word's characters
        if rows:
            start, end = float(column_starts[path[rows[0]]]), float(column_ends[path[rows[-1]]])
            timings.append(WordTiming(label, start, end, None if confidences is None else confidences[w]))
    return timings
