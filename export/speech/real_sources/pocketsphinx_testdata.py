"""PocketSphinx's test recordings (Debian `pocketsphinx-testdata`): the only microphone speech packages ship.

Two sets under /usr/share/pocketsphinx/test/data/, 16 kHz mono 16-bit WAV: `librivox/` (five sentences of
Sense and Sensibility read by a LibriVox volunteer) and `cards/` (five playing-card phrases from another
speaker). Each set's `*transcription` file has one line per clip, `<s> words </s> (clip id)`; the clip is
`<set>/<clip id>.wav`. The transcripts are lower case and write what was said ("a more a amiable").
"""

from __future__ import annotations

import pathlib
import re
from typing import Iterator

from attnserve.export.speech.real_sources import Clip

SOURCE = "pocketsphinx-testdata"
DATA = "usr/share/pocketsphinx/test/data"
# Set folder -> its transcript file and the speaker it holds.
SETS = {"librivox": ("transcription", "librivox_reader"), "cards": ("cards.transcription", "cards_speaker")}
_LINE = re.compile(r"^<s>\s*(.*?)\s*</s>\s*\(([\w.-]+)\)\s*$")


def transcripts(text: str) -> dict[str, str]:
    """Clip id -> its words, from a transcription file."""
    out = {}
    for line in text.splitlines():
        match = _LINE.match(line.strip())
        if match and match.group(1):
            out[match.group(2)] = " ".join(match.group(1).split())
    return out


def clips(root: pathlib.Path) -> Iterator[Clip]:
    """Every transcribed clip of both sets (`root`: the unpacked package)."""
    for folder, (transcript, speaker) in SETS.items():
        base = root / DATA / folder
        for name, text in transcripts((base / transcript).read_text("utf-8")).items():
            path = base / f"{name}.wav"
            if path.exists():
                yield Clip(SOURCE, f"{folder}/{name}", text, speaker, path.read_bytes(), "wav")
