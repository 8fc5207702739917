"""The recorded-speech corpus: each source's reader on a small archive written here in its format, the
builder's filters and manifest rows, the training channels, and the real packages where the machine has them
(unpacked under $ATTNSERVE_REAL_SPEECH_PKG/<package>, as export/speech/real.py leaves them, or installed)."""

from __future__ import annotations

import gzip
import io
import json
import shutil
import struct
import wave

import numpy as np
import pytest

from attnserve.export.speech import channel, manifest, real
from attnserve.export.speech.real_sources import Clip, asterisk, drascula, queen
from real_packages import package_root

HAS_SOX = shutil.which("sox") is not None


# --- Flight of the Amazon Queen -------------------------------------------------------------------------

def _string(text: str, align: int, at: int) -> bytes:
    """A length-prefixed string starting at offset `at`, padded as the engine skips it."""
    raw = bytes([len(text)]) + text.encode("latin-1")
    end = (at + len(raw) + align - 1) & ~(align - 1)
    return raw + b"\0" * (end - at - len(raw))


def _dog(key: int, person: list[tuple[int, str]], joe: list[tuple[int, str]], greeting: str,
         person2: str, joe2: str) -> bytes:
    levels = 1
    joe_at = 32 + levels * 96
    d = bytearray(joe_at)

    def table(entries, start):
        out = bytearray()
        for line_id, text in entries:
            out += b"\0\0" + struct.pack(">h", line_id)
            out += _string(text, 4, start + len(out))
        return out

    # Joe's table: its first entry (id 0, "no greeting" false) is the greeting the engine also reads alone.
    joe_entries = table([(0, greeting), *joe], joe_at)
    person_at = joe_at + len(joe_entries)
    person_entries = table(person, person_at)
    person2_at = person_at + len(person_entries)
    tail = _string(person2, 2, person2_at)
    tail += _string(joe2, 2, person2_at + len(tail))
    struct.pack_into(">5h", d, 0, -levels, 7, key, len(joe) + 1, len(person))
    struct.pack_into(">3H", d, 22, person_at, 0, person2_at)
    body = d + joe_entries + person_entries + tail
    return b"\0" * 20 + bytes(body)


def _cut(sentences: list[str]) -> bytes:
    d = bytearray(12 + 34 * len(sentences))
    at = len(d)
    struct.pack_into(">hhhHHH", d, 0, 0, len(sentences), 0, 0, at, 0)
    text = _string("*FL", 2, at)
    for sentence in sentences:
        text += _string(sentence, 2, at + len(text))
    return b"\0" * 20 + bytes(d + text)


def _queen_archive(entries: dict[str, bytes]) -> bytes:
    names = sorted(entries)
    header = b"QTBL" + b"CEM10\0" + b"\0\0" + b"\x01" + struct.pack(">H", len(names))
    offset = len(header) + 21 * len(names)
    table, blobs = b"", b""
    for name in names:
        table += name.encode().ljust(12, b"\0") + b"\x01" + struct.pack(">II", offset + len(blobs), len(entries[name]))
        blobs += entries[name]
    return header + table + blobs


def test_queen_pairs_dialogue_and_cutaway_clips(tmp_path):
    dog = _dog(2, person=[(6, "You're asking for trouble King.*FRI'm going to run you out of town.")],
               joe=[(7, "That's not true!")], greeting="Hello there.", person2="Back again?", joe2="Yes.")
    cut = _cut(["It's the blueprint.", "*", "It can fly."])
    entries = {"AND1.DOG": dog, "BLUEP.CUT": cut}
    for name in ("020006P1", "020006P2", "020007J1", "02SSSSJ1", "02XXXXP1", "BLUEP011", "BLUEP031"):
        entries[f"{name}.SB"] = f"mp3 of {name}".encode()
    path = tmp_path / queen.ARCHIVE
    path.parent.mkdir(parents=True)
    path.write_bytes(_queen_archive(entries))
    clips = {c.key: c for c in queen.clips(tmp_path)}
    assert {k: (c.text, c.character) for k, c in clips.items()} == {
        "020006P1": ("You're asking for trouble King.", "AND"),
        "020006P2": ("I'm going to run you out of town.", "AND"),
        "020007J1": ("That's not true!", "JOE"),
        "02SSSSJ1": ("Hello there.", "JOE"),
        "02XXXXP1": ("Back again?", "AND"),
        "BLUEP011": ("It's the blueprint.", ""),
        "BLUEP031": ("It can fly.", ""),
    }
    assert clips["BLUEP031"].audio == b"mp3 of BLUEP031" and clips["BLUEP031"].codec == "mp3"


def test_queen_segments_cut_at_commands():
    assert queen.segments("One.*FLTwo.*XY00(237,112)Three.") == [(1, "One."), (2, "Two."), (3, "Three.")]
    assert queen.segments("*WTAfter a pause.") == [(2, "After a pause.")]
    with pytest.raises(ValueError, match="QTBL"):
        queen.read_table(b"NOPE" + b"\0" * 20)


# --- Drascula -------------------------------------------------------------------------------------------

def _drascula_dat(tables: list[list[list[str]]]) -> bytes:
    """tables[t][lang] -> strings; the fixed-size tables before the text are empty."""
    out = bytearray(b"DRASCULA\x06")
    for _ in drascula._TABLES:
        out += struct.pack(">H", 0)
    out += struct.pack(">H", len(tables[0]))
    for table in tables:
        out += struct.pack(">H", len(table[0]))
        for strings in table:
            out += struct.pack(">H", 0) + b"\0\0"
            for s in strings:
                raw = s.encode("latin-1") + b"\0"
                pad = 4 - (len(raw) + 2) % 4
                out += struct.pack(">H", len(raw) + pad + 2) + raw + b"\0" * pad
    return bytes(out)


def test_drascula_reads_english_lines_per_speaker(tmp_path):
    folder = tmp_path / drascula.FOLDER
    folder.mkdir(parents=True)
    text = [["ZERO", "THAT'S A BIG DOOR"], ["CERO", "ES UNA PUERTA"]]
    textd = [["GOOD EVENING", "YOU FOOL"], ["BUENAS NOCHES", "TONTO"]]
    (folder / "drascula.dat").write_bytes(_drascula_dat([text, textd]))
    for name in ("1.ALS", "D0.ALS", "D1.ALS", "X3.ALS", "7.ALS"):
        (folder / name).write_bytes(bytes([128, 140, 120]))
    clips = {c.key: c for c in drascula.clips(tmp_path)}
    assert {k: (c.text, c.character) for k, c in clips.items()} == {
        "1.ALS": ("THAT'S A BIG DOOR", "john"), "D0.ALS": ("GOOD EVENING", "drascula"),
        "D1.ALS": ("YOU FOOL", "drascula")}
    assert clips["1.ALS"].codec == "u8" and clips["1.ALS"].sample_rate == 11025


# --- Asterisk -------------------------------------------------------------------------------------------

def _wav(samples: np.ndarray, rate: int) -> bytes:
    buffer = io.BytesIO()
    with wave.open(buffer, "wb") as f:
        f.setnchannels(1)
        f.setsampwidth(2)
        f.setframerate(rate)
        f.writeframes(samples.astype("<i2").tobytes())
    return buffer.getvalue()


def test_asterisk_pairs_prompts_and_skips_tones(tmp_path):
    sounds = tmp_path / asterisk.SOUNDS
    (sounds / "digits").mkdir(parents=True)
    for name in ("hello", "beep", "digits/1"):
        (sounds / f"{name}.wav").write_bytes(_wav(np.zeros(800), 8000))
    transcript = tmp_path / asterisk.TRANSCRIPT
    transcript.parent.mkdir(parents=True)
    transcript.write_bytes(gzip.compress(b"; header\nhello: Hello.\nbeep: [a beep]\ndigits/1: one\nmissing: gone\n"))
    clips = list(asterisk.clips(tmp_path, tmp_path))
    assert [(c.key, c.text) for c in clips] == [("digits/1", "one"), ("hello", "Hello.")]


# --- the builder ----------------------------------------------------------------------------------------

def test_transcripts_are_normalised_or_refused():
    assert real.transcript("THAT'S THE SECOND BIGGEST DOOR...") == "that's the second biggest door"
    assert real.transcript("Well-known, isn't it?") == "well known isn't it"
    assert real.transcript("Speeds of up to 100 miles") is None  # digits: no unique reading
    assert real.transcript("<ARGH>") is None
    assert real.transcript("the factory manufactures the new unit(s)") is None


def _tone_clip(seconds: float, text: str) -> Clip:
    t = np.arange(int(11025 * seconds)) / 11025
    u8 = (128 + 100 * np.sin(2 * np.pi * 300 * t)).astype(np.uint8)
    return Clip("drascula", "1.ALS", text, "john", u8.tobytes(), "u8", 11025)


@pytest.mark.skipif(not HAS_SOX, reason="sox is not installed")
def test_prepare_resamples_and_drops_implausible_rates(tmp_path):
    kept = real.prepare(_tone_clip(2.0, "i have another coin inside"))  # 26 characters in 2 s: plausible
    assert kept.reason is None and abs(len(kept.samples) / 16000 - 2.0) < 0.01
    assert real.prepare(_tone_clip(6.0, "hi")).reason == "implausible_rate"  # a laugh or a grunt
    assert real.prepare(_tone_clip(2.0, "it costs 5 coins")).reason == "no_transcript"
    row = real.row_of(kept, "test_real_heldout", 3)
    manifest.validate(row)
    assert (row["id"], row["character"], row["word_times"], row["words"]) == ("test_real_heldout_000003", "john", "none", [])
    real.write_wav(tmp_path / row["path"], kept.samples)
    with wave.open(str(tmp_path / row["path"])) as f:
        assert (f.getframerate(), f.getnframes()) == (16000, len(kept.samples))


def test_heldout_sources_and_dev_characters_split_apart():
    clip = lambda source, character, key="k": Clip(source, key, "t", character, b"", "wav")  # noqa: E731
    assert real.split_of(clip("drascula", "john")) == "test_real_heldout"
    assert real.split_of(clip("asterisk-core-sounds-en", "asterisk_voice")) == "test_real_heldout"
    assert real.split_of(clip("pocketsphinx-testdata", "cards_speaker")) == "test_microphone"
    assert real.split_of(clip("flight-of-the-amazon-queen", real.DEV_CHARACTERS[0])) == "dev"
    assert real.split_of(clip("flight-of-the-amazon-queen", "JOE")) == "train"
    sky = "beneath-a-steel-sky"
    assert real.split_of(clip(sky, "", f"{real.DEV_STEEL_SKY_SECTION}-0012")) == "dev"
    assert real.split_of(clip(sky, "", "1-0012")) == "train"
    # Only the section decides: line 5 of another section is not the held-out section 5.
    assert real.split_of(clip(sky, "", "2-0005")) == "train"


def test_manifest_refuses_words_without_times():
    row = {"id": "x", "path": "x.wav", "text": "hello", "spoken": "Hello.", "source": "s", "split": "train",
           "engine": "recorded", "voice": "s:a", "voice_settings": {}, "augmentation": {}, "duration": 1.0,
           "sample_rate": 16000, "words": [["hello", 0.0, 0.5]], "word_times": "none", "inexact_words": 0}
    with pytest.raises(ValueError, match="none"):
        manifest.validate(row)
    manifest.validate({**row, "words": []})
    with pytest.raises(ValueError, match="unknown fields"):
        manifest.validate({**row, "words": [], "speaker": "a"})


# --- channels -------------------------------------------------------------------------------------------

@pytest.mark.skipif(not HAS_SOX, reason="sox is not installed")
@pytest.mark.parametrize("codec", sorted(channel.CODECS))
def test_channel_codecs_keep_length_and_are_seeded(codec):
    t = np.arange(16000) / 16000
    x = (8000 * np.sin(2 * np.pi * 440 * t) * (1 + np.sin(2 * np.pi * 3 * t))).astype(np.int16)
    c = channel.Channel(codec=codec, bitrate=24, highpass=100, lowpass=4000, noise_snr=15.0, peak_db=-6.0)
    y = channel.apply(x, c, seed=3)
    assert len(y) == len(x) and y.dtype == np.int16
    assert abs(20 * np.log10(np.abs(y).max() / 32767) + 6.0) < 0.1
    assert np.array_equal(y, channel.apply(x, c, seed=3))
    assert not np.array_equal(y, channel.apply(x, c, seed=4))  # the noise follows the seed
    # The signal survives the codec: its 440 Hz tone stays the loudest band.
    spectrum = np.abs(np.fft.rfft(y.astype(float)))
    assert abs(np.argmax(spectrum) - 440) < 10


@pytest.mark.skipif(not HAS_SOX, reason="sox is not installed")
def test_channel_speed_and_band_change_length_and_spectrum():
    x = (np.random.default_rng(0).standard_normal(16000) * 3000).astype(np.int16)
    y = channel.apply(x, channel.Channel(speed=0.9, highpass=400, lowpass=3000), seed=0)
    assert abs(len(y) - 16000 / 0.9) < 50
    spectrum = np.abs(np.fft.rfft(y.astype(float)))
    freqs = np.fft.rfftfreq(len(y), 1 / 16000)
    assert spectrum[freqs > 4000].mean() < 0.05 * spectrum[(freqs > 500) & (freqs < 2500)].mean()


@pytest.mark.skipif(shutil.which("dpkg-deb") is None, reason="dpkg-deb is not installed")
def test_fetch_unpacks_into_a_fresh_output_folder(tmp_path):
    """A first build has no `pkg/` folder yet: fetch makes it (dpkg-deb -x makes only the last folder)."""
    import subprocess

    tree = tmp_path / "src"
    (tree / "DEBIAN").mkdir(parents=True)
    (tree / "DEBIAN" / "control").write_text(
        "Package: tiny-voice\nVersion: 1.0\nArchitecture: all\nMaintainer: t <t@t>\nDescription: t\n")
    (tree / "usr/share/tiny").mkdir(parents=True)
    (tree / "usr/share/tiny/line.txt").write_text("hello")
    out = tmp_path / "fresh"
    (out / "debs").mkdir(parents=True)
    subprocess.run(["dpkg-deb", "-b", str(tree), str(out / "debs" / "tiny-voice_1.0_all.deb")], check=True,
                   capture_output=True)
    root = real.fetch(out, "tiny-voice")
    assert root == out / "pkg" / "tiny-voice"
    assert (root / "usr/share/tiny/line.txt").read_text() == "hello"
    assert real.fetch(out, "tiny-voice") == root  # unpacked once


# --- the real packages ----------------------------------------------------------------------------------

QUEEN = package_root("flight-of-the-amazon-queen", queen.ARCHIVE)
DRASCULA = package_root("drascula", drascula.FOLDER + "/drascula.dat")


@pytest.mark.skipif(QUEEN is None, reason="Amazon Queen package not here")
def test_real_queen_package_pairs_thousands_of_clips():
    clips = list(queen.clips(QUEEN))
    assert len(clips) > 5500
    assert all(c.audio[:2] in (b"\xff\xe3", b"\xff\xf3", b"\xff\xfb", b"ID") for c in clips[:200])  # MP3 frames
    joe = [c for c in clips if c.character == "JOE"]
    assert len(joe) > 1000
    by_key = {c.key: c.text for c in clips}
    assert by_key["020006P1"] == "You're asking for trouble King."


@pytest.mark.skipif(DRASCULA is None, reason="Drascula package not here")
def test_real_drascula_package_reads_english():
    clips = {c.key: c for c in drascula.clips(DRASCULA)}
    assert len(clips) > 700
    assert clips["1.ALS"].text.startswith("THAT'S THE SECOND BIGGEST DOOR")


# --- the mixed corpus and the evaluation's pieces -------------------------------------------------------

def _row(uid: str, voice: str) -> dict:
    return {"id": uid, "path": f"dev/{uid}.wav", "text": "hello", "spoken": "Hello.", "source": "s", "split": "dev",
            "engine": "recorded", "voice": voice, "voice_settings": {}, "augmentation": {}, "duration": 1.0,
            "sample_rate": 16000, "words": [], "word_times": "none", "inexact_words": 0}


def test_mix_dev_rows_let_voices_take_turns(tmp_path):
    from attnserve.export.speech import mix

    rows = [_row(f"a{i}", "q:A") for i in range(3)] + [_row("b0", "q:B")] + [_row(f"c{i}", "q:C") for i in range(2)]
    manifest.write(tmp_path / "dev.jsonl", rows)
    turns = mix.dev_rows(tmp_path, "real")
    assert [r["id"] for r in turns] == ["real_a0", "real_b0", "real_c0", "real_a1", "real_c1", "real_a2"]
    assert turns[0]["path"] == "real/dev/a0.wav"


@pytest.mark.skipif(not HAS_SOX, reason="sox is not installed")
def test_mix_clean_copies_keep_the_clip_and_channel_copies_change_it(tmp_path):
    """--clean (the channel ablation's control) levels each copy and changes nothing else; dev_channel is the
    recorded dev through random channels, the same in both builds."""
    from attnserve.export.speech import mix

    real_dir = tmp_path / "real"
    t = np.arange(16000) / 16000
    samples = (6000 * np.sin(2 * np.pi * 300 * t)).astype(np.int16)
    for folder in ("train", "dev"):
        (real_dir / folder).mkdir(parents=True)
    mix.write_wav(real_dir / "train" / "a.wav", samples)
    mix.write_wav(real_dir / "dev" / "d.wav", samples)
    manifest.write(real_dir / "train.jsonl", [{**_row("a", "q:A"), "split": "train", "path": "train/a.wav"}])
    manifest.write(real_dir / "dev.jsonl", [_row("d", "q:A")])
    clean = mix.build(real_dir, None, tmp_path / "clean", 1, 1, 1, clean=True)
    noisy = mix.build(real_dir, None, tmp_path / "noisy", 3, 1, 1)
    assert clean["clean"] and not noisy["clean"]
    [row] = manifest.read(tmp_path / "clean" / "train.jsonl")
    assert row["augmentation"]["channel"] == {}
    copy = mix.read_wav(tmp_path / "clean" / row["path"]).astype(float)
    level = 10 ** (-3 / 20) / (6000 / 32768)  # -3 dBFS peak
    assert np.abs(copy - samples * level).max() <= 2
    channels = [r["augmentation"]["channel"] for r in manifest.read(tmp_path / "noisy" / "train.jsonl")]
    assert len(channels) == 3 and all(channels)
    # Both builds score on the same dev clips through the same channels, --clean or not.
    for build in ("clean", "noisy"):
        [dev] = manifest.read(tmp_path / build / "dev_channel.jsonl")
        assert dev["augmentation"]["channel"] and (tmp_path / build / dev["path"]).exists()
    assert (tmp_path / "clean" / "dev_channel.jsonl").read_text() == (tmp_path / "noisy" / "dev_channel.jsonl").read_text()


def test_channel_keep_leaves_one_effect_of_the_drawn_channel():
    import random

    full = [channel.sample(random.Random(f"k{i}"), 48) for i in range(200)]
    codec_only = [channel.keep(c, ("codec",)) for c in full]
    assert sum(bool(c.codec) for c in full) > 50
    for before, after in zip(full, codec_only):
        assert after.codec == before.codec and after.bitrate == before.bitrate  # the same draw, kept
        assert set(after.changes()) <= {"codec", "bitrate"}
    assert channel.keep(full[0], tuple(channel.EFFECTS)) == full[0]
    assert channel.keep(full[0], ()) == channel.Channel()
    with pytest.raises(ValueError, match="unknown channel effects"):
        channel.keep(full[0], ("echo",))


@pytest.mark.skipif(not HAS_SOX, reason="sox is not installed")
def test_mix_effects_arm_keeps_only_the_named_effect(tmp_path):
    from attnserve.export.speech import mix

    real_dir = tmp_path / "real"
    samples = (6000 * np.sin(2 * np.pi * 300 * np.arange(16000) / 16000)).astype(np.int16)
    for folder in ("train", "dev"):
        (real_dir / folder).mkdir(parents=True)
    rows = []
    for i in range(12):
        mix.write_wav(real_dir / "train" / f"a{i}.wav", samples)
        rows.append({**_row(f"a{i}", "q:A"), "split": "train", "path": f"train/a{i}.wav"})
    mix.write_wav(real_dir / "dev" / "d.wav", samples)
    manifest.write(real_dir / "train.jsonl", rows)
    manifest.write(real_dir / "dev.jsonl", [_row("d", "q:A")])
    stats = mix.build(real_dir, None, tmp_path / "codec", 1, 1, 1, effects=("codec",))
    full = mix.build(real_dir, None, tmp_path / "full", 1, 1, 1)
    assert stats["effects"] == ["codec"] and full["effects"] is None
    arm = {r["id"]: r["augmentation"]["channel"] for r in manifest.read(tmp_path / "codec" / "train.jsonl")}
    drawn = {r["id"]: r["augmentation"]["channel"] for r in manifest.read(tmp_path / "full" / "train.jsonl")}
    assert any(arm.values())
    for uid, changes in arm.items():
        assert changes == {k: v for k, v in drawn[uid].items() if k in ("codec", "bitrate")}
        copy = mix.read_wav(tmp_path / "codec" / "train" / f"{uid}.wav")
        assert len(copy) == len(samples)  # no speed change came through
    with pytest.raises(ValueError, match="unknown"):
        mix.build(real_dir, None, tmp_path / "bad", 1, 1, 1, effects=("echo",))


def test_evaluated_splits_include_the_microphone_split_where_the_corpus_has_it(tmp_path):
    from attnserve.export.speech import evaluate_real

    real, tts = tmp_path / "real", tmp_path / "tts"
    real.mkdir()
    assert evaluate_real.test_sets(real, tts, evaluate_real.SPLITS) == [
        (real, "test_real_heldout"), (tts, "test_heldout_voices"), (tts, "test_seen")]
    (real / "test_microphone.jsonl").write_text("")
    assert evaluate_real.test_sets(real, None, evaluate_real.SPLITS) == [(real, "test_real_heldout"), (real, "test_microphone")]
    assert evaluate_real.test_sets(real, tts, ["test_microphone", "test_seen"]) == [(real, "test_microphone"), (tts, "test_seen")]


def test_sphinx_words_and_merged_runs(tmp_path):
    from attnserve.export.speech import evaluate_real

    assert evaluate_real.sphinx_words("<s> THE(2) cat's [noise] sat-down </s>") == "the cat's satdown"
    for name, model in (("a", "m/6"), ("b", "m/7")):
        (tmp_path / f"{name}.json").write_text(
            '{"clips": 60, "splits": {"x.every2": {"%s": {"cer": 0.1}}}}' % model)
    merged = evaluate_real.merge([tmp_path / "a.json", tmp_path / "b.json"])
    assert merged["splits"] == {"x.every2": {"m/6": {"cer": 0.1}, "m/7": {"cer": 0.1}}}
    # A merge merges again: a later run (here the whole split, PocketSphinx beside it) joins an earlier merge.
    (tmp_path / "ab.json").write_text(json.dumps(merged))
    (tmp_path / "c.json").write_text('{"clips": null, "splits": {"x": {"pocketsphinx": {"cer": 0.4}}}}')
    again = evaluate_real.merge([tmp_path / "ab.json", tmp_path / "c.json"])
    assert again["clips"] == [60, None] and again["runs"] == [str(tmp_path / "a.json"), str(tmp_path / "b.json"),
                                                             str(tmp_path / "c.json")]
    assert again["splits"]["x"] == {"pocketsphinx": {"cer": 0.4}} and again["splits"]["x.every2"] == merged["splits"]["x.every2"]
