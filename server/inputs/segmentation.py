"""A long recording cut into segments at its pauses, none longer than a model's window.

A recognizer reads at most its window (`max_seconds`: 20 s for speech-en, 30 s for Whisper-style models),
so a long recording is cut first, where cutting loses nothing: in the pauses between phrases. The stages:

  1. frames: a `VoiceDetector` says, per frame (30 ms), whether it holds speech: the WebRTC VAD (PyPI
     `webrtcvad-wheels`, a GMM over sub-band energies, robust to steady noise) or, for clean audio and
     tones, the documented `EnergyDetector` below;
  2. regions: runs of speech frames; pauses shorter than `min_pause_seconds` are bridged (a breath inside
     a sentence), runs shorter than `min_speech_seconds` dropped (a click);
  3. padding: each region grows by `padding_seconds` into the pause on either side (never past half of
     it), so that a word's soft onset and release stay in its segment;
  4. packing: with `pack_seconds`, neighbouring regions join while the segment stays within it (windows
     of a model that reads context well); 0 = every region alone (a model trained on single sentences);
  5. bounding: a segment longer than `max_seconds` is cut at its quietest frame in the second half of
     the window, again and again, so every segment fits.

Everything here is numpy on samples at one rate; it knows nothing of models, requests or the wire.
"""

from __future__ import annotations

import abc
import dataclasses

import numpy as np

from attnserve.server.inputs.audio import resample

# Frame length of the decisions, in seconds: one of the three the WebRTC VAD accepts (10, 20, 30 ms).
FRAME_SECONDS = 0.03
# Frames the WebRTC VAD hears before a recording's first frame: the recording's quietest (about 1 s).
_PRIMING_FRAMES = 32
# Frames whose level is computed at once.
_BLOCK_FRAMES = 4096
# The shortest piece a cut leaves behind it, in frames: a recognizer needs a few of its analysis windows.
_MIN_PIECE_FRAMES = 4
# The rates the WebRTC VAD reads; other rates are resampled to the first that is not below them.
_VAD_RATES = (8000, 16000, 32000, 48000)


@dataclasses.dataclass(frozen=True)
class SegmentationOptions:
    """How a recording is cut (see the module docstring for the stages)."""

    # Longest segment, in seconds: the model's window.
    max_seconds: float
    # Non-speech at least this long ends a region; shorter pauses stay inside it.
    min_pause_seconds: float = 0.5
    # Speech runs shorter than this are dropped as noise.
    min_speech_seconds: float = 0.1
    # Silence kept on each side of a region (at most half the pause next to it).
    padding_seconds: float = 0.15
    # Neighbouring regions join while the segment stays this short; 0 = each region is a segment.
    pack_seconds: float = 0.0

    def __post_init__(self):
        if self.max_seconds < 4 * FRAME_SECONDS:
            raise ValueError(f"max_seconds {self.max_seconds} is too short to cut: use at least {4 * FRAME_SECONDS} s")
        if self.pack_seconds > self.max_seconds:
            raise ValueError(f"pack_seconds {self.pack_seconds} is over max_seconds {self.max_seconds}")


@dataclasses.dataclass(frozen=True)
class Segment:
    """Samples start..end (end excluded) of the recording."""

    start: int
    end: int

    def seconds(self, rate: int) -> tuple[float, float]:
        return self.start / rate, self.end / rate


class VoiceDetector(abc.ABC):
    """Says which frames of a recording hold speech."""

    @abc.abstractmethod
    def speech_frames(self, samples: np.ndarray, rate: int) -> np.ndarray:
        """(F,) bool, one per whole FRAME_SECONDS frame of `samples` ((N,) float32 in [-1, 1] at `rate`)."""


class WebRtcDetector(VoiceDetector):
    """The WebRTC VAD, on 16-bit PCM at a rate it reads. It adapts to the noise as it goes and so reads a
    recording's first frames as speech while it learns: it is primed with the recording's quietest frames
    first, and gated by level (a frame far quieter than the recording's loud frames is never speech). A
    fresh VAD per call: its state is the recording's, and requests run on several threads.

    Args:
        aggressiveness: 0 (keeps most frames as speech) .. 3 (drops most non-speech).
        gate_db: frames more than this far below the loud frames are never speech.
    """

    def __init__(self, aggressiveness: int = 2, gate_db: float = 40.0):
        import webrtcvad  # PyPI webrtcvad-wheels; imported here so that other detectors do without it

        self._new_vad = lambda: webrtcvad.Vad(aggressiveness)
        self._gate = EnergyDetector(range_db=gate_db, floor_db=-70.0)

    def speech_frames(self, samples: np.ndarray, rate: int) -> np.ndarray:
        vad_rate = next((r for r in _VAD_RATES if r >= rate), _VAD_RATES[-1])
        frames = len(samples) // round(FRAME_SECONDS * rate)
        x = resample(samples, rate, vad_rate) if vad_rate != rate else samples
        pcm = (np.clip(x, -1.0, 1.0) * 32767).astype("<i2")
        step = round(FRAME_SECONDS * vad_rate)
        pcm = pcm[: min(frames, len(pcm) // step) * step].reshape(-1, step)  # (F, step)
        vad = self._new_vad()
        level = frame_rms(x, vad_rate)[: len(pcm)]
        for row in pcm[np.sort(np.argsort(level)[:_PRIMING_FRAMES])]:  # the quietest frames, in time order
            vad.is_speech(row.tobytes(), vad_rate)
        out = np.array([vad.is_speech(row.tobytes(), vad_rate) for row in pcm], dtype=bool)
        out = np.pad(out, (0, frames - len(out)))  # resampling may end a frame short
        return out & self._gate.speech_frames(samples, rate)


class EnergyDetector(VoiceDetector):
    """A frame is speech when its RMS level is within `range_db` of the recording's loud frames (their
    95th percentile) and above `floor_db` dBFS. Fine for clean recordings and tones; the WebRTC VAD is
    better where steady noise is as loud as quiet speech."""

    def __init__(self, range_db: float = 35.0, floor_db: float = -55.0):
        self.range_db, self.floor_db = range_db, floor_db

    def speech_frames(self, samples: np.ndarray, rate: int) -> np.ndarray:
        level = 20 * np.log10(np.maximum(frame_rms(samples, rate), 1e-10))  # (F,) dBFS
        if len(level) == 0:
            return np.zeros(0, dtype=bool)
        loud = np.percentile(level, 95)
        return level > max(loud - self.range_db, self.floor_db)


def frame_rms(samples: np.ndarray, rate: int) -> np.ndarray:
    """(F,) RMS of each whole FRAME_SECONDS frame (in float64 a block of frames at a time: an hour's
    samples are not copied whole)."""
    step = round(FRAME_SECONDS * rate)
    frames = len(samples) // step
    out = np.empty(frames)
    for lo in range(0, frames, _BLOCK_FRAMES):
        hi = min(lo + _BLOCK_FRAMES, frames)
        x = np.asarray(samples[lo * step : hi * step], dtype=np.float64).reshape(hi - lo, step)
        out[lo:hi] = np.sqrt((x * x).mean(axis=1))
    return out


def segment(samples: np.ndarray, rate: int, options: SegmentationOptions, detector: VoiceDetector) -> list[Segment]:
    """Cuts a recording at its pauses (the module docstring's stages).

    Args:
        samples: (N,) float32 mono in [-1, 1].
        rate: their sample rate.

    Returns:
        Segments in time order, disjoint, each at most options.max_seconds long; none for a silent recording.
    """
    step = round(FRAME_SECONDS * rate)
    speech = detector.speech_frames(samples, rate)
    regions = speech_regions(speech, round(options.min_pause_seconds / FRAME_SECONDS),
                             round(options.min_speech_seconds / FRAME_SECONDS))
    # Frames -> samples; the last frame's region runs to the end of the recording (its partial frame).
    spans = [(s * step, len(samples) if e == len(speech) else e * step) for s, e in regions]
    spans = _padded(spans, round(options.padding_seconds * rate), len(samples))
    spans = _packed(spans, round(options.pack_seconds * rate))
    limit = int(options.max_seconds * rate)
    rms = frame_rms(samples, rate)
    return [Segment(s, e) for start, end in spans for s, e in _bounded(start, end, limit, rms, step)]


def speech_regions(speech: np.ndarray, min_pause: int, min_speech: int) -> list[tuple[int, int]]:
    """Runs of speech frames (start, end excluded), pauses under `min_pause` frames bridged, runs under
    `min_speech` frames dropped."""
    edges = np.flatnonzero(np.diff(np.concatenate([[0], speech.astype(np.int8), [0]])))
    runs = [(int(s), int(e)) for s, e in zip(edges[::2], edges[1::2]) if e - s >= min_speech]
    regions: list[tuple[int, int]] = []
    for start, end in runs:
        if regions and start - regions[-1][1] < min_pause:
            regions[-1] = (regions[-1][0], end)
        else:
            regions.append((start, end))
    return regions


def _padded(spans: list[tuple[int, int]], pad: int, total: int) -> list[tuple[int, int]]:
    """Each span widened by `pad` samples, never past the recording nor past half the gap to a neighbour."""
    out = []
    for i, (start, end) in enumerate(spans):
        before = (start - spans[i - 1][1]) // 2 if i else start
        after = (spans[i + 1][0] - end) // 2 if i + 1 < len(spans) else total - end
        out.append((start - min(pad, before), end + min(pad, after)))
    return out


def _packed(spans: list[tuple[int, int]], pack: int) -> list[tuple[int, int]]:
    """Neighbours joined (the pause between them included) while the joined span is at most `pack` samples."""
    out: list[tuple[int, int]] = []
    for start, end in spans:
        if out and end - out[-1][0] <= pack:
            out[-1] = (out[-1][0], end)
        else:
            out.append((start, end))
    return out


def _bounded(start: int, end: int, limit: int, rms: np.ndarray, step: int) -> list[tuple[int, int]]:
    """start..end cut into pieces of at most `limit` samples, each cut at the quietest frame boundary in the
    second half of the piece it ends."""
    pieces = []
    while end - start > limit:
        # Whole frames in the second half, leaving at least _MIN_PIECE_FRAMES for what follows.
        lo = -(-(start + limit // 2) // step)
        hi = min(start + limit, end - _MIN_PIECE_FRAMES * step) // step
        frames = rms[lo:hi]
        cut = (lo + int(np.argmin(frames))) * step if len(frames) else start + limit
        pieces.append((start, cut))
        start = cut
    pieces.append((start, end))
    return pieces
