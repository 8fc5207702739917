"""Decoder step time as the output grows: positions 10, 100 and 200, side by side for one or more repositories.

    .venv/bin/python bench/step_positions.py                                  # the bundled translator
    git show HEAD~5:models/translate-zh-en/2/decoder.onnx > OLD/translate-zh-en/2/decoder.onnx   # (a copy)
    .venv/bin/python bench/step_positions.py --models models OLD --repeats 5

One `Batch` of the same English sentence, batch 1 and 32, is stepped 210 times with a fixed token (no
search, no early end), one intra-op thread, and every step is timed; each repeat runs every repository in
turn. The table gives the median step time over positions 5-14, 95-104 and 195-204 and the ratio of the
last to the first: flat (about 1) when nothing is copied per step, rising with the position when the cache
is (server/decoding/kv_cache.py).
"""

from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import time

import numpy as np

from attnserve.server.decoding.batch import Batch
from attnserve.api.generation import GenerationRequest
from attnserve.server.engine.registry import open_model

SENTENCE = "The file could not be opened because it is in use by another program."
STEPS = 210
WINDOWS = {10: slice(5, 15), 100: slice(95, 105), 200: slice(195, 205)}


def step_times(engine, batch_size: int) -> list[float]:
    prepared = engine.prepare(GenerationRequest(engine.info.name, SENTENCE, "zh-TW"))
    batch = Batch.build(engine.manifest, engine.runtime, engine.preprocessor.collate([prepared.source] * batch_size))
    token = np.full(batch_size, prepared.start_id)
    times = []
    for _ in range(STEPS):
        started = time.perf_counter()
        batch.step(token)
        times.append(time.perf_counter() - started)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", type=pathlib.Path, nargs="+", default=[pathlib.Path("models")])
    parser.add_argument("--model", default="translate-zh-en")
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 32])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=pathlib.Path)
    args = parser.parse_args()
    engines = {str(repo): open_model(repo, args.model) for repo in args.models}
    samples = {(repo, b, p): [] for repo in engines for b in args.batch for p in WINDOWS}
    try:
        for _ in range(args.repeats):
            for b in args.batch:
                for repo, engine in engines.items():
                    times = step_times(engine, b)
                    for position, window in WINDOWS.items():
                        samples[repo, b, position].append(statistics.median(times[window]))
    finally:
        for engine in engines.values():
            engine.close()
    rows = []
    for repo in engines:
        for b in args.batch:
            ms = {p: 1e3 * statistics.median(samples[repo, b, p]) for p in WINDOWS}
            rows.append({"models": repo, "batch": b, **{f"ms_at_{p}": round(v, 3) for p, v in ms.items()},
                         "ratio_200_to_10": round(ms[200] / ms[10], 3)})
    print(json.dumps(rows, indent=2))
    print("\n| models | batch | step at 10 | at 100 | at 200 | 200 / 10 |\n|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['models']} | {r['batch']} | {r['ms_at_10']:.2f} ms | {r['ms_at_100']:.2f} ms | "
              f"{r['ms_at_200']:.2f} ms | {r['ratio_200_to_10']:.2f} |")
    if args.out:
        args.out.write_text(json.dumps(rows, indent=2) + "\n")


if __name__ == "__main__":
    main()
