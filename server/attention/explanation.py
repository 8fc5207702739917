"""Summaries of an attention matrix that say something about the translation (numpy only).

Given the matrix a response returns (rows = output pieces or words, columns = source pieces or words,
each row a distribution over the columns):

- **alignment**: for each row, the column it attended to most (argmax; ties go to the first column): a
  hard word alignment.
- **coverage**: for each column, its attention summed over the rows. A source word translated once by one
  output word gets about 1; 0 means no output word looked at it.
- **entropy**: for each row, -sum(p log p) over its columns, in nats: 0 when it looked at one column only,
  ln(cols) when it spread evenly (a row that cannot tell where its word came from).
- **neglected**: columns whose coverage is below `NEGLECT_THRESHOLD`, a hint that the output may have left
  that source word out (the classic coverage argument of Tu et al. 2016). A hint, not a verdict: the
  model can translate a word while attending elsewhere. The source's end token is never flagged, as
  models park attention there or ignore it freely.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from attnserve.api.generation import AttentionExplanation

# A column whose summed attention is below this (a tenth of one output row) is flagged as neglected.
NEGLECT_THRESHOLD = 0.1


def explain(
    weights: np.ndarray | Sequence[Sequence[float]],
    columns: int,
    ignored_columns: Sequence[int] = (),
    neglect_threshold: float = NEGLECT_THRESHOLD,
) -> AttentionExplanation:
    """Computes the explanation of one attention matrix.

    Args:
        weights: (R, C) attention of each output row on each source column; rows sum to 1. R may be 0.
        columns: C (needed when R is 0).
        ignored_columns: columns never flagged as neglected (the source's end token).
        neglect_threshold: coverage below which a column is flagged.

    Returns:
        The alignment (R,), coverage (C,), entropy (R,) and neglected flags (C,).
    """
    w = np.asarray(weights, dtype=np.float64).reshape(len(weights), columns)  # (R, C)
    rows, cols = w.shape
    coverage = w.sum(axis=0)  # (C,)
    if rows and cols:
        alignment = w.argmax(axis=1)  # (R,)
        with np.errstate(divide="ignore", invalid="ignore"):
            terms = np.where(w > 0, w * np.log(w), 0.0)  # (R, C); 0 log 0 = 0
        entropy = np.maximum(-terms.sum(axis=1), 0.0)  # (R,); rounding can give -0.0
    else:
        alignment, entropy = np.zeros(rows, dtype=np.int64), np.zeros(rows)
    neglected = coverage < neglect_threshold
    neglected[[c for c in ignored_columns if 0 <= c < cols]] = False
    return AttentionExplanation(
        alignment=alignment.tolist(),
        coverage=coverage.tolist(),
        entropy=entropy.tolist(),
        neglected=neglected.tolist(),
        neglect_threshold=neglect_threshold,
    )
