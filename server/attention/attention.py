"""Turns the cross-attention collected while decoding into the one matrix a client sees.

One layer is read and its heads (all, or those the request names) are combined: their mean by default, or
their element-wise maximum (what any one head looked at; rows then no longer sum to 1). At word granularity
the columns of a source word's pieces are summed (the word gets the attention all its pieces got, so each
row still sums to 1) and the rows of an output word's pieces are averaged (a word's row is the mean
distribution of its pieces, also summing to 1).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from attnserve.api.generation import AttentionMatrix, AttentionReduction
from attnserve.server.model.tokenization import Words


def combine_heads(
    weights: np.ndarray, layer: int, heads: Sequence[int] = (), reduction: AttentionReduction = AttentionReduction.MEAN
) -> np.ndarray:
    """Reads one decoder layer and combines its heads.

    Args:
        weights: (steps, layers, heads, S) attention of each output token on the source.
        layer: layer index; negative counts from the last.
        heads: head indices to combine (the engine checked them); empty = every head.
        reduction: their mean or their element-wise maximum.

    Returns:
        (steps, S) float32.

    Raises:
        ValueError: the layer does not exist.
    """
    layers = weights.shape[1]
    if not -layers <= layer < layers:
        raise ValueError(f"attention layer {layer} is out of range for a model with {layers} layers")
    chosen = weights[:, layer] if not heads else weights[:, layer][:, list(heads)]  # (steps, H', S)
    if reduction is AttentionReduction.MAX:
        return chosen.max(axis=1).astype(np.float32, copy=False)
    return chosen.mean(axis=1, dtype=np.float32)  # (steps, S)


def describe_heads(total: int, heads: Sequence[int], reduction: AttentionReduction) -> str:
    """E.g. "mean over 4 heads", "max over heads 0, 2"."""
    which = f"{total} heads" if not heads else f"head{'s' if len(heads) > 1 else ''} {', '.join(map(str, heads))}"
    return f"{reduction.value} over {which}"


def merge_words(matrix: np.ndarray, row_starts: Sequence[int], col_starts: Sequence[int]) -> np.ndarray:
    """Merges pieces into words: columns summed within a word, rows averaged within a word.

    Args:
        matrix: (R, C) piece-level attention.
        row_starts: first row of each output word (ascending, starting at 0).
        col_starts: first column of each source word (ascending, starting at 0).

    Returns:
        (len(row_starts), len(col_starts)).
    """
    rows, cols = matrix.shape
    if rows == 0 or cols == 0:
        return np.zeros((len(row_starts), len(col_starts)), dtype=matrix.dtype)
    merged = np.add.reduceat(matrix, np.asarray(col_starts), axis=1)  # (R, C')
    row_sizes = np.diff(np.append(np.asarray(row_starts), rows))  # (R',)
    return np.add.reduceat(merged, np.asarray(row_starts), axis=0) / row_sizes[:, None]


def attention_matrix(
    weights: np.ndarray,
    layer: int,
    row_pieces: Sequence[str],
    col_pieces: Sequence[str],
    row_words: Words | None = None,
    col_words: Words | None = None,
    heads: Sequence[int] = (),
    reduction: AttentionReduction = AttentionReduction.MEAN,
) -> AttentionMatrix:
    """Builds the matrix returned to clients.

    Args:
        weights: (steps, layers, heads, S) attention; one step per output piece, S source pieces.
        layer: decoder layer to read; negative counts from the last.
        row_pieces: the output pieces (steps of them); col_pieces: the source pieces (S of them).
        row_words, col_words: give both to merge pieces into words; neither for piece granularity.
        heads, reduction: which heads of the layer to combine (empty = all), and how.

    Returns:
        The matrix with labels, the non-negative layer index and a description of the reduction.
    """
    steps, layers, head_count, sources = weights.shape
    if steps != len(row_pieces) or sources != len(col_pieces):
        raise RuntimeError(f"attention {weights.shape} does not match {len(row_pieces)} x {len(col_pieces)} pieces")
    layer = layer % layers if -layers <= layer < layers else layer
    matrix = combine_heads(weights, layer, heads, reduction)  # (steps, S)
    rows, cols, unit = list(row_pieces), list(col_pieces), "pieces"
    if row_words is not None and col_words is not None:
        matrix = merge_words(matrix, row_words.starts, col_words.starts)
        rows, cols, unit = list(row_words.labels), list(col_words.labels), "words"
    return AttentionMatrix(
        weights=matrix.astype(np.float64).tolist(),
        row_labels=rows,
        col_labels=cols,
        layer=layer,
        reduction=f"layer {layer} of {layers}, {describe_heads(head_count, heads, reduction)}, {unit}",
    )
