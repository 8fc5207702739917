"""Where a clip captioner looked, per word: a timeline over the sampled frames and a strip of the frames it
looked at most, each with the word's attention over its cells drawn as a heatmap (Pillow).

A video model's attention columns are (frame, cell) pairs labelled "f<t>@<seconds>s:r<row>c<col>:x0,y0,x1,y1"
(server/inputs/video.py): frame t shows the clip at that time, the cell is a box of the model's input frame. The
strip shows the clip's own frames at those times, decoded here as the server decodes them (PyAV for files,
Pillow for stills), the frame showing at each time; the client imports nothing of the server's decoding (the
layer rule: clients carry only the shared request/response contract).
"""

from __future__ import annotations

import io
from collections.abc import Sequence

import numpy as np
from PIL import Image, ImageDraw, ImageFont

from attnserve.clients.columns import GridCell, frame_cells
from attnserve.clients.overlay import heat
from attnserve.api.generation import AttentionMatrix

_BARS = " ▁▂▃▄▅▆▇█"


def parse_columns(labels: Sequence[str]) -> tuple[list[float], list[GridCell]]:
    """The frames' times and one frame's grid cells, from (frame, cell) column labels.

    Raises:
        ValueError: the labels are not whole frames of (frame, cell) columns (not a video model's attention).
    """
    found = frame_cells(labels)
    if found is None:
        raise ValueError("the attention columns are not whole frames of (frame, cell) columns (f<t>@<s>s:r<r>c<c>:...)")
    return found


def timelines(attention: AttentionMatrix) -> np.ndarray:
    """(words, frames): each row's attention summed over every frame's cells."""
    times, cells = parse_columns(attention.col_labels)
    weights = np.asarray(attention.weights, dtype=np.float32).reshape(len(attention.row_labels), len(times), len(cells))
    return weights.sum(-1)


def text_timelines(attention: AttentionMatrix) -> str:
    """One line per word: the word, a bar per frame (its share of the word's attention), the peak frame's time."""
    times, _ = parse_columns(attention.col_labels)
    lines, width = [], max((len(w.strip()) for w in attention.row_labels), default=0)
    for word, row in zip(attention.row_labels, timelines(attention)):
        bars = "".join(_BARS[min(int(v / max(row.max(), 1e-9) * (len(_BARS) - 1) + 0.5), len(_BARS) - 1)] for v in row)
        peak = int(row.argmax())
        lines.append(f"{word.strip():<{width}}  {bars}  peak {times[peak]:.2f} s ({row[peak]:.0%})")
    return "\n".join(lines)


def clip_frames(video, times: Sequence[float], side: int = 128) -> list[Image.Image]:
    """The clip's frames showing at `times`, `side` pixels square (squeezed as the server squeezes them, so
    the cells' boxes scale onto them). The server has checked the clip against its limits already.

    Args:
        video: the request's VideoInput (a file, or stills with their rate).

    Raises:
        NotImplementedError: a video file, and PyAV is not installed.
        ValueError: the file does not decode here.
    """
    if video.frames:
        images = [Image.open(io.BytesIO(f)) for f in video.frames]
        starts = np.arange(len(images)) / video.frames_per_second
    else:
        images, starts = _decode_file(video.data)
    index = np.clip(np.searchsorted(starts, np.asarray(times), side="right") - 1, 0, len(images) - 1)
    return [images[i].convert("RGB").resize((side, side), Image.Resampling.BILINEAR) for i in index]


def _decode_file(data: bytes) -> tuple[list[Image.Image], np.ndarray]:
    """Every frame of a video file and when it starts showing (the first at 0)."""
    try:
        import av
    except ImportError:
        raise NotImplementedError("drawing a clip's frames needs PyAV (pip install 'attnserve[video]')") from None
    try:
        with av.open(io.BytesIO(data)) as container:
            decoded = [(f.to_image(), float(f.time or 0.0)) for f in container.decode(video=0)]
    except av.FFmpegError as exc:
        raise ValueError(f"cannot decode the clip: {exc}") from None
    if not decoded:
        raise ValueError("the clip holds no frames")
    starts = np.maximum.accumulate(np.array([t for _, t in decoded]) - decoded[0][1])
    return [image for image, _ in decoded], starts


def render(frames: Sequence[Image.Image], attention: AttentionMatrix, top: int = 3, panel: int = 128) -> Image.Image:
    """One line per word: its label, its timeline as bars, and its `top` most-attended frames with heatmaps.

    Args:
        frames: the clip's frames at the times of the attention's columns, in order.
        attention: the response's attention (rows: words; columns: (frame, cell) pairs).
        panel: the longer side of each frame drawn, in pixels.
    """
    times, cells = parse_columns(attention.col_labels)
    if len(frames) != len(times):
        raise ValueError(f"{len(frames)} frames given for attention over {len(times)}")
    rows, cols = max(c.row for c in cells) + 1, max(c.col for c in cells) + 1
    weights = np.asarray(attention.weights, dtype=np.float32).reshape(len(attention.row_labels), len(times), -1)
    scale = panel / max(frames[0].size)
    shown = [f.convert("RGB").resize((max(1, round(f.width * scale)), max(1, round(f.height * scale))))
             for f in frames]
    font = ImageFont.load_default(size=12)
    label_w, bars_w, line_h = 110, 8 * len(times) + 8, shown[0].height + 24
    sheet = Image.new("RGB", (label_w + bars_w + top * (shown[0].width + 6) + 8,
                              len(weights) * (line_h + 6) + 6), "white")
    draw = ImageDraw.Draw(sheet)
    for k, (word, grid) in enumerate(zip(attention.row_labels, weights)):
        y = 6 + k * (line_h + 6)
        line = grid.sum(-1)  # (T,) the timeline
        draw.text((6, y + line_h // 2 - 6), word.strip(), fill="black", font=font)
        for t, value in enumerate(line):  # bars from the bottom of the line, full height = weight 1
            x = label_w + 8 * t
            draw.rectangle([x, y + line_h - 4 - round(value * (line_h - 8)), x + 5, y + line_h - 4], fill=(200, 60, 0))
        for j, t in enumerate(np.argsort(-line, kind="stable")[:top]):
            x = label_w + bars_w + j * (shown[0].width + 6)
            sheet.paste(heat(shown[t], grid[t], rows, cols), (x, y))
            draw.text((x, y + shown[0].height + 4), f"{times[t]:.2f} s  {line[t]:.0%}", fill="black", font=font)
    return sheet
