"""A speech model whose manifest names a word LM (server/engine/speed_readings.py): the served answer is the
candidate that the rescorer ranks first among every reading's candidates, each decoded alone (served ==
offline), with that candidate's own words, attention and stream."""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib

import numpy as np
import pytest

from attnserve.api.generation import (AttentionGranularity, AttentionOptions, AudioInput, DecodingOptions,
                                      GenerationRequest)
from attnserve.export.speech.evaluate import decoding_variant
from attnserve.server.decoding.word_lm import WordLanguageModel, WordRescorer
from attnserve.server.model.repository import find_models
from speech_clips import child_and_in_process, example_samples, open_speech_version

REPOSITORY = pathlib.Path(os.environ.get("ATTNSERVE_BUNDLED_MODELS", pathlib.Path(__file__).parents[1] / "models"))
NAME = "speech-en"
SPEEDS = [1.0, 0.9, 1.1]
BEAMS = 8
# Heavier than the served weights, so that on these few clips the LM overrules the search's own best.
WEIGHTS = {"weight": 1.0, "word_bonus": 1.0, "unknown_penalty": 3.0}
WAIT = 120


@pytest.fixture(scope="module")
def engines(speech_examples):
    """(plain: read once, no word LM; rescored: read at SPEEDS with the word LM at WEIGHTS; its rescorer)."""
    newest = find_models(REPOSITORY, only=[NAME])[NAME].path
    manifest = json.loads((newest / "manifest.json").read_text())
    if "word_language_model" not in manifest:
        pytest.skip("the bundled speech model names no word LM")
    model = WordLanguageModel.load(newest / manifest["word_language_model"]["file"])
    with decoding_variant(newest, None, True, speeds=[1.0], word_lm=False) as plain_dir, \
            decoding_variant(newest, None, True, speeds=SPEEDS, word_lm=WEIGHTS) as rescored_dir:
        plain, rescored = open_speech_version(plain_dir), open_speech_version(rescored_dir)
        yield plain, rescored, WordRescorer(model, **WEIGHTS)
        plain.close()
        rescored.close()


def _request(audio: AudioInput, nbest: int = 1, read_once: bool = False) -> GenerationRequest:
    return GenerationRequest(NAME, audio=audio,
                             decoding=DecodingOptions(beam_size=BEAMS, num_return_sequences=nbest, read_once=read_once),
                             attention=AttentionOptions(enabled=True, granularity=AttentionGranularity.PIECES))


def _offline(plain, rescorer, samples, rate, speeds):
    """(speed, candidate) the rescorer ranks first among each speed's candidates decoded alone."""
    candidates = []
    for speed in speeds:
        alone = plain.generate(_request(AudioInput(samples=samples, sample_rate_hz=round(rate * speed)), nbest=BEAMS), WAIT)
        candidates += [(rescorer.score(c), -SPEEDS.index(speed), -j, speed, c) for j, c in enumerate(alone.nbest)]
    best = max(candidates, key=lambda c: c[:3])
    return best[3], best[4], best[2] == 0


def test_the_answer_is_the_candidate_the_word_lm_ranks_first_with_its_own_words(engines, speech_examples):
    plain, rescored, rescorer = engines
    overruled = 0
    for example in speech_examples:
        samples, rate = example_samples(example)
        speed, winner, was_best = _offline(plain, rescorer, samples, rate, SPEEDS)
        served = rescored.generate(_request(AudioInput(samples=samples, sample_rate_hz=rate), nbest=3), WAIT)
        assert served.text == winner.text
        assert [w.word for w in served.words] == served.text.split()
        assert all(0 <= w.start_seconds <= w.end_seconds <= example["duration"] + 1e-6 for w in served.words)
        assert all(0 < w.confidence <= 1 for w in served.words)
        # One attention row per output token (and its end), each a distribution over the recording's columns.
        weights = np.asarray(served.attention.weights)
        np.testing.assert_allclose(weights.sum(1), 1.0, atol=1e-5)
        # The n best: the winner's reading's candidates in the rescorer's order, the answer first.
        assert served.nbest[0].text == served.text and len(served.nbest) == 3
        scores = [rescorer.score(c) for c in served.nbest]
        assert scores == sorted(scores, reverse=True)
        overruled += not was_best
    assert overruled, "the LM chose every reading's own best: the test would not see a forced round"


def test_a_forced_winner_answers_as_the_model_forced_through_it_alone(engines, speech_examples):
    """A winner the search ranked below another: its words, confidences and attention are those of the same
    candidate forced through the model without a word LM (served == offline)."""
    plain, rescored, rescorer = engines
    forced_any = False
    for example in speech_examples:
        samples, rate = example_samples(example)
        _, winner, was_best = _offline(plain, rescorer, samples, rate, [1.0])
        if was_best:
            continue
        request = _request(AudioInput(samples=samples, sample_rate_hz=rate), read_once=True)
        served = rescored.generate(request, WAIT)
        ids = tuple(t.id for t in winner.tokens) + (plain.manifest.special_tokens.eos,)
        alone = plain.submit_prepared(dataclasses.replace(plain.prepare(request), speed=1.0).forcing(ids)).result(WAIT)
        assert served.text == alone.text == winner.text
        assert served.words == alone.words
        np.testing.assert_allclose(served.attention.weights, alone.attention.weights, atol=1e-6)
        forced_any = True
    assert forced_any, "no example's winner, read once, was a second candidate"


def test_a_request_read_once_is_still_rescored_among_its_own_candidates(engines, speech_examples):
    plain, rescored, rescorer = engines
    for example in speech_examples:
        samples, rate = example_samples(example)
        _, winner, _ = _offline(plain, rescorer, samples, rate, [1.0])
        served = rescored.generate(_request(AudioInput(samples=samples, sample_rate_hz=rate), read_once=True), WAIT)
        assert served.text == winner.text


def test_a_streamed_answer_equals_the_unary_one(engines, speech_examples):
    _, rescored, _ = engines
    for example in speech_examples:
        samples, rate = example_samples(example)
        request = _request(AudioInput(samples=samples, sample_rate_hz=rate))
        unary = rescored.generate(request, WAIT)
        streamed = []
        result = rescored.submit(request, on_token=streamed.append).result(WAIT)
        assert result.text == unary.text == "".join(t.text for t in streamed)
        assert [t.token for t in streamed] == result.tokens
        np.testing.assert_allclose([t.attention for t in streamed], result.attention.weights, atol=1e-6)


def test_cancelling_leaves_nothing_behind(engines, speech_examples):
    _, rescored, _ = engines
    samples, rate = example_samples(speech_examples[0])
    futures = [rescored.submit(_request(AudioInput(samples=samples, sample_rate_hz=rate))) for _ in range(6)]
    for future in futures:
        rescored.cancel(future)
    assert all(f.cancelled() for f in futures)
    assert rescored.generate(_request(AudioInput(samples=samples, sample_rate_hz=rate)), WAIT).text
    assert rescored.queued() == 0


def test_a_requests_hotwords_are_free_in_the_rescoring_as_offline(engines, speech_examples):
    plain, rescored, rescorer = engines
    for example in speech_examples[:3]:
        samples, rate = example_samples(example)
        hotwords = ("zyxt", example["text"].split()[-1])  # one the LM knows, one it never saw
        audio = AudioInput(samples=samples, sample_rate_hz=rate)
        request = dataclasses.replace(_request(audio, nbest=BEAMS, read_once=True))
        request = dataclasses.replace(request, decoding=dataclasses.replace(request.decoding, hotwords=hotwords))
        alone = plain.generate(request, WAIT)  # the same search, hotwords included
        best = max(enumerate(alone.nbest), key=lambda jc: (rescorer.score(jc[1], set(hotwords)), -jc[0]))[1]
        assert rescored.generate(request, WAIT).text == best.text


def test_get_model_says_the_candidates_are_rescored_and_the_wire_keeps_it(engines):
    from attnserve.api import convert

    plain, rescored, _ = engines
    assert rescored.info.audio.word_lm and not plain.info.audio.word_lm
    assert convert.model_info_from_proto(convert.model_info_to_proto(rescored.info)).audio.word_lm



def test_an_engine_in_a_child_process_rescores_as_in_process(engines, speech_examples):
    """--engine-process: the child loads the word LM from the manifest and answers the same."""
    _, rescored, _ = engines
    samples, rate = example_samples(speech_examples[1])
    request = _request(AudioInput(samples=samples, sample_rate_hz=rate))
    child, alone = child_and_in_process(rescored, request, WAIT, speeds=SPEEDS, word_lm=WEIGHTS)
    assert (child.text, child.words, child.attention.weights) == (alone.text, alone.words, alone.attention.weights)


def test_a_model_whose_word_lm_file_is_not_one_fails_to_load_naming_it(tmp_path):
    newest = find_models(REPOSITORY, only=[NAME])[NAME].path
    manifest = json.loads((newest / "manifest.json").read_text())
    if "word_language_model" not in manifest:
        pytest.skip("the bundled speech model names no word LM")
    folder = tmp_path / NAME / newest.name
    folder.mkdir(parents=True)
    for f in newest.iterdir():
        if f.name != manifest["word_language_model"]["file"]:
            (folder / f.name).symlink_to(f.resolve())
    (folder / manifest["word_language_model"]["file"]).write_bytes(b"not an npz file")
    with pytest.raises(ValueError, match=f"{manifest['word_language_model']['file']}.*not a readable word language model"):
        open_speech_version(folder)
