"""Where the engine's time goes under load: N threads keep requests in flight on one in-process engine
(continuous batching, no gRPC), and the batch operations are timed as they run.

    .venv/bin/python bench/engine_time.py                       # translate-zh-en, 32 clients, 15 s
    .venv/bin/python bench/engine_time.py --clients 8 --seconds 30

Each row is an operation of server/decoding/batch.py (the encoder and decoder calls inside `build` and `step`
are also shown alone): its share of the wall time, how often it ran and its mean time per call. The
operations are wrapped in place for the run, which adds about a microsecond per call. Requests admitted while
a batch runs are encoded on a second thread (`build`) beside the decoder steps, so the shares can add up to
more than 100%.
"""

from __future__ import annotations

import argparse
import collections
import functools
import json
import pathlib
import threading
import time

from attnserve.export.translation.train import read_pairs
from attnserve.server.decoding import batch, kv_cache, slots
from attnserve.server.engine.registry import open_model
from attnserve.api.generation import GREEDY, GenerationRequest
from attnserve.server.model import runtime

TIMED = [(batch.Batch, "build"), (batch.Batch, "step"), (batch.Batch, "select"), (batch.Batch, "merge"),
         (runtime.Runtime, "encode"), (runtime.Runtime, "decode_step"), (kv_cache.AppendCache, "gather"),
         (slots.Slots, "gather"), (slots.Slots, "place"), (slots.Slots, "copy")]


def timed(seconds: collections.Counter, calls: collections.Counter, cls, name: str) -> None:
    """Replaces cls.name with a wrapper adding its time to seconds[label] (classmethods stay classmethods)."""
    raw = cls.__dict__[name]
    is_classmethod = isinstance(raw, classmethod)
    function = raw.__func__ if is_classmethod else raw
    label = f"{cls.__name__}.{name}"

    @functools.wraps(function)
    def wrapper(*args, **kwargs):
        started = time.perf_counter()
        try:
            return function(*args, **kwargs)
        finally:
            seconds[label] += time.perf_counter() - started
            calls[label] += 1

    setattr(cls, name, classmethod(wrapper) if is_classmethod else wrapper)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", type=pathlib.Path, default=pathlib.Path("models"))
    parser.add_argument("--model", default="translate-zh-en")
    parser.add_argument("--split", type=pathlib.Path, default=pathlib.Path("data/corpus/test.tsv"))
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--seconds", type=float, default=15.0)
    parser.add_argument("--out", type=pathlib.Path, help="also write the report here (JSON)")
    args = parser.parse_args()
    pairs = read_pairs(args.split)[:300]
    requests = [GenerationRequest(args.model, zh, "en", GREEDY) for _, zh in pairs] + [
        GenerationRequest(args.model, en, "zh-TW", GREEDY) for en, _ in pairs]
    requests = requests[0::2] + requests[1::2]  # mix the directions and lengths
    seconds, calls = collections.Counter(), collections.Counter()
    for cls, name in TIMED:
        timed(seconds, calls, cls, name)
    engine = open_model(args.models, args.model)
    for request in requests[:8]:
        engine.generate(request, 60)  # warm-up
    seconds.clear()
    calls.clear()
    done, stop_at = [0], time.monotonic() + args.seconds

    def client(offset: int) -> None:
        i = offset
        while time.monotonic() < stop_at:
            engine.generate(requests[i % len(requests)], 600)
            i += args.clients
            done[0] += 1

    started = time.perf_counter()
    threads = [threading.Thread(target=client, args=(k,)) for k in range(args.clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - started
    engine.close()
    rows = {label: {"share_of_wall": round(s / wall, 3), "calls": calls[label],
                    "ms_per_call": round(1e3 * s / calls[label], 2)} for label, s in seconds.most_common()}
    report = {"clients": args.clients, "requests_per_s": round(done[0] / wall, 1), "operations": rows}
    print(json.dumps(report, indent=2))
    if args.out:
        args.out.write_text(json.dumps(report, indent=2) + "\n")
    print("\n| operation | share of wall time | calls | ms per call |\n|---|---|---|---|")
    for label, r in rows.items():
        print(f"| `{label}` | {r['share_of_wall']:.1%} | {r['calls']} | {r['ms_per_call']} |")


if __name__ == "__main__":
    main()
