"""Log-mel filterbank features: the one implementation, shared by serving and (later) training.

Imports numpy only, so training code can compute exactly the features the server computes without torch.
A model's manifest fixes every parameter (`input.features`, docs/model-contract.md); nothing here has a
default that could silently differ between the two sides.

The pipeline, per frame of `window_ms` taken every `shift_ms` (no padding: frame k reads samples
k * hop .. k * hop + window - 1, so a clip of N samples has 1 + (N - window) // hop frames, 0 when it is
shorter than one window):
  periodic Hann window -> zero-padded real FFT of `n_fft` points -> power |X|^2 -> triangular mel filters
  (HTK mel scale, `n_mels` filters between `f_min` and `f_max`, unnormalised) -> natural log, floored at
  `log_floor`.
Samples are floats in [-1, 1] (16-bit PCM divided by 32768).
"""

from __future__ import annotations

import dataclasses
import functools
import math

import numpy as np

FEATURE_TYPES = ("log-mel",)


@dataclasses.dataclass(frozen=True)
class LogMelSpec:
    """Every parameter of the features; a manifest's `input.features` (with the input's sample rate)."""

    # Samples per second of the audio the features are computed from.
    sample_rate_hz: int
    # Mel filters (feature dimension).
    n_mels: int
    # Analysis window length and the shift between window starts, in milliseconds.
    window_ms: float
    shift_ms: float
    # FFT size; None = the smallest power of two that holds a window.
    n_fft: int | None = None
    # Lowest and highest filter edges in Hz; f_max None = half the sample rate (Nyquist).
    f_min: float = 0.0
    f_max: float | None = None
    # Mel energies below this are raised to it before the log (log of silence is finite).
    log_floor: float = 1e-10

    def __post_init__(self):
        if self.sample_rate_hz <= 0 or self.n_mels <= 0:
            raise ValueError(f"sample_rate_hz and n_mels must be positive, got {self.sample_rate_hz}, {self.n_mels}")
        if not 0 < self.shift_ms <= self.window_ms:
            raise ValueError(f"shift_ms must be in (0, window_ms], got {self.shift_ms} with window_ms {self.window_ms}")
        if self.window_length < 2 or self.hop_length < 1:
            raise ValueError(f"window_ms {self.window_ms} is under two samples at {self.sample_rate_hz} Hz")
        if self.fft_size < self.window_length:
            raise ValueError(f"n_fft {self.fft_size} is shorter than the window ({self.window_length} samples)")
        if not 0 <= self.f_min < self.top_hz <= self.sample_rate_hz / 2:
            raise ValueError(
                f"filter edges must satisfy 0 <= f_min < f_max <= {self.sample_rate_hz / 2} (Nyquist), "
                f"got f_min {self.f_min}, f_max {self.top_hz}"
            )
        if not self.log_floor > 0:
            raise ValueError(f"log_floor must be positive, got {self.log_floor}")

    @property
    def window_length(self) -> int:
        """Samples per analysis window."""
        return round(self.sample_rate_hz * self.window_ms / 1000)

    @property
    def hop_length(self) -> int:
        """Samples between the starts of consecutive windows."""
        return round(self.sample_rate_hz * self.shift_ms / 1000)

    @property
    def fft_size(self) -> int:
        return self.n_fft if self.n_fft is not None else 1 << math.ceil(math.log2(self.window_length))

    @property
    def top_hz(self) -> float:
        return self.f_max if self.f_max is not None else self.sample_rate_hz / 2


def frame_count(num_samples: int, spec: LogMelSpec) -> int:
    """Frames of a clip of `num_samples`: 1 + (N - window) // hop, or 0 below one window."""
    if num_samples < spec.window_length:
        return 0
    return 1 + (num_samples - spec.window_length) // spec.hop_length


def hz_to_mel(hz):
    """HTK mel scale: 2595 log10(1 + f / 700)."""
    return 2595.0 * np.log10(1.0 + np.asarray(hz, dtype=np.float64) / 700.0)


def mel_to_hz(mel):
    return 700.0 * (10.0 ** (np.asarray(mel, dtype=np.float64) / 2595.0) - 1.0)


@functools.lru_cache(maxsize=8)
def mel_filterbank(spec: LogMelSpec) -> np.ndarray:
    """Triangular filters on the HTK mel scale, evenly spaced in mel between f_min and f_max.

    Returns:
        (n_mels, n_fft // 2 + 1) float64 weights of each FFT bin; filter m rises from edge m to its peak at
        edge m + 1 and falls to edge m + 2 (n_mels + 2 edges). Read-only (cached).
    """
    bins = np.arange(spec.fft_size // 2 + 1) * spec.sample_rate_hz / spec.fft_size  # (F,) bin frequencies
    edges = mel_to_hz(np.linspace(hz_to_mel(spec.f_min), hz_to_mel(spec.top_hz), spec.n_mels + 2))  # (M+2,)
    lower, peak, upper = edges[:-2, None], edges[1:-1, None], edges[2:, None]  # (M, 1) each
    rising = (bins[None, :] - lower) / (peak - lower)  # (M, F)
    falling = (upper - bins[None, :]) / (upper - peak)  # (M, F)
    weights = np.maximum(0.0, np.minimum(rising, falling))
    weights.setflags(write=False)
    return weights


@functools.lru_cache(maxsize=8)
def _window(length: int) -> np.ndarray:
    """Periodic Hann window (as torch.hann_window's default), read-only."""
    window = 0.5 - 0.5 * np.cos(2 * np.pi * np.arange(length) / length)
    window.setflags(write=False)
    return window


def log_mel(samples: np.ndarray, spec: LogMelSpec) -> np.ndarray:
    """Log-mel features of a mono clip.

    Args:
        samples: (N,) mono samples at `spec.sample_rate_hz`, floats in [-1, 1].
        spec: the feature parameters.

    Returns:
        (T, n_mels) float32, T = frame_count(N, spec) (possibly 0).
    """
    x = np.asarray(samples, dtype=np.float64).reshape(-1)  # (N,)
    frames = frame_count(len(x), spec)
    if frames == 0:
        return np.zeros((0, spec.n_mels), dtype=np.float32)
    windows = np.lib.stride_tricks.sliding_window_view(x, spec.window_length)[:: spec.hop_length][:frames]  # (T, W)
    spectrum = np.fft.rfft(windows * _window(spec.window_length), n=spec.fft_size)  # (T, F)
    power = spectrum.real**2 + spectrum.imag**2  # (T, F)
    mel = power @ mel_filterbank(spec).T  # (T, M)
    return np.log(np.maximum(mel, spec.log_floor)).astype(np.float32)
