"""The gateway's JSON: results and model descriptions as the page reads them.

A result is its dataclass as JSON, plus `columns`, what each attention column stands for, read from its
label once here rather than in JavaScript: time spans for audio, pixel boxes for images, the frames' times
and one frame's pixel boxes for video.
"""

from __future__ import annotations

import dataclasses
import enum

from attnserve.clients import columns
from attnserve.api.generation import GenerationResult, ModelInfo


def result_json(result: GenerationResult) -> dict:
    """The result, with `columns` = {"kind": "text" | "time" | "grid" | "frames", ...} when it carries
    attention, and `glossary_rows`: for each glossary placement, the attention rows (output words) its tokens fall in."""
    body = plain(dataclasses.asdict(result))
    body["columns"] = _columns(result.attention.col_labels) if result.attention is not None else None
    body["glossary_rows"] = _glossary_rows(result)
    return body


def model_json(info: ModelInfo) -> dict:
    return plain(dataclasses.asdict(info))


def error_json(code: str, message: str) -> dict:
    return {"error": {"code": code, "message": message}}


def _glossary_rows(result: GenerationResult) -> list[list[int]]:
    """Rows of each placed term. A word row's label is its pieces joined (word markers dropped), so the
    labels and the pieces spell the same characters: a token's rows are those its characters fall in.
    Empty lists when they do not (no attention, or labels that are not such joins)."""
    rows: list[list[int]] = [[] for _ in result.glossary]
    if result.attention is None:
        return rows
    labels = result.attention.row_labels
    pieces = [t.piece.replace("\u2581", "") for t in result.tokens]
    if "".join(labels) != "".join(pieces):
        return rows
    row_at = [r for r, label in enumerate(labels) for _ in label]  # character -> row
    starts = [0]
    for piece in pieces:
        starts.append(starts[-1] + len(piece))
    for j, g in enumerate(result.glossary):
        if g.output_start >= 0:
            rows[j] = sorted({row_at[c] for c in range(starts[g.output_start], starts[g.output_end])})
    return rows


def _columns(labels: list[str]) -> dict:
    spans = columns.time_spans(labels)
    if spans is not None:
        return {"kind": "time", "spans": [[s.start, s.end] for s in spans]}
    frames = columns.frame_cells(labels)
    if frames is not None:
        return {"kind": "frames", "times": frames[0], "boxes": [list(c.box) for c in frames[1]]}
    cells = columns.grid_cells(labels)
    if cells is not None:
        first = columns.leading_columns(labels)  # the column of the first cell: 1 after a ViT's "cls" column
        return {"kind": "grid", "boxes": [list(c.box) for c in cells], **({"first": first} if first else {})}
    return {"kind": "text"}


def plain(value):
    """Enums as their values, recursively (asdict leaves them as members)."""
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    return value
