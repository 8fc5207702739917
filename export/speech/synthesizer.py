"""The synthesizer interface: a request, its result, and the base classes of the engines.

``Engine.synthesize_many`` turns requests into ``Synthesis`` results in order; the audio
comes back at the engine's own rate with one (start, end) per transcript word.
``LibraryEngine`` is the base of engines that run inside this process from a C library
and keep state between utterances: each utterance runs in a forked child, so what it
sounds like never depends on what was said before.
"""

from __future__ import annotations

import ctypes
import os
import pickle
import wave
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np


@dataclass(frozen=True)
class Request:
    """What to say, and how."""

    spoken: str  # text as the engine reads it
    voice: str  # engine-specific voice name, e.g. "en-us+f3", "kal16", "kal_diphone"
    settings: dict = field(default_factory=dict)  # engine-native knobs (rate, pitch, stretch, ...)


@dataclass
class Synthesis:
    """Audio and per-word times for one request."""

    samples: np.ndarray  # (N,) int16 mono
    sample_rate: int
    words: list[tuple[float, float]]  # (start, end) seconds, one per transcript word
    word_times: str  # how the times were obtained, e.g. "espeak_events"
    inexact_words: int  # words whose time was split from a shared item or estimated


class SynthesisCrashed(RuntimeError):
    """The engine's library crashed (its forked child died) on one utterance: that utterance is lost, the
    engine is not (the next child starts from the same prepared worker)."""


class Engine:
    """Base class: a named synthesizer with a set of voices."""

    name = ""
    install_hint = ""  # how to get what ``missing`` reports

    def missing(self, voices: list[str] | None = None) -> list[str]:
        """What this machine lacks to run the engine with ``voices`` (default: all); empty if nothing."""
        raise NotImplementedError

    def synthesize(self, request: Request) -> Synthesis:
        raise NotImplementedError

    def synthesize_many(self, requests: list[Request]) -> list[Synthesis]:
        return [self.synthesize(r) for r in requests]


class LibraryEngine(Engine):
    """An engine in a C library that keeps state from one utterance to the next.

    espeak-ng (libc ``rand()``, wave-generator phase and echo buffers) and flite's clunit
    voices (libc ``rand()``) say the same request differently depending on what they said
    before. So the worker process only loads the library and its voices (``_prepare``),
    and every utterance is synthesized in a child forked from it (``_synthesize_here``)
    whose ``rand()`` is reseeded as in a fresh process (other code in the worker, such as
    Piper's phonemizer, also draws from it): an utterance's audio then depends on its
    request alone, whatever ran before it.
    """

    def _prepare(self, request: Request) -> None:
        raise NotImplementedError

    def _synthesize_here(self, request: Request) -> Synthesis:
        raise NotImplementedError

    def synthesize(self, request: Request) -> Synthesis:
        self._prepare(request)
        return _in_child(self._synthesize_here, request)


_LIBC = ctypes.CDLL(None)  # the process's own C library, whose rand() the engines share


def _in_child(fn, request: Request) -> Synthesis:
    """``fn(request)`` run in a forked child; its result (or exception) comes back pickled."""
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns
        status = 0
        try:
            os.close(read_fd)
            _LIBC.srand(1)  # glibc's initial state
            try:
                payload = pickle.dumps(("ok", fn(request)))
            except Exception as error:  # sent back to be raised in the parent
                payload, status = pickle.dumps(("error", error)), 1
            with os.fdopen(write_fd, "wb") as pipe:
                pipe.write(payload)
        finally:
            os._exit(status)
    os.close(write_fd)
    with os.fdopen(read_fd, "rb") as pipe:
        payload = pipe.read()
    os.waitpid(pid, 0)
    if not payload:
        raise SynthesisCrashed(f"synthesis child died on {request.spoken!r} ({request.voice})")
    kind, value = pickle.loads(payload)
    if kind == "error":
        raise value
    return value


def loadable(soname: str) -> bool:
    """Whether the dynamic loader can open ``soname``."""
    try:
        ctypes.CDLL(soname)
        return True
    except OSError:
        return False


def read_wav(path: Path) -> tuple[np.ndarray, int]:
    """(int16 mono samples, sample rate) of a 16-bit PCM WAV file."""
    with wave.open(str(path), "rb") as w:
        if w.getsampwidth() != 2:
            raise ValueError(f"{path}: expected 16-bit PCM")
        data = np.frombuffer(w.readframes(w.getnframes()), dtype="<i2")
        if w.getnchannels() > 1:
            data = data.reshape(-1, w.getnchannels())[:, 0]
        return data.astype(np.int16), w.getframerate()
