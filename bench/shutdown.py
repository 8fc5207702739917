"""Shutdown under load with --engine-process: seconds from SIGTERM until the calls in progress are cut off
and until the process exits, against --grace-seconds + app.CLOSE_SECONDS (what the manifests' grace period
allows after the preStop pause); and with a second signal one second after the first.

    python bench/shutdown.py --grace 10 --clients 8

Never part of the tests (no wall-clock gates); tests/test_lifecycle.py and test_engine_process.py check the
mechanism.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import pathlib
import signal
import sys
import time

import grpc

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "tests"))
from served_process import served  # noqa: E402

from attnserve.server.edge.app import CLOSE_SECONDS  # noqa: E402
from attnserve.v1 import attnserve_pb2 as pb  # noqa: E402
from attnserve.v1 import attnserve_pb2_grpc as pb_grpc  # noqa: E402

MODEL = "translate-zh-en"
LONG = pb.GenerateRequest(model=MODEL, text=pb.TextInput(text="这个问题比我们想象的要复杂得多。" * 6),
                          target_language="en", decoding=pb.DecodingOptions(beam_size=16, max_new_tokens=256))


def run(args, second_signal: bool) -> dict:
    extra = ["--model", MODEL, "--engine-process", "--grace-seconds", str(args.grace), "--log-level", "error"]
    with served(args.serve.split(), args.models, extra_args=extra) as server, \
            grpc.insecure_channel(server.address) as channel, \
            concurrent.futures.ThreadPoolExecutor(args.clients) as pool:
        stub = pb_grpc.AttnServeStub(channel)
        calls = [pool.submit(lambda: list(stub.GenerateStream(LONG, timeout=600))) for _ in range(args.clients)]
        time.sleep(2)  # decoding
        sent = time.perf_counter()
        server.process.send_signal(signal.SIGTERM)
        if second_signal:
            time.sleep(1)
            server.process.send_signal(signal.SIGTERM)
        ended = []
        for call in calls:
            try:
                call.result()
            except grpc.RpcError:
                pass
            ended.append(time.perf_counter() - sent)
        code = server.process.wait(600)
        exited = time.perf_counter() - sent
    return {"calls_ended_s": max(ended), "exited_s": exited, "exit_code": code,
            "allowed_s": args.grace + CLOSE_SECONDS}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="models")
    parser.add_argument("--grace", type=float, default=10)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--serve", default=f"{sys.executable} -m attnserve.clients.cli")
    parser.add_argument("--out")
    args = parser.parse_args()
    figures = {"one_signal": run(args, False), "two_signals": run(args, True)}
    print(json.dumps(figures, indent=2))
    if args.out:
        pathlib.Path(args.out).write_text(json.dumps(figures, indent=2) + "\n")


if __name__ == "__main__":
    main()
