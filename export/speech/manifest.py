"""The manifest: one JSON object per line per split (``<split>.jsonl``), in plan order.

A row (all times in seconds, relative to the start of the WAV file)::

    {"id": "train_000042", "path": "train/train_000042.wav",
     "text": "he asked me for directions",          # transcript: ALPHABET only
     "spoken": "He asked me for directions.",       # what the engine read
     "source": "hsk/level2", "split": "train",
     "engine": "espeak-ng", "voice": "en-gb-x-rp+f3",
     "voice_settings": {"rate": 181, "pitch": 73, "range": 40},
     "augmentation": {"speed": 1.043, "peak_db": -7.2},   # {} = none
     "duration": 1.93, "sample_rate": 16000,
     "words": [["he", 0.112, 0.236], ["asked", 0.236, 0.581], ...],
     "word_times": "espeak_events",    # espeak_events | flite_segments | festival_word_end | piper_alignment
     "inexact_words": 0}               # words whose time was split from a shared item or estimated

``validate`` is the schema; ``read`` validates every row it returns.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Iterable

from .text import ALPHABET

# "none": recorded speech (export/speech/real.py) comes without word times; its `words` is empty.
WORD_TIME_SOURCES = ("espeak_events", "flite_segments", "festival_word_end", "piper_alignment", "none")
FIELDS = {
    "id": str, "path": str, "text": str, "spoken": str, "source": str, "split": str, "engine": str,
    "voice": str, "voice_settings": dict, "augmentation": dict, "duration": float, "sample_rate": int,
    "words": list, "word_times": str, "inexact_words": int,
}
# Recorded speech only: who speaks (as the source names them) and the source's licence.
OPTIONAL_FIELDS = {"character": str, "licence": str}
_TOLERANCE = 1e-3  # seconds: rounding of stored times


def validate(row: dict) -> None:
    """Check one manifest row.

    Raises:
        ValueError: naming the first problem found.
    """
    for name, kind in FIELDS.items():
        if name not in row:
            raise ValueError(f"{row.get('id', '?')}: missing field {name!r}")
        value = row[name]
        if not (isinstance(value, kind) or (kind is float and isinstance(value, int))):
            raise ValueError(f"{row['id']}: {name} is {type(value).__name__}, expected {kind.__name__}")
    if set(row) - set(FIELDS) - set(OPTIONAL_FIELDS):
        raise ValueError(f"{row['id']}: unknown fields {sorted(set(row) - set(FIELDS) - set(OPTIONAL_FIELDS))}")
    for name, kind in OPTIONAL_FIELDS.items():
        if name in row and not isinstance(row[name], kind):
            raise ValueError(f"{row['id']}: {name} is {type(row[name]).__name__}, expected {kind.__name__}")
    if not row["text"] or set(row["text"]) - set(ALPHABET) or row["text"] != " ".join(row["text"].split()):
        raise ValueError(f"{row['id']}: text {row['text']!r} is not normalised")
    if row["word_times"] not in WORD_TIME_SOURCES:
        raise ValueError(f"{row['id']}: unknown word_times {row['word_times']!r}")
    words = row["words"]
    if row["word_times"] == "none":
        if words:
            raise ValueError(f"{row['id']}: word_times 'none' with words")
        return
    if [w[0] for w in words] != row["text"].split():
        raise ValueError(f"{row['id']}: words do not spell the text")
    previous_end = 0.0
    for word, start, end in words:
        if not (0.0 <= start <= end <= row["duration"] + _TOLERANCE):
            raise ValueError(f"{row['id']}: {word!r} at {start}-{end} outside 0-{row['duration']}")
        if start < previous_end - _TOLERANCE:
            raise ValueError(f"{row['id']}: {word!r} starts before the previous word ends")
        previous_end = end


def write(path: Path, rows: Iterable[dict]) -> int:
    """Write validated ``rows`` to ``path`` (JSONL); return how many."""
    n = 0
    with open(path, "w", encoding="utf-8") as f:
        for row in rows:
            validate(row)
            f.write(json.dumps(row, ensure_ascii=False, sort_keys=False) + "\n")
            n += 1
    return n


def read(path: Path) -> list[dict]:
    """The validated rows of a manifest file."""
    rows = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            row = json.loads(line)
            validate(row)
            rows.append(row)
    return rows
