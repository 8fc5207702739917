"""Head-of-line blocking within one model: how long a short greedy request takes beside expensive ones
(--heavy beam searches of a long source), over how long it takes alone.

    python bench/head_of_line.py --heavy 4 --beam 16

Starts `attnserve serve` with the translator; reports the short request's latency alone and beside the
heavy ones (median of --probes), and their ratio, against the target max(1 s, 4 x idle).
Never part of the tests (no wall-clock gates).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import pathlib
import statistics
import sys
import threading
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "tests"))
from served_process import served  # noqa: E402

import grpc  # noqa: E402

from attnserve.v1 import attnserve_pb2 as pb  # noqa: E402
from attnserve.v1 import attnserve_pb2_grpc as pb_grpc  # noqa: E402

MODEL = "translate-zh-en"
SHORT = pb.GenerateRequest(model=MODEL, text=pb.TextInput(text="请把文件保存到桌面上。"), target_language="en",
                           decoding=pb.DecodingOptions(beam_size=1))
LONG_TEXT = "这个问题比我们想象的要复杂得多，因为每一个决定都会影响到很多其他的人和事情。" * 3


def latency(stub) -> float:
    start = time.perf_counter()
    stub.Generate(SHORT, timeout=300)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="models")
    parser.add_argument("--heavy", type=int, default=4)
    parser.add_argument("--beam", type=int, default=16)
    parser.add_argument("--probes", type=int, default=10)
    parser.add_argument("--serve", default=f"{sys.executable} -m attnserve.clients.cli")
    parser.add_argument("--serve-args", default="", help="more `attnserve serve` flags, e.g. --fair-share-row-steps 64")
    parser.add_argument("--out")
    args = parser.parse_args()
    heavy = pb.GenerateRequest(model=MODEL, text=pb.TextInput(text=LONG_TEXT), target_language="en",
                               decoding=pb.DecodingOptions(beam_size=args.beam, max_new_tokens=256))
    with served(args.serve.split(), args.models, extra_args=["--model", MODEL, "--log-level", "error", *args.serve_args.split()]) as server, \
            grpc.insecure_channel(server.address) as channel:
        stub = pb_grpc.AttnServeStub(channel)
        idle = statistics.median(latency(stub) for _ in range(args.probes))
        stop = threading.Event()

        def keep_busy() -> None:
            while not stop.is_set():
                stub.Generate(heavy, timeout=600)

        with concurrent.futures.ThreadPoolExecutor(args.heavy) as pool:
            busy = [pool.submit(keep_busy) for _ in range(args.heavy)]
            time.sleep(3)  # the heavy ones are decoding
            beside = [latency(stub) for _ in range(args.probes)]
            stop.set()
            for b in busy:
                b.result()
    figures = {"idle_s": idle, "beside_median_s": statistics.median(beside), "beside_max_s": max(beside),
               "ratio_median": statistics.median(beside) / idle, "target_s": max(1.0, 4 * idle)}
    print(json.dumps(figures, indent=2))
    if args.out:
        pathlib.Path(args.out).write_text(json.dumps(figures, indent=2) + "\n")


if __name__ == "__main__":
    main()
