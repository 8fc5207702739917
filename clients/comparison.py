"""Draws one text's translations by several models, each with its attention heatmap (`attnserve compare`).

Every model gets a block of lines: its name, its translation and the heatmap of its attention, whose last
line names the layer it was read from; a model whose call failed gets its error instead, and the others
still show. The blocks stand side by side when, at their natural widths, they fit the terminal together
(a heatmap is never split into column blocks for it), else one below the other, each as
`attnserve translate --attention` draws it. Fetching the results is the CLI's job; this module only draws.

Example:
    outcomes = [Outcome("translate-zh-en", result=a), Outcome("translate-zh-en-rnn", error=exc)]
    print("\\n".join(comparison.render(outcomes, width=120, color=False)))
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from attnserve.clients import heatmap
from attnserve.clients.client import AttnServeError
from attnserve.clients.heatmap import display_width
from attnserve.api.generation import GenerationResult

GAP = 4  # terminal columns between blocks set side by side
_MIN_TEXT_WIDTH = 30  # a block's translation or error wraps at no fewer terminal columns than this


@dataclasses.dataclass(frozen=True)
class Outcome:
    """One model's answer to the compared request: its result, or the error its call failed with."""

    model: str
    result: GenerationResult | None = None
    error: AttnServeError | None = None


def render(outcomes: Sequence[Outcome], width: int, color: bool, gap: int = GAP) -> list[str]:
    """Draws the outcomes side by side when they fit in `width` terminal columns, else stacked.

    Args:
        outcomes: one per model, in the order to show them.
        width: terminal width in columns.
        color: ANSI 256-colour heatmap cells (see `heatmap.render`).
        gap: columns between blocks set side by side.

    Returns:
        The lines to print, without newlines.
    """
    # Side by side: captions padded to one height, so that the heatmaps start on the same line.
    share = (width - gap * (len(outcomes) - 1)) // max(len(outcomes), 1)  # an error may take this much
    blocks = [_block(outcome, width, color, share) for outcome in outcomes]
    caption_height = max((len(caption) for caption, _ in blocks), default=0)
    lines = heatmap.side_by_side(
        [caption + [""] * (caption_height - len(caption)) + body for caption, body in blocks], gap
    )
    if max((display_width(line) for line in lines), default=0) <= width:
        return lines

    # Too narrow: one block below the other, each with the whole terminal width.
    lines = []
    for outcome in outcomes:
        caption, body = _block(outcome, width, color)
        block = caption + body
        while not block[-1]:  # an error's block ends with its caption's blank line
            block.pop()
        lines += ([""] if lines else []) + block
    return lines


def _block(outcome: Outcome, width: int, color: bool, share: int | None = None) -> tuple[list[str], list[str]]:
    """(caption, body) of one model's block: its name and translation (or error), then its heatmap.

    Without `share` the block is drawn for a terminal of its own, `width` wide. With it, for side by side:
    the legend takes two lines, a translation wraps at its heatmap's width, an error at `share` columns.
    """
    narrow = share is not None
    body = []
    if outcome.result is not None and outcome.result.attention is not None:
        body = heatmap.render_lines(outcome.result.attention, color, width, narrow_legend=narrow)
    if outcome.error is not None:
        text = f"error: {outcome.error.code.name}: {outcome.error.details}"
    else:
        text = outcome.result.text or "(empty translation)"
    text_width = width
    if narrow:
        room = share if outcome.error is not None else 0
        text_width = max(_MIN_TEXT_WIDTH, room, display_width(outcome.model), *map(display_width, body))
    return [outcome.model, *_wrap(text, text_width), ""], body


def _wrap(text: str, width: int) -> list[str]:
    """Breaks `text` into lines of at most `width` terminal columns, at spaces where it can.

    Runs of spaces become one space. A word wider than a line (a run of CJK characters has no spaces) is
    broken between characters.
    """
    lines, line = [], ""
    for word in text.split():
        joined = f"{line} {word}" if line else word
        if display_width(joined) <= width:
            line = joined
            continue
        if line:
            lines.append(line)
        line = word
        while display_width(line) > width:
            head = _cut(line, width)
            lines.append(head)
            line = line[len(head) :]
    return [*lines, line]


def _cut(text: str, width: int) -> str:
    """The longest start of `text` that fits `width` terminal columns (at least one character)."""
    used = 0
    for index, ch in enumerate(text):
        used += display_width(ch)
        if used > width:
            return text[: max(index, 1)]
    return text
