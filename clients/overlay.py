"""Per-word attention heatmaps over the captioned image, drawn with Pillow: one labelled panel per word.

An image model's attention columns are grid cells labelled "r<row>c<col>:x0,y0,x1,y1" with their pixel box
in the model's input (server/inputs/image.py), after any named columns that stand for no cell (a ViT's "cls",
left out of the panels). The server squeezed the whole image into that input, so a box maps
back onto the original by scaling each axis by the original's size over the input's (the input's size is
the largest x1 and y1). Each panel shows the original with the word's attention as a heatmap (weights over
the row's largest, bilinearly smoothed between cell centres, drawn as a translucent warm colour) and the
most-attended cell outlined; its label is the word and that cell's weight.
"""

from __future__ import annotations

import io
import re

import numpy as np
from PIL import Image, ImageDraw, ImageFont, ImageOps

from attnserve.api.generation import AttentionMatrix
from attnserve.clients import columns as columns_of

_CELL = re.compile(r"^r(\d+)c(\d+):(\d+),(\d+),(\d+),(\d+)$")
# Heat colour stops (weight -> RGB): dark red, red, orange, yellow.
_STOPS = np.array([[0.0, 120, 0, 0], [0.4, 220, 30, 0], [0.75, 255, 150, 0], [1.0, 255, 255, 90]], dtype=np.float32)


def parse_cells(labels: list[str]) -> tuple[int, int, tuple[int, int], list[tuple[int, int, int, int]]]:
    """Grid rows, columns, the model's input (width, height) and each cell's box, from column labels.

    Raises:
        ValueError: a label is not a grid cell (the attention is not an image model's).
    """
    cells = []
    for label in labels:
        match = _CELL.match(label)
        if match is None:
            raise ValueError(f"attention column {label!r} is not an image grid cell (r<row>c<col>:x0,y0,x1,y1)")
        cells.append(tuple(int(v) for v in match.groups()))
    rows, cols = max(c[0] for c in cells) + 1, max(c[1] for c in cells) + 1
    if len(cells) != rows * cols:
        raise ValueError(f"{len(cells)} attention columns do not fill a {rows} x {cols} grid")
    size = (max(c[4] for c in cells), max(c[5] for c in cells))
    return rows, cols, size, [c[2:] for c in cells]


def _colour(weights: np.ndarray) -> np.ndarray:
    """(H, W) in 0..1 -> (H, W, 3) float RGB along the heat stops."""
    return np.stack([np.interp(weights, _STOPS[:, 0], _STOPS[:, k]) for k in (1, 2, 3)], axis=-1)


def heat(image: Image.Image, row: np.ndarray, rows: int, cols: int, strength: float = 0.75) -> Image.Image:
    """`image` with one word's attention over the grid blended in.

    Args:
        row: (rows * cols,) the word's attention weights, row by row.
    """
    grid = (row / max(float(row.max()), 1e-9)).reshape(rows, cols).astype(np.float32)
    smooth = np.asarray(Image.fromarray(grid, "F").resize(image.size, Image.Resampling.BILINEAR)).clip(0, 1)
    base = np.asarray(image.convert("RGB"), dtype=np.float32) * 0.55  # dimmed, so the heat reads
    alpha = (strength * smooth)[..., None]
    return Image.fromarray((base * (1 - alpha) + _colour(smooth) * alpha).clip(0, 255).astype(np.uint8))


def render(image_data: bytes, attention: AttentionMatrix, panel: int = 256, columns: int = 4) -> Image.Image:
    """A grid of panels, one per output word (attention row), each labelled with the word and its peak weight.

    Args:
        image_data: the PNG or JPEG file that was captioned.
        attention: the response's attention (rows: words or pieces; columns: grid cells).
        panel: the longer side of each panel's image, in pixels.
        columns: panels per line.
    """
    first = columns_of.leading_columns(attention.col_labels)  # a ViT's "cls" column: no cell to draw
    rows, cols, (width, height), boxes = parse_cells(attention.col_labels[first:])
    original = ImageOps.exif_transpose(Image.open(io.BytesIO(image_data))).convert("RGB")
    scale = panel / max(original.size)
    shown = original.resize((max(1, round(original.width * scale)), max(1, round(original.height * scale))),
                            Image.Resampling.LANCZOS)
    sx, sy = shown.width / width, shown.height / height  # model-input pixels -> panel pixels
    font = ImageFont.load_default(size=max(12, panel // 14))
    label_h = round(font.size * 1.6)
    shape = (len(attention.row_labels), len(attention.col_labels))
    weights = np.asarray(attention.weights, dtype=np.float32).reshape(shape)[:, first:]
    lines = -(-len(weights) // columns)
    sheet = Image.new("RGB", (columns * (shown.width + 8) + 8, lines * (shown.height + label_h + 8) + 8), "white")
    for k, (word, row) in enumerate(zip(attention.row_labels, weights)):
        x, y = 8 + (k % columns) * (shown.width + 8), 8 + (k // columns) * (shown.height + label_h + 8)
        peak = int(row.argmax())
        tile = heat(shown, row, rows, cols)
        x0, y0, x1, y1 = boxes[peak]
        ImageDraw.Draw(tile).rectangle([x0 * sx, y0 * sy, x1 * sx - 1, y1 * sy - 1], outline=(0, 255, 255), width=2)
        sheet.paste(tile, (x, y + label_h))
        ImageDraw.Draw(sheet).text((x, y), f"{word.strip()}  {row[peak]:.2f}", fill="black", font=font)
    return sheet
