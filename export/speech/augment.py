"""Audio perturbation with sox, and the word-time bookkeeping that goes with it.

One sox process per utterance reads the engine's raw samples, applies the effects of
the utterance's ``Augmentation`` and resamples to 16 kHz (``rate -h``), writing 32-bit
float so that no dither is added (sox runs with ``-R``: its own random numbers are
fixed). Noise, silence padding and the output level are applied afterwards in numpy
with a generator seeded per utterance, so a rebuild writes the same samples.

Only ``speed``, ``tempo`` and ``pad_start`` move words in time; ``pitch`` (sox keeps the
length), reverb, band limiting and noise do not. ``word_times`` applies exactly that.
"""

from __future__ import annotations

import random
import subprocess
from dataclasses import dataclass, fields

import numpy as np

SAMPLE_RATE = 16_000
MAX_SECONDS = 15.0  # longer utterances are left out of the corpus


@dataclass(frozen=True)
class Augmentation:
    """Perturbations of one utterance; the defaults mean "none"."""

    speed: float = 1.0  # sox speed: tempo and pitch together (factor)
    tempo: float = 1.0  # sox tempo -s: duration only (factor)
    pitch: int = 0  # sox pitch, cents; duration unchanged
    reverb: int = 0  # sox reverb reverberance, percent; 0 = no reverb
    room: int = 100  # sox reverb room scale, percent (only with reverb)
    telephone: bool = False  # 300-3400 Hz band (sox sinc)
    noise_snr: float | None = None  # additive noise at this speech-to-noise ratio, dB
    noise_color: str = "white"  # "white", "pink" or "brown" (only with noise_snr)
    pad_start: float = 0.0  # extra leading silence, seconds
    pad_end: float = 0.0  # extra trailing silence, seconds
    peak_db: float = -3.0  # output peak level, dBFS

    def __post_init__(self):
        if not (0.5 <= self.speed <= 2.0 and 0.5 <= self.tempo <= 2.0):
            raise ValueError(f"speed {self.speed} / tempo {self.tempo} outside 0.5-2")
        if self.noise_color not in ("white", "pink", "brown"):
            raise ValueError(f"unknown noise colour {self.noise_color!r}")
        if self.peak_db > 0 or self.pad_start < 0 or self.pad_end < 0:
            raise ValueError("peak_db must be <= 0 and padding >= 0")

    def changes(self) -> dict:
        """The fields that differ from "none" (what the manifest records)."""
        default = Augmentation()
        out = {f.name: getattr(self, f.name) for f in fields(self)
               if getattr(self, f.name) != getattr(default, f.name)}
        # A reverb or a noise is described whole, its default-valued details included.
        if self.reverb:
            out["room"] = self.room
        else:
            out.pop("room", None)
        if self.noise_snr is not None:
            out["noise_color"] = self.noise_color
        else:
            out.pop("noise_color", None)
        return {f.name: out[f.name] for f in fields(self) if f.name in out}

    def sox_effects(self) -> list[str]:
        effects: list[str] = []
        if self.speed != 1.0:
            effects += ["speed", f"{self.speed:.4f}"]
        if self.pitch:
            effects += ["pitch", str(self.pitch)]
        if self.tempo != 1.0:
            effects += ["tempo", "-s", f"{self.tempo:.4f}"]
        if self.reverb:
            effects += ["reverb", str(self.reverb), "50", str(self.room)]
        effects += ["rate", "-h", str(SAMPLE_RATE)]
        if self.telephone:  # after resampling: an 8 kHz voice slowed down has no 3400 Hz left to keep
            effects += ["sinc", "300-3400"]
        return effects

    def word_times(self, words: list[tuple[float, float]], duration: float) -> list[tuple[float, float]]:
        """Move engine word times to the augmented audio, clipped to ``duration``."""
        scale = 1.0 / (self.speed * self.tempo)
        return [(min(duration, self.pad_start + s * scale), min(duration, self.pad_start + e * scale))
                for s, e in words]


NONE = Augmentation()


def sample(rng: random.Random, male_only_voice: bool) -> Augmentation:
    """A random training perturbation. ``male_only_voice`` shifts pitch up more often."""
    kw: dict = {}
    if rng.random() < 0.5:
        kw["speed"] = round(rng.uniform(0.9, 1.1), 3)
    if male_only_voice and rng.random() < 0.45:
        kw["pitch"] = rng.randint(200, 700)  # towards a female range
    elif rng.random() < 0.25:
        kw["pitch"] = rng.randint(-300, 300)
    if rng.random() < 0.25:
        kw["tempo"] = round(rng.uniform(0.85, 1.15), 3)
    if rng.random() < 0.2:
        kw["reverb"], kw["room"] = rng.randint(10, 60), rng.randint(20, 100)
    if rng.random() < 0.08:
        kw["telephone"] = True
    if rng.random() < 0.3:
        kw["noise_snr"] = round(rng.uniform(8.0, 30.0), 1)
        kw["noise_color"] = rng.choice(("white", "pink", "brown"))
    if rng.random() < 0.3:
        kw["pad_start"] = round(rng.uniform(0.05, 0.4), 3)
        kw["pad_end"] = round(rng.uniform(0.05, 0.4), 3)
    kw["peak_db"] = round(rng.uniform(-15.0, -1.0), 1)
    return Augmentation(**kw)


def apply(samples: np.ndarray, rate: int, aug: Augmentation, seed: int) -> np.ndarray:
    """Perturb int16 ``samples`` at ``rate`` Hz; return 16 kHz int16 samples.

    Raises:
        RuntimeError: if sox fails.
    """
    cmd = ["sox", "-R", "-V1", "-t", "raw", "-r", str(rate), "-e", "signed", "-b", "16", "-c", "1", "-",
           "-t", "raw", "-e", "floating-point", "-b", "32", "-c", "1", "-", *aug.sox_effects()]
    run = subprocess.run(cmd, input=samples.astype("<i2").tobytes(), capture_output=True)
    if run.returncode != 0:
        raise RuntimeError(f"sox failed ({' '.join(cmd)}): {run.stderr.decode(errors='replace')[-500:]}")
    x = np.frombuffer(run.stdout, dtype="<f4").astype(np.float64)  # (T,)
    rng = np.random.default_rng(seed)
    x = np.concatenate([np.zeros(int(round(aug.pad_start * SAMPLE_RATE))), x,
                        np.zeros(int(round(aug.pad_end * SAMPLE_RATE)))])
    if aug.noise_snr is not None and x.size:
        x = x + _noise(x, aug.noise_snr, aug.noise_color, rng)
    peak = float(np.max(np.abs(x))) if x.size else 0.0
    if peak > 0:
        x = x * (10 ** (aug.peak_db / 20) / peak)
    return np.clip(np.round(x * 32767), -32768, 32767).astype(np.int16)


def _noise(x: np.ndarray, snr_db: float, color: str, rng: np.random.Generator) -> np.ndarray:
    """Noise of ``color`` scaled to ``snr_db`` below the RMS of the voiced part of ``x``."""
    n = rng.standard_normal(x.size)
    if color == "pink":  # 1/f power: shape a white spectrum by 1/sqrt(f)
        spectrum = np.fft.rfft(n)
        f = np.arange(spectrum.size)
        spectrum[1:] /= np.sqrt(f[1:])
        n = np.fft.irfft(spectrum, n=x.size)
    elif color == "brown":  # 1/f^2: integrated white noise, without its drift
        n = np.cumsum(n)
        n -= np.convolve(n, np.ones(801) / 801, mode="same")
    loud = np.abs(x) > 0.05 * np.max(np.abs(x))
    speech_rms = np.sqrt(np.mean(x[loud] ** 2)) if loud.any() else 0.0
    noise_rms = np.sqrt(np.mean(n ** 2)) or 1.0
    return n * (speech_rms / noise_rms) * 10 ** (-snr_db / 20)
