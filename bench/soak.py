"""Soak and load: starts `attnserve serve` on a model repository, drives it with N concurrent clients for a
while, and reports requests, errors, crossed answers (a response that differs from the same request alone)
and the server's RSS growth from the first minute's level to the end.

    python bench/soak.py --models models --clients 64 --seconds 60
    python bench/soak.py --models models --clients 16 --seconds 1800     # soak: RSS growth should be < 10%

Never part of the tests (no wall-clock gates); tests/test_reliability_load.py runs a bounded version.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import pathlib
import socket
import subprocess
import sys
import threading
import time

import grpc

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "tests"))
from test_reliability_load import answer, mixed_requests, same_answer  # noqa: E402

from attnserve.v1 import attnserve_pb2_grpc as pb_grpc  # noqa: E402


def rss_mib(pid: int) -> float:
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="models")
    parser.add_argument("--model", default="translate-zh-en")
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--seconds", type=float, default=60)
    parser.add_argument("--warmup-seconds", type=float, default=10, help="RSS baseline taken after this")
    args = parser.parse_args()

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    command = [sys.executable, "-m", "attnserve.clients.cli", "serve", "--models", args.models]
    command += ["--host", "127.0.0.1", "--port", str(port), "--log-level", "warning"]
    server = subprocess.Popen(command)
    try:
        channel = grpc.insecure_channel(f"127.0.0.1:{port}")
        grpc.channel_ready_future(channel).result(timeout=300)
        stub = pb_grpc.AttnServeStub(channel)
        requests = mixed_requests(args.model)
        alone = [stub.Generate(r, timeout=300) for r in requests]
        stop = threading.Event()
        counts = {"requests": 0, "errors": 0, "crossed": 0}
        lock = threading.Lock()

        def client(c: int) -> None:
            k = 0
            while not stop.is_set():
                i, k = (c * 7 + k * 3) % len(requests), k + 1
                try:
                    response = answer(stub, requests[i], stream=(c + k) % 3 == 0)
                    crossed, error = not same_answer(response, alone[i]), 0
                except grpc.RpcError:
                    crossed, error = False, 1
                with lock:
                    counts["requests"] += 1
                    counts["errors"] += error
                    counts["crossed"] += crossed

        start = time.monotonic()
        with concurrent.futures.ThreadPoolExecutor(args.clients) as pool:
            for c in range(args.clients):
                pool.submit(client, c)
            time.sleep(min(args.warmup_seconds, args.seconds))
            baseline = rss_mib(server.pid)
            samples = [baseline]
            while time.monotonic() - start < args.seconds:
                time.sleep(min(5.0, max(0.0, args.seconds - (time.monotonic() - start))))
                samples.append(rss_mib(server.pid))
            stop.set()
        elapsed = time.monotonic() - start
        report = {
            "clients": args.clients,
            "seconds": round(elapsed, 1),
            **counts,
            "requests_per_second": round(counts["requests"] / elapsed, 1),
            "rss_baseline_mib": round(baseline, 1),
            "rss_end_mib": round(samples[-1], 1),
            "rss_max_mib": round(max(samples), 1),
            "rss_growth_percent": round(100 * (samples[-1] - baseline) / baseline, 1),
        }
        print(json.dumps(report, indent=2))
        channel.close()
    finally:
        server.terminate()
        server.wait(60)


if __name__ == "__main__":
    main()
