"""Word timestamps from alignment heads by dynamic time warping (Whisper's; numpy only).

Whisper's checkpoints name the cross-attention heads whose attention follows the audio
(generation_config `alignment_heads`). A transcript's tokens are timed as openai/whisper's timing.py and
transformers' `return_token_timestamps` time them:

  1. the rows are each text token's attention *as the decoder's input* (the step that wrote the next
     token, EOS included), over the frames of the real audio (the 30 s window's padding cut off);
  2. per head, each frame's column is standardised over the tokens, then median-filtered along the frames
     (`median_filter_width`, reflected at the ends); the heads are averaged;
  3. the path of least cost through -matrix from (first token, first frame) to (last token, last frame),
     moving diagonally, down or right (DTW); a token starts at the frame where the path first reaches it.

A word starts where its first token starts and ends where the next word's first token starts; the last
word ends at the end of the path's last frame.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from attnserve.api.generation import WordTiming
from attnserve.server.model.tokenization import Words


def median_filter(x: np.ndarray, width: int) -> np.ndarray:
    """Median of each window of `width` (odd) along the last axis, the ends reflected; unchanged when the
    axis is no longer than width // 2 (as transformers' _median_filter)."""
    pad = width // 2
    if x.shape[-1] <= pad:
        return x
    padded = np.pad(x, [(0, 0)] * (x.ndim - 1) + [(pad, pad)], mode="reflect")
    windows = np.lib.stride_tricks.sliding_window_view(padded, width, axis=-1)  # (..., F, width)
    return np.sort(windows, axis=-1)[..., pad]


def dtw(matrix: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The least-cost monotonic path through `matrix` (R, C); returns its (text, time) indices.

    Costs accumulate in float32 and ties prefer the move to the left, then down, as transformers'
    `_dynamic_time_warping` (the same path, not merely an equally good one); cells are filled one
    anti-diagonal at a time.
    """
    rows, cols = matrix.shape
    cost = np.full((rows + 1, cols + 1), np.inf, dtype=np.float32)
    trace = np.full((rows + 1, cols + 1), -1, dtype=np.int8)
    cost[0, 0] = 0
    for d in range(2, rows + cols + 1):
        i = np.arange(max(1, d - cols), min(rows, d - 1) + 1)
        j = d - i
        c0, c1, c2 = cost[i - 1, j - 1], cost[i - 1, j], cost[i, j - 1]
        move = np.where((c0 < c1) & (c0 < c2), 0, np.where((c1 < c0) & (c1 < c2), 1, 2))
        best = np.choose(move, [c0, c1, c2])
        cost[i, j] = matrix[i - 1, j - 1] + best.astype(np.float64)
        trace[i, j] = move
    trace[0, :], trace[:, 0] = 2, 1
    i, j, text, time = rows, cols, [], []
    while i > 0 or j > 0:
        text.append(i - 1)
        time.append(j - 1)
        move = trace[i, j]
        i, j = (i - 1, j - 1) if move == 0 else (i - 1, j) if move == 1 else (i, j - 1)
    return np.array(text[::-1]), np.array(time[::-1])


def token_starts(weights: np.ndarray, median_width: int, seconds_per_column: float) -> tuple[np.ndarray, float]:
    """Each row's start time and the end of the path's last frame.

    Args:
        weights: (R, K, C) attention of R text tokens (as decoder inputs) in K alignment heads over C frames.

    Returns:
        (R,) seconds, and the end in seconds of the last row.
    """
    std = weights.std(axis=0, keepdims=True)
    std[std == 0] = 1.0  # one token, or a frame every token weighs alike: nothing to standardise (not NaN)
    matrix = (weights - weights.mean(axis=0, keepdims=True)) / std  # (R, K, C)
    matrix = median_filter(matrix.transpose(1, 0, 2), median_width).mean(axis=0)  # (R, C)
    text, time = dtw(-matrix.astype(np.float64))
    jumps = np.diff(text, prepend=-1).astype(bool)
    return time[jumps] * seconds_per_column, (time[-1] + 1) * seconds_per_column


def word_timings(weights: np.ndarray, words: Words, special: Sequence[bool], median_width: int,
                 seconds_per_column: float, confidences: Sequence[float] | None = None) -> list[WordTiming]:
    """Each word's span from the DTW token times.

    Args:
        weights: (R, K, C) see token_starts; row r is output token r of `words`' grouping.
        words: the tokens grouped into words; special: (R,) which tokens are special (never timed words).
        confidences: one per word of `words` (server/decoding/word_confidence.py), or None.
    """
    if not len(weights) or weights.shape[-1] == 0:
        return []
    starts, end = token_starts(weights, median_width, seconds_per_column)
    bounds = [*words.starts, len(weights)]
    out = []
    for w, label in enumerate(words.labels):
        first, after = bounds[w], bounds[w + 1]
        if all(special[first:after]):
            continue
        stop = float(starts[after]) if after < len(starts) else end
        out.append(WordTiming(label, float(starts[first]), max(stop, float(starts[first]) + seconds_per_column),
                              None if confidences is None else confidences[w]))
    return out


def alignment_rows(attention: np.ndarray, eos_attention: np.ndarray | None, heads: Sequence[tuple[int, int]],
                   prompt: int) -> np.ndarray:
    """The DTW rows of a hypothesis: text token k's attention as input, in the alignment heads.

    Args:
        attention: (n, L, H, S) the attention of the steps that wrote each of the n output tokens.
        eos_attention: (L, H, S) of the step that wrote EOS, or None (the output ran to its limit).
        heads: (layer, head) pairs.
        prompt: forced prompt tokens the output starts with (not timed).

    Returns:
        (R, K, S): row r belongs to output token prompt + r; the last token has a row only when EOS followed.
    """
    steps = attention[prompt + 1 :]
    if eos_attention is not None:
        steps = np.concatenate([steps, eos_attention[None]], axis=0)
    layers, chosen = zip(*heads) if heads else ((), ())
    return steps[:, list(layers), list(chosen)]  # (R, K, S)
