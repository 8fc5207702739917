"""Renders a transcript's words on a time axis: where in the audio the model listened for each word.

One line per word: its time span, its confidence (when the server gives one: the calibrated chance that the
word is right), the word, and a strip of shade characters across the clip, darker where
the word's attention (its characters' mean, `--attention` at word granularity) was higher. Attention
columns are merged to fit the terminal, each cell showing its strongest column. Above the strips, a time
ruler in seconds. Shades are scaled per word, so a quiet word's peak is as visible as a loud one's.

Example (`attnserve transcribe clip.wav --attention`):

    0.00-0.40   91%  the     ▓█░
    0.40-0.88   38%  cat        ░▓█▒
"""

from __future__ import annotations

import shutil
from collections.abc import Sequence

from attnserve.api.generation import AttentionMatrix, WordTiming

SHADES = " ░▒▓█"
_MAX_WORD = 14  # terminal columns for the word; longer words are cut with "…"


def render(words: Sequence[WordTiming], attention: AttentionMatrix | None, width: int | None = None) -> str:
    """The words with their spans and, given word-level attention over time columns, their strips.

    Args:
        words: the response's word timings.
        attention: the response's attention at word granularity (rows = words), or None for spans only.
        width: terminal width; None = the current terminal's.
    """
    if not words:
        return "(no words)"
    width = width or shutil.get_terminal_size().columns
    word_width = min(_MAX_WORD, max(len(w.word) for w in words))
    sure = any(w.confidence is not None for w in words)
    spans = [f"{w.start_seconds:5.2f}-{w.end_seconds:5.2f}  {_percent(w.confidence) if sure else ''}"
             f"{_fit(w.word, word_width)}" for w in words]
    if attention is None or len(attention.weights) != len(words) or not attention.col_labels:
        return "\n".join(spans)
    prefix = len(spans[0]) + 2
    cells, per_cell = _cells(len(attention.col_labels), max(8, width - prefix))
    duration = float(attention.col_labels[-1].split("-")[1])
    lines = [" " * prefix + _ruler(cells, duration)]
    for span, row in zip(spans, attention.weights):
        merged = [max(row[c * per_cell : (c + 1) * per_cell]) for c in range(cells)]
        peak = max(merged) or 1.0
        strip = "".join(SHADES[min(len(SHADES) - 1, round(v / peak * (len(SHADES) - 1)))] for v in merged)
        lines.append(f"{span}  {strip.rstrip()}")
    return "\n".join(lines)


def _percent(confidence: float | None) -> str:
    """A word's confidence as a fixed-width column ("  7%  ", " 91%  "; blank where the word has none)."""
    return " " * 6 if confidence is None else f"{round(confidence * 100):3d}%  "


def _cells(columns: int, room: int) -> tuple[int, int]:
    """How many cells to draw and how many attention columns each merges, to fit `room` terminal columns."""
    per_cell = -(-columns // room)
    return -(-columns // per_cell), per_cell


def _ruler(cells: int, duration: float) -> str:
    """Second marks ("0s", "1s", ...) placed over the cells where each second begins."""
    ruler = [" "] * cells
    for second in range(int(duration) + 1):
        at = int(second / duration * cells) if duration else 0
        mark = f"{second}s"
        if at + len(mark) <= cells and all(c == " " for c in ruler[max(0, at - 1) : at + len(mark)]):
            ruler[at : at + len(mark)] = mark
    return "".join(ruler).rstrip()


def _fit(text: str, width: int) -> str:
    return text.ljust(width) if len(text) <= width else text[: width - 1] + "…"
