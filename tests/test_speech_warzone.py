"""Warzone 2100's tutorial reader: a base.wz written here in the game's layout, and the real package where the
machine has it (unpacked under $ATTNSERVE_REAL_SPEECH_PKG/warzone2100-data, or installed)."""

from __future__ import annotations

import pathlib
import zipfile

import pytest

from attnserve.export.speech.real_sources import warzone
from real_packages import package_root

SCRIPT = r'''
function setUpConsoleAndAudioVar()
{
	consoleVar = [
		{"audio": "tut1.ogg", "clear": false, "message": _("Oil resources are key to your success"), "state": 0, "wait": 1},
		{"audio": "tut2.ogg", "clear": false, "message": undefined, "state": 1, "wait": 0},
		{"audio": "tut3.ogg", "clear": true, "message": _("You\'re ready, \"commander\""), "state": 2, "wait": 3},
		{"audio": "tut4.ogg", "clear": false, "message": _("This line has no clip in the archive"), "state": 2, "wait": 3},
	];
}
'''


def write_archive(root: pathlib.Path) -> None:
    path = root / warzone.ARCHIVE
    path.parent.mkdir(parents=True)
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr(warzone.SCRIPT, SCRIPT)
        for n in (1, 2, 3):
            archive.writestr(f"{warzone.AUDIO}tut{n}.ogg", f"OggS clip {n}")


def test_lines_pair_clips_with_messages_and_unescape_them():
    assert warzone.lines(SCRIPT) == {
        "tut1.ogg": "Oil resources are key to your success",
        "tut3.ogg": "You're ready, \"commander\"",
        "tut4.ogg": "This line has no clip in the archive",
    }


def test_clips_skip_lines_without_text_or_audio(tmp_path):
    write_archive(tmp_path)
    clips = list(warzone.clips(tmp_path))
    assert [(c.key, c.text, c.audio, c.codec, c.character) for c in clips] == [
        ("tut1", "Oil resources are key to your success", b"OggS clip 1", "ogg", "narrator"),
        ("tut3", "You're ready, \"commander\"", b"OggS clip 3", "ogg", "narrator"),
    ]


REAL = package_root(warzone.SOURCE, warzone.ARCHIVE)


@pytest.mark.skipif(REAL is None, reason="warzone2100-data not here")
def test_real_tutorial_lines():
    clips = list(warzone.clips(REAL))
    assert len(clips) == 42
    assert clips[0].text == "In this training session you'll learn how to build an effective base"
    assert all(c.audio.startswith(b"OggS") for c in clips)
