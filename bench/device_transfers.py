"""Bytes copied from the host to the device per decoder step, with and without IO binding, under load.

    .venv/bin/python bench/device_transfers.py --clients 32 --sentences 128 --out device_transfers.json

What IO binding (server/model/device_state.py) is for is the transfer volume on a GPU; the volume itself does not
depend on the device, so this runs on the CPU provider with `io_binding=True` and counts both sides of the
same run: every decoder step's feeds (what the CUDA provider copies in at every step without IO binding)
and what the bound path copied in (whole tensors when a batch is gathered afresh or its cache reallocated,
rows joining, each step's small inputs and new cache slots). `--clients` threads each submit test-split
sentences (both directions, greedy or `--beam`) one after another, so that rows join and leave the running batch as
they do under served traffic. Speed on the CPU is not the point: there IO binding is off by default.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import pathlib
import threading

from gpu_serving import read_requests  # bench/ is the script's folder

from attnserve.api.generation import GenerationRequest
from attnserve.server.engine.registry import load_engine
from attnserve.server.model.repository import find_models
from attnserve.server.model.runtime import RuntimeOptions


def run_clients(engine, requests: list[GenerationRequest], clients: int) -> None:
    pending, lock = iter(requests), threading.Lock()

    def client():
        while True:
            with lock:
                request = next(pending, None)
            if request is None:
                return
            engine.submit(request).result(120)

    threads = [threading.Thread(target=client) for _ in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", type=pathlib.Path, default=pathlib.Path("models"))
    parser.add_argument("--model", default="translate-zh-en")
    parser.add_argument("--split", type=pathlib.Path, default=pathlib.Path("data/corpus/test.tsv"))
    parser.add_argument("--sentences", type=int, default=128, help="sentences per direction")
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--beam", type=int, default=1, help="beam size of every request (1 = greedy)")
    parser.add_argument("--at-least", type=int, default=0, help="new tokens every request must make (longer outputs)")
    parser.add_argument("--out", type=pathlib.Path)
    args = parser.parse_args()
    version = find_models(args.models, only=[args.model])[args.model]
    engine = load_engine(version, RuntimeOptions(io_binding=True))
    steps, fed_bytes, decode_step = [0], [0], engine.runtime.decode_step

    def counting(feeds, residency=None):  # on the worker thread only
        steps[0] += 1
        fed_bytes[0] += sum(x.nbytes for x in feeds.values())
        return decode_step(feeds, residency)

    engine.runtime.decode_step = counting
    try:
        decoding = dict(beam_size=args.beam, min_new_tokens=args.at_least)
        requests = [dataclasses.replace(r, decoding=dataclasses.replace(r.decoding, **decoding))
                    for r in read_requests(args.split, args.model, args.sentences)]
        run_clients(engine, requests, args.clients)
    finally:
        engine.close()
    state = engine.runtime.device_state
    report = {
        "model": f"{args.model} {version.version}", "clients": args.clients, "beam": args.beam,
        "at_least": args.at_least, "steps": steps[0],
        "host_feeds_mb_per_step": round(fed_bytes[0] / steps[0] / 2**20, 3),
        "io_binding_mb_per_step": round(state.uploaded_bytes / steps[0] / 2**20, 3),
        "ratio": round(fed_bytes[0] / state.uploaded_bytes, 2),
        "whole_copies_per_tensor": max(state.uploads.values()),
        "rows_written_from_the_host_per_tensor": max(state.row_uploads.values(), default=0),
        "rows_copied_on_the_device_per_tensor": max(state.device_row_copies.values(), default=0),
    }
    print(json.dumps(report, indent=2))
    if args.out:
        args.out.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
