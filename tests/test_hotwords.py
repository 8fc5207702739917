"""Hotwords (server/decoding/hotwords.py): a request's names and terms favoured by the search, through the
bundled recognizer; the bonus is a potential, so a hypothesis keeps exactly what its finished hotwords and
its half-written one earned."""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib

import numpy as np
import pytest

from attnserve.api import convert
from attnserve.api.generation import AudioInput, DecodingOptions, GenerationRequest
from attnserve.server.decoding.hotwords import MAX_HOTWORDS, HotwordBias, Vocabulary, hotword_bias

REPOSITORY = pathlib.Path(os.environ.get("ATTNSERVE_BUNDLED_MODELS", pathlib.Path(__file__).parents[1] / "models"))
NAME = "speech-en"
EXAMPLES = REPOSITORY / NAME / "examples"
WAIT = 120
EOS = 2
CHARACTERS = Vocabulary(("<pad>", "<unk>", "</s>", "<s>", "▁", "'", *"abcdefghijklmnopqrstuvwxyz"),
                        frozenset({0, 1, 2, 3}))  # speech-en's


def ids(text: str, vocabulary: Vocabulary = CHARACTERS) -> list[int]:
    return [vocabulary.pieces.index("▁" if c == " " else c) for c in text]


def test_each_letter_of_a_hotword_gains_its_place_in_the_word_and_the_break_after_it_the_whole():
    bias = HotwordBias(["cat"], 1.0, CHARACTERS)
    at_start = bias.deltas(np.array(ids(""), dtype=np.int64))
    assert at_start[ids("c")[0]] == 1.0 and at_start[ids("x")[0]] == 0.0 and at_start[EOS] == 0.0
    half = bias.deltas(np.array(ids("ca"), dtype=np.int64))
    assert half[ids("t")[0]] == 3.0 and half[ids("x")[0]] == 0.0 and half[ids(" ")[0]] == 0.0 and half[EOS] == 0.0
    whole = bias.deltas(np.array(ids("the cat"), dtype=np.int64))
    assert whole[ids(" ")[0]] == 3.0 and whole[EOS] == 3.0 and whole[ids("s")[0]] == 0.0  # "cats" is not "cat"


def test_a_row_off_every_hotword_is_left_as_the_model_scored_it():
    bias = HotwordBias(["ungawa", "dog's"], 2.0, CHARACTERS)
    for text in ("the un", "ungaw", "zebra", "dog", "ungawas"):
        deltas = bias.deltas(np.array(ids(text + "x"), dtype=np.int64))
        assert not deltas.any(), text
    # Along a hotword the pull compounds: its k-th letter gains k x boost.
    gains = [bias.deltas(np.array(ids("ungawa"[:k]), dtype=np.int64))[ids("ungawa"[k])[0]] for k in range(6)]
    assert gains == [2.0, 4.0, 6.0, 8.0, 10.0, 12.0]


def test_pieces_that_open_a_word_with_letters_gain_them_at_once():
    vocabulary = Vocabulary(("</s>", "▁", "▁ca", "t", "▁dog", "s", "c", "a"), frozenset({0}))
    bias = HotwordBias(["cat"], 1.0, vocabulary)
    start = bias.deltas(np.array([], dtype=np.int64))
    assert start[2] == 2.0 and start[4] == 0.0 and start[6] == 1.0 and start[1] == 0.0
    assert bias.deltas(np.array([2], dtype=np.int64))[3] == 3.0  # "▁ca" + "t": the whole "cat"


def test_byte_level_pieces_match_a_hotword_by_its_bytes():
    vocabulary = Vocabulary(("<|endoftext|>", "Ġca", "f", "Ã©", "Ġthe", "e"), frozenset({0}), "Ġ")
    bias = hotword_bias(["café"], 1.0, vocabulary, "whisper")
    assert bias.words == {"cafÃ©"}
    assert bias.deltas(np.array([], dtype=np.int64))[1] == 2.0  # "Ġca" opens it
    after = bias.deltas(np.array([4, 1, 2], dtype=np.int64))  # " the caf"
    assert after[3] == 5.0 and after[5] == 0.0  # "é" is two bytes: "cafÃ©" is five characters; "cafe" is not it
    assert bias.deltas(np.array([1, 2, 3], dtype=np.int64))[0] == 5.0  # the end after the whole word


@pytest.mark.parametrize("phrases, boost, message", [
    (["Joe"], 2.0, "characters model 'speech-en' never writes: 'J'"),
    (["a" * 51], 2.0, "the limit is 50"),
    ([" ".join(f"w{'a' * (i % 7)}{chr(97 + i % 26)}{chr(97 + i // 26)}" for i in range(MAX_HOTWORDS + 1))], 2.0,
     f"over the limit of {MAX_HOTWORDS} words"),
    (["  "], 2.0, "holds no word"),
    (["cat"], 11.0, "hotword_boost 11.0 is out of range"),
    (["cat"], -1.0, "hotword_boost -1.0 is out of range"),
])
def test_lists_a_model_cannot_take_are_refused_naming_the_limit(phrases, boost, message):
    with pytest.raises(ValueError) as raised:
        hotword_bias(phrases, boost, CHARACTERS, NAME)
    assert message in str(raised.value)


def test_a_phrase_counts_its_words_one_by_one():
    assert hotword_bias(["filtering options", "options"], 2.0, CHARACTERS, NAME).words == {"filtering", "options"}


def test_the_hotwords_survive_the_wire():
    options = DecodingOptions(beam_size=8, hotwords=("additional", "filtering"), hotword_boost=1.5)
    assert convert._decoding_from_proto(convert._decoding_to_proto(options)) == options


@pytest.fixture(scope="module")
def clips() -> dict[str, AudioInput]:
    examples = json.loads((EXAMPLES / "examples.json").read_text())
    return {e["file"]: AudioInput(wav=(EXAMPLES / e["file"]).read_bytes()) for e in examples}


def _request(audio: AudioInput, hotwords=(), beam_size: int = 8) -> GenerationRequest:
    return GenerationRequest(NAME, audio=audio, decoding=DecodingOptions(beam_size=beam_size, hotwords=hotwords))


# "displays or hides additional filtering options", served by speech-en 12 as "... additional folter in options"
MISHEARD = "piper-en_US-joe-medium-000005.wav"
# "the document is not locked by any other user", served as "... is not luck by ..."
NAMED = "piper-en_US-joe-medium-000000.wav"


def test_words_the_model_misses_are_heard_when_they_are_hotwords(bundled_speech, clips):
    plain = bundled_speech.generate(_request(clips[NAMED]), WAIT).text.split()
    assert "locked" not in plain
    helped = bundled_speech.generate(_request(clips[NAMED], ("locked", "zebra")), WAIT).text.split()  # default boost
    assert "locked" in helped and "zebra" not in helped


def test_a_larger_boost_pulls_harder(bundled_speech, clips):
    def heard(boost: float) -> list[str]:
        request = _request(clips[MISHEARD], ("filtering",))
        request = dataclasses.replace(request, decoding=dataclasses.replace(request.decoding, hotword_boost=boost))
        return bundled_speech.generate(request, WAIT).text.split()

    assert "filtering" not in heard(0.25) and "filtering" not in heard(0.5) and "filtering" in heard(1.0)


def test_hotwords_the_clip_does_not_hold_leave_its_transcript_as_it_was(bundled_speech, clips):
    for audio in clips.values():
        plain = bundled_speech.generate(_request(audio), WAIT)
        assert bundled_speech.generate(_request(audio, ("zebra", "quixotic")), WAIT).text == plain.text


def test_a_batch_mixing_requests_with_and_without_hotwords_equals_each_alone(bundled_speech, clips):
    audio = clips[MISHEARD]
    requests = [_request(audio, ("additional", "filtering")), _request(audio), _request(audio, ("options",)),
                _request(audio, ("additional",), beam_size=1)]
    alone = [bundled_speech.generate(r, WAIT) for r in requests]
    futures = [bundled_speech.submit(r) for r in requests]
    batched = [f.result(WAIT) for f in futures]
    assert max(r.timings.batch_size for r in batched) > 1
    assert [r.text for r in batched] == [r.text for r in alone]
    np.testing.assert_allclose([t.logprob for r in batched for t in r.tokens],
                               [t.logprob for r in alone for t in r.tokens], atol=1e-4)


def test_a_streamed_answer_with_hotwords_equals_the_unary_one(bundled_speech, clips):
    request = _request(clips[MISHEARD], ("additional",), beam_size=1)
    unary = bundled_speech.generate(request, WAIT)
    streamed = []
    result = bundled_speech.submit(request, on_token=streamed.append).result(WAIT)
    assert result.text == unary.text == "".join(t.text for t in streamed)
