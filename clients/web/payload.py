"""The gateway's JSON: results and model descriptions as the page reads them.

A result is its dataclass as JSON, plus `columns`, what each attention column stands for, read from its
label once here rather than in JavaScript: time spans for audio, pixel boxes for images, the frames' times
and one frame's pixel boxes for video.
"""

from __future__ import annotations

import dataclasses
import enum

from attnserve.clients import columns
from attnserve.server.generation import GenerationResult, ModelInfo


def result_json(result: GenerationResult) -> dict:
    """The result, with `columns` = {"kind": "text" | "time" | "grid" | "frames", ...} when it carries attention."""
    body = plain(dataclasses.asdict(result))
    body["columns"] = _columns(result.attention.col_labels) if result.attention is not None else None
    return body


def model_json(info: ModelInfo) -> dict:
    return plain(dataclasses.asdict(info))


def error_json(code: str, message: str) -> dict:
    return {"error": {"code": code, "message": message}}


def _columns(labels: list[str]) -> dict:
    spans = columns.time_spans(labels)
    if spans is not None:
        return {"kind": "time", "spans": [[s.start, s.end] for s in spans]}
    frames = columns.frame_cells(labels)
    if frames is not None:
        return {"kind": "frames", "times": frames[0], "boxes": [list(c.box) for c in frames[1]]}
    cells = columns.grid_cells(labels)
    if cells is not None:
        return {"kind": "grid", "boxes": [list(c.box) for c in cells]}
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
