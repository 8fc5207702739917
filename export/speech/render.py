"""Render planned utterances: synthesize, perturb, write WAV files and manifest rows.

``render_chunk`` runs in a worker process. A chunk holds utterances of one engine, so each
worker keeps one engine instance per kind and festival starts once per chunk; chunks of
the engines with few voices (all but espeak-ng) hold one voice, so each voice is timed.
It returns the manifest rows, the ids left out as too long or because their synthesis or
augmentation failed (espeak-ng rarely segfaults on one voice and sentence; the rest of the
chunk is kept, and stats.json lists what was lost), and the timings for the speed table.
"""

from __future__ import annotations

import time
import wave
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from . import augment, engines
from .plan import Utterance
from .synthesizer import SynthesisCrashed

_engines: dict[str, engines.Engine] = {}  # one per engine kind, per worker process
CHUNK_SIZE = 40
_PER_VOICE_ENGINES = ("flite", "festival", "piper")  # few voices: chunked and timed per voice


@dataclass
class ChunkResult:
    """What a worker hands back for one chunk."""

    rows: list[dict]
    too_long: list[str]
    engine: str
    voice: str | None  # the chunk's voice, None for mixed-voice (espeak-ng) chunks
    engine_audio_seconds: float = 0.0  # audio the engine produced (before augmentation)
    engine_seconds: float = 0.0  # wall time inside the engine
    total_seconds: float = 0.0  # wall time for the chunk (engine, sox, numpy, writing)
    failed: list[str] = field(default_factory=list)  # ids whose synthesis crashed or whose sox effects failed


def chunks(plan: list[Utterance], size: int = CHUNK_SIZE) -> list[list[Utterance]]:
    """Consecutive utterances of the same engine (and the same voice, except for espeak-ng)."""
    groups: dict[tuple[str, str], list[Utterance]] = {}
    for u in plan:
        key = (u.voice.engine, u.voice.name if u.voice.engine in _PER_VOICE_ENGINES else "")
        groups.setdefault(key, []).append(u)
    return [g[i:i + size] for g in groups.values() for i in range(0, len(g), size)]


# Rough audio seconds per second of each slow voice (stats.json of a 10 h build); others ~100.
_SPEED = {"piper": 5.0, "festival:cmu_us_slt_arctic_hts": 20.0, "flite:awb": 30.0, "flite:rms": 30.0,
          "flite:slt": 30.0}


def cost(chunk: list[Utterance]) -> float:
    """Estimated seconds to render ``chunk``: slow chunks are started first, so the last
    chunks to finish are short ones and both workers stay busy to the end."""
    voice = chunk[0].voice
    speed = _SPEED.get(voice.key, _SPEED.get(voice.engine, 100.0))
    return sum(u.estimated_seconds() for u in chunk) / speed


def _engine(name: str) -> engines.Engine:
    if name not in _engines:
        _engines[name] = engines.ENGINES[name]()
    return _engines[name]


def render_chunk(job: tuple[str, list[Utterance]]) -> ChunkResult:
    """Synthesize and write one chunk under the corpus directory ``job[0]``."""
    out_dir, utterances = Path(job[0]), job[1]
    start = time.perf_counter()
    engine = _engine(utterances[0].voice.engine)
    requests = [engines.Request(u.sentence.spoken, u.voice.name, u.settings) for u in utterances]
    failed = []
    try:
        synths = engine.synthesize_many(requests)
    except SynthesisCrashed:  # one at a time, to lose only what crashes
        synths = []
        for u, request in zip(utterances, requests):
            try:
                synths.append(engine.synthesize(request))
            except SynthesisCrashed:
                failed.append(u.id)
                synths.append(None)
    engine_seconds = time.perf_counter() - start
    result = ChunkResult([], [], engine.name, utterances[0].voice.name if engine.name in _PER_VOICE_ENGINES else None,
                         engine_seconds=engine_seconds, failed=failed)
    for u, s in zip(utterances, synths):
        if s is None:
            continue
        seconds = len(s.samples) / s.sample_rate
        result.engine_audio_seconds += seconds
        try:
            audio = augment.apply(s.samples, s.sample_rate, u.augmentation, u.seed)
        except RuntimeError as error:
            print(f"[speech] dropped {u.id}: {error}", flush=True)
            result.failed.append(u.id)
            continue
        duration = len(audio) / augment.SAMPLE_RATE
        if duration > augment.MAX_SECONDS:
            result.too_long.append(u.id)
            continue
        write_wav(out_dir / u.path, audio)
        result.rows.append(_row(u, s, duration, u.augmentation.word_times(s.words, duration)))
    result.total_seconds = time.perf_counter() - start
    return result


def _row(u: Utterance, s: engines.Synthesis, duration: float, times: list[tuple[float, float]]) -> dict:
    return {
        "id": u.id, "path": u.path, "text": u.sentence.transcript, "spoken": u.sentence.spoken,
        "source": u.sentence.source, "split": u.split, "engine": u.voice.engine, "voice": u.voice.name,
        "voice_settings": dict(u.settings), "augmentation": u.augmentation.changes(),
        "duration": round(duration, 4), "sample_rate": augment.SAMPLE_RATE,
        "words": [[w, round(a, 3), round(b, 3)] for w, (a, b) in zip(u.sentence.words, times)],
        "word_times": s.word_times, "inexact_words": s.inexact_words,
    }


def write_wav(path: Path, samples: np.ndarray) -> None:
    """16 kHz mono 16-bit PCM."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(augment.SAMPLE_RATE)
        w.writeframes(samples.astype("<i2").tobytes())
