"""Drascula: The Vampire Strikes Back (Debian `drascula`): English voice clips and their lines.

Clips are `en/<prefix><n>.ALS`: raw unsigned 8-bit mono PCM at 11,025 Hz. Their text is in
`drascula.dat` (written by ScummVM's devtools/create_drascula; format learnt there): "DRASCULA", a version
byte, fixed-size tables that each start with a big-endian count (their entry sizes are `_TABLES`), a
language count, then string tables: a count, and per language a u16 size, 2 padding bytes and per string
a u16 step (to the next string), the NUL-terminated string and padding. Language 0 is English.
A clip's prefix names its string table and speaker; n is the line's index in it.
"""

from __future__ import annotations

import pathlib
import re
import struct
from typing import Iterator

from attnserve.export.speech.real_sources import Clip

SOURCE = "drascula"
FOLDER = "usr/share/scummvm/drascula/en"
SAMPLE_RATE = 11025
# Entry bytes of the tables before the text: char map, item locations, polygon x/y, verb bar, menu x/y,
# frame x, candles, pianist, drunk, room pre-updates, room updates, room actions, talk sequences.
_TABLES = (4, 4, 4, 2, 4, 2, 4, 2, 2, 20, 20, 10, 8)
# Clip prefix -> (string table, speaker).
PREFIXES = {"": (0, "john"), "D": (1, "drascula"), "B": (2, "bartender"), "BJ": (3, "bj"), "E": (4, "drunk"),
            "I": (5, "igor"), "L": (6, "lost_man"), "P": (7, "pianist"), "T": (8, "waiter"),
            "VB": (9, "von_braun")}
_NAME = re.compile(r"^([A-Z]*)(\d+)\.ALS$", re.I)


def string_tables(data: bytes, language: int = 0) -> list[list[str]]:
    """Every string table of `drascula.dat` in one language.

    Raises:
        ValueError: if the data is not a drascula.dat.
    """
    if data[:8] != b"DRASCULA":
        raise ValueError("not a drascula.dat (no DRASCULA header)")
    at = 9
    for size in _TABLES:
        (count,) = struct.unpack_from(">H", data, at)
        at += 2 + count * size
    (languages,) = struct.unpack_from(">H", data, at)
    at += 2
    tables = []
    while at < len(data):
        (count,) = struct.unpack_from(">H", data, at)
        at += 2
        for lang in range(languages):
            at += 4  # the table's size and padding
            strings = []
            for _ in range(count):
                (step,) = struct.unpack_from(">H", data, at)
                strings.append(data[at + 2 : at + step].split(b"\0", 1)[0].decode("latin-1"))
                at += step
            if lang == language:
                tables.append(strings)
    return tables


def clips(root: pathlib.Path) -> Iterator[Clip]:
    """Every English clip whose line is known, from the unpacked package at `root`."""
    folder = root / FOLDER
    tables = string_tables((folder / "drascula.dat").read_bytes())
    for path in sorted(folder.iterdir()):
        match = _NAME.match(path.name)
        if not match or match.group(1).upper() not in PREFIXES:
            continue
        table, speaker = PREFIXES[match.group(1).upper()]
        index = int(match.group(2))
        if index < len(tables[table]) and tables[table][index].strip():
            yield Clip(SOURCE, path.name.upper(), tables[table][index], speaker, path.read_bytes(), "u8",
                       SAMPLE_RATE)
