"""Readers of the recorded, transcribed English speech that Debian packages ship (docs/speech-corpus.md).

One module per source. Each turns the unpacked package into `Clip`s: the voice file's audio as the game or
package stores it, the line of text it speaks, and who speaks it. `real.py` pairs, filters and writes them.
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class Clip:
    """One recorded line, before normalisation and resampling."""

    source: str  # the Debian package it comes from
    key: str  # the voice file's name inside the source (unique per source)
    text: str  # the line as the source writes it (markup removed)
    character: str  # who speaks it, as the source names them ("" when unknown)
    audio: bytes  # encoded as `codec` says
    codec: str  # "mp3", "u8" (raw unsigned 8-bit mono), "wav", "ogg"
    sample_rate: int = 0  # raw codecs only
