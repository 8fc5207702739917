"""How well served word confidences tell right words from wrong ones, and the scale that calibrates them.

    python -m attnserve.export.speech.confidence --model-dir models/speech-en/12 --corpus data/speech-sky2 \\
        --splits dev dev_channel --out models/speech-en/word-confidence-v12.json

A recognised word is right when the word-level edit alignment with the reference pairs it with the same
word. For the confidences of a set of words (server/decoding/word_confidence.py) it reports the AUC (the
chance that a right word is more confident than a wrong one), the expected calibration error over ten
equal-width bins (how far "0.7" is from 70% right), and accuracy per confidence band; and, for choosing a
model's `decoding.word_confidence_scale` on dev clips, the calibration the same words would have at other
scales (a confidence c served at scale s is c ** (t / s) at scale t).
"""

from __future__ import annotations

import argparse
import pathlib

import numpy as np

from attnserve.export.common.serving import open_engine
from attnserve.export.speech import manifest
from attnserve.export.common.reports import emit

BANDS = (0.0, 0.25, 0.5, 0.75, 0.9, 1.0)
SCALES = (1.0, 1.5, 2.0, 2.5, 3.0, 3.5, 4.0, 5.0)


def right_words(hypothesis: list[str], reference: list[str]) -> list[bool]:
    """For each hypothesis word, whether a minimum-edit alignment with `reference` pairs it with itself."""
    n, m = len(hypothesis), len(reference)
    cost = np.zeros((n + 1, m + 1), dtype=np.int64)
    cost[:, 0], cost[0, :] = np.arange(n + 1), np.arange(m + 1)
    for i in range(1, n + 1):
        for j in range(1, m + 1):
            cost[i, j] = min(cost[i - 1, j] + 1, cost[i, j - 1] + 1,
                             cost[i - 1, j - 1] + (hypothesis[i - 1] != reference[j - 1]))
    right, i, j = [False] * n, n, m
    while i > 0 and j > 0:  # walk back, preferring the diagonal: a match or a substitution
        if cost[i, j] == cost[i - 1, j - 1] + (hypothesis[i - 1] != reference[j - 1]):
            right[i - 1] = hypothesis[i - 1] == reference[j - 1]
            i, j = i - 1, j - 1
        elif cost[i, j] == cost[i - 1, j] + 1:
            i -= 1
        else:
            j -= 1
    return right


def auc(confidence: np.ndarray, right: np.ndarray) -> float:
    """P(a right word's confidence > a wrong word's), ties counting half (the Mann-Whitney statistic)."""
    _, inverse, counts = np.unique(confidence, return_inverse=True, return_counts=True)
    ranks = (np.cumsum(counts) - (counts - 1) / 2)[inverse]  # 1-based, tied values sharing their mean rank
    positives, negatives = int(right.sum()), int((~right).sum())
    if positives == 0 or negatives == 0:
        return float("nan")
    return float((ranks[right].sum() - positives * (positives + 1) / 2) / (positives * negatives))


def calibration(confidence, right) -> dict:
    """AUC, expected calibration error (ten bins) and accuracy per BANDS band of a set of words."""
    confidence, right = np.asarray(confidence, dtype=np.float64), np.asarray(right, dtype=bool)
    bins = np.clip((confidence * 10).astype(int), 0, 9)
    ece = sum(float(np.mean(bins == b)) * abs(confidence[bins == b].mean() - right[bins == b].mean())
              for b in range(10) if np.any(bins == b))
    bands = []
    for lo, hi in zip(BANDS[:-1], BANDS[1:]):
        inside = (confidence >= lo) & ((confidence < hi) | (hi == 1.0))
        if inside.any():
            bands.append({"from": lo, "to": hi, "words": int(inside.sum()),
                          "right": round(float(right[inside].mean()), 3)})
    return {"words": len(right), "right": round(float(right.mean()), 3) if len(right) else None,
            "auc": round(auc(confidence, right), 3), "ece": round(ece, 3), "bands": bands}


def words_and_outcomes(results, references: list[str]) -> tuple[list[float], list[bool]]:
    """Every served word's confidence and whether it is right, over a split's results."""
    confidences, outcomes = [], []
    for result, reference in zip(results, references, strict=True):
        words = [w for w in result.words if w.confidence is not None]
        confidences += [w.confidence for w in words]
        outcomes += right_words([w.word for w in words], reference.split())
    return confidences, outcomes


def at_scales(confidence, right, served_scale: float) -> dict:
    """The calibration the same words would have at each of SCALES."""
    confidence = np.asarray(confidence, dtype=np.float64)
    return {str(t): calibration(confidence ** (t / served_scale), right) for t in SCALES}


def main() -> None:
    from attnserve.export.speech.evaluate import transcribe

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model-dir", type=pathlib.Path, required=True)
    parser.add_argument("--corpus", type=pathlib.Path, required=True)
    parser.add_argument("--splits", nargs="+", required=True)
    parser.add_argument("--beam-size", type=int, default=0, help="0: the manifest's default search")
    parser.add_argument("--out", type=pathlib.Path)
    args = parser.parse_args()
    engine = open_engine(args.model_dir)
    scale = engine.manifest.decoding.word_confidence_scale
    report, pooled = {"model": str(args.model_dir), "word_confidence_scale": scale, "splits": {}}, ([], [])
    try:
        for split in args.splits:
            rows = manifest.read(args.corpus / f"{split}.jsonl")
            results = transcribe(engine, args.corpus, rows, args.beam_size, attention=False)
            confidence, right = words_and_outcomes(results, [row["text"] for row in rows])
            report["splits"][split] = calibration(confidence, right)
            pooled[0].extend(confidence)
            pooled[1].extend(right)
    finally:
        engine.close()
    report["pooled_at_scales"] = at_scales(*pooled, scale)
    emit(report, args.out)


if __name__ == "__main__":
    main()
