"""Renders an attention matrix as a terminal heatmap.

Rows are output tokens (or words), columns source tokens (or words). Each cell is two terminal columns
wide, so a CJK character (double width) fits a column label exactly; column labels are written
vertically, one character per line. Matrices wider than the terminal are split into blocks of columns.
Shades are scaled to the largest weight of the matrix: 256-colour grey backgrounds on a terminal, shade
characters otherwise. `side_by_side` sets rendered blocks of lines next to each other (`attnserve compare`).

Example:
    print(heatmap.render(result.attention))
"""

from __future__ import annotations

import re
import shutil
import sys
import unicodedata
from collections.abc import Sequence

from attnserve.api.generation import AttentionMatrix

SHADES = " ░▒▓█"  # plain output: none, light, medium, dark, full
_CELL = 2  # terminal columns per matrix cell
_MAX_ROW_LABEL = 16  # terminal columns; longer row labels are cut with "…"
_MAX_COL_LABEL = 8  # characters written vertically; longer column labels are cut with "…"
_GREYS = range(232, 256)  # the 256-colour palette's grey ramp, black to white
_RESET = "\x1b[0m"
_ANSI = re.compile(r"\x1b\[[0-9;]*m")  # the colour escapes `render` writes; they take no terminal columns


def render(matrix: AttentionMatrix, color: bool | None = None, width: int | None = None) -> str:
    """Draws `matrix` as text.

    Args:
        matrix: the attention matrix; weights[r][c] is row r's attention on column c.
        color: ANSI 256-colour backgrounds; None = only when stdout is a terminal.
        width: terminal width in columns; None = the current terminal's (80 when unknown).

    Returns:
        The heatmap, lines joined by "\\n", ending with a scale legend and the matrix's reduction.
    """
    return "\n".join(render_lines(matrix, color, width))


def render_lines(
    matrix: AttentionMatrix, color: bool | None = None, width: int | None = None, *, narrow_legend: bool = False
) -> list[str]:
    """`render`'s lines (without newlines), for layouts that place the heatmap among other text.

    Args:
        matrix, color, width: as for `render`.
        narrow_legend: write the scale legend on two lines, half as wide, for heatmaps set side by side.
    """
    if not matrix.row_labels or not matrix.col_labels:
        return ["(empty attention matrix)"]
    if color is None:
        color = sys.stdout.isatty()
    if width is None:
        width = shutil.get_terminal_size().columns
    row_labels = [_clean(label) for label in matrix.row_labels]
    label_width = min(max(display_width(label) for label in row_labels), _MAX_ROW_LABEL)
    peak = max(max(row) for row in matrix.weights) or 1.0  # an all-zero matrix draws blank, not a crash

    blocks = _column_blocks(len(matrix.col_labels), width - label_width - 1)
    lines: list[str] = []
    for block in blocks:
        if len(blocks) > 1:
            lines.append(f"columns {block.start + 1}-{block.stop} of {len(matrix.col_labels)}")
        header = [_clean(matrix.col_labels[c]) for c in block]
        lines += [" " * (label_width + 1) + line for line in _vertical_labels(header)]
        for label, row in zip(row_labels, matrix.weights):
            cells = "".join(_cell(row[c] / peak, color) for c in block)
            lines.append(f"{_fit(label, label_width)} {cells}{_RESET if color else ''}")
        lines.append("")
    lines += _legend(peak, color, narrow_legend)
    lines.append(matrix.reduction)
    return lines


def side_by_side(blocks: Sequence[Sequence[str]], gap: int = 4) -> list[str]:
    """Sets blocks of lines next to each other, top-aligned, `gap` spaces apart.

    Each block is padded to its widest line in terminal columns (CJK characters count two, colour
    escapes none), so every block starts at the same column on every line; shorter blocks end in blank
    lines. Trailing spaces are dropped.

    Returns:
        The combined lines, as many as the tallest block has.
    """
    widths = [max((display_width(line) for line in block), default=0) for block in blocks]
    height = max((len(block) for block in blocks), default=0)
    lines = []
    for index in range(height):
        parts = []
        for block, block_width in zip(blocks, widths):
            line = block[index] if index < len(block) else ""
            parts.append(line + " " * (block_width - display_width(line)))
        lines.append((" " * gap).join(parts).rstrip(" "))
    return lines


def display_width(text: str) -> int:
    """Terminal columns `text` takes: 2 per wide (CJK) character, 0 per combining mark or colour escape, else 1."""
    return sum(_char_width(ch) for ch in _ANSI.sub("", text))


def _char_width(ch: str) -> int:
    if unicodedata.combining(ch):
        return 0
    return 2 if unicodedata.east_asian_width(ch) in ("W", "F") else 1


def _clean(label: str) -> str:
    # A newline or tab inside a piece would break the grid.
    return "".join(ch if ch.isprintable() else "?" for ch in label) or " "


def _fit(text: str, width: int) -> str:
    """Cuts `text` to `width` terminal columns (ending in "…" when cut) and pads it to exactly that."""
    if display_width(text) > width:
        kept, used = [], 0
        for ch in text:
            if used + _char_width(ch) > width - 1:
                break
            kept.append(ch)
            used += _char_width(ch)
        text = "".join(kept) + "…"
    return text + " " * (width - display_width(text))


def _column_blocks(count: int, room: int) -> list[range]:
    """Splits `count` columns into blocks that fit `room` terminal columns (at least one column each)."""
    per_block = max(room // _CELL, 1)
    return [range(start, min(start + per_block, count)) for start in range(0, count, per_block)]


def _vertical_labels(labels: list[str]) -> list[str]:
    """Header lines with each label written top to bottom, bottom-aligned just above its column."""
    glyphs = [_vertical_glyphs(label) for label in labels]
    height = max(len(g) for g in glyphs)
    lines = []
    for line in range(height):
        cells = []
        for label_glyphs in glyphs:
            index = line - (height - len(label_glyphs))
            cells.append(_fit(label_glyphs[index], _CELL) if index >= 0 else " " * _CELL)
        lines.append("".join(cells).rstrip())
    return lines


def _vertical_glyphs(label: str) -> list[str]:
    glyphs = [ch for ch in label if not unicodedata.combining(ch)] or [" "]
    if len(glyphs) > _MAX_COL_LABEL:
        glyphs = glyphs[: _MAX_COL_LABEL - 1] + ["…"]
    return glyphs


def _cell(fraction: float, color: bool) -> str:
    fraction = min(max(fraction, 0.0), 1.0)
    if color:
        grey = _GREYS[round(fraction * (len(_GREYS) - 1))]
        return f"\x1b[48;5;{grey}m" + " " * _CELL
    return SHADES[round(fraction * (len(SHADES) - 1))] * _CELL


def _legend(peak: float, color: bool, narrow: bool = False) -> list[str]:
    steps = [i / (len(SHADES) - 1) for i in range(1, len(SHADES))]
    swatches = [f"{_cell(step, color)}{_RESET if color else ''} {step * peak:.2f}" for step in steps]
    if narrow:  # the last swatch is the maximum, so "(max ...)" adds nothing there
        half = len(swatches) // 2
        return ["scale: " + " ".join(swatches[:half]), "       " + " ".join(swatches[half:])]
    return [f"scale: {' '.join(swatches)}  (max {peak:.2f})"]
