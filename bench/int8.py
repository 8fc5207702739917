"""A translator's int8 variant against its float32 graphs, side by side in one run: speed and agreement.

    .venv/bin/python -m attnserve.export.common.quantize --model-dir COPY/translate-zh-en/2   # on a copy of models/
    .venv/bin/python bench/int8.py --models COPY --sentences 200 --repeats 3

On the same test sentences (both directions, greedy, one intra-op thread), each repeat runs both graphs in
turn, so that a slow spell on a shared machine hits both:
- `batch_1`: the sentences one at a time (seconds);
- `batch_32`: all of them submitted at once (continuous batching, up to 32 rows; seconds).
It prints the medians, float32 / int8 (the speed-up), and how many outputs are identical. Quality on the
whole test split: `attnserve.export.translation.evaluate --served-variant int8`.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import time

from attnserve.export.translation.train import read_pairs
from attnserve.server.engine.batcher import BatchingOptions
from attnserve.server.engine.registry import load_engine
from attnserve.api.generation import GREEDY, GenerationRequest
from attnserve.server.model.repository import find_models
from attnserve.server.model.runtime import RuntimeOptions

WAIT = 600  # seconds; only a bound against hanging


def requests(model: str, split: pathlib.Path, count: int) -> list[GenerationRequest]:
    """Both directions of the first `count` // 2 pairs."""
    pairs = read_pairs(split)[: count // 2]
    return [GenerationRequest(model, zh, "en", GREEDY) for _, zh in pairs] + [
        GenerationRequest(model, en, "zh-TW", GREEDY) for en, _ in pairs]


def run(engine, batch: list[GenerationRequest], together: bool) -> tuple[float, list[str]]:
    started = time.perf_counter()
    if together:
        texts = [f.result(WAIT).text for f in [engine.submit(r) for r in batch]]
    else:
        texts = [engine.generate(r, WAIT).text for r in batch]
    return time.perf_counter() - started, texts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", type=pathlib.Path, required=True, help="a repository whose model has int8")
    parser.add_argument("--model", default="translate-zh-en")
    parser.add_argument("--split", type=pathlib.Path, default=pathlib.Path("data/corpus/test.tsv"))
    parser.add_argument("--sentences", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=pathlib.Path)
    args = parser.parse_args()
    version = find_models(args.models)[args.model]
    batch = requests(args.model, args.split, args.sentences)
    engines = {name: load_engine(version, RuntimeOptions(variant=variant), BatchingOptions(max_batch_size=32))
               for name, variant in (("float32", None), ("int8", "int8"))}
    if engines["int8"].info.variant != "int8":
        raise SystemExit(f"{version.path}: no int8 variant (run attnserve.export.common.quantize on it first)")
    times = {(name, mode): [] for name in engines for mode in ("batch_1", "batch_32")}
    outputs = {}
    try:
        for _ in range(args.repeats):
            for mode, together in (("batch_1", False), ("batch_32", True)):
                for name, engine in engines.items():
                    seconds, outputs[name] = run(engine, batch, together)
                    times[name, mode].append(seconds)
    finally:
        for engine in engines.values():
            engine.close()
    report = {
        "model": f"{version.name}/{version.version}",
        "requests": len(batch),
        "repeats": args.repeats,
        "seconds": {f"{name} {mode}": statistics.median(t) for (name, mode), t in times.items()},
        "speedup": {mode: statistics.median(times["float32", mode]) / statistics.median(times["int8", mode])
                    for mode in ("batch_1", "batch_32")},
        "identical_outputs": sum(a == b for a, b in zip(outputs["float32"], outputs["int8"])),
    }
    print(json.dumps(report, indent=2))
    if args.out:
        args.out.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
