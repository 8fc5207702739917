"""The bundled speech recognizer (models/speech-en) on the held-out-voice clips shipped beside it: it
transcribes them, times their words where the synthesizer said them, and answers the same alone and
batched."""

from __future__ import annotations

import difflib
import os
import pathlib

import numpy as np
import pytest

from attnserve.export.speech.scoring import error_rate
from attnserve.server.engine.batcher import BatchingOptions
from attnserve.api.generation import AudioInput, DecodingOptions, GenerationRequest
from attnserve.server.engine.registry import load_engine
from attnserve.server.model.repository import find_models
from attnserve.server.model.runtime import RuntimeOptions

pytestmark = pytest.mark.bundled

REPOSITORY = pathlib.Path(os.environ.get("ATTNSERVE_BUNDLED_MODELS", pathlib.Path(__file__).parents[1] / "models"))
NAME = "speech-en"
EXAMPLES = REPOSITORY / NAME / "examples"
WAIT = 120


@pytest.fixture(scope="module")
def engine(speech_examples):
    engine = load_engine(find_models(REPOSITORY)[NAME], RuntimeOptions(), BatchingOptions(max_batch_size=8, window_ms=200.0))
    yield engine
    engine.close()


def request(example: dict, beam_size: int = 1) -> GenerationRequest:
    wav = (EXAMPLES / example["file"]).read_bytes()
    return GenerationRequest(NAME, audio=AudioInput(wav=wav), decoding=DecodingOptions(beam_size=beam_size))


@pytest.fixture(scope="module")
def alone(engine, speech_examples):
    return [engine.generate(request(e), WAIT) for e in speech_examples]


def test_held_out_voices_are_transcribed(alone, speech_examples):
    # The served version is undertrained (its card has the error rates of all held-out clips); a broken
    # export, feature change or decode loop writes unrelated or looping text, 100% and more.
    cer = error_rate([r.text for r in alone], [e["text"] for e in speech_examples], "char")
    # Measured: version 3 0.27, version 2 0.44 (both with joint CTC/attention decoding; version 1, the speller
    # alone cut by the CTC length hint: 0.64).
    assert cer < 0.55, [(r.text, e["text"]) for r, e in zip(alone, speech_examples)]


def test_words_are_timed_where_the_synthesizer_said_them(alone, speech_examples):
    errors = []
    for result, example in zip(alone, speech_examples):
        assert result.words and [w.word for w in result.words] == result.text.split()
        starts = [w.start_seconds for w in result.words]
        assert starts == sorted(starts) and all(w.start_seconds < w.end_seconds <= example["duration"] + 0.01
                                                for w in result.words)
        served, reference = [w.word for w in result.words], [w for w, _, _ in example["words"]]
        for block in difflib.SequenceMatcher(None, served, reference, autojunk=False).get_matching_blocks():
            errors += [abs(result.words[block.a + k].start_seconds - example["words"][block.b + k][1])
                       for k in range(block.size)]
    assert len(errors) >= len(speech_examples) and np.median(errors) < 0.2


def test_a_batch_of_the_clips_equals_each_alone(engine, alone, speech_examples):
    futures = [engine.submit(request(e)) for e in speech_examples]
    batched = [f.result(WAIT) for f in futures]
    assert max(r.timings.batch_size for r in batched) > 1
    for a, b in zip(alone, batched):
        assert a.text == b.text
        assert [(w.word, w.start_seconds, w.end_seconds) for w in a.words] == [
            (w.word, w.start_seconds, w.end_seconds) for w in b.words]
        # Log-probabilities, and the confidences read from them, may differ in their last bits across batches.
        np.testing.assert_allclose([t.logprob for t in a.tokens], [t.logprob for t in b.tokens], atol=1e-4)
        np.testing.assert_allclose([w.confidence for w in a.words], [w.confidence for w in b.words], atol=1e-4)

