"""The synthesized speech corpus (export/speech): text, plan, manifest, and real synthesis.

Unit tests need nothing but Python. The synthesis tests run the real engines and sox and
are skipped, with the package to install, where a tool is missing.
"""

from __future__ import annotations

import json
import os
import shutil
import wave
from dataclasses import replace

import numpy as np
import pytest

from attnserve.export.speech import augment, build, engines, manifest, plan, render, text, voices, word_times
from attnserve.export.speech.text import Sentence

# --------------------------------------------------------------------------- text


@pytest.mark.parametrize("spoken, transcript", [
    ("Don't open the file-menu, please!", "don't open the file menu please"),
    ("He said \u201cgood morning\u201d to the teacher\u2019s son.", "he said good morning to the teacher's son"),
    ("The students' books are here.", "the students books are here"),
    ("Wait \u2014 is it   raining?", "wait is it raining"),
])
def test_normalise_keeps_letters_apostrophes_and_single_spaces(spoken, transcript):
    assert text.normalise(spoken) == transcript
    assert set(transcript) <= set(text.ALPHABET)


@pytest.mark.parametrize("spoken", ["There are 3 files.", "Caf\u00e9 open.", "Save as %s now.", "50% done"])
def test_normalise_refuses_text_without_a_unique_transcript(spoken):
    with pytest.raises(ValueError):
        text.normalise(spoken)


@pytest.mark.parametrize("spoken, source, reason", [
    ("He studies abroad to learn advanced technology.", "hsk/level3", None),
    ("His salary rose.", "hsk/level6", None),
    ("Select the column that you want to use as the primary sort key.", "libreoffice_help", None),
    ("There are 3 apples on the table.", "hsk/level1", "symbols_digits_or_non_english"),
    ("Could not open %s for writing.", "gettext/git", "symbols_digits_or_non_english"),
    ("Press {0} to open the file.", "gettext/calibre", "symbols_digits_or_non_english"),
    ("Open the &File menu and choose Save.", "gettext/gimp-data", "symbols_digits_or_non_english"),
    ("Insert <b>bold</b> text here.", "gettext/inkscape", "symbols_digits_or_non_english"),
    ("Export the document as PDF now.", "libreoffice_help", "acronym_or_camelcase"),
    ("Spend less time on your PCs today.", "debian_reference", "acronym_or_camelcase"),
    ("LibreOffice opens the document for you.", "libreoffice_help", "acronym_or_camelcase"),
    ("Choose Format - Cells - Numbers.", "libreoffice_help", "menu_path"),
    ("Mr. Wang is a very good teacher.", "hsk/level2", "abbreviation"),
    ("Use a filter, e.g. the blur filter.", "gettext/gimp-data", "abbreviation"),
    ("Places the arrowhead(s) on the line.", "libreoffice_help", "odd_punctuation"),
    ("Save the file", "gettext/gimp-data", "too_short"),
    ("Paste the content of the clipboard into the selection", "gettext/inkscape", "not_a_sentence"),
    ("Go " + "on and on " * 20 + "forever.", "hsk/level1", "too_long"),
])
def test_rejection_reasons(spoken, source, reason):
    assert text.rejection(spoken, source) == reason


def test_select_keeps_one_sentence_per_transcript_in_input_order():
    rows = [("Open the door, please.", "hsk/level1", "train"),
            ("Open the door please!", "hsk/level2", "dev"),  # same transcript: a duplicate
            ("Close the window.", "hsk/level1", "test"),
            ("Saving %s.", "gettext/git", "train")]
    kept, reasons = text.select(rows)
    assert [(s.transcript, s.split) for s in kept] == [("open the door please", "train"),
                                                       ("close the window", "test")]
    assert reasons == {"duplicate": 1, "symbols_digits_or_non_english": 1}


def test_spoken_words_give_offsets_into_the_spoken_text():
    spoken = text.spoken_form("It\u2019s a well-known fact, isn't it?")
    words = text.spoken_words(spoken)
    assert [w.lower() for _, w in words] == text.normalise(spoken).split()
    assert all(spoken[o:o + len(w)] == w for o, w in words)


# --------------------------------------------------------------------------- word times


def test_by_position_splits_a_merged_word_by_letters():
    # espeak-ng reads "in the" as one phonetic word.
    items = [word_times.TimedItem(0.1, 0.4, position=0), word_times.TimedItem(0.5, 1.1, position=3)]
    times, shared = word_times.by_position(["go", "in", "the"], [0, 3, 6], items)
    assert times[0] == (0.1, 0.4)
    assert times[1][0] == 0.5 and times[2][1] == 1.1
    assert times[1][1] == pytest.approx(0.5 + 0.6 * 2 / 5)
    assert shared == 2


def test_by_name_matches_engine_spellings_and_estimates_missing_words():
    items = [word_times.TimedItem(0.0, 0.3, name="dont"), word_times.TimedItem(0.3, 0.5, name="go"),
             word_times.TimedItem(0.7, 0.9, name="home")]
    times, inexact = word_times.by_name(["Don't", "go", "there", "home"], items)
    assert times[:2] == [(0.0, 0.3), (0.3, 0.5)]
    assert times[3] == (0.7, 0.9)
    assert 0.5 <= times[2][0] <= times[2][1] <= 0.7
    assert inexact == 1


def test_by_counts_cuts_words_into_groups_by_phoneme_counts():
    items = [word_times.TimedItem(0.0, 0.4, count=4), word_times.TimedItem(0.5, 1.0, count=5)]
    times, shared = word_times.by_counts([4, 2, 3], items)  # "spring", "in", "the"
    assert times[0] == (0.0, 0.4)
    assert times[1] == pytest.approx((0.5, 0.7)) and times[2] == pytest.approx((0.7, 1.0))
    assert shared == 2


def test_matchers_return_monotonic_times():
    times = word_times.monotonic([(0.0, 0.5), (0.4, 0.3), (0.6, 0.9)])
    assert times == [(0.0, 0.5), (0.5, 0.5), (0.6, 0.9)]


# --------------------------------------------------------------------------- plan


def _sentences() -> list[Sentence]:
    """122 distinct sentences: 100 train, 10 dev, 12 test; every third one everyday (HSK)."""
    subjects = ["the cat", "my friend", "the teacher", "a small dog", "her brother", "our neighbour"]
    verbs = ["sees", "likes", "finds", "helps", "calls"]
    objects = ["the river", "a red house", "the old tree", "my sister", "the market"]
    en = [f"{s.capitalize()} {v} {o}." for s in subjects for v in verbs for o in objects][:122]
    splits = ["train"] * 100 + ["dev"] * 10 + ["test"] * 12
    rows = [(e, "hsk/level1" if i % 3 == 0 else "libreoffice_help", sp) for i, (e, sp) in enumerate(zip(en, splits))]
    kept, rejected = text.select(rows)
    assert not rejected
    return kept


def _key(u: plan.Utterance):
    return (u.id, u.split, u.sentence.transcript, u.voice.key, json.dumps(u.settings, sort_keys=True),
            u.augmentation, u.seed)


def test_plan_is_deterministic_by_seed():
    sentences = _sentences()
    a = plan.make_plan(sentences, plan.PlanOptions(hours=0.05, seed=7))
    b = plan.make_plan(sentences, plan.PlanOptions(hours=0.05, seed=7))
    c = plan.make_plan(sentences, plan.PlanOptions(hours=0.05, seed=8))
    assert [_key(u) for u in a] == [_key(u) for u in b]
    assert [_key(u) for u in a] != [_key(u) for u in c]


def test_a_smaller_build_is_a_prefix_of_a_larger_one():
    sentences = _sentences()
    small = [u for u in plan.make_plan(sentences, plan.PlanOptions(hours=0.02)) if u.split == "train"]
    large = [u for u in plan.make_plan(sentences, plan.PlanOptions(hours=0.1)) if u.split == "train"]
    assert len(large) > len(small) > 0
    assert [_key(u) for u in large[:len(small)]] == [_key(u) for u in small]


def test_train_hours_are_reached_with_new_voices_when_sentences_run_out():
    sentences = _sentences()
    p = [u for u in plan.make_plan(sentences, plan.PlanOptions(hours=0.1)) if u.split == "train"]
    assert sum(u.estimated_seconds() for u in p) == pytest.approx(360, abs=10)
    train_sentences = [s for s in sentences if s.split == "train"]
    assert len(p) > len(train_sentences)  # more than one pass over the sentences
    assert len({(u.sentence.transcript, u.voice.key, json.dumps(u.settings)) for u in p}) == len(p)


def test_heldout_voices_only_ever_speak_test_heldout_voices():
    sentences = _sentences()
    p = plan.make_plan(sentences, plan.PlanOptions(hours=0.3, seed=3, dev_voices=3, test_voices=3))
    for u in p:
        if u.split == "test_heldout_voices":
            assert u.voice.key in voices.HELDOUT_KEYS
        else:
            assert u.voice.key not in voices.HELDOUT_KEYS, u
    assert not {v.key for v in voices.train_voices()} & voices.HELDOUT_KEYS
    # Each held-out voice speaks every test sentence, the same ones test_seen uses.
    test = {s.transcript for s in sentences if s.split == "test"}
    for v in voices.HELDOUT_VOICES:
        assert {u.sentence.transcript for u in p if u.voice == v} == test
    assert {u.sentence.transcript for u in p if u.split == "test_seen"} == test
    # A broken plan is refused.
    bad = replace(next(u for u in p if u.split == "train"), voice=voices.HELDOUT_VOICES[0])
    with pytest.raises(RuntimeError):
        plan.check_heldout([bad])


def test_eval_sentences_cut_dev_and_test_alike_and_keep_train():
    from attnserve.export.speech.build import first_eval_sentences

    p = plan.make_plan(_sentences(), plan.PlanOptions(hours=0.1, test_voices=2))
    cut = first_eval_sentences(p, 4)
    assert [u for u in cut if u.split == "train"] == [u for u in p if u.split == "train"]
    by_split = {name: {u.sentence.transcript for u in cut if u.split == name} for name in plan.SPLITS}
    assert len(by_split["dev"]) == 4 and len(by_split["test_seen"]) == 4
    assert by_split["test_heldout_voices"] == by_split["test_seen"]  # the same sentences, every held-out voice
    assert sum(u.split == "test_heldout_voices" for u in cut) == 4 * len(voices.HELDOUT_VOICES)
    assert first_eval_sentences(p, None) == p


def test_splits_never_share_sentences_and_only_train_is_augmented():
    p = plan.make_plan(_sentences(), plan.PlanOptions(hours=0.1))
    by_split = {name: {u.sentence.transcript for u in p if u.split == name} for name in plan.SPLITS}
    assert not by_split["train"] & (by_split["dev"] | by_split["test_seen"])
    assert not by_split["dev"] & by_split["test_seen"]
    assert all(u.augmentation == augment.NONE for u in p if u.split != "train")
    train = [u for u in p if u.split == "train"]
    assert len({u.augmentation for u in train}) > 0.9 * len(train)
    kinds = {k for u in train for k in u.augmentation.changes()}
    assert {"speed", "tempo", "pitch", "reverb", "noise_snr", "pad_start", "peak_db"} <= kinds
    assert len({u.voice.engine for u in train}) == 3
    assert len({u.id for u in p}) == len(p)


def test_augmentation_moves_word_times_only_for_speed_tempo_and_padding():
    aug = augment.Augmentation(speed=1.25, tempo=0.8, pitch=300, reverb=30, pad_start=0.2)
    assert aug.word_times([(0.5, 1.0)], duration=2.0) == [(0.7, 1.2)]
    aug = augment.Augmentation(speed=2.0, pad_start=0.1)
    assert aug.word_times([(1.0, 4.0)], duration=1.5) == [(0.6, 1.5)]  # clipped to the audio
    assert augment.Augmentation().changes() == {}
    assert augment.Augmentation(speed=1.1, peak_db=-6.0).changes() == {"speed": 1.1, "peak_db": -6.0}
    assert augment.Augmentation(reverb=20, noise_snr=12.0).changes() == {
        "reverb": 20, "room": 100, "noise_snr": 12.0, "noise_color": "white"}
    with pytest.raises(ValueError):
        augment.Augmentation(speed=3.0)
    with pytest.raises(ValueError):
        augment.Augmentation(noise_snr=10.0, noise_color="purple")


# --------------------------------------------------------------------------- manifest


def _row(**changes) -> dict:
    row = {"id": "dev_000001", "path": "dev/dev_000001.wav", "text": "he asked me",
           "spoken": "He asked me.", "source": "hsk/level2", "split": "dev", "engine": "espeak-ng",
           "voice": "en-us+f3", "voice_settings": {"rate": 170}, "augmentation": {}, "duration": 1.5,
           "sample_rate": 16000, "words": [["he", 0.1, 0.3], ["asked", 0.3, 0.8], ["me", 0.8, 1.2]],
           "word_times": "espeak_events", "inexact_words": 0}
    row.update(changes)
    return row


def test_manifest_schema_accepts_a_good_row_and_round_trips(tmp_path):
    manifest.validate(_row())
    path = tmp_path / "dev.jsonl"
    assert manifest.write(path, [_row(), _row(id="dev_000002")]) == 2
    assert [r["id"] for r in manifest.read(path)] == ["dev_000001", "dev_000002"]


@pytest.mark.parametrize("changes", [
    {"text": "He asked me"},  # not normalised
    {"text": "he asked  me"},
    {"words": [["he", 0.1, 0.3], ["asked", 0.3, 0.8]]},  # does not spell the text
    {"words": [["he", 0.1, 0.3], ["asked", 0.2, 0.8], ["me", 0.8, 1.2]]},  # overlaps
    {"words": [["he", 0.1, 0.3], ["asked", 0.3, 0.8], ["me", 0.8, 1.9]]},  # beyond the audio
    {"word_times": "guess"},
    {"duration": "1.5"},
    {"extra": 1},
])
def test_manifest_schema_rejects_bad_rows(changes):
    with pytest.raises(ValueError):
        manifest.validate(_row(**changes))


def test_manifest_schema_rejects_a_missing_field():
    row = _row()
    del row["engine"]
    with pytest.raises(ValueError, match="engine"):
        manifest.validate(row)


# --------------------------------------------------------------------------- tools


def test_missing_tools_are_named_with_their_install_command(monkeypatch):
    monkeypatch.setattr(build.shutil, "which", lambda name: None)
    monkeypatch.setattr(engines.Espeak, "missing", lambda self, voices=None: ["libespeak-ng.so.1 (package espeak-ng)"])
    u = plan.Utterance("dev_000000", "dev", _sentences()[0], voices.Voice("espeak-ng", "en-us"), {})
    missing = build.missing_tools([u])
    assert "sox (apt-get install sox)" in missing
    assert any("espeak-ng" in m and "apt-get install espeak-ng" in m for m in missing)


# --------------------------------------------------------------------------- real synthesis


def _skip_without(*needs: tuple[engines.Engine, list[str] | None]):
    """Skip, naming what to install, unless every engine (with those voices) and sox can run."""
    missing = [f"{item} -> {engine.install_hint}" for engine, voices_ in needs for item in engine.missing(voices_)]
    if not shutil.which("sox"):
        missing.append("sox -> apt-get install sox")
    if missing:
        pytest.skip(f"not installed: {'; '.join(missing)} (see docs/speech-corpus.md)")


def _render(tmp_path, voice: voices.Voice, settings: dict, aug=augment.NONE, spoken=None) -> dict:
    spoken = spoken or "The spring water in the mountains is clear. Don't you think so?"
    sentence = Sentence(spoken, text.normalise(spoken), "hsk/level3", "test")
    u = plan.Utterance("test_seen_000000", "test_seen", sentence, voice, settings, aug, seed=5)
    result = render.render_chunk((str(tmp_path), [u]))
    assert not result.too_long and len(result.rows) == 1
    return result.rows[0]


def _check_audio_and_times(tmp_path, row: dict):
    manifest.validate(row)
    with wave.open(str(tmp_path / row["path"]), "rb") as w:
        assert (w.getframerate(), w.getnchannels(), w.getsampwidth()) == (16000, 1, 2)
        assert w.getnframes() / 16000 == pytest.approx(row["duration"], abs=1e-3)
    starts = [s for _, s, _ in row["words"]]
    ends = [e for _, _, e in row["words"]]
    assert starts == sorted(starts) and ends == sorted(ends)
    assert all(0 <= s <= e <= row["duration"] for s, e in zip(starts, ends))
    assert ends[-1] - starts[0] > 0.5 * row["duration"]  # the words cover the speech, not one corner
    assert row["words"][-1][0] == "so"


def test_espeak_synthesis_writes_16k_audio_with_monotonic_word_times(tmp_path):
    _skip_without((engines.Espeak(), None))
    row = _render(tmp_path, voices.Voice("espeak-ng", "en-us+f3"), {"rate": 170, "pitch": 70, "range": 50})
    _check_audio_and_times(tmp_path, row)
    assert row["word_times"] == "espeak_events"


def test_augmented_espeak_synthesis_is_reproducible(tmp_path):
    _skip_without((engines.Espeak(), None))
    aug = augment.Augmentation(speed=1.1, pitch=200, reverb=30, noise_snr=15.0, noise_color="pink",
                               pad_start=0.2, peak_db=-6.0)
    voice, settings = voices.Voice("espeak-ng", "en-gb-x-rp+m3"), {"rate": 150, "pitch": 30, "range": 60}
    a = _render(tmp_path / "a", voice, settings, aug)
    b = _render(tmp_path / "b", voice, settings, aug)
    _check_audio_and_times(tmp_path / "a", a)
    assert a == b
    assert (tmp_path / "a" / a["path"]).read_bytes() == (tmp_path / "b" / b["path"]).read_bytes()
    plain = _render(tmp_path / "c", voice, settings)
    # speed 1.1 shortens speech; the 0.2 s of padding shifts the first word.
    assert a["words"][0][1] == pytest.approx(0.2 + plain["words"][0][1] / 1.1, abs=0.002)


def test_library_engines_do_not_depend_on_what_ran_before(tmp_path):
    _skip_without((engines.Flite(), ["rms"]))
    import ctypes

    request = engines.Request("The spring water in the mountains is clear.", "rms", {"duration_stretch": 1.1})
    flite = engines.Flite()
    first = flite.synthesize(request).samples.tobytes()
    libc = ctypes.CDLL(None)
    for _ in range(7):  # other code in the worker (Piper's phonemizer) draws from rand() too
        libc.rand()
    flite.synthesize(engines.Request("Something else entirely.", "kal16", {}))
    assert flite.synthesize(request).samples.tobytes() == first


@pytest.mark.parametrize("engine, voice, settings", [
    ("flite", "kal16", {"duration_stretch": 1.1, "f0_mean": 140}),
    ("flite", "slt", {}),
    ("festival", "kal_diphone", {"duration_stretch": 0.9, "f0_mean": 150}),
])
def test_other_engines_report_word_times(tmp_path, engine, voice, settings):
    _skip_without((engines.ENGINES[engine](), [voice]))
    row = _render(tmp_path, voices.Voice(engine, voice), settings)
    _check_audio_and_times(tmp_path, row)
    assert row["inexact_words"] == 0


def test_piper_synthesis_is_reproducible_and_timed(tmp_path):
    _skip_without((engines.Piper(), None))
    voice = voices.Voice("piper", "en_US-joe-medium")
    a = _render(tmp_path / "a", voice, {})
    b = _render(tmp_path / "b", voice, {})
    _check_audio_and_times(tmp_path / "a", a)
    assert a["word_times"] == "piper_alignment" and a == b
    assert (tmp_path / "a" / a["path"]).read_bytes() == (tmp_path / "b" / b["path"]).read_bytes()


def test_build_writes_every_split_and_replaces_a_previous_build(tmp_path):
    _skip_without(*((e, None) for e in (engines.Espeak(), engines.Flite(), engines.Festival(), engines.Piper())))
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    rows = {"train": ["He asked me for directions.", "Select the column that you want to sort.",
                      "I buy the train ticket.", "There are 3 apples here."],
            "dev": ["The embassy is in this district."], "test": ["Air should circulate freely."]}
    for split, sentences in rows.items():
        (corpus / f"{split}.tsv").write_text("".join(f"{s}\t\u4e2d\n" for s in sentences), encoding="utf-8")
        sources = ["hsk/level2" if i % 2 == 0 else "libreoffice_help" for i in range(len(sentences))]
        (corpus / f"{split}.source").write_text("".join(f"{s}\n" for s in sources), encoding="utf-8")
    out = tmp_path / "speech"
    (out / "train").mkdir(parents=True)
    (out / "train" / "stale.wav").write_bytes(b"old")
    assert build.main(["--out", str(out), "--corpus", str(corpus), "--hours", "0.002", "--seed", "1"]) == 0
    assert not (out / "train" / "stale.wav").exists()
    assert not (out / build.STAGING).exists() and not (out / build.RETIRED).exists()
    split_rows = {split: manifest.read(out / f"{split}.jsonl") for split in plan.SPLITS}
    assert split_rows["train"] and len(split_rows["dev"]) == 1 and len(split_rows["test_seen"]) == 1
    assert {r["engine"] for r in split_rows["test_heldout_voices"]} == {"piper", "festival", "flite"}
    assert all(r["text"] == "air should circulate freely" for r in split_rows["test_heldout_voices"])
    stats = json.loads((out / "stats.json").read_text())
    assert stats["text"]["rejected_rows"] == {"symbols_digits_or_non_english": 1}
    for rows_ in split_rows.values():
        for row in rows_:
            assert (out / row["path"]).exists()



def test_an_utterance_that_crashes_the_engine_is_dropped_and_the_rest_of_its_chunk_kept(tmp_path, monkeypatch):
    _skip_without((engines.Espeak(), ["en-us"]))
    real = engines.Espeak._synthesize_here

    def dies_on_one(self, request):
        if "crash" in request.spoken:
            os._exit(11)  # the forked child dies, as espeak-ng does on a rare voice and sentence
        return real(self, request)

    monkeypatch.setattr(engines.Espeak, "_synthesize_here", dies_on_one)
    said = ["The first one is fine.", "This one will crash.", "The last one is fine too."]
    chunk = [
        plan.Utterance(f"train_{i:06d}", "train", Sentence(s, text.normalise(s), "hsk/level3", "train"),
                       voices.Voice("espeak-ng", "en-us"), {}, augment.NONE, seed=i)
        for i, s in enumerate(said)
    ]
    result = render.render_chunk((str(tmp_path), chunk))
    assert result.failed == ["train_000001"]
    assert [r["id"] for r in result.rows] == ["train_000000", "train_000002"]
    assert not (tmp_path / chunk[1].path).exists() and (tmp_path / chunk[2].path).exists()


def test_a_slowed_8_khz_voice_takes_the_telephone_band(tmp_path):
    """flite's 8 kHz kal slowed down has no 3400 Hz left: the band filter runs after resampling to 16 kHz."""
    if not shutil.which("sox"):
        pytest.skip("not installed: sox -> apt-get install sox")
    t = np.arange(8000) / 8000
    samples = (8000 * np.sin(2 * np.pi * 440 * t)).astype(np.int16)
    aug = augment.Augmentation(speed=0.915, pitch=-245, telephone=True)
    out = augment.apply(samples, 8000, aug, seed=0)
    assert len(out) == pytest.approx(16000 / 0.915, rel=0.02) and np.abs(out).max() > 0
