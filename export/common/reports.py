"""The closing step every evaluation and benchmark script shares: its JSON report printed, and kept."""

from __future__ import annotations

import json
import pathlib


def emit(report: dict, out: pathlib.Path | None, indent: int = 2, ensure_ascii: bool = True) -> None:
    """Prints `report` as JSON and, given `out`, writes it there too (with a final newline)."""
    text = json.dumps(report, indent=indent, ensure_ascii=ensure_ascii)
    if out:
        out.write_text(text + "\n")
    print(text)
