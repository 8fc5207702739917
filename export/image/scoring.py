"""Caption scores: exact match, BLEU, and pointing accuracy (does the model look at what it names?).

Pointing: every word of an object's name in a generated caption ("red" and "apple" of "red apple", "cats" of
"two cats") is one trial; it hits when the grid cell the word attended to most has its centre inside the box
of an object of that name in the scene (either one, for two of a kind). A name the scene does not hold is a
miss. `overlap=True` counts a hit when the cell merely overlaps the box (a looser reading, reported beside).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import sacrebleu

from attnserve.export.image.objects import OBJECTS
from attnserve.export.image.scenes import Scene

# Name words (singular or plural) -> the object's name; longest first so "red apples" wins over nothing shorter.
_MENTIONS = sorted({**{o.name: o.name for o in OBJECTS}, **{o.plural: o.name for o in OBJECTS}}.items(),
                   key=lambda item: -len(item[0].split()))


def exact_match(hypotheses: Sequence[str], references: Sequence[str]) -> float:
    return sum(h == r for h, r in zip(hypotheses, references)) / max(len(references), 1)


def bleu(hypotheses: Sequence[str], references: Sequence[str]) -> float:
    """Corpus BLEU (sacrebleu, one reference per image), 0..100."""
    return sacrebleu.corpus_bleu(list(hypotheses), [list(references)]).score


def mentions(words: Sequence[str]) -> list[tuple[str, list[int]]]:
    """(object name, word positions) of each object named in a caption, in order."""
    found, i = [], 0
    while i < len(words):
        for text, name in _MENTIONS:
            n = len(text.split())
            if list(words[i : i + n]) == text.split():
                found.append((name, list(range(i, i + n))))
                i += n
                break
        else:
            i += 1
    return found


def pointing_trials(words: Sequence[str], attention: np.ndarray, scene: Scene, grid: int, overlap: bool = False
                    ) -> list[bool]:
    """One hit or miss per name word of a caption.

    Args:
        words: the caption's words; attention: (words, grid * grid) each word's attention over the cells.
        scene: the image's scene graph (boxes as fractions of the side).
        grid: cells per side.
    """
    trials = []
    for name, positions in mentions(words):
        boxes = [o.box for o in scene.objects if o.name == name]
        for p in positions:
            cell = int(np.argmax(attention[p]))
            r, c = divmod(cell, grid)
            trials.append(any(_hit(r, c, grid, box, overlap) for box in boxes))
    return trials


def hit_share(name: str, scene: Scene, grid: int) -> float:
    """The share of cells whose centre lies in a box of `name`: pointing accuracy of a random look."""
    boxes = [o.box for o in scene.objects if o.name == name]
    hits = sum(any(_hit(r, c, grid, box, False) for box in boxes) for r in range(grid) for c in range(grid))
    return hits / grid**2


def _hit(r: int, c: int, grid: int, box, overlap: bool) -> bool:
    x0, y0, x1, y1 = box
    if overlap:
        return c / grid < x1 and (c + 1) / grid > x0 and r / grid < y1 and (r + 1) / grid > y0
    cx, cy = (c + 0.5) / grid, (r + 0.5) / grid
    return x0 <= cx < x1 and y0 <= cy < y1
