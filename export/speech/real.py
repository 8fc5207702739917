"""Builds the corpus of recorded human speech that Debian packages ship (docs/speech-corpus.md).

    python -m attnserve.export.speech.real --out /work/data/real-speech

Downloads the packages (`apt-get download`, unpacked with `dpkg-deb -x`; nothing is installed), reads each
source's voice clips and lines of text (export/speech/real_sources/), normalises the text as the synthesized
corpus does (export/speech/text.py: a line with digits or symbols has no unique transcript and is dropped),
drops clips whose characters per second are implausible for the line (laughs, grunts, wrong pairings),
resamples to 16 kHz with sox and writes `<split>/<id>.wav` and `<split>.jsonl` in the synthesized corpus's
manifest format (export/speech/manifest.py), with the source, character and licence of every clip.

Splits: `test_real_heldout` is whole sources (all of Drascula and the Asterisk voice), never trained on or
used for selection; `dev` is the Amazon Queen characters in `DEV_CHARACTERS` and Steel Sky's section
`DEV_STEEL_SKY_SECTION` and the whole of `DEV_SOURCES` (Warzone 2100's tutorial), all held out from
training; `train` is the rest. `test_microphone` is PocketSphinx's test recordings, the only microphone
speech packages ship (37 s): too little for a figure of its own weight, so it is reported beside the others.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import json
import logging
import multiprocessing
import pathlib
import shutil
import subprocess
import wave
from typing import Iterator

import numpy as np

from attnserve.export.speech import manifest, text
from attnserve.export.speech.real_sources import Clip, asterisk, drascula, pocketsphinx_testdata, queen, steel_sky, warzone

log = logging.getLogger("attnserve.speech.real")

SAMPLE_RATE = 16_000
MAX_SECONDS = 15.0
MIN_SECONDS = 0.4
# Characters of transcript per second of voiced audio: the sources read ~12-13 (measured); outside this
# range a clip is a laugh, a grunt, a spelled-out word or a wrong pairing.
MIN_CPS, MAX_CPS = 5.0, 24.0
PACKAGES = {
    queen.SOURCE: ["flight-of-the-amazon-queen"],
    # ScummVM's binary holds the Huffman tree that Steel Sky's text needs (real_sources/steel_sky.py).
    steel_sky.SOURCE: ["beneath-a-steel-sky", "scummvm"],
    drascula.SOURCE: ["drascula"],
    asterisk.SOURCE: ["asterisk-core-sounds-en-wav", "asterisk-core-sounds-en"],
    warzone.SOURCE: ["warzone2100-data"],
    pocketsphinx_testdata.SOURCE: ["pocketsphinx-testdata"],
}
LICENCES = {
    queen.SOURCE: "freeware: free redistribution, modified versions marked (Debian copyright file)",
    drascula.SOURCE: "freeware: free redistribution (Debian copyright file)",
    steel_sky.SOURCE: "Beneath-a-Steel-Sky-License: free redistribution, no fee for the game (Debian copyright file)",
    asterisk.SOURCE: "CC-BY-SA-3.0",
    warzone.SOURCE: "GPL-2+",
    pocketsphinx_testdata.SOURCE: "BSD-2-Clause (Debian copyright file)",
}
HELDOUT_SOURCES = (drascula.SOURCE, asterisk.SOURCE)
# Amazon Queen speakers held out as dev (two female, one male; ~270 clips).
DEV_CHARACTERS = ("WITCH", "NAOMI", "IAN")
# A Steel Sky section held out as dev too (421 clips, 15 min): 8-bit 11 kHz studio speech as Drascula's, so
# selection sees the recording kind that the held-out test has. Characters met only there are new to
# training; the hero and his robot speak in every section, so they are not.
DEV_STEEL_SKY_SECTION = "5"
# Whole sources held out as dev: Warzone 2100's tutorial narrator (~2 min), a voice no split trains on.
DEV_SOURCES = (warzone.SOURCE,)
# Whole sources recorded through a microphone (not a studio), held out as their own test split.
MICROPHONE_SOURCES = (pocketsphinx_testdata.SOURCE,)
SPLITS = ("train", "dev", "test_real_heldout", "test_microphone")


def fetch(out: pathlib.Path, package: str) -> pathlib.Path:
    """The package unpacked under out/pkg/<package> (downloaded into out/debs first if missing)."""
    target = out / "pkg" / package
    if target.exists():
        return target
    debs = out / "debs"
    debs.mkdir(parents=True, exist_ok=True)
    if not list(debs.glob(f"{package}_*.deb")):
        subprocess.run(["apt-get", "download", package], cwd=debs, check=True, capture_output=True)
    deb = sorted(debs.glob(f"{package}_*.deb"))[-1]
    staging = target.with_suffix(".partial")
    shutil.rmtree(staging, ignore_errors=True)
    staging.parent.mkdir(parents=True, exist_ok=True)  # dpkg-deb -x makes the folder, not its parents
    subprocess.run(["dpkg-deb", "-x", str(deb), str(staging)], check=True)
    staging.rename(target)
    return target


def all_clips(out: pathlib.Path) -> Iterator[Clip]:
    roots = {name: fetch(out, name) for names in PACKAGES.values() for name in names}
    yield from queen.clips(roots["flight-of-the-amazon-queen"])
    # After Amazon Queen, so that the earlier sources' clips keep their ids.
    yield from steel_sky.clips(roots["beneath-a-steel-sky"], roots["scummvm"])
    yield from drascula.clips(roots["drascula"])
    yield from asterisk.clips(roots["asterisk-core-sounds-en-wav"], roots["asterisk-core-sounds-en"])
    # Last: its clips only add dev rows, after the others' (every earlier id stays).
    yield from warzone.clips(roots["warzone2100-data"])
    yield from pocketsphinx_testdata.clips(roots["pocketsphinx-testdata"])


def decode(clip: Clip) -> np.ndarray:
    """The clip as 16 kHz mono int16 samples (sox; MP3 needs libsox-fmt-mp3).

    Raises:
        RuntimeError: if sox cannot decode it.
    """
    kinds = {"mp3": ["-t", "mp3"], "wav": ["-t", "wav"], "ogg": ["-t", "ogg"],
             "u8": ["-t", "raw", "-r", str(clip.sample_rate), "-e", "unsigned", "-b", "8", "-c", "1"]}
    cmd = ["sox", "-R", "-V1", *kinds[clip.codec], "-", "-t", "raw", "-e", "signed", "-b", "16", "-c", "1", "-",
           "rate", "-h", str(SAMPLE_RATE)]
    run = subprocess.run(cmd, input=clip.audio, capture_output=True)
    if run.returncode != 0:
        raise RuntimeError(f"sox failed on {clip.source}/{clip.key}: {run.stderr.decode(errors='replace')[-300:]}")
    return np.frombuffer(run.stdout, dtype="<i2")


def voiced_seconds(samples: np.ndarray) -> float:
    """Seconds from the first to the last 10 ms frame above 5% of the clip's loudest frame."""
    frames = samples[: len(samples) // 160 * 160].astype(np.float64).reshape(-1, 160)
    if not len(frames):
        return 0.0
    rms = np.sqrt((frames**2).mean(1))
    loud = np.flatnonzero(rms > 0.05 * rms.max()) if rms.max() > 0 else []
    return (loud[-1] - loud[0] + 1) / 100 if len(loud) else 0.0


def transcript(line: str) -> str | None:
    """The normalised transcript of a source's line, or None when it has no unique one."""
    if text.GLUED_PARENTHESIS.search(line):  # "unit(s)": "unit", "units" or "unit s"
        return None
    try:
        return text.normalise(line) or None
    except ValueError:
        return None


def split_of(clip: Clip) -> str:
    if clip.source in HELDOUT_SOURCES:
        return "test_real_heldout"
    if clip.source in MICROPHONE_SOURCES:
        return "test_microphone"
    if clip.source in DEV_SOURCES or clip.character in DEV_CHARACTERS:
        return "dev"
    if clip.source == steel_sky.SOURCE and clip.key.split("-")[0] == DEV_STEEL_SKY_SECTION:
        return "dev"
    return "train"


@dataclasses.dataclass(frozen=True)
class Prepared:
    """A clip that passed every filter, or the reason it did not (`samples` None)."""

    clip: Clip
    label: str | None
    samples: np.ndarray | None
    reason: str | None


def prepare(clip: Clip) -> Prepared:
    label = transcript(clip.text)
    if label is None:
        return Prepared(clip, None, None, "no_transcript")
    try:
        samples = decode(clip)
    except RuntimeError:
        return Prepared(clip, label, None, "decode_failed")
    seconds = len(samples) / SAMPLE_RATE
    if not MIN_SECONDS <= seconds <= MAX_SECONDS:
        return Prepared(clip, label, None, "too_short" if seconds < MIN_SECONDS else "too_long")
    voiced = voiced_seconds(samples)
    cps = len(label) / voiced if voiced else float("inf")
    if not MIN_CPS <= cps <= MAX_CPS:
        return Prepared(clip, label, None, "implausible_rate")
    return Prepared(clip, label, samples, None)


def write_wav(path: pathlib.Path, samples: np.ndarray) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with wave.open(str(path), "wb") as f:
        f.setnchannels(1)
        f.setsampwidth(2)
        f.setframerate(SAMPLE_RATE)
        f.writeframes(samples.astype("<i2").tobytes())


def row_of(p: Prepared, split: str, number: int) -> dict:
    clip, uid = p.clip, f"{split}_{number:06d}"
    return {
        "id": uid, "path": f"{split}/{uid}.wav", "text": p.label, "spoken": " ".join(clip.text.split()),
        "source": clip.source, "split": split, "engine": "recorded",
        "voice": f"{clip.source}:{clip.character or 'unknown'}", "voice_settings": {"file": clip.key},
        "augmentation": {}, "duration": round(len(p.samples) / SAMPLE_RATE, 4), "sample_rate": SAMPLE_RATE,
        "words": [], "word_times": "none", "inexact_words": 0,
        "character": clip.character or "unknown", "licence": LICENCES[clip.source],
    }


def build(out: pathlib.Path, jobs: int = 2) -> dict:
    """Writes the corpus under `out` and returns its statistics (also written to out/stats.json)."""
    clips = list(all_clips(out))
    log.info("%d clips with text", len(clips))
    rows = {split: [] for split in SPLITS}
    dropped = collections.Counter()
    for split in SPLITS:
        shutil.rmtree(out / split, ignore_errors=True)
    with multiprocessing.get_context("fork").Pool(jobs) as pool:
        for p in pool.imap(prepare, clips, chunksize=16):
            if p.reason is not None:
                dropped[f"{p.clip.source}:{p.reason}"] += 1
                continue
            split = split_of(p.clip)
            row = row_of(p, split, len(rows[split]))
            write_wav(out / row["path"], p.samples)
            rows[split].append(row)
    for split, split_rows in rows.items():
        manifest.write(out / f"{split}.jsonl", split_rows)
    stats = statistics(rows, dropped, len(clips))
    (out / "stats.json").write_text(json.dumps(stats, indent=1))
    return stats


def statistics(rows: dict[str, list[dict]], dropped: collections.Counter, candidates: int) -> dict:
    hours = collections.defaultdict(float)
    speakers = collections.defaultdict(set)
    by_character = collections.defaultdict(float)
    for split, split_rows in rows.items():
        for row in split_rows:
            hours[f"{row['source']}/{split}"] += row["duration"] / 3600
            speakers[row["source"]].add(row["character"])
            by_character[f"{row['source']}:{row['character']}"] += row["duration"] / 3600
    return {
        "candidates": candidates, "dropped": dict(sorted(dropped.items())),
        "clips": {split: len(r) for split, r in rows.items()},
        "hours": {k: round(v, 3) for k, v in sorted(hours.items())},
        "speakers": {k: sorted(v) for k, v in sorted(speakers.items())},
        "hours_per_character": {k: round(v, 3) for k, v in sorted(by_character.items())},
        "filters": {"seconds": [MIN_SECONDS, MAX_SECONDS], "chars_per_second": [MIN_CPS, MAX_CPS]},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=pathlib.Path, default=pathlib.Path("data/real-speech"))
    parser.add_argument("--jobs", type=int, default=2, help="decoding processes")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    stats = build(args.out, args.jobs)
    print(json.dumps({k: stats[k] for k in ("clips", "hours", "dropped")}, indent=1))


if __name__ == "__main__":
    main()
