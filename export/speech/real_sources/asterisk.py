"""Asterisk's English core prompts (Debian `asterisk-core-sounds-en-wav` + `asterisk-core-sounds-en`).

One professional voice, 16-bit WAV at 8 kHz, under /usr/share/asterisk/sounds/en_US_f_Allison/ (some in sub-folders:
`digits/1.wav`); the transcript file `core-sounds-en.txt(.gz)` has a `name: text` line per prompt (name
with its sub-folder, no extension). Prompts that are tones or sound effects have bracketed text.
"""

from __future__ import annotations

import gzip
import pathlib
import re
from typing import Iterator

from attnserve.export.speech.real_sources import Clip

SOURCE = "asterisk-core-sounds-en"
SOUNDS = "usr/share/asterisk/sounds/en_US_f_Allison"
TRANSCRIPT = "usr/share/doc/asterisk-core-sounds-en/core-sounds-en.txt.gz"
_LINE = re.compile(r"^([\w/-]+)\s*:\s*(.+)$")


def transcripts(text: str) -> dict[str, str]:
    """Prompt name -> its text, from core-sounds-en.txt."""
    out = {}
    for line in text.splitlines():
        match = _LINE.match(line.strip())
        if match:
            out[match.group(1)] = match.group(2).strip()
    return out


def _read_transcript(path: pathlib.Path) -> str:
    data = path.read_bytes()
    return (gzip.decompress(data) if path.suffix == ".gz" else data).decode("utf-8", "replace")


def clips(wav_root: pathlib.Path, text_root: pathlib.Path) -> Iterator[Clip]:
    """Every prompt with a WAV file and a line of text (`wav_root`, `text_root`: the unpacked packages)."""
    lines = transcripts(_read_transcript(text_root / TRANSCRIPT))
    sounds = wav_root / SOUNDS
    for name, text in sorted(lines.items()):
        path = sounds / f"{name}.wav"
        if path.exists() and not text.startswith("["):
            yield Clip(SOURCE, name, text, "asterisk_voice", path.read_bytes(), "wav")
