"""Audio input (server/inputs/audio.py): WAV parsing, resampling, the audio preprocessor's checks and limits, its
padding, and the time span labels of attention columns. No model is needed: the preprocessor reads only the
manifest (tests/test_speech.py serves a real audio model)."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from attnserve.server.inputs import audio
from attnserve.server.inputs.audio import AudioPreprocessor, read_wav, resample
from attnserve.server.inputs.features import log_mel
from attnserve.api.generation import (
    AudioInput,
    GenerationRequest,
    InputKind,
    InputTooLargeError,
    ModelInfo,
)
from attnserve.server.model.manifest import parse_manifest
from fakes import speller_manifest, wav_bytes

RATE = 16000


def tone(hz: float, seconds: float, rate: int = RATE, channels: int = 1) -> np.ndarray:
    t = np.arange(round(seconds * rate)) / rate
    x = 0.5 * np.sin(2 * np.pi * hz * t)
    return x if channels == 1 else np.stack([x, 0.25 * np.cos(2 * np.pi * hz * t)], axis=1)


@pytest.fixture(scope="module")
def pre() -> AudioPreprocessor:
    data = speller_manifest()
    data["input"].update(max_seconds=2, max_bytes=400_000)
    return AudioPreprocessor(parse_manifest(data), tokenizer=None)


def request(**fields) -> GenerationRequest:
    return GenerationRequest("speech-en", audio=AudioInput(**fields))


# ---- WAV files -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("fmt,atol", [("pcm16", 1 / 32767), ("pcm32", 1e-7), ("float32", 1e-7), ("float64", 0)])
@pytest.mark.parametrize("extensible", [False, True])
def test_wav_formats_read_back_as_float_samples(fmt, atol, extensible):
    x = tone(440, 0.1)
    wav = read_wav(wav_bytes(x, RATE, fmt, extensible=extensible))
    assert (wav.sample_rate_hz, wav.channels, wav.frames) == (RATE, 1, len(x))
    samples = wav.samples()
    assert samples.dtype == np.float32
    np.testing.assert_allclose(samples, x, atol=atol + 1e-7)


def test_stereo_is_averaged_to_mono_and_other_chunks_are_skipped():
    x = tone(440, 0.1, channels=2)
    wav = read_wav(wav_bytes(x, 44100, "float32", extra_chunk=True))
    assert wav.channels == 2 and wav.frames == len(x)
    np.testing.assert_allclose(wav.samples(), x.mean(axis=1), atol=1e-7)


def test_a_truncated_data_chunk_keeps_the_whole_frames_it_has():
    data = wav_bytes(tone(440, 0.01, channels=2), RATE, "pcm16")
    assert read_wav(data[:-3]).frames == 160 - 1  # the last frame lost 3 of its 4 bytes


@pytest.mark.parametrize(
    "data,message",
    [
        (b"", "audio data is not a WAV file"),
        (b"ID3\x03 this is an mp3", "audio data is not a WAV file"),
        (b"RF64" + bytes(20), "RF64 file"),
        (wav_bytes(tone(440, 0.01), RATE, "pcm24"), "unsupported WAV format: 24-bit integer PCM"),
        (wav_bytes(tone(440, 0.01), RATE, "pcm8"), "unsupported WAV format: 8-bit integer PCM"),
        (wav_bytes(np.zeros((10, 3)), RATE, "pcm16"), "unsupported WAV file with 3 channels"),
        (wav_bytes(tone(440, 0.01), RATE)[:36], "the WAV file has no data chunk"),
        (b"RIFF\x04\x00\x00\x00WAVE", "the WAV file has no fmt chunk"),
    ],
)
def test_files_that_are_not_usable_wav_are_named(data, message):
    with pytest.raises(ValueError, match=message):
        read_wav(data)


# ---- resampling -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("rate", [8000, 11025, 22050, 32000, 44100, 48000])
def test_resampling_a_tone_gives_the_tone_at_16k(rate):
    x = tone(440, 0.5, rate)
    y = resample(x.astype(np.float32), rate, RATE)
    assert y.dtype == np.float32 and len(y) == math.ceil(len(x) * RATE / rate)
    want = tone(440, len(y) / RATE)[: len(y)]
    np.testing.assert_allclose(y[200:-200], want[200:-200], atol=2e-3)  # away from the clip's edges


def test_resampling_removes_what_the_new_rate_cannot_hold():
    y = resample(tone(10000, 0.5, 48000).astype(np.float32), 48000, RATE)  # above 8 kHz: would alias to 6 kHz
    assert np.abs(y[200:-200]).max() < 0.01


def test_resampling_to_the_same_rate_is_the_identity_and_odd_rates_are_refused():
    x = tone(440, 0.1).astype(np.float32)
    np.testing.assert_array_equal(resample(x, RATE, RATE), x)
    with pytest.raises(ValueError, match="unsupported sample rate 44099 Hz: resampling it to 16000 Hz needs"):
        resample(x, 44099, RATE)


# ---- the preprocessor ------------------------------------------------------------------------------------


def test_a_16k_wav_becomes_its_log_mel_frames(pre):
    x = tone(440, 1.0)
    source = pre.prepare(request(wav=wav_bytes(x, RATE, "float32")))
    np.testing.assert_array_equal(source.features, log_mel(x.astype(np.float32), pre.spec.features))
    assert source.features.shape == (98, 80) and source.length == 25 and source.seconds == 1.0


@pytest.mark.parametrize("rate", [8000, 44100, 48000])
def test_other_rates_and_stereo_are_resampled_mono(pre, rate):
    x = tone(440, 0.5, rate, channels=2)
    source = pre.prepare(request(wav=wav_bytes(x, rate, "float32")))
    stored = x.astype(np.float32).astype(np.float64)  # what the float WAV holds
    mono = resample(stored.mean(axis=1).astype(np.float32), rate, RATE)
    np.testing.assert_array_equal(source.features, log_mel(mono, pre.spec.features))
    assert source.seconds == pytest.approx(0.5, abs=1 / RATE)


def test_raw_samples_equal_the_same_samples_in_a_wav_file(pre):
    x = tone(300, 0.3, 8000).astype(np.float32)
    from_wav = pre.prepare(request(wav=wav_bytes(x, 8000, "float32")))
    from_samples = pre.prepare(request(samples=x, sample_rate_hz=8000))
    np.testing.assert_array_equal(from_wav.features, from_samples.features)


@pytest.mark.parametrize(
    "fields,message",
    [
        ({}, "audio is empty: set AudioInput data"),
        ({"wav": wav_bytes(np.zeros(0), RATE)}, "audio is empty: it holds no samples"),
        ({"samples": np.zeros(0, np.float32), "sample_rate_hz": RATE}, "audio is empty: it holds no samples"),
        ({"wav": b"not audio at all"}, "audio data is not a WAV file"),
        ({"samples": np.array([0.1, np.nan] * 400, np.float32), "sample_rate_hz": RATE}, "non-finite samples"),
        ({"wav": wav_bytes(np.array([0.1, np.inf] * 400), RATE, "float32")}, "non-finite samples"),
        ({"samples": np.zeros(1600, np.float32)}, "raw audio samples need their sample_rate_hz"),
        ({"wav": wav_bytes(np.zeros(1600), RATE), "samples": np.zeros(1600, np.float32)}, "not both"),
        ({"wav": wav_bytes(np.zeros(1600), RATE), "sample_rate_hz": 8000}, "differs from the WAV header's 16000 Hz"),
        ({"wav": wav_bytes(np.zeros(1600), 44099)}, "unsupported sample rate 44099 Hz"),
        ({"samples": np.zeros(1600, np.float32), "sample_rate_hz": 1000}, "unsupported sample rate 1000 Hz"),
        ({"samples": np.zeros(300, np.float32), "sample_rate_hz": RATE}, "shorter than one 25 ms analysis window"),
    ],
)
def test_bad_audio_is_a_value_error_naming_the_problem(pre, fields, message):
    with pytest.raises(ValueError, match=message) as raised:
        pre.prepare(request(**fields))
    assert not isinstance(raised.value, InputTooLargeError)


@pytest.mark.parametrize(
    "fields,message",
    [
        ({"wav": wav_bytes(np.zeros(2 * RATE + 1), RATE)}, "audio is 2.00 s long; model 'speech-en' accepts at most 2"),
        ({"samples": np.zeros(3 * 8000, np.float32), "sample_rate_hz": 8000}, "audio is 3.00 s long"),
        ({"wav": bytes(400_001)}, "audio is 400001 bytes; model 'speech-en' accepts at most 400000 bytes"),
        ({"samples": np.zeros(100_001, np.float32), "sample_rate_hz": 96000}, "audio is 400004 bytes"),
    ],
)
def test_audio_over_a_limit_is_input_too_large(pre, fields, message):
    with pytest.raises(InputTooLargeError, match=message):
        pre.prepare(request(**fields))


def test_duration_is_checked_from_the_header_before_any_sample_is_decoded(pre, monkeypatch):
    monkeypatch.setattr(audio.Wav, "samples", lambda self: pytest.fail("decoded a WAV that is too long"))
    with pytest.raises(InputTooLargeError):
        pre.prepare(request(wav=wav_bytes(np.zeros(40000), 16000)))


def test_a_request_of_another_kind_is_refused(pre):
    with pytest.raises(ValueError, match="model 'speech-en' takes audio input, not text"):
        pre.prepare(GenerationRequest("speech-en", "hello"))
    with pytest.raises(ValueError, match="carries one input; this one has text and audio"):
        pre.prepare(GenerationRequest("speech-en", "hello", audio=AudioInput(wav=b"RIFF")))
    with pytest.raises(ValueError, match="takes audio input; the request has none"):
        pre.prepare(GenerationRequest("speech-en"))


# ---- batches and labels -------------------------------------------------------------------------------


def test_collate_pads_frames_to_a_multiple_of_the_time_reduction(pre):
    sources = [pre.prepare(request(samples=tone(440, s).astype(np.float32), sample_rate_hz=RATE)) for s in (0.2, 0.1)]
    frames = [len(s.features) for s in sources]
    assert frames == [18, 8]
    batch = pre.collate(sources)
    features, mask = batch.feeds["input_features"], batch.feeds["attention_mask"]
    assert features.shape == (2, 20, 80) and mask.dtype == np.int64
    np.testing.assert_array_equal(mask.sum(axis=1), frames)
    assert np.all(features[1, 8:] == 0)
    np.testing.assert_array_equal(batch.lengths, [5, 2])  # ceil(frames / 4)


@pytest.mark.parametrize("seconds", [0.025, 0.1, 0.137, 1.0])
def test_column_labels_tile_the_clip_in_steps_of_the_time_reduction(pre, seconds):
    x = tone(440, seconds).astype(np.float32)
    source = pre.prepare(request(samples=x, sample_rate_hz=RATE))
    tokens = pre.source_tokens(source)
    assert len(tokens) == source.length == math.ceil(len(source.features) / 4)
    assert all(t.id == -1 and t.logprob == 0.0 for t in tokens)
    spans = [tuple(map(float, t.piece.split("-"))) for t in tokens]
    assert spans[0][0] == 0.0
    assert all(a[1] == b[0] for a, b in zip(spans, spans[1:])), "spans are contiguous"
    assert all(end - start == pytest.approx(0.04) for start, end in spans[:-1])
    assert spans[-1][1] == pytest.approx(len(source.features) * 0.01) and spans[-1][1] <= seconds
    assert pre.source_words(source).labels == tuple(t.piece for t in tokens)  # columns never merge


def test_labels_show_milliseconds_when_a_column_is_not_whole_centiseconds():
    data = speller_manifest()
    data["input"]["features"]["shift_ms"] = 12.5
    data["input"]["time_reduction"] = 2
    labels = AudioPreprocessor(parse_manifest(data), None).column_labels(5)
    assert labels == ["0.000-0.025", "0.025-0.050", "0.050-0.062"]


def test_describe_states_the_kind_and_limits(pre):
    base = ModelInfo("speech-en", 1, "speech-recognition", "", ["en"], ["en"], 0, 400, 1, 1)
    info = pre.describe(base)
    assert info.input_kind is InputKind.AUDIO and info.image is None
    assert dataclasses.asdict(info.audio) == {
        "sample_rate_hz": 16000, "max_seconds": 2.0, "max_bytes": 400_000, "seconds_per_column": pytest.approx(0.04),
        # Long-form limits and other formats are the server's (server/engine/longform.py), not the preprocessor's.
        "long_form_max_seconds": 0.0, "long_form_max_bytes": 0, "formats": (),
        "speeds": (1.0,),  # the manifest's decoding.speeds: none named, the recording alone
        "word_lm": False,  # no word_language_model named
    }
    assert info.max_source_tokens == math.ceil(198 / 4)  # 2 s: 198 frames
