"""How a speech version is chosen: every checkpoint's served-search dev scores gathered (checkpoint_scores.py)
and drawn on the card (model_card_recorded.selection_lines)."""

from __future__ import annotations

import json
import pathlib

import pytest

from attnserve.export.speech import checkpoint_scores, model_card_recorded
from attnserve.export.speech.model_card_recorded import selection_lines


def _scores(cer: float, wer: float) -> dict:
    return {"splits": {split: {"cer": cer + k / 100, "wer": wer + k / 100, "clips": 248, "by_voice": {}}
                       for k, split in enumerate(("dev", "dev_channel"))}}


def test_gather_orders_checkpoints_and_checks_the_choice(tmp_path):
    (tmp_path / "base.json").write_text(json.dumps(_scores(0.5, 0.8)))
    for run, steps in (("channels", (300, 20, 1000)), ("clean", (25, 310))):
        (tmp_path / run).mkdir()
        for step in steps:
            (tmp_path / run / f"step-{step}.json").write_text(json.dumps(_scores(step / 10000, 0.7)))
    runs = [("channels", tmp_path / "channels"), ("clean", tmp_path / "clean")]
    gathered = checkpoint_scores.gather(("v8", tmp_path / "base.json"), runs, "channels:300")
    assert [c["step"] for c in gathered["runs"][0]["checkpoints"]] == [20, 300, 1000]  # by step, not by name
    assert gathered["runs"][1]["checkpoints"][1]["splits"]["dev_channel"] == {"cer": 0.041, "wer": 0.71, "clips": 248}
    with pytest.raises(ValueError, match="no such run and step"):
        checkpoint_scores.gather(("v8", tmp_path / "base.json"), runs, "clean:300")

    lines = selection_lines(gathered)
    assert lines[0] == "| checkpoint | channels: dev | channels: dev_channel | clean: dev | clean: dev_channel |"
    assert lines[2].startswith("| v8 (the version before) | 50.0% / 80.0% | 51.0% / 81.0% |")
    assert lines[4] == "| 2 (steps 300, 310) | **3.0% / 70.0%** | **4.0% / 71.0%** | 3.1% / 70.0% | 4.1% / 71.0% |"
    assert lines[5].endswith("| - | - |")  # the clean run had no third checkpoint
    ablation = checkpoint_scores.gather(("v8", tmp_path / "base.json"), runs, None)  # shipped nothing
    assert ablation["chosen"] is None
    ablation_lines = selection_lines(ablation)
    assert ablation_lines[4] == lines[4].replace("**", "") and "**" not in "".join(ablation_lines)


def test_card_finds_the_new_version_among_older_ones_and_names_dev_sources():
    scores = {"splits": {"test_seen": {"models/speech-en/9": {}, "pocketsphinx": {}, "models/speech-en/10": {},
                                       "models/speech-en/11": {}}}}
    # The older versions come first in a merged file: the card must still describe the one it exports.
    assert model_card_recorded.version_key(scores, pathlib.Path("models/speech-en/11")) == "models/speech-en/11"
    with pytest.raises(SystemExit, match="models/speech-en/12 has no scores"):
        model_card_recorded.version_key(scores, pathlib.Path("models/speech-en/12"))
    real = {"hours": {"drascula/test_real_heldout": 0.75, "flight-of-the-amazon-queen/dev": 0.22,
                      "flight-of-the-amazon-queen/train": 3.67, "warzone2100-data/dev": 0.03}}
    assert model_card_recorded.held_out_for_dev(real) == "flight-of-the-amazon-queen, warzone2100-data"


def test_card_says_how_the_training_copies_were_channelled():
    # mix.py's stats: --clean, one effect family (--effects), or the whole random channel.
    assert model_card_recorded.channel_words({"clean": True, "effects": None}) == "without channels (`mix --clean`)"
    assert "only the speed part" in model_card_recorded.channel_words({"clean": False, "effects": ["speed"]})
    assert "codec and level part" in model_card_recorded.channel_words({"clean": False, "effects": ["codec", "level"]})
    assert "room, band, codec" in model_card_recorded.channel_words({"clean": False, "effects": None})
