"""Speed readings (server/engine/speed_readings.py): a recording decoded at several playback speeds answers
with the best-scoring reading, in the recording's own time and attention columns."""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib

import numpy as np
import pytest

from attnserve.api import convert
from attnserve.api.generation import (AttentionGranularity, AttentionOptions, AudioInput, DecodingOptions,
                                      GenerationRequest)
from attnserve.export.speech.evaluate import decoding_variant
from attnserve.server.engine.speed_readings import column_map
from attnserve.server.model.manifest import parse_manifest
from attnserve.server.model.repository import find_models
from speech_clips import child_and_in_process, example_samples, open_speech_version

REPOSITORY = pathlib.Path(os.environ.get("ATTNSERVE_BUNDLED_MODELS", pathlib.Path(__file__).parents[1] / "models"))
NAME = "speech-en"
SPEEDS = [1.0, 0.9, 1.1]
WAIT = 120


def spans(count: int, width: float = 0.08) -> tuple[np.ndarray, np.ndarray]:
    starts = np.arange(count) * width
    return starts, starts + width


def test_the_recording_maps_onto_its_own_columns_one_to_one():
    np.testing.assert_allclose(column_map(spans(12), spans(12), 1.0), np.eye(12), atol=1e-12)


@pytest.mark.parametrize("speed", [0.9, 1.1, 0.5, 2.0])
def test_a_reading_spreads_each_column_over_the_recording_by_overlapping_time(speed):
    recording = spans(25)  # 2 s
    reading = spans(int(np.ceil(25 / speed)))  # the same 2 s played at `speed`
    moved = column_map(reading, recording, speed)
    np.testing.assert_allclose(moved.sum(1), 1.0)
    # A column's weight lands where its time lies: the mass centre moves by the speed.
    centres = (recording[0] + recording[1]) / 2
    for j in range(len(reading[0]) - 1):
        reading_centre = (reading[0][j] + reading[1][j]) / 2
        assert abs(moved[j] @ centres - reading_centre * speed) < 0.04 + 1e-9


def test_a_column_past_the_recordings_end_goes_to_its_last_column():
    moved = column_map(spans(3), spans(2), 1.0)
    assert moved[2].tolist() == [0.0, 1.0]


def _manifest(speeds, kind="audio") -> dict:
    manifest = json.loads((REPOSITORY / NAME / "12" / "manifest.json").read_text())
    manifest["decoding"]["speeds"] = speeds
    if kind == "text":
        manifest["input"] = {"kind": "text"}
    return manifest


@pytest.mark.parametrize("speeds, message", [
    ([0.9, 1.1], "1.0 among them"),
    ([1.0, 1.0], "distinct"),
    ([1.0, 3.0], "[0.5, 2]"),
    ([1.0, 0.66666], "whole sample rates"),
    ([1.0, True], "distinct numbers"),
])
def test_speeds_a_server_cannot_read_are_refused_naming_the_field(speeds, message):
    if not (REPOSITORY / NAME / "12" / "manifest.json").is_file():
        pytest.skip("no bundled speech model")
    with pytest.raises(ValueError, match="decoding.speeds") as raised:
        parse_manifest(_manifest(speeds), "manifest.json")
    assert message in str(raised.value)


def test_speeds_of_a_model_that_reads_text_are_refused():
    path = REPOSITORY / "translate-zh-en"
    manifests = sorted(path.glob("*/manifest.json"))
    if not manifests:
        pytest.skip("no bundled translation model")
    manifest = json.loads(manifests[-1].read_text())
    manifest.setdefault("decoding", {})["speeds"] = SPEEDS
    with pytest.raises(ValueError, match="speeds.*applies to audio input"):
        parse_manifest(manifest, "manifest.json")


@pytest.fixture(scope="module")
def engines(speech_examples):
    """(read once, read at SPEEDS): the bundled recognizer's newest version, two manifests."""
    newest = find_models(REPOSITORY, only=[NAME])[NAME].path
    with decoding_variant(newest, None, True, speeds=[1.0], word_lm=False) as once_dir, \
            decoding_variant(newest, None, True, speeds=SPEEDS, word_lm=False) as read_dir:
        once, read = open_speech_version(once_dir), open_speech_version(read_dir)
        yield once, read
        once.close()
        read.close()


def _request(audio: AudioInput, beam_size: int = 8, attention: bool = True, nbest: int = 1) -> GenerationRequest:
    return GenerationRequest(NAME, audio=audio,
                             decoding=DecodingOptions(beam_size=beam_size, num_return_sequences=nbest),
                             attention=AttentionOptions(enabled=attention, granularity=AttentionGranularity.PIECES))


def test_the_answer_is_the_best_scoring_reading_each_decoded_alone(engines, speech_examples):
    once, read = engines
    chosen = []
    for example in speech_examples:
        samples, rate = example_samples(example)
        alone = {s: once.generate(_request(AudioInput(samples=samples, sample_rate_hz=round(rate * s)), nbest=2), WAIT)
                 for s in SPEEDS}
        best = max(SPEEDS, key=lambda s: alone[s].nbest[0].score)  # SPEEDS starts with 1.0: it wins ties
        served = read.generate(_request(AudioInput(samples=samples, sample_rate_hz=rate)), WAIT)
        assert served.text == alone[best].text
        assert served.nbest == []  # one sequence asked for; the readings' own n-best stays inside
        end = example["duration"]
        np.testing.assert_allclose([(w.start_seconds, w.end_seconds) for w in served.words],
                                   [(min(w.start_seconds * best, end), min(w.end_seconds * best, end))
                                    for w in alone[best].words], atol=1e-4)
        # The winning reading's own confidences: times move, how sure the model was does not.
        np.testing.assert_allclose([w.confidence for w in served.words], [w.confidence for w in alone[best].words],
                                   atol=1e-4)
        # Attention over the recording's own columns, each row still a distribution.
        assert served.attention.col_labels == alone[1.0].attention.col_labels
        assert served.source_tokens == alone[1.0].source_tokens
        np.testing.assert_allclose(np.sum(served.attention.weights, axis=1), 1.0, atol=1e-5)
        chosen.append(best)
    assert set(chosen) != {1.0}, "no clip chose another speed: the test would not see the mapping"


def test_a_streamed_answer_equals_the_unary_one(engines, speech_examples):
    _, read = engines
    for example in speech_examples:
        samples, rate = example_samples(example)
        request = _request(AudioInput(samples=samples, sample_rate_hz=rate))
        unary = read.generate(request, WAIT)
        streamed = []
        future = read.submit(request, on_token=streamed.append)
        result = future.result(WAIT)
        assert result.text == unary.text == "".join(t.text for t in streamed)
        assert [t.token for t in streamed] == result.tokens
        np.testing.assert_allclose([t.attention for t in streamed], result.attention.weights, atol=1e-6)


def test_greedy_requests_are_read_once(engines, speech_examples):
    once, read = engines
    samples, rate = example_samples(speech_examples[0])
    request = _request(AudioInput(samples=samples, sample_rate_hz=rate), beam_size=1)
    assert read.generate(request, WAIT).text == once.generate(request, WAIT).text


def _spy(engine, monkeypatch) -> list:
    """Records (reading speed, inner future) of every request the engine queues."""
    queued, submit = [], engine.submit_prepared

    def spy(prepared, *args, **kwargs):
        future = submit(prepared, *args, **kwargs)
        queued.append((prepared.speed, future))
        return future

    monkeypatch.setattr(engine, "submit_prepared", spy)
    return queued


def test_a_clip_too_long_to_slow_down_is_read_at_the_other_speeds(engines, speech_examples, monkeypatch):
    once, read = engines
    queued = _spy(read, monkeypatch)
    samples, rate = example_samples(speech_examples[0])
    window = read.info.audio.max_seconds
    # Repeated up to just under the window: the 0.9 reading would pass it.
    long = np.tile(samples, int(window * rate * 0.97 // len(samples)) + 1)[: int(window * rate * 0.97)]
    served = read.generate(_request(AudioInput(samples=long, sample_rate_hz=rate), attention=False), WAIT)
    alone = {s: once.generate(_request(AudioInput(samples=long, sample_rate_hz=round(rate * s)), attention=False,
                                       nbest=2), WAIT) for s in (1.0, 1.1)}
    assert served.text == max(alone.values(), key=lambda r: r.nbest[0].score).text
    assert sorted(speed for speed, _ in queued if speed is not None) == [1.0, 1.1]  # 0.9 would last 21.6 s


def test_a_clip_too_short_to_speed_up_is_read_at_the_other_speeds(engines, monkeypatch):
    once, read = engines
    queued = _spy(read, monkeypatch)
    # 26 ms: one 25 ms analysis window; played 1.1x as fast it would hold none.
    tone = (0.3 * np.sin(np.arange(416) * 0.2)).astype(np.float32)
    served = read.generate(_request(AudioInput(samples=tone, sample_rate_hz=16000), attention=False), WAIT)
    assert sorted(speed for speed, _ in queued if speed is not None) == [0.9, 1.0]
    alone = {s: once.generate(_request(AudioInput(samples=tone, sample_rate_hz=round(16000 * s)), attention=False,
                                       nbest=2), WAIT) for s in (1.0, 0.9)}
    assert served.text == max(alone.values(), key=lambda r: r.nbest[0].score).text


def test_cancelling_cancels_every_reading(engines, speech_examples, monkeypatch):
    _, read = engines
    queued = _spy(read, monkeypatch)
    samples, rate = example_samples(speech_examples[0])
    futures = [read.submit(_request(AudioInput(samples=samples, sample_rate_hz=rate))) for _ in range(6)]
    for future in futures:
        read.cancel(future)
    assert all(f.cancelled() for f in futures)
    readings = [f for speed, f in queued if speed is not None]
    assert len(readings) == 6 * len(SPEEDS)
    for inner in readings:  # each stopped (or, started before the cancel, ended) without an answer used
        with pytest.raises(Exception):
            inner.result(WAIT)
    # Nothing of theirs is left behind: a fresh request is answered at once.
    assert read.generate(_request(AudioInput(samples=samples, sample_rate_hz=rate)), WAIT).text
    assert read.queued() == 0


def test_an_engine_in_a_child_process_reads_as_in_process(engines, speech_examples):
    """--engine-process: the child prepares and submits the request; its readings answer the same."""
    _, read = engines
    samples, rate = example_samples(speech_examples[1])
    request = _request(AudioInput(samples=samples, sample_rate_hz=rate))
    child, alone = child_and_in_process(read, request, WAIT, speeds=SPEEDS, word_lm=False)
    assert (child.text, child.words, child.attention.weights) == (alone.text, alone.words, alone.attention.weights)


def test_a_request_that_asks_to_be_read_once_is_the_recording_alone(engines, speech_examples, monkeypatch):
    once, read = engines
    queued = _spy(read, monkeypatch)
    samples, rate = example_samples(speech_examples[2])
    request = _request(AudioInput(samples=samples, sample_rate_hz=rate))
    alone = once.generate(request, WAIT)
    asked = dataclasses.replace(request, decoding=dataclasses.replace(request.decoding, read_once=True))
    served = read.generate(asked, WAIT)
    assert (served.text, served.words, served.attention.weights) == (alone.text, alone.words, alone.attention.weights)
    assert [speed for speed, _ in queued] == [None]  # the request itself, no reading


def test_get_model_states_the_speeds_and_the_wire_keeps_them_and_read_once(engines):
    once, read = engines
    assert read.info.audio.speeds == tuple(SPEEDS) and once.info.audio.speeds == (1.0,)
    assert not read.info.audio.word_lm  # its manifest copy leaves the word LM out
    assert convert.model_info_from_proto(convert.model_info_to_proto(read.info)) == read.info
    request = GenerationRequest(NAME, audio=AudioInput(wav=b"RIFF"), decoding=DecodingOptions(read_once=True))
    assert convert.request_from_proto(convert.request_to_proto(request)).decoding.read_once
