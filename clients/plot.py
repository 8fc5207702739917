"""Draws attention as a PNG with matplotlib (`attnserve translate|transcribe --attention out.png`).

Text: a heatmap with the source words along the x axis and the output words down the y axis, each cell
shaded by its weight, with a colour bar. Audio: the same heatmap laid on a time axis in seconds (each
column spans its time), every word's span outlined on its row, and a strip below with the words placed at
their spans. Figures are built with the object API (no pyplot state), so drawing is safe in any thread.
Needs the `plot` extra (`pip install 'attnserve[plot]'`).

Example:
    plot.save_attention(result.attention, "attention.png")
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import matplotlib
from attnserve.clients import columns
from attnserve.api.generation import AttentionMatrix, WordTiming
from matplotlib import font_manager
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

_CMAP = "magma_r"  # white for no attention, dark for all of it
_DPI = 120
_INCH_PER_LABEL = 0.32  # room for one tick label along an axis


@functools.cache
def _fonts() -> list[str]:
    """Matplotlib's default font, then a font with CJK glyphs when one is installed (fonts-noto-cjk)."""
    installed = {font.name for font in font_manager.fontManager.ttflist}
    cjk = sorted(name for name in installed if "CJK" in name)
    return ["DejaVu Sans", *cjk[:1]]


def _style():
    return matplotlib.rc_context({"font.family": _fonts(), "font.size": 10})


def save_attention(matrix: AttentionMatrix, path: str) -> None:
    """Writes `matrix` as a labelled heatmap PNG to `path`."""
    with _style():
        attention_figure(matrix).savefig(path, dpi=_DPI, bbox_inches="tight")


def save_timeline(words: Sequence[WordTiming], matrix: AttentionMatrix, path: str) -> None:
    """Writes an audio response's attention on a time axis, with its words' spans, as a PNG to `path`.

    Raises:
        ValueError: the matrix's columns are not time spans, or its rows are not the words.
    """
    with _style():
        timeline_figure(words, matrix).savefig(path, dpi=_DPI, bbox_inches="tight")


def attention_figure(matrix: AttentionMatrix) -> Figure:
    """The heatmap: rows = output words or pieces, columns = source words or pieces."""
    rows, cols = len(matrix.row_labels), len(matrix.col_labels)
    figure = Figure(figsize=(max(4.0, 1.5 + cols * _INCH_PER_LABEL), max(3.0, 1.5 + rows * _INCH_PER_LABEL)))
    axes = figure.add_subplot()
    image = axes.imshow(matrix.weights, cmap=_CMAP, vmin=0.0, aspect="auto", interpolation="nearest")
    axes.set_xticks(range(cols), matrix.col_labels, rotation=90)
    axes.set_yticks(range(rows), matrix.row_labels)
    axes.xaxis.tick_top()
    axes.xaxis.set_label_position("top")
    axes.set_xlabel("source")
    axes.set_ylabel("output")
    axes.text(0.5, -0.02, matrix.reduction, transform=axes.transAxes, ha="center", va="top", fontsize=9)
    figure.colorbar(image, ax=axes, label="attention weight", shrink=0.8)
    return figure


def timeline_figure(words: Sequence[WordTiming], matrix: AttentionMatrix) -> Figure:
    """Rows = the words, x = seconds; each word's span outlined, and the words placed on a time strip below.

    Raises:
        ValueError: the matrix's columns are not time spans, or its rows are not the words.
    """
    spans = columns.time_spans(matrix.col_labels)
    if spans is None:
        raise ValueError("the attention columns are not time spans: not an audio response")
    if len(matrix.weights) != len(words):
        raise ValueError(f"{len(matrix.weights)} attention rows for {len(words)} words: ask for word granularity")
    start, end = spans[0].start, spans[-1].end
    figure = Figure(figsize=(10.0, 2.0 + len(words) * _INCH_PER_LABEL))
    heat, strip = figure.subplots(2, 1, sharex=True, height_ratios=[max(1, len(words)), 1.2])
    # The heatmap: each column drawn over its own time span, each row one word.
    image = heat.imshow(
        matrix.weights, cmap=_CMAP, vmin=0.0, aspect="auto", interpolation="nearest",
        extent=(start, end, len(words) - 0.5, -0.5),
    )
    heat.set_yticks(range(len(words)), [w.word for w in words])
    heat.set_ylabel("word")
    heat.set_title(matrix.reduction, fontsize=9)
    for row, word in enumerate(words):
        heat.add_patch(Rectangle((word.start_seconds, row - 0.5), word.end_seconds - word.start_seconds, 1.0,
                                 fill=False, edgecolor="tab:cyan", linewidth=1.5))
    figure.colorbar(image, ax=[heat, strip], label="attention weight", shrink=0.8)
    # The strip: where each word was heard, alternating lanes so that neighbours' labels do not collide.
    for i, word in enumerate(words):
        lane = i % 2
        strip.broken_barh([(word.start_seconds, word.end_seconds - word.start_seconds)], (lane, 0.8),
                          facecolors="tab:cyan", alpha=0.6)
        strip.text((word.start_seconds + word.end_seconds) / 2, lane + 0.4, word.word, ha="center", va="center")
    strip.set_ylim(-0.1, 1.9)
    strip.set_yticks([])
    strip.set_xlim(start, end)
    strip.set_xlabel("time (s)")
    return figure
