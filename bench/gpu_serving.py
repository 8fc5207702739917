"""The served translator on the CUDA provider against the CPU provider, with and without IO binding: the
same tokens, and tokens/s at batch 1, 32 and 128.

    python bench/gpu_serving.py --models models --devices cpu cuda-host cuda --out gpu_serving.json  # GPU machine
    .venv/bin/python bench/gpu_serving.py --devices cpu cpu-bound --sentences 16 --batches 1 8      # rehearsal here

Every device serves the same model version through `load_engine`, as `attnserve serve --device` does (one
intra-op thread on the CPU). A device is `cpu` or `cuda`, with IO binding as `--io-binding auto` has it (on
for cuda: encoder K/V and K/V cache stay on the GPU between steps, server/model/device_state.py), or suffixed
`-bound` (on) or `-host` (off: every input copied in at every step). Parity: `--sentences` test-split
sentences in each direction, greedy, each device's output text compared with the first device's. A device
that fails is reported with its error, and the others still run.
Throughput: the same sentences sent in groups of `batch` requests submitted together (continuous batching
encodes and decodes each group as one batch), generated tokens over wall time, after one warm-up group.
Run on the device machine by bench/gpu_serving.sh.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import time
import traceback

from attnserve.server.engine.batcher import BatchingOptions
from attnserve.api.generation import DecodingOptions, GenerationRequest
from attnserve.server.engine.registry import load_engine
from attnserve.server.model.repository import find_models
from attnserve.server.model.runtime import RuntimeOptions
from attnserve.server.engine.scheduler import SchedulingOptions


def read_requests(split: pathlib.Path, model: str, count: int) -> list[GenerationRequest]:
    """`count` sentences each way, alternating directions."""
    pairs = [line.split("\t") for line in split.read_text(encoding="utf-8").splitlines()[:count]]
    requests = []
    for en, zh in pairs:
        requests += [GenerationRequest(model, zh, "en", DecodingOptions(128, beam_size=1)),
                     GenerationRequest(model, en, "zh-TW", DecodingOptions(128, beam_size=1))]
    return requests


def runtime_options(device: str) -> RuntimeOptions:
    """`cpu`, `cuda`, either suffixed `-bound` (IO binding on) or `-host` (off)."""
    name, _, binding = device.partition("-")
    if binding not in ("", "bound", "host"):
        raise SystemExit(f"unknown device {device!r}: use cpu or cuda, optionally suffixed -bound or -host")
    return RuntimeOptions(device=name, io_binding={"": None, "bound": True, "host": False}[binding])


def run_all(engine, requests: list[GenerationRequest], batch: int) -> tuple[list[str], int, float]:
    """Texts, generated tokens and seconds for `requests` sent `batch` at a time."""
    texts, tokens, started = [], 0, time.perf_counter()
    for begin in range(0, len(requests), batch):
        futures = [engine.submit(r) for r in requests[begin : begin + batch]]
        results = [f.result() for f in futures]
        texts += [r.text for r in results]
        tokens += sum(len(r.tokens) for r in results)
    return texts, tokens, time.perf_counter() - started


def measure(version, device: str, batching: BatchingOptions, requests: list[GenerationRequest], batches: list[int],
            outputs: dict[int, list[str]], index: int) -> dict:
    """One device's entry: its providers, tokens/s per batch and how many outputs equal the first device's
    (whose texts `outputs` keeps, by device index)."""
    engine = load_engine(version, runtime_options(device), batching)
    try:
        run_all(engine, requests[: max(batches)], max(batches))  # warm-up: sessions, allocator, lazy state
        entry = {"providers": engine.runtime.providers, "io_binding": engine.runtime.device_state is not None,
                 "tokens_per_s": {}}
        for batch in batches:
            texts, tokens, seconds = run_all(engine, requests, batch)
            entry["tokens_per_s"][batch] = round(tokens / seconds, 1)
            outputs.setdefault(index, texts)
            print(f"{device} batch {batch}: {tokens / seconds:.0f} tokens/s", flush=True)
        if 0 in outputs:
            entry["identical_to_first"] = f"{sum(a == b for a, b in zip(outputs[0], outputs[index]))} / {len(requests)}"
        return entry
    finally:
        engine.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", type=pathlib.Path, default=pathlib.Path("models"))
    parser.add_argument("--model", default="translate-zh-en")
    parser.add_argument("--split", type=pathlib.Path, default=pathlib.Path("data/corpus/test.tsv"))
    parser.add_argument("--sentences", type=int, default=256, help="sentences per direction")
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 32, 128])
    parser.add_argument("--devices", nargs="+", default=["cpu", "cuda-host", "cuda"],
                        help="the first is the reference of the parity check")
    parser.add_argument("--out", type=pathlib.Path)
    args = parser.parse_args()
    version = find_models(args.models, only=[args.model])[args.model]
    requests = read_requests(args.split, args.model, args.sentences)
    widest = max(args.batches)
    batching = BatchingOptions(max_batch_size=widest, max_queue_size=max(256, widest),
                               continuous=SchedulingOptions(max_rows=widest))
    report = {"model": f"{args.model} {version.version}", "requests": len(requests), "devices": {}}
    outputs = {}
    for index, device in enumerate(args.devices):
        try:
            report["devices"][f"{index}:{device}"] = measure(version, device, batching, requests, args.batches,
                                                            outputs, index)
        except Exception as exc:  # noqa: BLE001  (one device failing must not cost the others' figures)
            traceback.print_exc()
            report["devices"][f"{index}:{device}"] = {"error": f"{type(exc).__name__}: {exc}"}
    print(json.dumps(report, indent=2))
    if args.out:
        args.out.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
