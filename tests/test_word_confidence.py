"""Word confidence (server/decoding/word_confidence.py): each served word's calibrated chance of being right,
from its pieces' log-scores and the boundary after it; and the calibration report (export/speech/confidence.py)."""

from __future__ import annotations

import json
import math
import os
import pathlib

import numpy as np
import pytest

from attnserve.api import convert
from attnserve.api.generation import AudioInput, DecodingOptions, GenerationRequest, WordTiming
from attnserve.clients import timeline
from attnserve.export.speech.confidence import at_scales, auc, calibration, right_words
from attnserve.server.decoding.word_confidence import word_confidences
from attnserve.server.model.manifest import parse_manifest
from attnserve.server.model.tokenization import Words

REPOSITORY = pathlib.Path(os.environ.get("ATTNSERVE_BUNDLED_MODELS", pathlib.Path(__file__).parents[1] / "models"))
NAME = "speech-en"
EXAMPLES = REPOSITORY / NAME / "examples"
WAIT = 120


def test_a_character_words_confidence_counts_its_letters_and_the_space_that_ends_it():
    pieces = ["▁", "t", "h", "e", "▁", "c", "a", "t"]
    logprobs = [-0.5, -0.1, -0.2, -0.3, -0.4, -0.6, -0.7, -0.8]
    words = Words((0, 4), ("the", "cat"))
    got = word_confidences(words, pieces, logprobs, 2.0)
    assert got == pytest.approx([math.exp(2.0 * np.mean([-0.1, -0.2, -0.3, -0.4])),  # not the opening -0.5
                                 math.exp(2.0 * np.mean([-0.6, -0.7, -0.8]))])  # the last word: no boundary


def test_subword_pieces_that_carry_their_own_marker_add_no_boundary():
    words = Words((0, 1, 3), ("power", "grids", "."))
    got = word_confidences(words, ["▁power", "▁grid", "s", "."], [-0.2, -0.4, -0.6, -1.0], 1.0)
    assert got == pytest.approx([math.exp(-0.2), math.exp(-0.5), math.exp(-1.0)])


def test_a_word_of_markers_only_is_scored_by_its_markers():
    assert word_confidences(Words((0,), ("▁",)), ["▁"], [-0.3], 1.0) == pytest.approx([math.exp(-0.3)])


def test_a_larger_scale_spreads_confidences_apart_without_reordering_them():
    words, pieces = Words((0, 2), ("a", "b")), ["▁", "a", "▁", "b"]
    soft = word_confidences(words, pieces, [-0.1, -0.05, -0.2, -0.9], 1.0)
    sharp = word_confidences(words, pieces, [-0.1, -0.05, -0.2, -0.9], 3.0)
    assert soft[0] > soft[1] and sharp[0] > sharp[1] and sharp[1] < soft[1]
    assert all(0 < c <= 1 for c in soft + sharp)


def _manifest() -> dict:
    path = REPOSITORY / NAME / "12" / "manifest.json"
    if not path.is_file():
        pytest.skip("no bundled speech model")
    return json.loads(path.read_text())


@pytest.mark.parametrize("scale", [0, -1.0, "3", True])
def test_a_scale_that_is_not_a_positive_number_is_refused_naming_the_field(scale):
    manifest = _manifest()
    manifest["decoding"]["word_confidence_scale"] = scale
    with pytest.raises(ValueError, match="decoding.word_confidence_scale"):
        parse_manifest(manifest, "manifest.json")


def test_without_a_scale_a_model_serves_geometric_mean_probabilities():
    manifest = _manifest()
    del manifest["decoding"]["word_confidence_scale"]
    assert parse_manifest(manifest, "manifest.json").decoding.word_confidence_scale == 1.0


def test_the_confidence_survives_the_wire_and_its_absence_too():
    for word in (WordTiming("cat", 0.4, 0.88, 0.384), WordTiming("cat", 0.4, 0.88)):
        assert convert.word_from_proto(convert.word_to_proto(word)) == word


def test_every_served_word_carries_the_confidence_of_its_own_tokens(bundled_speech):
    """Served (speed readings, joint CTC, beam search) == recomputed from the answer's tokens."""
    scale = bundled_speech.manifest.decoding.word_confidence_scale
    assert scale != 1.0  # the bundled model is calibrated, so the scale is applied, not skipped
    examples = json.loads((EXAMPLES / "examples.json").read_text())
    for example in examples:
        audio = AudioInput(wav=(EXAMPLES / example["file"]).read_bytes())
        request = GenerationRequest(NAME, audio=audio, decoding=DecodingOptions(beam_size=8))
        result = bundled_speech.generate(request, WAIT)
        pieces, logprobs = [t.piece for t in result.tokens], [t.logprob for t in result.tokens]
        starts = [i for i, p in enumerate(pieces) if i == 0 or (p.startswith("▁") and pieces[i - 1] != "▁")]
        words = Words(tuple(starts), tuple(w.word for w in result.words))
        assert len(starts) == len(result.words) > 0
        assert [w.confidence for w in result.words] == pytest.approx(word_confidences(words, pieces, logprobs, scale))
        assert all(0 < w.confidence <= 1 for w in result.words)


def test_right_words_follow_the_minimum_edit_alignment():
    right = right_words("the cat sad on mat".split(), "the cat sat on the mat".split())
    assert right == [True, True, False, True, True]
    assert right_words([], "a b".split()) == [] and right_words("a b".split(), []) == [False, False]


def test_auc_counts_ties_as_half_and_perfect_ranking_as_one():
    right = np.array([True, True, False, False])
    assert auc(np.array([0.9, 0.8, 0.2, 0.1]), right) == 1.0
    assert auc(np.array([0.1, 0.2, 0.8, 0.9]), right) == 0.0
    assert auc(np.array([0.5, 0.5, 0.5, 0.5]), right) == 0.5


def test_calibration_reads_how_far_confidences_are_from_the_share_right():
    confidence = np.array([0.95] * 20 + [0.15] * 20)
    right = np.array([True] * 19 + [False] + [True] * 3 + [False] * 17)
    report = calibration(confidence, right)
    assert report["ece"] == 0.0  # 95% right at 0.95, 15% right at 0.15
    assert [(b["from"], b["words"], b["right"]) for b in report["bands"]] == [(0.0, 20, 0.15), (0.9, 20, 0.95)]
    rescaled = at_scales(confidence, right, served_scale=1.0)["2.0"]  # 0.95 -> 0.9025, 0.15 -> 0.0225
    # Reported to 3 places.
    assert rescaled["ece"] == pytest.approx(0.5 * (0.95 - 0.9025) + 0.5 * (0.15 - 0.0225), abs=1e-3)
    assert rescaled["auc"] == report["auc"]


def test_the_timeline_shows_each_words_confidence_when_the_server_gave_one():
    lines = timeline.render([WordTiming("the", 0.0, 0.4, 0.91), WordTiming("cat", 0.4, 0.88, 0.05)], None).splitlines()
    assert lines == [" 0.00- 0.40   91%  the", " 0.40- 0.88    5%  cat"]
    assert timeline.render([WordTiming("the", 0.0, 0.4)], None) == " 0.00- 0.40  the"
