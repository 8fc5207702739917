"""Continuous batching vs the windowed batcher: a short request submitted while a long beam search runs.

    python bench/continuous.py [--models models/] [--model translate-zh-en] [--beam 16] [--repeats 3]

One long request (beam --beam, min_new_tokens = max_new_tokens, on a long source) is submitted; as soon
as the worker has taken it, one short greedy request follows. For each mode (the windowed batcher,
continuous batching) the report gives the short request's time to first token and total latency from its
submission, and the long one's latency, median over --repeats, with the ratio windowed / continuous.
Nothing here passes or fails; only the ratios mean much on a shared machine.
"""

from __future__ import annotations

import argparse
import statistics
import time

from attnserve.server.engine.batcher import BatchingOptions
from attnserve.api.generation import DecodingOptions, GenerationRequest
from attnserve.server.engine.registry import load_engines
from attnserve.server.model.runtime import RuntimeOptions
from attnserve.server.engine.scheduler import SchedulingOptions

LONG_SOURCE = "Cannot open the file because it is being used by another program. " * 3
SHORT_SOURCE = "Save"
MODES = {
    "windowed": BatchingOptions(continuous=None),
    "continuous": BatchingOptions(continuous=SchedulingOptions()),
}


def one_run(engine, model: str, beam: int, new: int) -> dict[str, float]:
    """Latencies (seconds) of one round: the long request, then the short one once the long one runs."""
    long = GenerationRequest(model, LONG_SOURCE, "zh-TW", DecodingOptions(new, beam, min_new_tokens=new))
    short = GenerationRequest(model, SHORT_SOURCE, "zh-TW", DecodingOptions(8, beam_size=1))
    first_token = []
    start = time.perf_counter()
    long_future = engine.submit(long)
    while not long_future.running():  # taken by the worker: its batch has started
        time.sleep(0.0005)
    sent = time.perf_counter()
    short_future = engine.submit(short, lambda token: first_token.append(time.perf_counter()))
    short_future.result()
    short_done = time.perf_counter()
    long_future.result()
    return {
        "short_ttft_s": first_token[0] - sent,
        "short_latency_s": short_done - sent,
        "long_latency_s": time.perf_counter() - start,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="models")
    parser.add_argument("--model", default="translate-zh-en")
    parser.add_argument("--beam", type=int, default=16)
    parser.add_argument("--max-new-tokens", type=int, default=120)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    rows = {}
    runtime = RuntimeOptions(intra_op_threads=args.threads)
    registries = {mode: load_engines(args.models, runtime, options) for mode, options in MODES.items()}
    try:
        runs = {mode: [] for mode in MODES}
        for _ in range(args.repeats):  # interleaved, so drift in machine load hits both modes alike
            for mode, registry in registries.items():
                runs[mode].append(one_run(registry.get(args.model), args.model, args.beam, args.max_new_tokens))
        for mode, results in runs.items():
            rows[mode] = {k: statistics.median(r[k] for r in results) for k in results[0]}
    finally:
        for registry in registries.values():
            registry.close()
    print(f"{args.model}: beam {args.beam} x {args.max_new_tokens} tokens running; short greedy request, "
          f"median of {args.repeats}")
    print(f"{'':24}" + "".join(f"{m:>12}" for m in MODES) + f"{'ratio':>10}")
    for key in rows["windowed"]:
        w, c = rows["windowed"][key], rows["continuous"][key]
        print(f"{key:24}{w:12.4f}{c:12.4f}{w / c:10.1f}x")


if __name__ == "__main__":
    main()
