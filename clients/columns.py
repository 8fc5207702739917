"""What an attention column stands for, read from its label: a piece of text, a time span, an image cell, or
a cell of one frame of a clip.

The server labels the columns of audio input with their time span in seconds ("0.40-0.44") and those of
image input with their grid cell and pixel box ("r0c1:32,0,64,32": row 0, column 1, x0,y0,x1,y1); text
columns are the source words or pieces themselves; video columns are (frame, cell) pairs, frame by frame,
with the time the frame shows ("f3@1.250s:r0c1:8,0,16,8"). An image encoder's positions that stand for no cell
(ViT's class token) come before the cells, labelled with a name ("cls"). The PNG renderer and the web gateway
read them here.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence

_SPAN = re.compile(r"^(\d+(?:\.\d+)?)-(\d+(?:\.\d+)?)$")
_CELL = re.compile(r"^r(\d+)c(\d+):(\d+),(\d+),(\d+),(\d+)$")
_FRAME = re.compile(r"^f(\d+)@(\d+(?:\.\d+)?)s:(r\d+c\d+:\d+,\d+,\d+,\d+)$")
_LEADING = re.compile(r"^[a-z][a-z0-9_]*$")  # a column before the cells that stands for no cell: "cls"


@dataclasses.dataclass(frozen=True)
class TimeSpan:
    start: float  # seconds from the start of the audio
    end: float


@dataclasses.dataclass(frozen=True)
class GridCell:
    row: int  # the cell's place in the encoder's grid, counted from 0
    col: int
    box: tuple[int, int, int, int]  # pixels of the model's input image: x0, y0, x1, y1


def time_spans(labels: Sequence[str]) -> list[TimeSpan] | None:
    """Every label's time span, or None unless every label is one (then the columns are not audio)."""
    matches = [_SPAN.match(label) for label in labels]
    if not labels or not all(matches):
        return None
    return [TimeSpan(float(m[1]), float(m[2])) for m in matches]


def leading_columns(labels: Sequence[str]) -> int:
    """How many columns before an image's cells stand for no cell (named: "cls"); 0 for other columns."""
    k = 0
    while k < len(labels) and _LEADING.match(labels[k]):
        k += 1
    return k if k < len(labels) and _CELL.match(labels[k]) else 0


def grid_cells(labels: Sequence[str]) -> list[GridCell] | None:
    """Every cell label's grid cell (after any leading named columns: `leading_columns`), or None unless
    every other label is one (then the columns are not an image)."""
    labels = labels[leading_columns(labels):]
    matches = [_CELL.match(label) for label in labels]
    if not labels or not all(matches):
        return None
    return [GridCell(int(m[1]), int(m[2]), (int(m[3]), int(m[4]), int(m[5]), int(m[6]))) for m in matches]


def frame_cells(labels: Sequence[str]) -> tuple[list[float], list[GridCell]] | None:
    """The sampled frames' times and one frame's grid cells, or None unless every label is a (frame, cell)
    column and together they fill whole frames (then the columns are not a clip)."""
    matches = [_FRAME.match(label) for label in labels]
    if not labels or not all(matches):
        return None
    times = {int(m[1]): float(m[2]) for m in matches}
    cells = grid_cells([m[3] for m in matches if m[1] == "0"])
    if cells is None or len(labels) != len(times) * len(cells) or sorted(times) != list(range(len(times))):
        return None
    return [times[t] for t in range(len(times))], cells
