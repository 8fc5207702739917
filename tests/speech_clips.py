"""Spoken test clips: made here (espeak-ng reads a sentence, resampled to 16 kHz; tests skip without it), or
the bundled speech model's example clips, and that model opened as the speech tests open it."""

from __future__ import annotations

import os
import pathlib
import shutil
import subprocess

import numpy as np
import pytest

from attnserve.export.speech.evaluate import decoding_variant
from attnserve.server.engine.batcher import BatchingOptions
from attnserve.server.engine.registry import load_engine
from attnserve.server.inputs.audio import read_wav, resample
from attnserve.server.model.repository import find_models
from attnserve.server.model.runtime import RuntimeOptions
from served_process import generate_in_engine_process

RATE = 16000
BUNDLED = pathlib.Path(os.environ.get("ATTNSERVE_BUNDLED_MODELS", pathlib.Path(__file__).parents[1] / "models"))
SPEECH = "speech-en"


def espeak(text: str, voice: str = "en-us", speed: int = 165) -> np.ndarray:
    """(N,) float32 samples at 16 kHz of espeak-ng reading `text`, its leading and trailing silence trimmed."""
    if shutil.which("espeak-ng") is None:
        pytest.skip("espeak-ng is not installed (apt-get install espeak-ng)")
    wav = subprocess.run(["espeak-ng", "-v", voice, "-s", str(speed), "--stdout", text], check=True,
                         capture_output=True).stdout
    parsed = read_wav(_fixed_sizes(wav))
    x = resample(parsed.samples(), parsed.sample_rate_hz, RATE)
    loud = np.flatnonzero(np.abs(x) > 0.01)
    return x[loud[0] : loud[-1] + 1] if len(loud) else x


def _fixed_sizes(wav: bytes) -> bytes:
    """espeak-ng writes a stream's WAV header (sizes 0x7fffffff); the sizes that the bytes have."""
    data = bytearray(wav)
    data[4:8] = (len(data) - 8).to_bytes(4, "little")
    data[40:44] = (len(data) - 44).to_bytes(4, "little")
    return bytes(data)


def recording(clips: list[np.ndarray], pauses: list[float], noise: float = 0.0, seed: int = 0):
    """Clips joined by pauses (seconds: before the first clip, between clips, after the last: len(clips) + 1).

    Returns:
        (N,) float32 samples and each clip's (start, end) in seconds.
    """
    rng = np.random.default_rng(seed)
    parts, spans, t = [], [], 0
    for i, pause in enumerate(pauses):
        parts.append(np.zeros(round(pause * RATE), dtype=np.float32))
        t += len(parts[-1])
        if i < len(clips):
            parts.append(clips[i].astype(np.float32))
            spans.append((t / RATE, (t + len(clips[i])) / RATE))
            t += len(clips[i])
    x = np.concatenate(parts)
    return (x + noise * rng.standard_normal(len(x)).astype(np.float32)), spans


def example_samples(example: dict) -> tuple[np.ndarray, int]:
    """(float32 samples, sample rate) of one of the bundled speech model's examples (examples.json rows)."""
    wav = read_wav((BUNDLED / SPEECH / "examples" / example["file"]).read_bytes())
    return wav.samples().astype(np.float32), wav.sample_rate_hz


def open_speech_version(model_dir: pathlib.Path):
    """The speech model of a version folder (models/speech-en/N, or a variant copy of one), in process, with
    batches of up to 8 gathered for 100 ms."""
    return load_engine(find_models(model_dir.parent.parent)[SPEECH], RuntimeOptions(),
                       BatchingOptions(max_batch_size=8, window_ms=100.0))



def child_and_in_process(engine, request, wait: float, **variant):
    """`request` answered by the bundled speech model's newest version, changed as `decoding_variant(**variant)`
    says and loaded in a child process as `--engine-process` loads it, and by `engine` in process:
    (child's answer, in-process answer)."""
    newest = find_models(BUNDLED, only=[SPEECH])[SPEECH].path
    with decoding_variant(newest, None, True, **variant) as variant_dir:
        child = generate_in_engine_process(variant_dir, request, wait)
    return child, engine.generate(request, wait)
