"""An audio model served end to end: the tiny listen-attend-spell model (tests/tiny_speech.py) takes WAV files
and raw samples over gRPC. Served == the PyTorch reference on the same features, batched == alone, streamed
== unary; ModelInfo states the kind and limits; bad audio is INVALID_ARGUMENT, too much is OUT_OF_RANGE, and
neither ever reaches a batch."""

from __future__ import annotations

import json
import math
import shutil

import grpc
import numpy as np
import pytest
import torch

from attnserve.clients import cli, timeline
from attnserve.clients.client import AttnServeError, Client, audio_request
from attnserve.server.edge import app
from attnserve.server.inputs.audio import read_wav, resample
from attnserve.server.engine.batcher import BatchingOptions
from attnserve.server.inputs.features import log_mel
from attnserve.server.engine.registry import load_engine
from attnserve.api.generation import (
    AttentionGranularity,
    AudioInput,
    GenerationRequest,
    InputKind,
    InputTooLargeError,
)
from attnserve.server.model.manifest import load_manifest
from attnserve.server.model.repository import find_models, open_runtime
from attnserve.server.model.runtime import RuntimeOptions
from attnserve.server.attention.timestamps import word_timings
from attnserve.v1 import attnserve_pb2 as pb
from attnserve.v1 import attnserve_pb2_grpc as pb_grpc
from conftest import TINY_SPEECH_NAME as NAME
from fakes import BATCHING_MODES, WAIT, batching, generate_together, held, wav_bytes

ATOL = 1e-5
RATE = 16000


def clip(seconds: float, rate: int = RATE, seed: int = 0, channels: int = 1) -> np.ndarray:
    """A chirp plus noise: every clip different, every frame different."""
    t = np.arange(round(seconds * rate)) / rate
    x = 0.3 * np.sin(2 * np.pi * (200 + 900 * t) * t) + 0.05 * np.random.default_rng(seed).standard_normal(len(t))
    return x if channels == 1 else np.stack([x, np.roll(x, 7)], axis=1)


# (seconds, rate, channels, format): mixed lengths, rates and layouts, as clients send them
CLIPS = [(1.0, 16000, 1, "pcm16"), (0.4, 8000, 1, "float32"), (2.2, 44100, 2, "pcm16"), (0.13, 48000, 2, "float32")]


def wav(i: int) -> bytes:
    seconds, rate, channels, fmt = CLIPS[i]
    return wav_bytes(clip(seconds, rate, i, channels), rate, fmt)


def reference(model, data: bytes, start: int) -> tuple[list[int], np.ndarray, int]:
    """Offline: the server's own WAV reader, resampler and features, then the PyTorch model's greedy decode.

    Returns:
        tokens, (n, S) attention, and the clip's frame count.
    """
    spec = load_manifest_of_repo().input.features
    parsed = read_wav(data)
    samples = resample(parsed.samples(), parsed.sample_rate_hz, RATE)
    features = log_mel(samples, spec)
    tokens, attention = model.greedy_decode(torch.from_numpy(features), start, eos=2, max_new=12)
    return tokens, attention, len(features)


_REPO = {}


def load_manifest_of_repo():
    return load_manifest(_REPO["path"] / NAME / "1" / "manifest.json")


@pytest.fixture(scope="module")
def served(tiny_speech_repo):
    """(client, stub, engines): the tiny speech model behind an in-process gRPC server."""
    _REPO["path"] = tiny_speech_repo
    # A server that does not cut long recordings: the model's window is the limit (long-form audio, cut
    # at pauses, is tests/test_longform.py's).
    engines = app.load_engines(app.ServeOptions(models=str(tiny_speech_repo), long_form_max_minutes=0))
    with app.BackgroundServer(engines) as background, Client(background.address, timeout=WAIT) as client:
        with grpc.insecure_channel(background.address) as channel:
            yield client, pb_grpc.AttnServeStub(channel), engines


@pytest.fixture(scope="module")
def start(served) -> int:
    _, _, engines = served
    return engines[NAME].manifest.decoder_start["en"]


def status_of(call) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as raised:
        call()
    return raised.value


# ---- results -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("i", range(len(CLIPS)))
def test_a_served_wav_equals_the_offline_reference(served, tiny_speech_model, start, i):
    client, _, _ = served
    result = client.generate(audio_request(wav(i), model=NAME, attention=True, granularity="pieces"))
    tokens, attention, frames = reference(tiny_speech_model, wav(i), start)
    assert [t.id for t in result.tokens] == tokens and tokens
    np.testing.assert_allclose(result.attention.weights, attention, atol=ATOL)
    # One column per encoder position: ceil(frames / 4), labelled with its 40 ms time span.
    columns = -(-frames // 4)
    assert len(result.source_tokens) == len(result.attention.col_labels) == columns
    assert result.attention.col_labels[:2] == ["0.00-0.04", "0.04-0.08"]
    assert result.attention.col_labels[-1].endswith(f"-{frames * 0.01:.2f}")
    assert result.text == served[2][NAME].tokenizer.decode(tokens) and result.target_language == "en"
    # Word timestamps: the offline attention read along its monotonic path, over the same 40 ms columns.
    starts = np.arange(columns) * 0.04
    words = served[2][NAME].tokenizer.words(tokens)
    pieces = [t.piece for t in result.tokens]
    expected = word_timings(np.asarray(attention), pieces, words, starts, np.minimum(starts + 0.04, frames * 0.01))
    assert [w.word for w in result.words] == [w.word for w in expected] and expected
    np.testing.assert_allclose([(w.start_seconds, w.end_seconds) for w in result.words],
                               [(w.start_seconds, w.end_seconds) for w in expected], atol=1e-9)
    assert all(0 <= w.start_seconds < w.end_seconds <= frames * 0.01 for w in result.words)


def test_words_have_timestamps_without_asking_for_attention(served):
    client, _, _ = served
    with_attention = client.generate(audio_request(wav(0), model=NAME, attention=True))
    without = client.generate(audio_request(wav(0), model=NAME))
    assert without.attention is None and without.words == with_attention.words and without.words


def test_raw_samples_equal_the_same_audio_as_a_wav_file(served):
    client, _, _ = served
    x = clip(0.7, 22050, seed=5).astype(np.float32)
    from_wav = client.generate(audio_request(wav_bytes(x, 22050, "float32"), model=NAME, attention=True))
    from_samples = client.generate(audio_request(x, 22050, model=NAME, attention=True))
    assert from_samples.tokens == from_wav.tokens and from_samples.attention == from_wav.attention


@pytest.mark.parametrize("mode", BATCHING_MODES)
def test_a_batch_of_clips_equals_each_clip_alone(served, tiny_speech_repo, mode):
    _, _, engines = served
    n = len(CLIPS)
    requests = [GenerationRequest(NAME, audio=AudioInput(wav=wav(i)), attention=_pieces()) for i in range(n)]
    batched = generate_together(tiny_speech_repo, NAME, mode, requests)
    for request, result in zip(requests, batched):
        alone = engines[NAME].generate(request, WAIT)
        assert [t.id for t in result.tokens] == [t.id for t in alone.tokens]
        np.testing.assert_allclose(result.attention.weights, alone.attention.weights, atol=ATOL)
        assert result.source_tokens == alone.source_tokens


@pytest.mark.parametrize("beam_size", [1, 3])
def test_a_streamed_clip_ends_with_the_unary_response(served, beam_size):
    _, stub, _ = served
    request = pb.GenerateRequest(
        model=NAME, audio=pb.AudioInput(data=wav(2)), decoding=pb.DecodingOptions(beam_size=beam_size),
        attention=pb.AttentionOptions(mode=pb.ATTENTION_MODE_AGGREGATED, granularity=pb.ATTENTION_GRANULARITY_WORDS),
    )
    unary = stub.Generate(request, timeout=WAIT)
    *events, final = list(stub.GenerateStream(request, timeout=WAIT))
    final.response.ClearField("timings")
    unary.ClearField("timings")
    assert final.response == unary and [e.token.token for e in events] == list(unary.tokens)
    cols = unary.attention.cols  # words never merge time spans: the streamed rows have as many columns
    assert all(len(e.token.attention) == cols for e in events)


def _pieces():
    from attnserve.api.generation import AttentionOptions

    return AttentionOptions(enabled=True, granularity=AttentionGranularity.PIECES)


# ---- what the model says it takes ---------------------------------------------------------------------


def test_list_and_get_model_state_the_input_kind_and_limits(served):
    client, stub, _ = served
    info = client.get_model(NAME)
    assert client.list_models() == [info]
    assert info.input_kind is InputKind.AUDIO and info.image is None and info.task == "speech-recognition"
    assert (info.audio.sample_rate_hz, info.audio.max_seconds, info.audio.max_bytes) == (16000, 3.0, 400_000)
    assert info.audio.seconds_per_column == pytest.approx(0.04)
    assert info.max_source_tokens == 75  # 3 s: 298 frames, 75 columns
    wire = stub.GetModel(pb.GetModelRequest(name=NAME), timeout=WAIT)
    assert wire.input_kind == pb.INPUT_KIND_AUDIO and wire.audio.max_seconds == 3.0 and not wire.HasField("image")
    # The whole request's limit leaves room for the largest audio and the other fields; no text limit.
    assert info.max_request_bytes == wire.max_request_bytes > 400_000 and info.max_text_chars == 0
    assert info.max_beam_size == wire.max_beam_size == 16


def test_a_request_over_the_stated_size_is_refused_before_it_is_parsed(served):
    client, stub, _ = served
    limit = client.get_model(NAME).max_request_bytes
    too_big = pb.GenerateRequest(model=NAME, audio=pb.AudioInput(data=bytes(limit)))  # not even a WAV file
    error = status_of(lambda: stub.Generate(too_big, timeout=WAIT))
    assert error.code() in (grpc.StatusCode.OUT_OF_RANGE, grpc.StatusCode.RESOURCE_EXHAUSTED)
    assert "not a WAV file" not in error.details()  # refused by size, before the audio was read


# ---- bad input -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "audio,code,message",
    [
        (pb.AudioInput(data=b"this is no wav"), grpc.StatusCode.INVALID_ARGUMENT, "audio data is not a WAV file"),
        (pb.AudioInput(), grpc.StatusCode.INVALID_ARGUMENT, "audio is empty"),
        (pb.AudioInput(data=wav_bytes(np.zeros(0), RATE)), grpc.StatusCode.INVALID_ARGUMENT, "holds no samples"),
        (pb.AudioInput(samples=[0.0, float("nan")] * 400, sample_rate_hz=RATE), grpc.StatusCode.INVALID_ARGUMENT,
         "non-finite samples"),
        (pb.AudioInput(data=wav_bytes(np.zeros(10), RATE, "pcm24")), grpc.StatusCode.INVALID_ARGUMENT,
         "unsupported WAV format: 24-bit integer PCM"),
        (pb.AudioInput(data=wav_bytes(np.zeros(4 * 8000), 8000)), grpc.StatusCode.OUT_OF_RANGE,
         f"audio is 4.00 s long; model '{NAME}' accepts at most 3 s"),
        (pb.AudioInput(data=bytes(400_001)), grpc.StatusCode.OUT_OF_RANGE,
         f"audio is 400001 bytes; model '{NAME}' accepts at most 400000 bytes"),
    ],
)
@pytest.mark.parametrize("rpc", ["Generate", "GenerateStream"])
def test_bad_audio_is_refused_with_a_message(served, rpc, audio, code, message):
    _, stub, _ = served
    request = pb.GenerateRequest(model=NAME, audio=audio)
    error = status_of(lambda: list(getattr(stub, rpc)(request, timeout=WAIT)) if rpc == "GenerateStream"
                      else stub.Generate(request, timeout=WAIT))
    assert error.code() == code
    assert message in error.details()


def test_text_sent_to_an_audio_model_is_invalid_argument(served):
    client, _, _ = served
    with pytest.raises(AttnServeError) as raised:
        client.translate("hello", model=NAME)
    assert raised.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert raised.value.details == f"model '{NAME}' takes audio input, not text"


@pytest.mark.parametrize("mode", BATCHING_MODES)
def test_bad_audio_never_reaches_a_batch(tiny_speech_repo, mode):
    # At most 2 requests start together: if a bad one were queued, the two good ones would not share.
    engine = load_engine(find_models(tiny_speech_repo)[NAME], RuntimeOptions(), batching(mode, 2))
    try:
        with held(engine, GenerationRequest(NAME, audio=AudioInput(wav=wav(2)))):
            first = engine.submit(GenerationRequest(NAME, audio=AudioInput(wav=wav(0))))
            with pytest.raises(InputTooLargeError):
                engine.submit(GenerationRequest(NAME, audio=AudioInput(samples=np.zeros(RATE * 4, np.float32),
                                                                       sample_rate_hz=RATE)))
            with pytest.raises(ValueError, match="non-finite"):
                engine.submit(GenerationRequest(NAME, audio=AudioInput(samples=np.full(800, np.inf, np.float32),
                                                                       sample_rate_hz=RATE)))
            second = engine.submit(GenerationRequest(NAME, audio=AudioInput(wav=wav(1))))
        assert [f.result(WAIT).timings.batch_size for f in (first, second)] == [2, 2]
    finally:
        engine.close()


# ---- a manifest that disagrees with its graphs -------------------------------------------------------------


@pytest.fixture
def repo_copy(tmp_path, tiny_speech_repo):
    copy = tmp_path / "repo"
    shutil.copytree(tiny_speech_repo, copy)
    return copy


def _edit(repo, change) -> None:
    path = repo / NAME / "1" / "manifest.json"
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))


def test_a_manifest_with_other_mel_bins_than_the_encoder_is_refused_at_load(repo_copy):
    _edit(repo_copy, lambda d: d["input"]["features"].update(n_mels=40))
    with pytest.raises(ValueError, match=r"encoder.onnx: input 'input_features' axis 2 is 80, the manifest says 40"):
        open_runtime(find_models(repo_copy)[NAME])


def test_a_manifest_whose_time_reduction_the_encoder_does_not_do_fails_the_request(repo_copy):
    _edit(repo_copy, lambda d: d["input"].update(time_reduction=8))  # 98 frames: padded to 104, 13 columns
    engine = load_engine(find_models(repo_copy)[NAME], RuntimeOptions(), BatchingOptions())
    try:
        message = "has 26 positions on its source axis 1; the model's audio input gives 13"
        with pytest.raises(RuntimeError, match=message):
            engine.generate(GenerationRequest(NAME, audio=AudioInput(wav=wav(0))), WAIT)
    finally:
        engine.close()


# ---- attnserve transcribe -----------------------------------------------------------------------------------


def test_transcribe_prints_the_transcript(served, tmp_path, capsys):
    client, _, _ = served
    (tmp_path / "clip.wav").write_bytes(wav(1))
    assert cli.main(["transcribe", str(tmp_path / "clip.wav"), "--address", client.address]) == 0
    assert capsys.readouterr().out == client.generate(audio_request(wav(1), model=NAME)).text + "\n"


def test_transcribe_attention_shows_every_word_with_its_span_and_strip(served, tmp_path, capsys):
    client, _, _ = served
    (tmp_path / "clip.wav").write_bytes(wav(1))
    assert cli.main(["transcribe", str(tmp_path / "clip.wav"), "--attention", "--address", client.address]) == 0
    lines = capsys.readouterr().out.splitlines()
    result = client.generate(audio_request(wav(1), model=NAME, attention=True, granularity="words"))
    assert lines[0] == result.text and lines[2].strip().startswith("0s")  # the time ruler
    rows = lines[3:]
    assert len(rows) == len(result.words) > 0
    for row, word in zip(rows, result.words):
        sure = f"{round(word.confidence * 100):3d}%  "  # the served words carry their confidence
        assert row.startswith(f"{word.start_seconds:5.2f}-{word.end_seconds:5.2f}  {sure}{word.word[:13]}")
        assert any(shade in row for shade in timeline.SHADES[1:])


def test_transcribe_json_carries_the_word_timings(served, tmp_path, capsys):
    client, _, _ = served
    (tmp_path / "clip.wav").write_bytes(wav(2))
    assert cli.main(["transcribe", str(tmp_path / "clip.wav"), "--json", "--address", client.address]) == 0
    words = json.loads(capsys.readouterr().out)["words"]
    expected = client.generate(audio_request(wav(2), model=NAME)).words
    assert [(w["word"], w["start_seconds"], w["end_seconds"]) for w in words] == [
        (w.word, w.start_seconds, w.end_seconds) for w in expected]


def test_transcribe_a_file_that_is_not_audio_is_a_clear_error(served, tmp_path, capsys):
    client, _, _ = served
    (tmp_path / "notes.txt").write_text("hello")
    assert cli.main(["transcribe", str(tmp_path / "notes.txt"), "--address", client.address]) == 1
    assert capsys.readouterr().err.startswith("error: INVALID_ARGUMENT: ")
    with pytest.raises(SystemExit, match="cannot read"):
        cli.main(["transcribe", str(tmp_path / "missing.wav"), "--address", client.address])


def test_a_manifest_rate_limit_caps_the_output_by_the_clips_duration(repo_copy):
    def cap(manifest):
        manifest["input"]["max_tokens_per_second"] = 2.0

    _edit(repo_copy, cap)
    engine = load_engine(find_models(repo_copy)[NAME], RuntimeOptions(), BatchingOptions())
    try:
        seconds = len(read_wav(wav(0)).samples()) / read_wav(wav(0)).sample_rate_hz
        prepared = engine.prepare(GenerationRequest(NAME, audio=AudioInput(wav=wav(0))))
        assert prepared.max_new_tokens == min(12, math.ceil(2.0 * seconds) + 1) < 12
        result = engine.generate(GenerationRequest(NAME, audio=AudioInput(wav=wav(0))), WAIT)
        assert len(result.tokens) <= prepared.max_new_tokens
    finally:
        engine.close()
