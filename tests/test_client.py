"""The Python clients, and the protobuf <-> dataclass conversion they share with the server."""

from __future__ import annotations

import asyncio
import dataclasses

import grpc
import numpy as np
import pytest

from attnserve.clients.client import AsyncClient, AttnServeError, Client, translation_request
from attnserve.api import convert, generation
from attnserve.api.generation import AttentionGranularity, AttentionMatrix, GenerationResult, StreamedToken
from attnserve.v1 import attnserve_pb2 as pb
from fakes import WAIT, FakeEngine

MODEL = "fake-translate"  # the fake_server's model


@pytest.fixture
def client(fake_server):
    background, _ = fake_server
    with Client(background.address, timeout=WAIT) as client:
        yield client


def test_translate_returns_the_engine_result(client, fake_engine):
    result = client.translate("我愛你", to="zh-TW", attention=True, granularity="pieces", model=MODEL)
    request = translation_request("我愛你", "zh-TW", True, "pieces", model=MODEL)
    sent = fake_engine.requests[-1]  # with the id the server gives a request that names none
    assert sent.request_id.startswith("gen-") and dataclasses.replace(sent, request_id="") == request
    assert result == fake_engine.generate(request)
    assert result.attention.col_labels == ["我", "愛", "你", "</s>"]


def test_translate_sends_every_option(client, fake_engine):
    client.translate("abc", to="en", attention=True, granularity="words", layer=-2, max_new_tokens=2, model=MODEL)
    assert dataclasses.replace(fake_engine.requests[-1], request_id="") == generation.GenerationRequest(
        model=MODEL,
        text="abc",
        target_language="en",
        decoding=generation.DecodingOptions(max_new_tokens=2),
        attention=generation.AttentionOptions(True, -2, AttentionGranularity.WORDS),
    )


def test_translate_without_attention_has_none(client):
    assert client.translate("abc", model=MODEL).attention is None


def test_stream_yields_tokens_then_the_result(client):
    request = translation_request("abcd", attention=True, granularity="pieces", model=MODEL)
    *tokens, result = list(client.stream(request))
    assert isinstance(result, GenerationResult) and result == client.generate(request)
    assert all(isinstance(t, StreamedToken) for t in tokens)
    assert [t.index for t in tokens] == [0, 1, 2, 3]
    assert [t.token for t in tokens] == result.tokens
    assert [t.attention for t in tokens] == result.attention.weights


def test_stream_without_attention_has_no_rows(client):
    *tokens, result = list(client.stream(translation_request("abcd", model=MODEL)))
    assert len(tokens) == 4 and all(t.attention is None for t in tokens)
    assert result.attention is None


def test_source_language_is_checked(client):
    request = translation_request("abc", model=MODEL)
    assert client.generate(request, source_language="en").text == "cba"
    with pytest.raises(AttnServeError) as raised:
        client.generate(request, source_language="xx")
    assert raised.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert "unknown source language 'xx'" in raised.value.details


def test_models(client, fake_engine):
    assert client.list_models() == [fake_engine.info]
    assert client.get_model(MODEL) == fake_engine.info


def test_errors_carry_code_and_details(client):
    with pytest.raises(AttnServeError) as raised:
        client.translate("abc", model="nope")
    error = raised.value
    assert error.code == grpc.StatusCode.NOT_FOUND
    assert error.details == f"unknown model 'nope'; available: {MODEL}"
    assert str(error) == f"NOT_FOUND: {error.details}"


def test_stream_errors_are_attnserve_errors(client):
    with pytest.raises(AttnServeError) as raised:
        list(client.stream(translation_request("abc", to="fr", model=MODEL)))
    assert raised.value.code == grpc.StatusCode.INVALID_ARGUMENT


def test_timeout_is_deadline_exceeded(fake_server, fake_engine):
    background, _ = fake_server
    fake_engine.gate.clear()
    with Client(background.address, timeout=0.2) as client, pytest.raises(AttnServeError) as raised:
        client.translate("abc", model=MODEL)
    assert raised.value.code == grpc.StatusCode.DEADLINE_EXCEEDED


def test_unreachable_server_is_unavailable():
    with Client("127.0.0.1:1", timeout=WAIT) as client, pytest.raises(AttnServeError) as raised:
        client.list_models()
    assert raised.value.code == grpc.StatusCode.UNAVAILABLE


def test_async_client(fake_server, fake_engine):
    background, _ = fake_server

    async def scenario():
        async with AsyncClient(background.address, timeout=WAIT) as client:
            result = await client.translate("abc", attention=True, model=MODEL)
            streamed = [event async for event in client.stream(translation_request("abc", model=MODEL))]
            models = await client.list_models()
            info = await client.get_model(MODEL)
            with pytest.raises(AttnServeError) as raised:
                await client.get_model("nope")
        return result, streamed, models, info, raised.value

    result, streamed, models, info, error = asyncio.run(scenario())
    assert result == fake_engine.generate(translation_request("abc", attention=True, model=MODEL))
    assert [e.token for e in streamed[:-1]] == streamed[-1].tokens
    assert models == [info] == [fake_engine.info]
    assert error.code == grpc.StatusCode.NOT_FOUND


# ---- conversion ------------------------------------------------------------------------------------


def _result(attention: AttentionMatrix | None) -> GenerationResult:
    return GenerationResult(
        model="m",
        text="I love you",
        target_language="en",
        tokens=[generation.Token("▁I", 10, -0.125), generation.Token("▁love", 11, -1 / 3)],
        source_tokens=[generation.Token("我", 20, 0.0), generation.Token("</s>", 2, 0.0)],
        finish_reason=generation.FinishReason.LENGTH,
        attention=attention,
        timings=generation.Timings(0.1, 0.2, 0.3, 0.4, 1.0, 3),
    )


@pytest.mark.parametrize(
    "attention",
    [None, AttentionMatrix([[0.75, 0.25], [0.5, 0.5]], ["▁I", "▁love"], ["我", "</s>"], 2, "layer 2 of 3")],
)
def test_result_round_trips(attention):
    # Weights travel as float32: these are exact in float32, logprobs and timings travel as double.
    result = _result(attention)
    assert convert.result_from_proto(convert.result_to_proto(result)) == result


def test_request_round_trips():
    request = translation_request("abc", "zh-TW", True, "words", -2, 5, "m", beam_size=4, request_id="x")
    assert convert.request_from_proto(convert.request_to_proto(request)) == request
    heads = translation_request("abc", attention=True, heads=[0, -1], reduction="max")
    assert convert.request_from_proto(convert.request_to_proto(heads)) == heads


def test_unknown_reduction_is_a_value_error_on_both_sides():
    with pytest.raises(ValueError):
        translation_request("abc", reduction="median")
    wire = convert.request_to_proto(translation_request("abc", attention=True))
    wire.attention.reduction = 7
    with pytest.raises(ValueError, match="unknown attention reduction 7"):
        convert.request_from_proto(wire)


def test_model_info_round_trips():
    info = FakeEngine().info
    assert convert.model_info_from_proto(convert.model_info_to_proto(info)) == info


@pytest.mark.parametrize(
    "kind_fields",
    [
        {"input_kind": generation.InputKind.AUDIO, "audio": generation.AudioInputInfo(16000, 30.0, 1 << 24, 0.04)},
        {"input_kind": generation.InputKind.IMAGE, "image": generation.ImageInputInfo(224, 224, 7, 7, 1 << 23, 1 << 24)},
    ],
    ids=["audio", "image"],
)
def test_model_info_of_every_input_kind_round_trips(kind_fields):
    info = dataclasses.replace(FakeEngine().info, **kind_fields)
    wire = convert.model_info_to_proto(info)
    assert wire.HasField("audio") == (info.audio is not None) and wire.HasField("image") == (info.image is not None)
    assert convert.model_info_from_proto(wire) == info


def test_model_info_without_a_kind_is_a_text_model():
    wire = convert.model_info_to_proto(FakeEngine().info)
    wire.input_kind = pb.INPUT_KIND_UNSPECIFIED  # what a server from before input kinds sends
    assert convert.model_info_from_proto(wire).input_kind is generation.InputKind.TEXT
    wire.input_kind = 9
    with pytest.raises(ValueError, match="unknown input kind 9"):
        convert.model_info_from_proto(wire)


@pytest.mark.parametrize(
    "inputs",
    [
        {"audio": generation.AudioInput(wav=b"RIFF....WAVE")},
        {"audio": generation.AudioInput(samples=np.array([0.5, -0.25], np.float32), sample_rate_hz=8000)},
        {"image": generation.ImageInput(b"\x89PNG")},
    ],
    ids=["wav", "samples", "image"],
)
def test_audio_and_image_requests_round_trip(inputs):
    request = generation.GenerationRequest("m", target_language="en", **inputs)
    wire = convert.request_to_proto(request)
    assert wire.WhichOneof("input") == next(iter(inputs))
    assert convert.request_from_proto(wire) == request


def test_a_request_with_two_inputs_cannot_be_sent():
    request = generation.GenerationRequest("m", "text", audio=generation.AudioInput(wav=b"RIFF"))
    with pytest.raises(ValueError, match="carries one input; this one has text and audio"):
        convert.request_to_proto(request)


def test_audio_request_builds_wav_and_sample_requests():
    from attnserve.clients.client import audio_request

    wav = audio_request(b"RIFF", model="speech", to="en", attention=True)
    assert wav.audio == generation.AudioInput(wav=b"RIFF") and wav.text == "" and wav.attention.enabled
    samples = audio_request([0.0, 0.5], 8000, model="speech")
    assert samples.audio.samples.dtype == np.float32 and samples.audio.sample_rate_hz == 8000
    assert samples.audio != generation.AudioInput(samples=np.array([0.0, 0.25], np.float32), sample_rate_hz=8000)


def test_ragged_attention_is_a_broken_invariant():
    matrix = AttentionMatrix([[1.0, 0.0], [1.0]], ["a", "b"], ["x", "y"], 0, "")
    with pytest.raises(RuntimeError, match="2 x 2"):
        convert.result_to_proto(_result(matrix))


def test_short_attention_weights_are_rejected():
    msg = pb.AttentionMatrix(rows=2, cols=2, weights=[1.0, 0.0, 1.0], row_labels=["a", "b"], col_labels=["x", "y"])
    with pytest.raises(ValueError, match="carries 3 weights"):
        convert.attention_from_proto(msg)


def test_unknown_finish_reason_is_rejected():
    msg = convert.result_to_proto(_result(None))
    msg.finish_reason = pb.FINISH_REASON_UNSPECIFIED
    with pytest.raises(ValueError, match="finish reason"):
        convert.result_from_proto(msg)


def test_unknown_granularity_is_a_value_error():
    with pytest.raises(ValueError):
        translation_request("abc", granularity="letters")


@pytest.mark.parametrize("attention", [[0.5, 0.25], None])
def test_streamed_token_round_trips(attention):
    event = StreamedToken(3, generation.Token("▁a", 7, -0.5), attention)
    assert convert.stream_events_from_proto(convert.token_event_to_proto(event)) == [event]


# ---- the real engine -----------------------------------------------------------------------------------


@pytest.fixture
def tiny_client(tiny_server):
    background, engines = tiny_server
    with Client(background.address, timeout=WAIT) as client:
        yield client, engines["tiny-translate"]


def test_real_translate_is_the_offline_result_as_it_travels(tiny_client):
    client, engine = tiny_client
    request = translation_request("知識就是力量。", "en", attention=True, model="tiny-translate")
    served = client.translate("知識就是力量。", "en", attention=True, model="tiny-translate")
    offline = engine.generate(request)
    # Attention weights travel as float32; everything else arrives exactly.
    expected = convert.result_from_proto(convert.result_to_proto(offline))
    assert dataclasses.replace(served, timings=None) == dataclasses.replace(expected, timings=None)
    assert served.attention.col_labels[-1] == "</s>"


def test_real_stream_is_the_unary_result_with_its_rows(tiny_client):
    client, _ = tiny_client
    request = translation_request("知識就是力量。", attention=True, granularity="pieces", model="tiny-translate")
    *tokens, result = list(client.stream(request))
    unary = client.generate(request)
    assert dataclasses.replace(result, timings=None) == dataclasses.replace(unary, timings=None)
    assert tokens and [t.token for t in tokens] == unary.tokens
    np.testing.assert_allclose([t.attention for t in tokens], unary.attention.weights, atol=1e-6)


@pytest.mark.parametrize("interval", [0, 3])
def test_real_stream_in_batches_yields_the_same_tokens_one_by_one(tiny_server, interval, monkeypatch):
    background, _ = tiny_server
    request = translation_request("知識就是力量。", attention=True, granularity="pieces", model="tiny-translate")
    messages, from_proto = [], convert.stream_events_from_proto
    monkeypatch.setattr(convert, "stream_events_from_proto", lambda m: messages.append(m) or from_proto(m))

    async def batched_async():
        async with AsyncClient(background.address, timeout=WAIT) as client:
            return [event async for event in client.stream(request, stream_interval=interval)]

    with Client(background.address, timeout=WAIT) as client:
        one_by_one = list(client.stream(request))
        sent = len(messages)
        assert len(one_by_one) > 4  # tokens enough to batch
        batched = list(client.stream(request, stream_interval=interval))
    assert len(messages) - sent == (len(one_by_one) if interval == 0 else 2 + -(-(len(one_by_one) - 2) // interval))
    for streamed in (batched, asyncio.run(batched_async())):
        assert [t.token for t in streamed[:-1]] == [t.token for t in one_by_one[:-1]]
        np.testing.assert_allclose([t.attention for t in streamed[:-1]], [t.attention for t in one_by_one[:-1]])
        assert dataclasses.replace(streamed[-1], timings=None) == dataclasses.replace(one_by_one[-1], timings=None)
