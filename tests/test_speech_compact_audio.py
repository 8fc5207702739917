"""Packing a corpus split into Opus zip parts and unpacking it gives the same corpus back, up to the codec."""

import json
import pathlib

import numpy as np
import pytest

pytest.importorskip("soundfile")

from attnserve.export.speech import compact_audio  # noqa: E402
from attnserve.export.speech.feature_cache import wav_features  # noqa: E402

RATE = compact_audio.SAMPLE_RATE_HZ


def sweep(seconds: float, seed: int) -> np.ndarray:
    """A vowel-like clip: a gliding 120-250 Hz pulse train's harmonics under a slow loudness envelope."""
    rng = np.random.default_rng(seed)
    t = np.arange(int(seconds * RATE)) / RATE
    f0 = 120 + 130 * t / seconds
    phase = 2 * np.pi * np.cumsum(f0) / RATE
    x = sum(np.sin(k * phase) / k for k in range(1, 30) if k * f0.max() < RATE / 2)
    x = x * (0.5 + 0.5 * np.sin(2 * np.pi * 1.5 * t)) + 0.01 * rng.standard_normal(len(t))
    return (0.3 * 32767 * x / np.abs(x).max()).astype(np.int16)


def snr_db(x: np.ndarray, y: np.ndarray) -> float:
    x, y = x.astype(np.float64), y.astype(np.float64)
    return float(10 * np.log10((x**2).sum() / ((x - y) ** 2).sum()))


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> pathlib.Path:
    root = tmp_path_factory.mktemp("speech")
    for split, lengths in {"train": [1.0, 2.3, 0.4], "dev": [1.7]}.items():
        (root / split).mkdir()
        rows = []
        for i, seconds in enumerate(lengths):
            path = f"{split}/{split}_{i:06d}.wav"
            (root / path).write_bytes(compact_audio.wav_bytes(sweep(seconds, seed=i)))
            rows.append({"id": f"{split}_{i:06d}", "path": path, "text": "a b", "duration": seconds})
        (root / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return root


def test_round_trip_keeps_names_lengths_and_manifests(corpus, tmp_path):
    opts = compact_audio.PackOptions(part_bytes=1_000_000, jobs=2)
    parts = compact_audio.pack(corpus, ["train", "dev"], tmp_path / "parts", opts)
    summary = compact_audio.unpack(parts, tmp_path / "out", jobs=2)

    assert summary["clips"] == 4 and sorted(summary["manifests"]) == ["dev.jsonl", "train.jsonl"]
    for split in ["train", "dev"]:
        assert (tmp_path / "out" / f"{split}.jsonl").read_bytes() == (corpus / f"{split}.jsonl").read_bytes()
    originals = sorted(p.relative_to(corpus) for p in corpus.rglob("*.wav"))
    assert sorted(p.relative_to(tmp_path / "out") for p in (tmp_path / "out").rglob("*.wav")) == originals
    for path in originals:
        x = compact_audio.read_wav_samples(corpus / path)
        y = compact_audio.read_wav_samples(tmp_path / "out" / path)
        assert len(y) == len(x)
        # Measured at the default level (~11 kbit/s): these clips ~11 dB SNR and 0.65 mean absolute log-mel
        # error (above the model's -11.5 floor); the corpus's speech a median 11 dB and 0.70-0.79.
        assert snr_db(x, y) > 8
        f, g = (np.maximum(wav_features((root / path).read_bytes()), -11.5) for root in (corpus, tmp_path / "out"))
        assert np.abs(f - g).mean() < 0.9


def test_parts_stay_under_their_limit(corpus, tmp_path):
    opts = compact_audio.PackOptions(compression_level=0.0, part_bytes=100_000, jobs=2)  # ~250 kbit/s
    parts = compact_audio.pack(corpus, ["train", "dev"], tmp_path, opts)
    assert len(parts) > 1 and all(p.stat().st_size <= opts.part_bytes for p in parts)
    with pytest.raises(ValueError, match="compression_level"):
        compact_audio.PackOptions(compression_level=1.5)
