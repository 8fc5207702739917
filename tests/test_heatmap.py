"""The terminal heatmap: labels, alignment with double-width characters, shading, wide matrices."""

from __future__ import annotations

import re

from attnserve.clients import heatmap
from attnserve.clients.heatmap import display_width
from attnserve.api.generation import AttentionMatrix

ANSI = re.compile(r"\x1b\[[0-9;]*m")
ROWS = ["▁I", "▁love", "▁you"]
COLS = ["我", "愛", "你", "</s>"]
WEIGHTS = [[0.8, 0.1, 0.1, 0.0], [0.0, 0.9, 0.1, 0.0], [0.0, 0.2, 0.4, 0.4]]


def matrix(weights=WEIGHTS, rows=ROWS, cols=COLS) -> AttentionMatrix:
    return AttentionMatrix(weights, rows, cols, 2, "layer 2 of 3, mean over 4 heads, pieces")


def grid(text: str) -> list[str]:
    """The header and matrix lines of the first block (everything before the first blank line)."""
    return text.split("\n\n")[0].splitlines()


def column_label(lines: list[str], index: int, label_width: int) -> str:
    """Reads column `index` of the vertical header back, top to bottom."""
    glyphs = []
    for line in lines:
        cells, used = "", 0
        for ch in line:  # walk by terminal columns, since CJK glyphs are two wide
            if used >= label_width + 1 + 2 * index and used < label_width + 1 + 2 * (index + 1):
                cells += ch
            used += display_width(ch)
        glyphs.append(cells.strip())
    return "".join(glyphs)


def test_display_width_counts_cjk_twice():
    assert display_width("我愛你") == 6
    assert display_width("love") == 4
    assert display_width("é") == 1  # e + combining acute


def test_rows_and_columns_are_labelled():
    text = heatmap.render(matrix(), color=False, width=80)
    lines = grid(text)
    header, body = lines[:-3], lines[-3:]
    assert [line.split(" ")[0] for line in body] == ROWS
    label_width = max(map(display_width, ROWS))
    assert [column_label(header, c, label_width) for c in range(len(COLS))] == COLS
    assert text.splitlines()[-1] == "layer 2 of 3, mean over 4 heads, pieces"


def test_grid_stays_aligned_with_double_width_labels():
    rows = ["我", "愛", "你們"]
    text = heatmap.render(matrix(rows=rows, cols=["▁I", "▁love", "▁you", "</s>"]), color=False, width=80)
    body = grid(text)[-3:]
    assert {display_width(line) for line in body} == {display_width("你們") + 1 + 2 * 4}


def test_shades_follow_the_weights():
    body = grid(heatmap.render(matrix(), color=False, width=80))[-3:]
    cells = [line[len("▁love ") :] for line in body]
    assert cells[1][2:4] == "██"  # the largest weight, 0.9
    assert cells[1][0:2] == "  "  # zero
    assert cells[0][0:2] == "██"  # 0.8 of 0.9 rounds to full
    assert cells[2][4:6] == "▒▒"  # 0.4 of 0.9 rounds to half


def test_plain_output_has_no_escapes_and_colour_output_has_256_colour_backgrounds():
    assert not ANSI.search(heatmap.render(matrix(), color=False, width=80))
    coloured = heatmap.render(matrix(), color=True, width=80)
    assert "\x1b[48;5;255m" in coloured  # the largest weight is white
    assert ANSI.sub("", coloured).count("█") == 0


def test_wide_matrices_are_split_into_blocks_that_fit():
    cols = [f"w{c}" for c in range(60)]
    weights = [[(r + c) % 7 / 7 for c in range(60)] for r in range(3)]
    text = heatmap.render(matrix(weights=weights, cols=cols), color=False, width=50)
    assert max(display_width(line) for line in text.splitlines()[:-2]) <= 50
    assert "columns 1-" in text and "of 60" in text
    assert text.count("▁love") == len(re.findall(r"^columns ", text, re.M))


def test_long_labels_are_cut():
    rows = ["▁" + "x" * 40]
    cols = ["y" * 20]
    text = heatmap.render(matrix(weights=[[1.0]], rows=rows, cols=cols), color=False, width=80)
    lines = grid(text)
    assert lines[-1].split(" ")[0].endswith("…") and display_width(lines[-1].split(" ")[0]) == 16
    assert column_label(lines[:-1], 0, 16) == "y" * 7 + "…"


def test_empty_matrix():
    assert heatmap.render(matrix(weights=[], rows=[], cols=[]), color=False) == "(empty attention matrix)"
