"""The training corpus of recorded and synthesized speech, every training copy through a random channel.

    python -m attnserve.export.speech.mix --real /work/data/real-speech --tts /work/data/speech \
        --out /work/data/speech-mix --real-copies 2

Writes `<out>/train/<id>.wav` (each a channel copy, export/speech/channel.py) and `<out>/train.jsonl`, and a
`dev.jsonl` that names the real corpus's dev clips (held-out Amazon Queen characters, recorded speech as
the model is meant for) through the link `<out>/real`: what `speech.train --corpus <out>` selects on.
`dev_channel.jsonl` holds the same dev clips through one random channel each (`dev_channel/<id>.wav`): the
dev clips share the training game's studio and codec, so a model that never hears other channels looks
better on `dev` than it is on other recordings; selecting on both keeps that in view.
`test_real_heldout` and the synthesized dev and test splits are never read here. Rerunning with more
sources or copies keeps the copies already written (a copy is a function of its id).

`--clean` writes the same rows without channels (each copy only levelled to -3 dBFS): the control of the
channel ablation (docs/speech-corpus.md), trained beside a channel build from the same weights.
`--effects codec` (or several names of `channel.EFFECTS`) keeps only those parts of each copy's drawn channel:
a single-effect arm of the same ablation.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import multiprocessing
import pathlib
import random
import wave

import numpy as np

from attnserve.export.speech import channel, manifest

log = logging.getLogger("attnserve.speech.mix")


@dataclasses.dataclass(frozen=True)
class Task:
    row: dict  # the source row
    source_path: pathlib.Path
    copy: int
    uid: str
    out: pathlib.Path
    folder: str = "train"  # where the copy goes under `out`
    # Only these parts of the drawn channel: None all of it, () none (--clean, the ablation's control).
    effects: tuple[str, ...] | None = None


def read_wav(path: pathlib.Path) -> np.ndarray:
    with wave.open(str(path)) as f:
        if f.getframerate() != channel.SAMPLE_RATE or f.getnchannels() != 1 or f.getsampwidth() != 2:
            raise ValueError(f"{path}: expected 16 kHz mono 16-bit")
        return np.frombuffer(f.readframes(f.getnframes()), "<i2")


def write_wav(path: pathlib.Path, samples: np.ndarray) -> None:
    with wave.open(str(path), "wb") as f:
        f.setnchannels(1)
        f.setsampwidth(2)
        f.setframerate(channel.SAMPLE_RATE)
        f.writeframes(samples.astype("<i2").tobytes())


def run(task: Task) -> dict | None:
    """The new row of one channel copy (None if sox failed on it)."""
    rng = random.Random(f"mix/{task.uid}")
    chosen = channel.sample(rng, len(channel.rooms()))
    if task.effects is not None:
        chosen = channel.keep(chosen, task.effects)
    target = task.out / task.folder / f"{task.uid}.wav"
    if target.exists():  # a copy is a function of its id: an earlier build's file is the same
        samples = read_wav(target)
    else:
        try:
            samples = channel.apply(read_wav(task.source_path), chosen, seed=rng.randrange(2**31))
        except (RuntimeError, ValueError) as error:
            log.warning("%s: %s", task.uid, error)
            return None
        write_wav(target.with_suffix(".tmp"), samples)
        target.with_suffix(".tmp").rename(target)
    row = dict(task.row)
    row.update(id=task.uid, path=f"{task.folder}/{task.uid}.wav", duration=round(len(samples) / channel.SAMPLE_RATE, 4),
               augmentation={**row["augmentation"], "channel": chosen.changes(), "of": task.row["id"]},
               words=[], word_times="none", inexact_words=0)
    return row


def tasks(corpus: pathlib.Path, prefix: str, copies: int, out: pathlib.Path, split: str = "train",
          folder: str = "train", effects: tuple[str, ...] | None = None) -> list[Task]:
    rows = manifest.read(corpus / f"{split}.jsonl")
    return [Task(row, corpus / row["path"], k, f"{prefix}{k}_{row['id']}", out, folder, effects)
            for k in range(copies) for row in rows]


def link(out: pathlib.Path, name: str, target: pathlib.Path) -> None:
    path = out / name
    if path.is_symlink() or path.exists():
        path.unlink()
    path.symlink_to(target.resolve())


def dev_rows(corpus: pathlib.Path, prefix: str) -> list[dict]:
    """The corpus's dev rows, voices taking turns, so that the first N (`train --dev-clips`) hear every voice."""
    by_voice: dict[str, list[dict]] = {}
    for row in manifest.read(corpus / "dev.jsonl"):
        by_voice.setdefault(row["voice"], []).append(row)
    turns = [row for k in range(max(map(len, by_voice.values()), default=0))
             for rows in by_voice.values() if k < len(rows) for row in rows[k : k + 1]]
    return [{**row, "id": f"{prefix}_{row['id']}", "path": f"{prefix}/{row['path']}"} for row in turns]


def build(real: pathlib.Path, tts: pathlib.Path | None, out: pathlib.Path, real_copies: int, tts_copies: int,
          jobs: int, clean: bool = False, effects: tuple[str, ...] | None = None) -> dict:
    channel.rooms()  # computed once, before the workers fork
    (out / "train").mkdir(parents=True, exist_ok=True)
    kept = () if clean else effects
    if kept is not None:
        channel.check_effects(kept)  # unknown names fail before any work
    work = tasks(real, "r", real_copies, out, effects=kept)
    dev = dev_rows(real, "real")
    link(out, "real", real)
    if tts is not None:
        work += tasks(tts, "t", tts_copies, out, effects=kept)
        link(out, "tts", tts)
    random.Random(0).shuffle(work)  # both kinds in every stretch of the build's progress
    with multiprocessing.get_context("fork").Pool(jobs) as pool:
        rows = [row for row in pool.imap(run, work, chunksize=8) if row is not None]
    rows.sort(key=lambda row: row["id"])
    manifest.write(out / "train.jsonl", rows)
    manifest.write(out / "dev.jsonl", dev)
    hours = {}
    for row in rows:
        kind = "recorded" if row["engine"] == "recorded" else "synthesized"
        hours[kind] = hours.get(kind, 0.0) + row["duration"] / 3600
    stats = {"train_clips": len(rows), "failed": len(work) - len(rows), "dev_clips": len(dev),
             "dev_channel_clips": dev_channel(real, out, jobs),
             "train_hours": {k: round(v, 3) for k, v in hours.items()}, "real_copies": real_copies,
             "tts_copies": tts_copies, "rooms": len(channel.rooms()), "clean": clean,
             "effects": list(effects) if effects is not None else None}
    (out / "stats.json").write_text(json.dumps(stats, indent=1))
    return stats


def dev_channel(real: pathlib.Path, out: pathlib.Path, jobs: int) -> int:
    """Writes `dev_channel.jsonl`: each recorded dev clip through one random channel (even for --clean,
    whose control it measures); returns its clip count."""
    (out / "dev_channel").mkdir(parents=True, exist_ok=True)
    work = tasks(real, "dc", 1, out, split="dev", folder="dev_channel")
    with multiprocessing.get_context("fork").Pool(jobs) as pool:
        rows = [row for row in pool.imap(run, work, chunksize=8) if row is not None]
    manifest.write(out / "dev_channel.jsonl", rows)
    return len(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--real", type=pathlib.Path, required=True, help="export/speech/real.py's output")
    parser.add_argument("--tts", type=pathlib.Path, help="export/speech/build.py's output (optional)")
    parser.add_argument("--out", type=pathlib.Path, required=True)
    parser.add_argument("--real-copies", type=int, default=2, help="channel copies of each recorded clip")
    parser.add_argument("--tts-copies", type=int, default=1, help="channel copies of each synthesized clip")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--clean", action="store_true", help="no channels: the ablation's control")
    parser.add_argument("--effects", nargs="+", choices=sorted(channel.EFFECTS),
                        help="keep only these parts of each drawn channel: a single-effect ablation arm")
    args = parser.parse_args()
    if args.clean and args.effects:
        parser.error("--clean and --effects exclude each other")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    print(json.dumps(build(args.real, args.tts, args.out, args.real_copies, args.tts_copies, args.jobs,
                                args.clean, tuple(args.effects) if args.effects else None), indent=1))


if __name__ == "__main__":
    main()
