"""The server under N concurrent clients over gRPC, with and without batching, side by side in one run.

    .venv/bin/python bench/concurrency.py                                # 1, 8, 32, 64 clients, 10 s each
    .venv/bin/python bench/concurrency.py --clients 1 32 --seconds 20 --out results.json

Two `attnserve serve --model translate-zh-en` processes (one intra-op thread each; `--all-models` loads the
whole repository instead) run the bundled translator: `batched` with the server's defaults (continuous
batching) and `unbatched` with `--max-rows 1` (one request decodes at a time); with `--hold-steps N` a third,
`held`, holds a few queued requests back for up to N steps so that they join the running batch together
(`--admission-hold-steps`), and with `--engine-process` another, `process`, is the batched server with its
engine in a child process (`--engine-process`). This process is the clients: at each concurrency level N, N
asyncio clients each send a request (real test-split sentences, both directions, greedy, no attention) over
`GenerateStream`, wait for its end, and send the next, for `--seconds`; with `--unary`, each level runs again
against the batched and unbatched servers with clients that call `Generate` (one message per request instead
of one per token): `batched/unary`, `unbatched/unary`, `process/unary`. The levels alternate between the servers so that a slow spell on a
shared machine hits all. Reported per server and level: requests/s, generated
tokens/s, latency p50/p95/p99 and time to first token p50/p95 (both from the client's send), and the server's
peak RSS (its engine processes' included).

Also reported: `batching_gain` (batched / unbatched tokens/s at each level; with `--unary`, also
`batching_gain_unary`, the same with unary clients on both sides, which leaves out the per-token messages'
cost), and from `--paired-requests`
requests sent one at a time, each in turn through `ModelEngine.generate` in this process, unary `Generate` and
`GenerateStream` to the batched server: `grpc_over_in_process` (unary median latency / in-process median
latency: what the server adds to a lone request) and `grpc_stream_over_in_process` (the same, streamed); under
`process`, the same three for the `process` server.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import pathlib
import socket
import statistics
import subprocess
import sys
import tempfile
import time

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

import sentences  # bench/, beside this script
from import_setup import peak_rss_mb
from attnserve.clients.client import AsyncClient
from attnserve.api.generation import GenerationRequest, GenerationResult
from attnserve.server.engine.registry import open_model

STARTUP_SECONDS = 120


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerProcess:
    """`attnserve serve` in a child process on a free loopback port."""

    def __init__(self, models: pathlib.Path, extra: list[str]):
        self.port = free_port()
        command = [sys.executable, "-m", "attnserve.clients.cli", "serve", "--models", str(models),
                   "--host", "127.0.0.1", "--port", str(self.port), "--threads", "1", *extra]
        # Its log goes to a file: an unread pipe fills up under load and blocks the server.
        self.log = tempfile.NamedTemporaryFile(prefix="attnserve-bench-", suffix=".log", delete=False)
        self.process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=self.log)
        self._wait_serving()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def _wait_serving(self) -> None:
        deadline = time.monotonic() + STARTUP_SECONDS
        with grpc.insecure_channel(self.address) as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            while time.monotonic() < deadline:
                if self.process.poll() is not None:
                    raise SystemExit(f"the server exited: {pathlib.Path(self.log.name).read_text()[-2000:]}")
                try:
                    if stub.Check(health_pb2.HealthCheckRequest(), timeout=2).status == 1:
                        return
                except grpc.RpcError:
                    pass
                time.sleep(0.5)
        raise SystemExit(f"the server on {self.address} did not start in {STARTUP_SECONDS} s")

    def peak_rss_mb(self) -> float:
        """The server's peak resident memory, with its engine processes' (--engine-process) added: the sum of
        the peaks, an upper bound of the peak of the sum."""
        return sum(peak_rss_mb(pid) for pid in [self.process.pid, *_children(self.process.pid)])

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(60)
        self.log.close()
        pathlib.Path(self.log.name).unlink()


def _children(pid: int) -> list[int]:
    return [int(child) for task in pathlib.Path(f"/proc/{pid}/task").iterdir()
            for child in (task / "children").read_text().split()]


async def closed_loop(address: str, requests: list[GenerationRequest], clients: int, seconds: float,
                      unary: bool = False, stream_interval: int = 0) -> dict:
    """`clients` clients, each sending its next request when the last one ended, for `seconds`.

    Streamed (`GenerateStream`, one message per token, or per `stream_interval` tokens after the first)
    unless `unary` (`Generate`: one message per request; its first token arrives with the whole answer)."""
    latencies, first_tokens, tokens = [], [], 0
    stop_at = time.perf_counter() + seconds
    async with AsyncClient(address, timeout=600) as client:

        async def one_client(offset: int) -> None:
            nonlocal tokens
            i = offset
            while time.perf_counter() < stop_at:
                request = requests[i % len(requests)]
                i += clients
                sent, first = time.perf_counter(), None
                if unary:
                    result = await client.generate(request)  # awaited apart: `tokens +=` must not span an await
                    tokens += len(result.tokens)
                    first = time.perf_counter() - sent
                else:
                    async for event in client.stream(request, stream_interval=stream_interval):
                        if first is None:
                            first = time.perf_counter() - sent
                        if isinstance(event, GenerationResult):
                            tokens += len(event.tokens)
                latencies.append(time.perf_counter() - sent)
                first_tokens.append(first)

        started = time.perf_counter()
        await asyncio.gather(*(one_client(k) for k in range(clients)))
        elapsed = time.perf_counter() - started
    quantile = lambda xs, q: statistics.quantiles(xs, n=100)[q - 1] if len(xs) > 1 else xs[0]  # noqa: E731
    return {
        "requests": len(latencies),
        "requests_per_s": len(latencies) / elapsed,
        "tokens_per_s": tokens / elapsed,
        "latency_p50_ms": 1e3 * statistics.median(latencies),
        "latency_p95_ms": 1e3 * quantile(latencies, 95),
        "latency_p99_ms": 1e3 * quantile(latencies, 99),
        "first_token_p50_ms": 1e3 * statistics.median(first_tokens),
        "first_token_p95_ms": 1e3 * quantile(first_tokens, 95),
    }


async def paired_latency_ms(address: str, models: pathlib.Path, model: str, requests: list[GenerationRequest],
                            count: int) -> dict:
    """The same `count` requests one at a time, each sent three ways in turn: `ModelEngine.generate` in this
    process, unary `Generate` and `GenerateStream` (read to its end) over gRPC; each way's median latency.
    Interleaving per request, in a rotating order, keeps a slow spell of the machine from favouring one way."""
    engine = open_model(models, model)
    times = {"in_process": [], "grpc_unary": [], "grpc_stream": []}
    try:
        async with AsyncClient(address, timeout=600) as client:

            async def send(way: str, request: GenerationRequest) -> None:
                if way == "in_process":
                    engine.generate(request, 600)
                elif way == "grpc_unary":
                    await client.generate(request)
                else:
                    async for _ in client.stream(request):
                        pass

            ways = list(times)
            for i, request in enumerate(requests[:count]):
                # The order rotates: the way sent right after the in-process one was measured ~15% slower.
                for way in ways[i % 3 :] + ways[: i % 3]:
                    started = time.perf_counter()
                    await send(way, request)
                    times[way].append(time.perf_counter() - started)
    finally:
        engine.close()
    return {way: 1e3 * statistics.median(xs) for way, xs in times.items()}


def batching_gain(batched: dict, unbatched: dict) -> dict:
    """Batched / unbatched tokens/s at each level."""
    return {c: batched[c]["tokens_per_s"] / unbatched[c]["tokens_per_s"] for c in batched}


def single_request_report(single: dict, levels: dict, server: str) -> dict:
    """One batched server's lone-request latencies and its batching gain at each level (`levels`: every
    run's levels, `server`: the batched server's name there)."""
    report = {
        "single_request_latency_p50_ms": single,
        "batching_gain": batching_gain(levels[server], levels["unbatched"]),
        "grpc_over_in_process": single["grpc_unary"] / single["in_process"],
        "grpc_stream_over_in_process": single["grpc_stream"] / single["in_process"],
    }
    if f"{server}/unary" in levels:
        report["batching_gain_unary"] = batching_gain(levels[f"{server}/unary"], levels["unbatched/unary"])
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sentences.add_arguments(parser, sentences=400)
    parser.add_argument("--clients", type=int, nargs="+", default=[1, 8, 32, 64])
    parser.add_argument("--seconds", type=float, default=10.0, help="per server and level")
    parser.add_argument("--all-models", action="store_true",
                        help="the servers load every model of --models (default: only --model, as a deployment "
                             "of one model would)")
    parser.add_argument("--hold-steps", type=int, default=0,
                        help="also run a third server, `held`, with --admission-hold-steps N")
    parser.add_argument("--engine-process", action="store_true",
                        help="also run `process`: the batched server with --engine-process (the model's engine in "
                             "a child process)")
    parser.add_argument("--unary", action="store_true",
                        help="also run each level with unary clients (`Generate`) against the batched servers: "
                             "`batched/unary` (and `process/unary`)")
    parser.add_argument("--stream-interval", type=int, default=0,
                        help="also run the batched servers with streaming clients that take their tokens this many "
                             "at a time (GenerateRequest.stream_interval); 0 = not")
    parser.add_argument("--paired-requests", type=int, default=200,
                        help="requests sent one at a time in process, unary and streamed (grpc_over_in_process)")
    parser.add_argument("--out", type=pathlib.Path)
    args = parser.parse_args()

    requests = sentences.requests(args)
    requests = requests[0::2] + requests[1::2]  # mix the directions and lengths
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    only = [] if args.all_models else ["--model", args.model]
    servers = {"batched": ServerProcess(args.models, only),
               "unbatched": ServerProcess(args.models, [*only, "--max-rows", "1", "--max-batch-size", "1",
                                                        "--max-beam-size", "1"])}
    if args.hold_steps:
        servers["held"] = ServerProcess(args.models, [*only, "--admission-hold-steps", str(args.hold_steps)])
    if args.engine_process:
        servers["process"] = ServerProcess(args.models, [*only, "--engine-process"])
    # Each run: (level name, server, unary clients?, stream interval).
    runs = [(name, server, False, 0) for name, server in servers.items()]
    batched = [name for name in ("batched", "process") if name in servers]
    if args.unary:
        runs += [(f"{name}/unary", servers[name], True, 0) for name in [*batched, "unbatched"]]
    if args.stream_interval:
        runs += [(f"{name}/interval {args.stream_interval}", servers[name], False, args.stream_interval)
                 for name in batched]
    levels: dict[str, dict[int, dict]] = {name: {} for name, *_ in runs}
    try:
        for server in servers.values():  # warm-up: the first requests load lazily-built state
            asyncio.run(closed_loop(server.address, requests, 4, 2.0))
        single = {name: asyncio.run(paired_latency_ms(servers[name].address, args.models, args.model, requests,
                                                      args.paired_requests))
                  for name in ("batched", "process") if name in servers}
        for clients in args.clients:
            for name, server, unary, interval in runs:
                levels[name][clients] = asyncio.run(
                    closed_loop(server.address, requests, clients, args.seconds, unary, interval))
                print(name, clients, json.dumps({k: round(v, 1) for k, v in levels[name][clients].items()}),
                      flush=True)
        rss = {name: server.peak_rss_mb() for name, server in servers.items()}
    finally:
        for server in servers.values():
            server.stop()
    report = {
        "model": args.model,
        "seconds_per_level": args.seconds,
        "levels": levels,
        "server_peak_rss_mb": rss,
        "servers_load": "every model" if args.all_models else args.model,
        **single_request_report(single["batched"], levels, "batched"),
    }
    if "process" in single:
        report["process"] = single_request_report(single["process"], levels, "process")
    print(json.dumps(report, indent=2))
    print("\n| server | clients | tokens/s | requests/s | p50 / p95 / p99 latency | first token p50 / p95 |")
    print("|---|---|---|---|---|---|")
    for name, by_level in levels.items():
        for clients, r in by_level.items():
            print(f"| {name} | {clients} | {r['tokens_per_s']:.0f} | {r['requests_per_s']:.1f} | "
                  f"{r['latency_p50_ms']:.0f} / {r['latency_p95_ms']:.0f} / {r['latency_p99_ms']:.0f} ms | "
                  f"{r['first_token_p50_ms']:.0f} / {r['first_token_p95_ms']:.0f} ms |")
    if args.out:
        args.out.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
