"""Warzone 2100's tutorial narrator (Debian `warzone2100-data`).

`base.wz` is a zip archive. Its `script/tutorial.js` lists the tutorial's console lines as JavaScript objects,
`{"audio": "tutN.ogg", ..., "message": _("text"), ...}`, each naming the Ogg Vorbis clip (11,025 Hz, mono,
under `audio/tutorial/`) that speaks it; a line whose message is `undefined` has no text. One narrator.
"""

from __future__ import annotations

import pathlib
import re
import zipfile
from typing import Iterator

from attnserve.export.speech.real_sources import Clip

SOURCE = "warzone2100-data"
ARCHIVE = "usr/share/games/warzone2100/base.wz"
SCRIPT = "script/tutorial.js"
AUDIO = "audio/tutorial/"
_LINE = re.compile(r'\{\s*"audio"\s*:\s*"(tut\d+\.ogg)"[^{}]*?"message"\s*:\s*(?:_\(\s*"((?:[^"\\]|\\.)*)"\s*\)|undefined)')
_ESCAPE = re.compile(r"\\(.)")


def lines(script: str) -> dict[str, str]:
    """Clip name -> its message, for every console line of the script that has one."""
    return {audio: _ESCAPE.sub(r"\1", message) for audio, message in _LINE.findall(script) if message}


def clips(root: pathlib.Path) -> Iterator[Clip]:
    """Every tutorial line with a message and a clip (`root`: the unpacked package)."""
    with zipfile.ZipFile(root / ARCHIVE) as archive:
        names = set(archive.namelist())
        for audio, text in lines(archive.read(SCRIPT).decode("utf-8")).items():
            if AUDIO + audio in names:
                yield Clip(SOURCE, audio.removesuffix(".ogg"), text, "narrator", archive.read(AUDIO + audio), "ogg")
