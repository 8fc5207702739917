"""Character and word error rates: Levenshtein edits over the reference length, summed over a set."""

from __future__ import annotations

from collections.abc import Sequence


def edit_distance(hypothesis: Sequence, reference: Sequence) -> int:
    """Fewest substitutions, insertions and deletions that turn `hypothesis` into `reference`."""
    previous = list(range(len(reference) + 1))
    for i, h in enumerate(hypothesis, 1):
        current = [i]
        for j, r in enumerate(reference, 1):
            current.append(min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (h != r)))
        previous = current
    return previous[-1]


def error_rate(hypotheses: Sequence[str], references: Sequence[str], unit: str) -> float:
    """Corpus-level CER (`unit="char"`) or WER (`unit="word"`): total edits / total reference units."""
    if unit not in ("char", "word"):
        raise ValueError(f"unit must be 'char' or 'word', got {unit!r}")
    split = (lambda s: list(s)) if unit == "char" else (lambda s: s.split())
    edits = sum(edit_distance(split(h), split(r)) for h, r in zip(hypotheses, references, strict=True))
    return edits / max(sum(len(split(r)) for r in references), 1)
