"""Flood isolation: a flood of cheap-to-send, costly-to-decode images to one model, and what it does to
another model and to the server after the flood's clients gave up.

Starts `attnserve serve` with the captioner and the translator, measures the translator's latency idle,
then sends `--images` solid-colour PNGs of `--side` x `--side` pixels (a few hundred kB each, tens of
megapixels decoded, under the captioner's max_pixels) with a `--deadline` while one client keeps
translating, and reports:

  * the translator's latency during the flood over its idle latency (p50 and max),
  * the flood's outcomes by status code,
  * the server's CPU seconds from the moment every flood client had its answer (or gave up) to when the
    process went quiet: decoding nobody waits for any more.

    python bench/flood.py --images 200 --side 6300 --deadline 2

Never part of the tests (no wall-clock gates); tests/test_intake.py checks the mechanism.
"""

from __future__ import annotations

import argparse
import collections
import concurrent.futures
import io
import json
import os
import pathlib
import statistics
import sys
import threading
import time

import grpc

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "tests"))
from served_process import served  # noqa: E402

from attnserve.v1 import attnserve_pb2 as pb  # noqa: E402
from attnserve.v1 import attnserve_pb2_grpc as pb_grpc  # noqa: E402

TRANSLATE = pb.GenerateRequest(model="translate-zh-en", text=pb.TextInput(text="我们明天去公园散步吧。"))


def solid_png(side: int) -> bytes:
    from PIL import Image

    out = io.BytesIO()
    Image.new("RGB", (side, side), (40, 120, 200)).save(out, "PNG", optimize=True)
    return out.getvalue()


def cpu_seconds(pid: int) -> float:
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


def latencies(stub, count: int, stop: threading.Event | None = None) -> list[float]:
    out = []
    while len(out) < count and not (stop and stop.is_set()):
        start = time.perf_counter()
        try:
            stub.Generate(TRANSLATE, timeout=120)
        except grpc.RpcError:  # counted at its time taken: the timeout
            pass
        out.append(time.perf_counter() - start)
    return out


def flood(stub, png: bytes, images: int, deadline: float) -> collections.Counter:
    request = pb.GenerateRequest(model="caption-emoji", image=pb.ImageInput(data=png))

    def one(_):
        try:
            stub.Generate(request, timeout=deadline)
            return "OK"
        except grpc.RpcError as error:
            return error.code().name

    with concurrent.futures.ThreadPoolExecutor(64) as pool:
        return collections.Counter(pool.map(one, range(images)))


def quiet_after(pid: int, since_cpu: float, idle_cpu_per_s: float = 0.05, limit: float = 300) -> tuple[float, float]:
    """(seconds until the process uses under idle_cpu_per_s CPU per second, CPU seconds used meanwhile)."""
    start, last = time.perf_counter(), cpu_seconds(pid)
    while time.perf_counter() - start < limit:
        time.sleep(1)
        now = cpu_seconds(pid)
        if now - last < idle_cpu_per_s:
            return time.perf_counter() - start, now - since_cpu
        last = now
    return limit, cpu_seconds(pid) - since_cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="models")
    parser.add_argument("--images", type=int, default=200)
    parser.add_argument("--side", type=int, default=6300)
    parser.add_argument("--deadline", type=float, default=2.0)
    parser.add_argument("--serve", default=f"{sys.executable} -m attnserve.clients.cli")
    parser.add_argument("--out", help="write the figures as JSON here")
    args = parser.parse_args()
    png = solid_png(args.side)
    extra = ["--model", "caption-emoji", "--model", "translate-zh-en", "--log-level", "error"]
    with served(args.serve.split(), args.models, extra_args=extra) as server, \
            grpc.insecure_channel(server.address, options=[("grpc.max_send_message_length", 64 << 20)]) as channel:
        stub = pb_grpc.AttnServeStub(channel)
        idle = latencies(stub, 20)
        stop = threading.Event()
        with concurrent.futures.ThreadPoolExecutor(1) as side:
            during = side.submit(latencies, stub, 10_000, stop)
            outcomes = flood(stub, png, args.images, args.deadline)
            flood_ended = cpu_seconds(server.process.pid)
            stop.set()
            busy = during.result()
        quiet_seconds, cpu_after = quiet_after(server.process.pid, flood_ended)
    figures = {
        "png_bytes": len(png), "decoded_mpx": args.side**2 / 1e6, "images": args.images, "deadline_s": args.deadline,
        "outcomes": dict(outcomes),
        "translate_idle_p50_s": statistics.median(idle), "translate_flood_p50_s": statistics.median(busy),
        "translate_flood_max_s": max(busy), "translate_p50_ratio": statistics.median(busy) / statistics.median(idle),
        "translate_max_over_idle_p50": max(busy) / statistics.median(idle),
        "server_busy_after_flood_s": quiet_seconds, "server_cpu_after_flood_s": cpu_after,
    }
    print(json.dumps(figures, indent=2))
    if args.out:
        pathlib.Path(args.out).write_text(json.dumps(figures, indent=2) + "\n")


if __name__ == "__main__":
    main()
