"""Word confidence: how sure the search was of each word it wrote, read from its tokens' log-scores.

A word's confidence is exp(scale x m), m the mean log-score of the word's own pieces and of the boundary
that closes it (the next word's opening marker when that marker is a piece of its own, as a character
model's "▁"; the last word has none). The log-scores are those the search ranked by (with joint CTC
decoding, 0.8 x the speller's + 0.2 x the CTC prefix score), so exp(m) alone, a geometric mean of
per-piece probabilities, is overconfident; the manifest's `decoding.word_confidence_scale` sharpens it so
that the number reads as the chance the word is right. Measured on speech-en 12 (models/speech-en/README.md,
"Word confidence"): scale 3, fitted on dev clips, gives a calibration error of 0.04 there.

Why the boundary counts: a character model that is unsure where a word ends ("a" "usel" for "unusual")
spends its doubt on the space, not on the letters; including it ranked right and wrong dev words better
(AUC 0.815 against 0.802 without it).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from attnserve.server.model.tokenization import METASPACE, Words


def word_confidences(words: Words, pieces: Sequence[str], logprobs: Sequence[float], scale: float) -> list[float]:
    """One confidence in (0, 1] per word of `words` (see the module docstring).

    Args:
        words: the grouping of `pieces` into words.
        pieces: the output pieces; logprobs: their log-scores, one per piece.
        scale: the manifest's word_confidence_scale (> 0).
    """
    bounds = [*words.starts, len(pieces)]
    out = []
    for w in range(len(words.labels)):
        first, after = bounds[w], bounds[w + 1]
        scores = [logprobs[i] for i in range(first, after) if pieces[i].strip(METASPACE)]
        if not scores:  # a word of markers only
            scores = list(logprobs[first:after])
        if after < len(pieces) and not pieces[after].strip(METASPACE):
            scores.append(logprobs[after])  # the boundary that closes the word
        out.append(float(np.exp(scale * np.mean(scores))))
    return out
