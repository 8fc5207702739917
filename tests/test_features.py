"""Log-mel features (server/inputs/features.py), checked against independent arithmetic: the frame count formula, a
pure tone's energy landing in the mel band of its frequency, Parseval on the power spectrum, the log floor."""

from __future__ import annotations

import math
import subprocess
import sys

import numpy as np
import pytest

from attnserve.server.inputs.features import LogMelSpec, frame_count, log_mel, mel_filterbank

SPEC = LogMelSpec(sample_rate_hz=16000, n_mels=80, window_ms=25, shift_ms=10, log_floor=1e-10)


def tone(hz: float, seconds: float = 1.0, rate: int = 16000, amplitude: float = 0.5) -> np.ndarray:
    return (amplitude * np.sin(2 * np.pi * hz * np.arange(int(seconds * rate)) / rate)).astype(np.float32)


def test_window_hop_and_fft_sizes():
    assert (SPEC.window_length, SPEC.hop_length, SPEC.fft_size) == (400, 160, 512)
    assert LogMelSpec(8000, 40, 25, 10, log_floor=1e-10).fft_size == 256  # 200 samples -> next power of two


@pytest.mark.parametrize("samples,frames", [(0, 0), (399, 0), (400, 1), (559, 1), (560, 2), (16000, 98), (48000, 298)])
def test_frame_count_is_one_plus_whole_hops_after_the_first_window(samples, frames):
    assert frame_count(samples, SPEC) == frames
    assert log_mel(np.zeros(samples, np.float32), SPEC).shape == (frames, 80)


@pytest.mark.parametrize("hz", [300.0, 1000.0, 3000.0, 6500.0])
def test_a_pure_tone_peaks_in_the_band_whose_centre_is_nearest_its_frequency(hz):
    # Centres computed here from the HTK formula, independently of the module.
    mel = lambda f: 2595 * math.log10(1 + f / 700)  # noqa: E731
    centres = [700 * (10 ** (m / 2595) - 1) for m in np.linspace(0, mel(8000), 82)[1:-1]]
    expected = int(np.argmin([abs(c - hz) for c in centres]))
    features = log_mel(tone(hz), SPEC)  # (98, 80)
    assert features.dtype == np.float32
    assert abs(int(features.mean(axis=0).argmax()) - expected) <= 1
    # Far from the tone the bands hold almost nothing: at least 40 dB (ln 10^4) below the peak.
    far = [m for m in range(80) if abs(m - expected) > 12]
    assert features.mean(axis=0)[far].max() < features.mean(axis=0).max() - math.log(1e4)


def test_power_spectrum_obeys_parseval_through_an_all_pass_filterbank():
    # With the filterbank replaced by per-bin weights 1 (DC and Nyquist) and 2 (others), a frame's mel energy
    # is its windowed energy times n_fft (Parseval for the one-sided real FFT).
    x = np.random.default_rng(0).standard_normal(400).astype(np.float32) * 0.1
    window = 0.5 - 0.5 * np.cos(2 * np.pi * np.arange(400) / 400)
    power = np.abs(np.fft.rfft(x * window, n=512)) ** 2
    weights = np.full(257, 2.0)
    weights[[0, -1]] = 1.0
    assert (power * weights).sum() == pytest.approx(512 * np.sum((x * window) ** 2), rel=1e-9)
    # And the module computes the same power spectrum: a one-bin filter picks one bin's power.
    fb = mel_filterbank(SPEC)
    assert log_mel(x, SPEC)[0] == pytest.approx(np.log(np.maximum(fb @ power, 1e-10)), rel=1e-5, abs=1e-5)


def test_filters_are_triangles_that_cover_the_band_with_no_empty_filter():
    fb = mel_filterbank(SPEC)
    assert fb.shape == (80, 257) and fb.min() >= 0 and fb.max() <= 1
    assert (fb.sum(axis=1) > 0).all()
    peaks = fb.argmax(axis=1)
    assert (np.diff(peaks) >= 0).all(), "filters rise in frequency"
    assert not fb.flags.writeable


def test_silence_is_the_log_floor():
    assert np.all(log_mel(np.zeros(1600, np.float32), SPEC) == np.float32(math.log(1e-10)))


@pytest.mark.parametrize(
    "fields,message",
    [
        ({"shift_ms": 30}, "shift_ms must be in"),
        ({"n_fft": 256}, "n_fft 256 is shorter than the window"),
        ({"f_max": 9000}, "f_max <= 8000"),
        ({"log_floor": 0}, "log_floor must be positive"),
    ],
)
def test_inconsistent_parameters_are_refused(fields, message):
    values = dict(sample_rate_hz=16000, n_mels=80, window_ms=25, shift_ms=10, log_floor=1e-10) | fields
    with pytest.raises(ValueError, match=message):
        LogMelSpec(**values)


def test_features_import_without_torch_or_onnxruntime():
    script = (
        "import sys\n"
        "sys.modules['torch'] = None\n"
        "sys.modules['onnxruntime'] = None\n"
        "from attnserve.server.inputs import features\n"
        "print(features.log_mel([0.0] * 800, features.LogMelSpec(16000, 80, 25, 10)).shape)\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "(3, 80)"
