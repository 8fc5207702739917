"""Flight of the Amazon Queen (Debian `flight-of-the-amazon-queen`): voice clips and their lines of text.

The CD version's data is one archive, `queen.1c` (format learnt from ScummVM's engines/queen). It opens
with "QTBL", a 6-byte version ("CEM10": CD, English), 2 spare bytes, a compression byte (1 = MP3) and a
table: a big-endian entry count, then per entry a 12-byte name, a bundle byte, offset and size (u32 BE).
Voice clips are `<name>.SB` entries, here MP3 streams. The text lives in two kinds of script:

- dialogues (`.DOG`, after a 20-byte header): a talk key and per-speaker tables of (id, string); the clip
  of string `id` said by the other person is `"%2d%4xP" % (key, id)` plus the segment number (below),
  Joe's are `...J`; the greeting lines use `SSSS` / `XXXX` in place of the id;
- cutaways (`.CUT`, after a 20-byte header): one sentence per scripted object, in object order; object
  i's clip is the cutaway's name padded with `_` to 5 characters, `%02d` % i and the segment number.

A sentence is cut into segments by `*` commands (two characters, or `*XY..(x,y)` with coordinates); the
k-th segment's clip ends in the hex digit k. Spaces in clip names are zeros.
"""

from __future__ import annotations

import pathlib
import re
import struct
from typing import Iterator

from attnserve.export.speech.real_sources import Clip

SOURCE = "flight-of-the-amazon-queen"
ARCHIVE = "usr/share/scummvm/flight-of-the-amazon-queen/queen.1c"
_HEADER = 20  # bytes before a .DOG or .CUT script's data
_COMMAND = re.compile(r"\*(XY\d\d\(\s*\d+\s*,\s*\d+\s*\)|..)", re.S)


def read_table(data: bytes) -> dict[str, tuple[int, int]]:
    """Entry name -> (offset, size) of a rebuilt (`QTBL`) archive.

    Raises:
        ValueError: if the data is not such an archive.
    """
    if data[:4] != b"QTBL":
        raise ValueError("not a rebuilt Queen archive (no QTBL header)")
    (count,) = struct.unpack_from(">H", data, 13)
    table, at = {}, 15
    for _ in range(count):
        name = data[at : at + 12].split(b"\0", 1)[0].decode("ascii")
        offset, size = struct.unpack_from(">II", data, at + 13)
        table[name] = (offset, size)
        at += 21
    return table


def read_string(data: bytes, offset: int, align: int = 2) -> tuple[str, int]:
    """A length-prefixed string at `offset` and the offset after it (aligned, as the engine reads)."""
    length = data[offset]
    offset += 1
    if not length:
        return "", offset
    text = data[offset : offset + length].decode("latin-1")
    return text, (offset + length + align - 1) & ~(align - 1)


def segments(sentence: str) -> list[tuple[int, str]]:
    """(segment number from 1, text) of a sentence cut at its `*` commands; empty segments left out."""
    out, start, number = [], 0, 1
    for match in _COMMAND.finditer(sentence):
        out.append((number, sentence[start : match.start()]))
        number += 1
        start = match.end()
    out.append((number, sentence[start:]))
    return [(n, text.strip()) for n, text in out if text.strip()]


def _speaker_table(data: bytes, offset: int, count: int) -> Iterator[tuple[int, str]]:
    for _ in range(count):
        offset += 2
        (line_id,) = struct.unpack_from(">h", data, offset)
        text, offset = read_string(data, offset + 2, align=4)
        yield line_id, text


def dialogue_lines(name: str, data: bytes) -> Iterator[tuple[str, str, str]]:
    """(clip prefix, sentence, character) of a `.DOG` script's entry (the 20-byte header included)."""
    d = data[_HEADER:]
    levels, _, key, joe_count, person_count = (abs(v) if i == 0 else v for i, v in
                                               enumerate(struct.unpack_from(">5h", d, 0)))
    person_at, _, person2_at = struct.unpack_from(">3H", d, 22)
    joe_at = 32 + levels * 96
    person = re.sub(r"\d+$", "", name.rsplit(".", 1)[0]) or name
    for line_id, text in _speaker_table(d, person_at, person_count):
        yield f"{key:2d}{line_id:4x}P", text, person
    for line_id, text in _speaker_table(d, joe_at, joe_count):
        yield f"{key:2d}{line_id:4x}J", text, "JOE"
    (no_greeting,) = struct.unpack_from(">H", d, joe_at + 2)
    if not no_greeting:
        yield f"{key:2d}SSSSJ", read_string(d, joe_at + 4)[0], "JOE"
    person2, at = read_string(d, person2_at)
    yield f"{key:2d}XXXXP", person2, person
    yield f"{key:2d}XXXXJ", read_string(d, at)[0], "JOE"


def cutaway_lines(name: str, data: bytes) -> Iterator[tuple[str, str, str]]:
    """(clip prefix, sentence, character) of a `.CUT` script's sentences; the speaker is not recorded."""
    d = data[_HEADER:]
    (objects,) = struct.unpack_from(">h", d, 2)
    (at,) = struct.unpack_from(">H", d, 8)
    _, at = read_string(d, at)  # the entry string (Joe's facing), not spoken
    base = name.rsplit(".", 1)[0].upper()
    base = (base + "_____")[:5] if len(base) < 5 else base
    for i in range(1, abs(objects) + 1):
        if at >= len(d):
            return
        sentence, at = read_string(d, at)
        if sentence and sentence != "*" and not sentence.startswith("#"):
            yield f"{base}{i:02d}", sentence, ""


def clips(root: pathlib.Path) -> Iterator[Clip]:
    """Every voice clip whose text is known, from the unpacked package at `root`."""
    data = (root / ARCHIVE).read_bytes()
    table = read_table(data)
    seen = set()
    for name in sorted(table):
        kind = name.rsplit(".", 1)[-1]
        if kind not in ("DOG", "CUT"):
            continue
        offset, size = table[name]
        reader = dialogue_lines if kind == "DOG" else cutaway_lines
        for prefix, sentence, character in reader(name, data[offset : offset + size]):
            for number, text in segments(sentence):
                key = f"{prefix}{number:x}".replace(" ", "0").upper()
                if key in seen or f"{key}.SB" not in table:
                    continue
                seen.add(key)
                at, length = table[f"{key}.SB"]
                yield Clip(SOURCE, key, text, character, data[at : at + length], "mp3")
