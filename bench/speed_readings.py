"""What speed readings cost: the same clips through the served recognizer read once and read at its
manifest's speeds, alternating in one run, as audio seconds transcribed per second (and WER beside).

    python bench/speed_readings.py --corpus /work/data/speech-sky2 --split dev --clips 120 \\
        --out bench/results/speed_readings.json

Both engines are the newest speech-en of --models, one with `decoding.speeds` set to [1.0] (a temporary
copy of its manifest, graphs linked). Each round submits every clip (shortest first, at most 40 in
flight) to one engine and then the other; rounds alternate which goes first, so a machine that gets
busier or quieter during the run moves both. The ratio is the readings' throughput over read-once's.
"""

from __future__ import annotations

import argparse
import functools
import pathlib
import time
from collections.abc import Callable

from attnserve.api.generation import AudioInput, DecodingOptions, GenerationRequest
from attnserve.export.common.serving import open_engine
from attnserve.export.speech import manifest
from attnserve.export.speech.evaluate import decoding_variant
from attnserve.export.speech.scoring import error_rate
from attnserve.server.model.manifest import load_manifest
from attnserve.server.model.repository import find_models
from attnserve.export.common.reports import emit

NAME = "speech-en"


def transcribe(engine, wavs: list[bytes], options: list[DecodingOptions] | None = None) -> tuple[list[str], float]:
    """Texts in clip order and the seconds they took, at most 40 requests in flight; `options`: each clip's
    search (bench/hotwords.py gives its hotwords), else the model's default."""
    options = options or [DecodingOptions()] * len(wavs)
    started, texts = time.perf_counter(), []
    for begin in range(0, len(wavs), 40):
        futures = [engine.submit(GenerationRequest(NAME, audio=AudioInput(wav=w), decoding=o))
                   for w, o in zip(wavs[begin : begin + 40], options[begin : begin + 40])]
        texts += [f.result().text for f in futures]
    return texts, time.perf_counter() - started


def alternate(arms: dict[str, Callable[[], tuple[list[str], float]]], rounds: int
              ) -> tuple[dict[str, list[str]], dict[str, list[float]]]:
    """Runs every arm once per round, rounds alternating which goes first (a machine that gets busier or
    quieter during the run moves all of them); (each arm's texts, each arm's seconds per round)."""
    texts, seconds = {}, {name: [] for name in arms}
    for round_ in range(rounds):
        for name in (list(arms) if round_ % 2 == 0 else list(arms)[::-1]):
            texts[name], took = arms[name]()
            seconds[name].append(round(took, 2))
    return texts, seconds


def clip_arguments(description: str) -> argparse.ArgumentParser:
    """The options the speech benches share: the models, the corpus split, how many clips, rounds, --out."""
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", type=pathlib.Path, default=pathlib.Path("models"))
    parser.add_argument("--corpus", type=pathlib.Path, required=True, help="a speech corpus folder (manifests)")
    parser.add_argument("--split", default="dev")
    parser.add_argument("--clips", type=int, default=120, help="the first N clips of the split")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--out", type=pathlib.Path)
    return parser


def first_clips(args: argparse.Namespace, every: list[dict]) -> tuple[list[dict], list[bytes]]:
    """The split's first --clips rows, shortest first, and their WAV bytes."""
    rows = sorted(every[: args.clips], key=lambda r: r["duration"])
    return rows, [(args.corpus / r["path"]).read_bytes() for r in rows]


def race(model_dirs: dict[str, pathlib.Path], wavs: list[bytes], rounds: int
         ) -> tuple[dict[str, list[str]], dict[str, list[float]]]:
    """Each version folder's engine transcribes the clips once per round, alternating (see `alternate`);
    the engines are closed after."""
    engines = {name: open_engine(folder) for name, folder in model_dirs.items()}
    try:
        return alternate({n: functools.partial(transcribe, e, wavs) for n, e in engines.items()}, rounds)
    finally:
        for engine in engines.values():
            engine.close()


def main() -> None:
    args = clip_arguments(__doc__).parse_args()
    rows, wavs = first_clips(args, manifest.read(args.corpus / f"{args.split}.jsonl"))
    references = [r["text"] for r in rows]
    audio_seconds = sum(r["duration"] for r in rows)
    newest = find_models(args.models, only=[NAME])[NAME].path
    speeds = list(load_manifest(newest / "manifest.json").decoding.speeds)
    with decoding_variant(newest, None, True, speeds=[1.0]) as once_dir:
        texts, seconds = race({"read once": once_dir, "speed readings": newest}, wavs, args.rounds)
    report = {
        "model": str(newest), "speeds": speeds, "split": args.split, "clips": len(rows),
        "audio_seconds": round(audio_seconds, 1), "rounds": args.rounds,
        "audio_seconds_per_second": {n: round(audio_seconds / min(s), 2) for n, s in seconds.items()},
        "wer": {n: round(error_rate(t, references, "word"), 4) for n, t in texts.items()},
    }
    rates = report["audio_seconds_per_second"]
    report["throughput_ratio"] = round(rates["speed readings"] / rates["read once"], 3)
    emit(report, args.out)


if __name__ == "__main__":
    main()
