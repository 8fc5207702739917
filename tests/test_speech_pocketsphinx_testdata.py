"""PocketSphinx's test recordings as the microphone test split: a package tree written here in its layout,
and the real package where the machine has it (unpacked under $ATTNSERVE_REAL_SPEECH_PKG, or installed)."""

from __future__ import annotations

import pytest

from attnserve.export.speech.real_sources import pocketsphinx_testdata as ps
from real_packages import package_root

LIBRIVOX = """<s> he was not an ill disposed young man </s> (sense-0880)
<s> had he married a more a amiable woman </s> (sense-0920)
<s> </s> (sense-0930)
"""
CARDS = "<s> ten of clubs  </s> (001)\n<s> five five </s> (404)\n"


def write_package(root):
    librivox, cards = root / ps.DATA / "librivox", root / ps.DATA / "cards"
    librivox.mkdir(parents=True)
    cards.mkdir()
    (librivox / "transcription").write_text(LIBRIVOX)
    (cards / "cards.transcription").write_text(CARDS)
    for path in (librivox / "sense-0880.wav", librivox / "sense-0920.wav", librivox / "sense-0930.wav",
                 cards / "001.wav"):  # 404 has a line and no clip
        path.write_bytes(b"RIFF " + path.name.encode())


def test_transcripts_read_words_and_ids_and_skip_empty_lines():
    assert ps.transcripts(LIBRIVOX) == {"sense-0880": "he was not an ill disposed young man",
                                        "sense-0920": "had he married a more a amiable woman"}
    assert ps.transcripts(CARDS) == {"001": "ten of clubs", "404": "five five"}


def test_clips_pair_both_sets_with_their_wavs(tmp_path):
    write_package(tmp_path)
    clips = list(ps.clips(tmp_path))
    assert [(c.key, c.text, c.character, c.codec, c.audio) for c in clips] == [
        ("librivox/sense-0880", "he was not an ill disposed young man", "librivox_reader", "wav", b"RIFF sense-0880.wav"),
        ("librivox/sense-0920", "had he married a more a amiable woman", "librivox_reader", "wav", b"RIFF sense-0920.wav"),
        ("cards/001", "ten of clubs", "cards_speaker", "wav", b"RIFF 001.wav"),
    ]


REAL = package_root(ps.SOURCE, ps.DATA + "/librivox/transcription")


@pytest.mark.skipif(REAL is None, reason="pocketsphinx-testdata not here")
def test_real_package_has_ten_microphone_clips():
    clips = list(ps.clips(REAL))
    assert len(clips) == 10 and {c.character for c in clips} == {"librivox_reader", "cards_speaker"}
    assert clips[1].text == "he was not an ill disposed young man"
    assert all(c.audio[:4] == b"RIFF" for c in clips)
