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

Whisper's features (WhisperFeatureExtractor, read from a checkpoint's preprocessor_config.json) are the
same pipeline with options set: the clip zero-padded or cut to a fixed window (`pad_seconds`, 30 s; exactly
window / shift frames), frames centred on their shift (`center`: the signal reflect-padded by n_fft / 2),
Slaney's mel scale and filter normalisation (`mel_scale`, `filter_norm`), log10, values raised to the
clip's maximum minus `dynamic_range` (8), then `(x + add) / divide` ((x + 4) / 4).
"""

from __future__ import annotations

import dataclasses
import functools
import math

import numpy as np

FEATURE_TYPES = ("log-mel",)
MEL_SCALES = ("htk", "slaney")
FILTER_NORMS = (None, "slaney")
LOGS = ("ln", "log10")


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
    # Mel scale of the filter edges: "htk" (2595 log10(1 + f / 700)) or "slaney" (linear below 1 kHz).
    mel_scale: str = "htk"
    # None: triangles of peak 1; "slaney": each triangle divided by its width in Hz (equal area).
    filter_norm: str | None = None
    # Frame k centred on sample k * hop (the signal reflect-padded by n_fft / 2 at both ends), not starting there.
    center: bool = False
    # "ln" (natural) or "log10".
    log: str = "ln"
    # Values below the clip's maximum minus this are raised to it (after the log); None = no clamp.
    dynamic_range: float | None = None
    # The log features are finally mapped to (x + add) / divide.
    add: float = 0.0
    divide: float = 1.0
    # Clips are zero-padded or cut to this many seconds and give window / shift frames; None = as long as sent.
    pad_seconds: float | None = None

    def __post_init__(self):
        self._check_sizes()
        if self.mel_scale not in MEL_SCALES or self.filter_norm not in FILTER_NORMS or self.log not in LOGS:
            raise ValueError(f"mel_scale {self.mel_scale!r}, filter_norm {self.filter_norm!r}, log {self.log!r}: "
                             f"use one of {MEL_SCALES}, {FILTER_NORMS}, {LOGS}")
        if self.center and self.fft_size != self.window_length:
            raise ValueError(f"center needs n_fft {self.fft_size} equal to the window ({self.window_length} samples)")
        if self.dynamic_range is not None and not self.dynamic_range > 0:
            raise ValueError(f"dynamic_range must be positive, got {self.dynamic_range}")
        if not self.divide > 0 or (self.pad_seconds is not None and not self.pad_seconds > 0):
            raise ValueError(f"divide and pad_seconds must be positive, got {self.divide}, {self.pad_seconds}")

    def _check_sizes(self):
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
    """Frames of a clip of `num_samples`: 1 + (N - window) // hop, or 0 below one window; centred frames:
    1 + N // hop; a fixed window: pad_seconds / shift, whatever N."""
    if spec.pad_seconds is not None:
        return _padded_samples(spec) // spec.hop_length
    if spec.center:
        return 1 + num_samples // spec.hop_length
    if num_samples < spec.window_length:
        return 0
    return 1 + (num_samples - spec.window_length) // spec.hop_length


def _padded_samples(spec: LogMelSpec) -> int:
    return round(spec.pad_seconds * spec.sample_rate_hz)


# Slaney's mel scale (librosa's default, Whisper's): linear below 1 kHz, logarithmic above.
_SLANEY_HZ, _SLANEY_MEL, _SLANEY_STEP = 1000.0, 15.0, 27.0 / np.log(6.4)


def hz_to_mel(hz, scale: str = "htk"):
    """HTK mel scale: 2595 log10(1 + f / 700); or Slaney's."""
    hz = np.asarray(hz, dtype=np.float64)
    if scale == "slaney":
        log_part = _SLANEY_MEL + np.log(np.maximum(hz, _SLANEY_HZ) / _SLANEY_HZ) * _SLANEY_STEP
        return np.where(hz >= _SLANEY_HZ, log_part, 3.0 * hz / 200.0)
    return 2595.0 * np.log10(1.0 + hz / 700.0)


def mel_to_hz(mel, scale: str = "htk"):
    mel = np.asarray(mel, dtype=np.float64)
    if scale == "slaney":
        log_part = _SLANEY_HZ * np.exp((np.maximum(mel, _SLANEY_MEL) - _SLANEY_MEL) / _SLANEY_STEP)
        return np.where(mel >= _SLANEY_MEL, log_part, 200.0 * mel / 3.0)
    return 700.0 * (10.0 ** (mel / 2595.0) - 1.0)


@functools.lru_cache(maxsize=8)
def mel_filterbank(spec: LogMelSpec) -> np.ndarray:
    """Triangular filters on the HTK mel scale, evenly spaced in mel between f_min and f_max.

    Returns:
        (n_mels, n_fft // 2 + 1) float64 weights of each FFT bin; filter m rises from edge m to its peak at
        edge m + 1 and falls to edge m + 2 (n_mels + 2 edges). Read-only (cached).
    """
    bins = np.arange(spec.fft_size // 2 + 1) * spec.sample_rate_hz / spec.fft_size  # (F,) bin frequencies
    scale = spec.mel_scale
    edges = mel_to_hz(np.linspace(hz_to_mel(spec.f_min, scale), hz_to_mel(spec.top_hz, scale), spec.n_mels + 2), scale)
    lower, peak, upper = edges[:-2, None], edges[1:-1, None], edges[2:, None]  # (M, 1) each
    rising = (bins[None, :] - lower) / (peak - lower)  # (M, F)
    falling = (upper - bins[None, :]) / (upper - peak)  # (M, F)
    weights = np.maximum(0.0, np.minimum(rising, falling))
    if spec.filter_norm == "slaney":
        weights *= 2.0 / (upper - lower)
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
    if spec.pad_seconds is not None:
        x = np.pad(x[: _padded_samples(spec)], (0, max(_padded_samples(spec) - len(x), 0)))
    if spec.center:
        x = np.pad(x, spec.fft_size // 2, mode="reflect" if len(x) > spec.fft_size // 2 else "constant")
    windows = np.lib.stride_tricks.sliding_window_view(x, spec.window_length)[:: spec.hop_length][:frames]  # (T, W)
    spectrum = np.fft.rfft(windows * _window(spec.window_length), n=spec.fft_size)  # (T, F)
    power = spectrum.real**2 + spectrum.imag**2  # (T, F)
    mel = np.maximum(power @ mel_filterbank(spec).T, spec.log_floor)  # (T, M)
    out = np.log10(mel) if spec.log == "log10" else np.log(mel)
    if spec.dynamic_range is not None:
        out = np.maximum(out, out.max() - spec.dynamic_range)
    return ((out + spec.add) / spec.divide).astype(np.float32)
