"""Log-mel features of a corpus split, computed once by the server's own code and cached on disk.

Training must see exactly what the server computes, so a WAV file takes the server's path: `read_wav` ->
mono samples -> `resample` to the model's rate (a no-op for the 16 kHz corpus) -> `log_mel`
(server/inputs/features.py). `FEATURES` is the one home of the feature parameters: the exporter writes the
manifest's `input.features` from it.

A split's cache is two files in the cache folder: `<split>.npy`, every utterance's (T, n_mels) float32
frames one after another (float32, so cached frames equal served frames bit for bit; 10 h of audio is
1.2 GB, memory-mapped), and `<split>.json`, the index (ids, frame offsets and counts, transcripts,
durations, voices) with a fingerprint of the manifest file and the feature parameters; a changed corpus or
spec rebuilds the cache.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import multiprocessing
import pathlib

import numpy as np
from tqdm import tqdm

from attnserve.server.inputs.audio import read_wav, resample
from attnserve.server.inputs.features import LogMelSpec, log_mel

# The model's features: 80 HTK-mel bands of 25 ms windows every 10 ms at 16 kHz (docs/model-contract.md).
FEATURES = LogMelSpec(sample_rate_hz=16000, n_mels=80, window_ms=25, shift_ms=10, n_fft=512, log_floor=1e-10)


def manifest_features(spec: LogMelSpec = FEATURES) -> dict:
    """The manifest's `input.features` for `spec` (its sample rate goes to `input.sample_rate_hz`)."""
    fields = {"type": "log-mel", "n_mels": spec.n_mels, "window_ms": spec.window_ms, "shift_ms": spec.shift_ms}
    if spec.n_fft is not None:
        fields["n_fft"] = spec.n_fft
    if spec.f_min:
        fields["f_min"] = spec.f_min
    if spec.f_max is not None:
        fields["f_max"] = spec.f_max
    return {**fields, "log_floor": spec.log_floor}


def wav_features(data: bytes, spec: LogMelSpec = FEATURES) -> np.ndarray:
    """A WAV file's (T, n_mels) float32 log-mel frames, computed as the server computes them."""
    wav = read_wav(data)
    samples = resample(wav.samples(), wav.sample_rate_hz, spec.sample_rate_hz)
    return log_mel(samples, spec)


@dataclasses.dataclass(frozen=True)
class Utterance:
    id: str
    text: str  # transcript: the corpus ALPHABET only
    voice: str  # "engine:voice"
    duration: float  # seconds
    offset: int  # first frame in the split's array
    frames: int


@dataclasses.dataclass(frozen=True, eq=False)
class SplitFeatures:
    """A cached split: utterances and their frames (a memory-mapped array)."""

    utterances: list[Utterance]
    frames: np.ndarray  # (sum of T, n_mels) float32

    def features(self, i: int) -> np.ndarray:
        """(T, n_mels) frames of utterance i (a view)."""
        u = self.utterances[i]
        return self.frames[u.offset : u.offset + u.frames]

    @property
    def seconds(self) -> float:
        return sum(u.duration for u in self.utterances)


def _fingerprint(manifest: pathlib.Path, spec: LogMelSpec) -> str:
    digest = hashlib.sha256(manifest.read_bytes())
    digest.update(repr(spec).encode())
    return digest.hexdigest()[:16]


def load_split(corpus: pathlib.Path, split: str, cache: pathlib.Path, spec: LogMelSpec = FEATURES) -> SplitFeatures:
    """The split's cached features, built first if missing or stale.

    Args:
        corpus: folder with `<split>.jsonl` and the WAV files it names.
        split: e.g. "train", "dev".
        cache: folder for `<split>.npy` and `<split>.json`.
    """
    manifest = corpus / f"{split}.jsonl"
    index_path, frames_path = cache / f"{split}.json", cache / f"{split}.npy"
    fingerprint = _fingerprint(manifest, spec)
    if index_path.exists() and frames_path.exists():
        index = json.loads(index_path.read_text())
        if index["fingerprint"] == fingerprint:
            return SplitFeatures([Utterance(**u) for u in index["utterances"]], np.load(frames_path, mmap_mode="r"))
    return _build(corpus, manifest, split, cache, spec, fingerprint)


def _path_features(task: tuple[pathlib.Path, LogMelSpec]) -> np.ndarray:
    path, spec = task
    return wav_features(path.read_bytes(), spec)


def _build(corpus, manifest, split, cache, spec, fingerprint) -> SplitFeatures:
    cache.mkdir(parents=True, exist_ok=True)
    rows = [json.loads(line) for line in manifest.read_text(encoding="utf-8").splitlines() if line.strip()]
    arrays, utterances, offset = [], [], 0
    paths = [(corpus / row["path"], spec) for row in rows]
    # One process per core: 10 h of audio takes minutes on one (in clip order, as a serial loop would give).
    with multiprocessing.get_context("fork").Pool() as pool:
        computed = pool.imap(_path_features, paths, chunksize=32)
        for row, frames in tqdm(zip(rows, computed), total=len(rows), desc=f"features {split}", mininterval=10):
            voice = f"{row['engine']}:{row['voice']}"
            utterances.append(Utterance(row["id"], row["text"], voice, float(row["duration"]), offset, len(frames)))
            arrays.append(frames)
            offset += len(frames)
    frames_path, index_path = cache / f"{split}.npy", cache / f"{split}.json"
    tmp = frames_path.with_suffix(".tmp.npy")
    np.save(tmp, np.concatenate(arrays) if arrays else np.zeros((0, spec.n_mels), np.float32))
    tmp.replace(frames_path)
    index = {"fingerprint": fingerprint, "utterances": [dataclasses.asdict(u) for u in utterances]}
    index_path.write_text(json.dumps(index))  # written last: an index always describes a complete array
    return SplitFeatures(utterances, np.load(frames_path, mmap_mode="r"))
