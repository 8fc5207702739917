"""Packs corpus splits into a few small Ogg/Opus archives (for an upload), and unpacks them back to WAV files.

    python -m attnserve.export.speech.compact_audio pack --corpus data/speech --splits train dev --out .gpu/speech
    python -m attnserve.export.speech.compact_audio unpack .gpu/speech/speech-*.zip --out data/speech

The 10 h training split is 1.2 GB of 16-bit WAV; as Opus at ~11 kbit/s it is ~50 MB. `pack` encodes every
clip of a split (`soundfile`'s libsndfile, Ogg/Opus at `compression_level`), and writes the clips and the
split's `<split>.jsonl` into zip parts of at most `part_bytes` each. Members are deflated: that squeezes the
~800 zero bytes libsndfile pads each file's comment header with, and leaves the Opus packets as they are.

`unpack` decodes every clip, in parallel over all cores, to a 16 kHz mono 16-bit WAV under the clip's own
path, and writes the jsonl files unchanged: the result is a corpus folder that `feature_cache.load_split` and
`train.py` read as they read the original. A decoded clip has exactly its original number of samples (the
Ogg granule position ends the stream), so the jsonl's durations still hold; its samples are not the original
ones (Opus is lossy), which the choice of `compression_level` weighed (see `PackOptions`).
"""

from __future__ import annotations

import argparse
import dataclasses
import io
import json
import multiprocessing
import os
import pathlib
import wave
import zipfile

import numpy as np

SAMPLE_RATE_HZ = 16000
OPUS_SUFFIX = ".opus"


@dataclasses.dataclass(frozen=True)
class PackOptions:
    # libsndfile's Opus compression level, 0 (best, ~250 kbit/s) .. 1 (smallest, ~6 kbit/s). 0.98 is ~11 kbit/s
    # on this corpus (10.2 h of training audio -> ~50 MB); on dev, features and the recognizer's CER then stay
    # close to the clean audio's (docs of the measurement: the compact_audio test and the session report).
    compression_level: float = 0.98
    # Largest zip part, in bytes (an upload's limit, with room to spare).
    part_bytes: int = 28_000_000
    # Worker processes for encoding (None: all cores).
    jobs: int | None = None

    def __post_init__(self):
        if not 0 <= self.compression_level <= 1:
            raise ValueError(f"compression_level must be in [0, 1], got {self.compression_level}")
        if self.part_bytes <= 0:
            raise ValueError(f"part_bytes must be positive, got {self.part_bytes}")


def encode_opus(samples: np.ndarray, compression_level: float) -> bytes:
    """(N,) int16 mono samples at 16 kHz -> an Ogg/Opus file."""
    import soundfile

    out = io.BytesIO()
    soundfile.write(out, samples, SAMPLE_RATE_HZ, format="OGG", subtype="OPUS", compression_level=compression_level)
    return out.getvalue()


def decode_opus(data: bytes) -> np.ndarray:
    """An Ogg/Opus file written by `encode_opus` -> (N,) int16 mono samples at 16 kHz."""
    import soundfile

    samples, rate = soundfile.read(io.BytesIO(data), dtype="int16", always_2d=True)
    if rate != SAMPLE_RATE_HZ or samples.shape[1] != 1:
        raise ValueError(f"expected 16 kHz mono Opus, got {rate} Hz with {samples.shape[1]} channels")
    return samples[:, 0]


def wav_bytes(samples: np.ndarray) -> bytes:
    """(N,) int16 samples -> a 16 kHz mono 16-bit PCM WAV file (the corpus's own format)."""
    out = io.BytesIO()
    with wave.open(out, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(SAMPLE_RATE_HZ)
        w.writeframes(samples.astype("<i2").tobytes())
    return out.getvalue()


def read_wav_samples(path: pathlib.Path) -> np.ndarray:
    """A corpus WAV file's (N,) int16 samples; anything but 16 kHz mono 16-bit PCM is refused."""
    with wave.open(str(path), "rb") as w:
        if (w.getframerate(), w.getnchannels(), w.getsampwidth()) != (SAMPLE_RATE_HZ, 1, 2):
            raise ValueError(f"{path}: expected 16 kHz mono 16-bit PCM, got {w.getframerate()} Hz, "
                             f"{w.getnchannels()} channels, {8 * w.getsampwidth()} bits")
        return np.frombuffer(w.readframes(w.getnframes()), dtype="<i2")


def member_name(wav_path: str) -> str:
    """The zip member of a clip: its corpus path with .wav replaced by .opus."""
    return str(pathlib.PurePosixPath(wav_path).with_suffix(OPUS_SUFFIX))


def _encode_task(task: tuple[str, str, float]) -> tuple[str, bytes]:
    path, wav_path, level = task
    return member_name(wav_path), encode_opus(read_wav_samples(pathlib.Path(path)), level)


def pack(corpus: pathlib.Path, splits: list[str], out: pathlib.Path, opts: PackOptions = PackOptions(),
         prefix: str = "speech") -> list[pathlib.Path]:
    """Encodes the splits' clips into zip parts `<out>/<prefix>-000.zip`, ... and returns their paths.

    Each part holds whole clips; the jsonl files go into the first part. Clips keep their corpus paths.
    """
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob(f"{prefix}-*.zip"):
        old.unlink()
    manifests = {s: (corpus / f"{s}.jsonl").read_bytes() for s in splits}
    tasks = [(str(corpus / row["path"]), row["path"], opts.compression_level)
             for s in splits for row in _rows(manifests[s])]
    parts: list[pathlib.Path] = []
    archive = None
    with multiprocessing.Pool(opts.jobs or os.cpu_count()) as pool:
        for name, data in pool.imap(_encode_task, tasks, chunksize=16):
            # A new part when this clip would push the current one over the limit (headers: ~100 bytes per
            # member in the local header and again in the central directory).
            if len(data) + 200 > opts.part_bytes:
                raise ValueError(f"{name} alone ({len(data)} bytes) exceeds part_bytes {opts.part_bytes}")
            if archive is None or archive.fp.tell() + 200 * (len(archive.filelist) + 1) + len(data) > opts.part_bytes:
                if archive is not None:
                    archive.close()
                parts.append(out / f"{prefix}-{len(parts):03d}.zip")
                archive = zipfile.ZipFile(parts[-1], "w", zipfile.ZIP_DEFLATED)
                if len(parts) == 1:
                    for split, manifest in manifests.items():
                        archive.writestr(f"{split}.jsonl", manifest, zipfile.ZIP_LZMA)
            archive.writestr(name, data)
    if archive is not None:
        archive.close()
    return parts


def _rows(manifest: bytes) -> list[dict]:
    return [json.loads(line) for line in manifest.decode("utf-8").splitlines() if line.strip()]


_open_parts: dict[str, zipfile.ZipFile] = {}


def _decode_task(task: tuple[str, str, str]) -> int:
    """Decodes one member of a part to `<out>/<path>.wav`; returns its samples."""
    part, name, out = task
    archive = _open_parts.get(part)
    if archive is None:  # one open handle per part and worker process
        archive = _open_parts[part] = zipfile.ZipFile(part)
    samples = decode_opus(archive.read(name))
    target = pathlib.Path(out) / pathlib.PurePosixPath(name).with_suffix(".wav")
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(wav_bytes(samples))
    return len(samples)


def unpack(parts: list[pathlib.Path], out: pathlib.Path, jobs: int | None = None) -> dict:
    """Decodes the parts' clips to WAV files under `out` (in parallel) and writes their jsonl files.

    Returns:
        {"clips": decoded clips, "seconds": their audio, "manifests": the jsonl files written}.
    """
    out.mkdir(parents=True, exist_ok=True)
    tasks, manifests = [], []
    for part in parts:
        with zipfile.ZipFile(part) as archive:
            for name in archive.namelist():
                if name.endswith(OPUS_SUFFIX):
                    tasks.append((str(part), name, str(out)))
                elif name.endswith(".jsonl"):
                    (out / name).write_bytes(archive.read(name))
                    manifests.append(name)
    with multiprocessing.Pool(jobs or os.cpu_count()) as pool:
        samples = sum(pool.imap_unordered(_decode_task, tasks, chunksize=32))
    return {"clips": len(tasks), "seconds": samples / SAMPLE_RATE_HZ, "manifests": manifests}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    packing = commands.add_parser("pack", help="encode splits of a corpus into zip parts")
    packing.add_argument("--corpus", type=pathlib.Path, default=pathlib.Path("data/speech"))
    packing.add_argument("--splits", nargs="+", default=["train", "dev"])
    packing.add_argument("--out", type=pathlib.Path, required=True, help="folder for the parts")
    packing.add_argument("--compression-level", type=float, default=PackOptions.compression_level)
    packing.add_argument("--part-mb", type=float, default=PackOptions.part_bytes / 1e6)
    packing.add_argument("--jobs", type=int)
    unpacking = commands.add_parser("unpack", help="decode zip parts into a corpus folder of WAV files")
    unpacking.add_argument("parts", nargs="+", type=pathlib.Path)
    unpacking.add_argument("--out", type=pathlib.Path, required=True, help="corpus folder to write")
    unpacking.add_argument("--jobs", type=int)
    args = parser.parse_args()
    if args.command == "pack":
        opts = PackOptions(args.compression_level, int(args.part_mb * 1e6), args.jobs)
        for part in pack(args.corpus, args.splits, args.out, opts):
            print(f"{part}\t{part.stat().st_size / 1e6:.1f} MB")
    else:
        print(json.dumps(unpack(args.parts, args.out, args.jobs)))


if __name__ == "__main__":
    main()
