"""Goodput under overload: the share of answers delivered within their deadlines when requests arrive at
2x and 4x what the model can serve, with deadline-aware admission (the default) and without it
(--no-deadline-admission), side by side in one run.

For each setting a fresh `attnserve serve` is started and measured twice:

  1. saturated throughput X: `--clients` closed-loop clients without deadlines for `--seconds`;
  2. for each factor F in --factors: open-loop arrivals (Poisson) at F x X per second for `--seconds`, each
     with a `--deadline`; goodput = answers within their deadline per second, reported over X.

    python bench/goodput.py --seconds 20 --deadline 2 --factors 2 4
    python bench/goodput.py --model speech-en --audio clip20.wav --clients 12 --seconds 60 --deadline 20

Never part of the tests (no wall-clock gates); tests/test_cost.py checks the estimator.
"""

from __future__ import annotations

import argparse
import collections
import concurrent.futures
import json
import pathlib
import random
import sys
import threading
import time

import grpc

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "tests"))
from served_process import served  # noqa: E402

from attnserve.v1 import attnserve_pb2 as pb  # noqa: E402
from attnserve.v1 import attnserve_pb2_grpc as pb_grpc  # noqa: E402

SENTENCES = [
    "我们明天去公园散步吧。", "这本书的作者是一位著名的科学家。", "请把文件保存到桌面上。",
    "他每天早上六点起床，然后去跑步。", "天气预报说今天下午会下雨。", "这个问题比我们想象的要复杂得多。",
    "Open the file and save it again.", "The meeting was moved to next Thursday afternoon.",
    "Knowledge is power.", "She has lived in this city for more than twenty years.",
]


AUDIO: bytes | None = None  # --audio: every request carries this WAV instead of a sentence


def request(model: str, i: int) -> pb.GenerateRequest:
    if AUDIO is not None:
        return pb.GenerateRequest(model=model, audio=pb.AudioInput(data=AUDIO))
    text = SENTENCES[i % len(SENTENCES)]
    target = "zh-TW" if text.isascii() else "en"
    return pb.GenerateRequest(model=model, text=pb.TextInput(text=text), target_language=target)


def saturated(stub, model: str, clients: int, seconds: float) -> float:
    """Answers per second of `clients` closed-loop clients."""
    stop = time.monotonic() + seconds

    def client(c: int) -> int:
        done = 0
        while time.monotonic() < stop:
            stub.Generate(request(model, c + done))  # no deadline: nothing is refused for one
            done += 1
        return done

    with concurrent.futures.ThreadPoolExecutor(clients) as pool:
        return sum(pool.map(client, range(clients))) / seconds


def overloaded(stub, model: str, rate: float, seconds: float, deadline: float) -> collections.Counter:
    """Outcomes of open-loop arrivals at `rate` per second, each with `deadline`: OK (in time) or the code."""
    rng = random.Random(0)
    calls, outcomes, lock = [], collections.Counter(), threading.Lock()
    start = time.monotonic()
    at, i = 0.0, 0
    while at < seconds:
        time.sleep(max(0.0, start + at - time.monotonic()))
        call = stub.Generate.future(request(model, i), timeout=deadline)

        def done(future, lock=lock):
            code = future.code()
            with lock:
                outcomes[code.name if code is not None else "UNKNOWN"] += 1

        call.add_done_callback(done)
        calls.append(call)
        at += rng.expovariate(rate)
        i += 1
    for call in calls:
        call.exception()  # waits for it
    return outcomes


def measure(args, deadline_admission: bool) -> dict:
    extra = ["--model", args.model, "--log-level", "error"] + ([] if deadline_admission else ["--no-deadline-admission"])
    with served(args.serve.split(), args.models, extra_args=extra) as server, \
            grpc.insecure_channel(server.address) as channel:
        stub = pb_grpc.AttnServeStub(channel)
        saturated(stub, args.model, args.clients, 3)  # warm-up
        capacity = saturated(stub, args.model, args.clients, args.seconds)
        figures = {"saturated_per_s": capacity}
        for factor in args.factors:
            outcomes = overloaded(stub, args.model, factor * capacity, args.seconds, args.deadline)
            goodput = outcomes["OK"] / args.seconds
            figures[f"{factor}x"] = {"outcomes": dict(outcomes), "goodput_per_s": goodput,
                                     "goodput_over_saturated": goodput / capacity}
            time.sleep(args.deadline)  # the last deadlines pass before the next load
        return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="models")
    parser.add_argument("--model", default="translate-zh-en")
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--seconds", type=float, default=20)
    parser.add_argument("--deadline", type=float, default=2.0)
    parser.add_argument("--factors", type=float, nargs="+", default=[2, 4])
    parser.add_argument("--serve", default=f"{sys.executable} -m attnserve.clients.cli")
    parser.add_argument("--audio", type=pathlib.Path, help="send this WAV (with --model speech-en, say)")
    parser.add_argument("--out", help="write the figures as JSON here")
    args = parser.parse_args()
    global AUDIO
    AUDIO = args.audio.read_bytes() if args.audio else None
    figures = {"deadline_s": args.deadline, "seconds": args.seconds,
               "without_deadline_admission": measure(args, False), "with_deadline_admission": measure(args, True)}
    print(json.dumps(figures, indent=2))
    if args.out:
        pathlib.Path(args.out).write_text(json.dumps(figures, indent=2) + "\n")


if __name__ == "__main__":
    main()
