"""Dynamic batching: what grouping concurrent requests buys, measured side by side in one run.

    python bench/batching.py [--models models/] [--model NAME] [--requests 32] [--repeats 3] [--threads 1]
    python bench/batching.py --random-model      # no trained model yet: a random one of the shipped shape

The same N requests (mixed lengths, English -> Traditional Chinese and back) run three ways on one engine:
  sequential   one at a time through `ModelEngine.generate`, each waiting for the previous one
  batched      all submitted at once through `ModelEngine.submit`, so the batcher groups them
  grpc         all at once over gRPC (`BackgroundServer` + `AsyncClient`, in this process)
and the report gives requests/s, generated tokens/s and p50/p95 latency for each, plus the ratios
batched / sequential (what batching buys) and grpc / batched (what the wire costs). Only the ratios mean
much on a shared machine; nothing here passes or fails.

--random-model exports a random-weight Transformer with the production shape (3+3 layers, d=256, 16000
classes) and a tokenizer trained on this file's sentences into a temporary folder; it needs the `export`
extra (torch). Every request is capped at 2 x its source tokens + 4 new tokens (or --max-new-tokens) so
that a random model, which rarely emits end-of-sequence, still produces outputs of a realistic length.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import pathlib
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from concurrent.futures import Future

import numpy as np

from attnserve.clients.client import AsyncClient
from attnserve.server.edge.app import BackgroundServer
from attnserve.server.engine.batcher import BatchingOptions
from attnserve.server.engine.engine import ModelEngine
from attnserve.server.engine.registry import load_engines
from attnserve.api.generation import (
    AttentionGranularity,
    AttentionOptions,
    DecodingOptions,
    GenerationRequest,
    GenerationResult,
)
from attnserve.server.model.runtime import RuntimeOptions

# (source text, target language): short UI strings to long sentences, in both directions.
SENTENCES = [
    ("Save", "zh-TW"),
    ("儲存檔案", "en"),
    ("Open the File menu, then choose Save.", "zh-TW"),
    ("開啟檔案選單，然後選擇儲存。", "en"),
    ("Knowledge is power.", "zh-TW"),
    ("知識就是力量。", "en"),
    ("The weather is nice today, let's take a walk in the park!", "zh-TW"),
    ("今天天氣很好，我們去公園散步吧！", "en"),
    ("Cannot open the file because it is being used by another program.", "zh-TW"),
    ("無法開啟檔案，因為另一個程式正在使用它。", "en"),
    ("Delete the selected items?", "zh-TW"),
    ("要刪除選取的項目嗎？", "en"),
    ("My younger sister goes to the library every Saturday to read books.", "zh-TW"),
    ("我妹妹每個星期六都去圖書館看書。", "en"),
    ("Show hidden files", "zh-TW"),
    ("顯示隱藏檔案", "en"),
    ("The package manager downloads the newest version of every package and installs it.", "zh-TW"),
    ("套件管理程式會下載每個套件的最新版本並安裝它。", "en"),
    ("Where is the train station?", "zh-TW"),
    ("火車站在哪裡？", "en"),
    ("Press Ctrl+Z to undo the last change.", "zh-TW"),
    ("按 Ctrl+Z 復原上一次的變更。", "en"),
    ("If the problem persists, restart the computer and try again later.", "zh-TW"),
    ("如果問題仍然存在，請重新啟動電腦，稍後再試一次。", "en"),
]

RANDOM_MODEL_NAME = "random-translate"
RANDOM_VOCAB_SIZE = 16000  # the shipped model's vocabulary


@dataclasses.dataclass
class Run:
    """What one way of sending the requests measured."""

    seconds: float  # first submit -> last answer
    latencies: list[float]  # per request: its submit -> its answer
    results: list[GenerationResult]

    def summary(self) -> dict:
        tokens = sum(len(r.tokens) for r in self.results)
        return {
            "seconds": round(self.seconds, 3),
            "requests_per_s": round(len(self.results) / self.seconds, 2),
            "generated_tokens": tokens,
            "tokens_per_s": round(tokens / self.seconds, 1),
            "latency_p50_ms": round(float(np.percentile(self.latencies, 50)) * 1e3, 1),
            "latency_p95_ms": round(float(np.percentile(self.latencies, 95)) * 1e3, 1),
            "mean_batch_size": round(float(np.mean([r.timings.batch_size for r in self.results])), 2),
        }


def build_requests(
    engine: ModelEngine, count: int, max_new_tokens: int, attention: bool
) -> list[GenerationRequest]:
    """`count` requests cycling through SENTENCES; see the module docstring for the token cap."""
    limit = engine.manifest.limits.max_new_tokens
    options = AttentionOptions(enabled=attention, granularity=AttentionGranularity.WORDS)
    requests = []
    for i in range(count):
        text, target = SENTENCES[i % len(SENTENCES)]
        cap = max_new_tokens or min(limit, 2 * len(engine.tokenizer.encode(text)) + 4)
        requests.append(
            GenerationRequest(
                model=engine.manifest.name,
                text=text,
                target_language=target,
                decoding=DecodingOptions(max_new_tokens=cap, beam_size=1),
                attention=options,
                request_id=f"bench-{i}",
            )
        )
    return requests


def run_sequential(engine: ModelEngine, requests: Sequence[GenerationRequest]) -> Run:
    """(a) One request at a time: each waits for the previous answer."""
    latencies, results = [], []
    started = time.perf_counter()
    for request in requests:
        sent = time.perf_counter()
        results.append(engine.generate(request))
        latencies.append(time.perf_counter() - sent)
    return Run(time.perf_counter() - started, latencies, results)


def run_batched(engine: ModelEngine, requests: Sequence[GenerationRequest]) -> Run:
    """(b) Every request submitted at once; the batcher groups them."""
    answered: dict[int, float] = {}
    stamped = threading.Semaphore(0)

    def stamp(index: int):
        # Runs on the worker thread the moment the request is answered, so later ones do not inflate it.
        def done(_future: Future) -> None:
            answered[index] = time.perf_counter()
            stamped.release()

        return done

    started = time.perf_counter()
    futures: list[Future[GenerationResult]] = []
    sent = []
    for i, request in enumerate(requests):
        sent.append(time.perf_counter())
        futures.append(engine.submit(request))
        futures[-1].add_done_callback(stamp(i))
    results = [future.result() for future in futures]
    for _ in futures:  # a future's callbacks run just after its result() waiters wake
        stamped.acquire()
    seconds = max(answered.values()) - started
    return Run(seconds, [answered[i] - sent[i] for i in range(len(requests))], results)


async def _send_all(address: str, requests: Sequence[GenerationRequest]) -> Run:
    async with AsyncClient(address) as client:
        await client.list_models()  # connect before the clock starts

        async def one(request: GenerationRequest) -> tuple[float, GenerationResult]:
            sent = time.perf_counter()
            result = await client.generate(request)
            return time.perf_counter() - sent, result

        started = time.perf_counter()
        answers = await asyncio.gather(*(one(r) for r in requests))
        seconds = time.perf_counter() - started
    return Run(seconds, [latency for latency, _ in answers], [result for _, result in answers])


def run_grpc(server: BackgroundServer, requests: Sequence[GenerationRequest]) -> Run:
    """(c) Every request at once over gRPC, from an asyncio client in this process."""
    return asyncio.run(_send_all(server.address, requests))


def mismatches(reference: Run, other: Run) -> int:
    """Requests whose generated token ids differ from the reference run's (batched should equal unbatched)."""
    return sum(
        [t.id for t in a.tokens] != [t.id for t in b.tokens] for a, b in zip(reference.results, other.results)
    )


def export_random_model(repository: pathlib.Path) -> None:
    """Writes a random-weight model of the shipped shape into `repository` (needs torch)."""
    import torch
    from tokenizers import AddedToken

    from attnserve.export.translation.bpe import train_tokenizer
    from attnserve.export.translation.model import Transformer, TransformerConfig
    from attnserve.export.translation.onnx_export import export_model

    tokenizer = train_tokenizer([text for text, _ in SENTENCES] * 3, vocab_size=RANDOM_VOCAB_SIZE, min_frequency=1)
    # A few dozen sentences give a few hundred pieces; filler tokens bring the vocabulary to the model's
    # 16000 classes, so the output layer costs what the shipped model's does. No text contains them.
    filler = range(tokenizer.get_vocab_size(), RANDOM_VOCAB_SIZE)
    tokenizer.add_tokens([AddedToken(f"<unused{i}>", normalized=False) for i in filler])
    torch.manual_seed(0)
    model = Transformer(TransformerConfig(vocab_size=RANDOM_VOCAB_SIZE, dropout=0.0)).eval()
    export_model(
        model, tokenizer, repository / RANDOM_MODEL_NAME / "1", RANDOM_MODEL_NAME, 1, description="random weights"
    )


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", type=pathlib.Path, default=pathlib.Path("models"), help="model repository")
    parser.add_argument("--model", help="model to run (default: the repository's first)")
    parser.add_argument("--random-model", action="store_true", help="export a random model instead of --models")
    parser.add_argument("--requests", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3, help="runs of each way, interleaved; medians reported")
    parser.add_argument("--threads", type=int, default=1, help="ONNX Runtime intra-op threads")
    parser.add_argument("--max-batch-size", type=int, default=16)
    parser.add_argument("--max-new-tokens", type=int, default=0, help="per request; 0 = 2 x source tokens + 4")
    parser.add_argument("--no-attention", action="store_true", help="do not ask for word-level attention")
    return parser.parse_args()


def median_run(runs: Sequence[Run]) -> Run:
    return sorted(runs, key=lambda run: run.seconds)[len(runs) // 2]


def report(args: argparse.Namespace, engine: ModelEngine, runs: dict[str, list[Run]]) -> dict:
    """Each way's median repeat, and the median over repeats of each ratio (runs of one repeat are adjacent)."""
    sequential, batched, wire = runs["sequential"], runs["batched"], runs["grpc"]

    def median_ratio(numerators: Sequence[float], denominators: Sequence[float]) -> float:
        return round(float(np.median([a / b for a, b in zip(numerators, denominators)])), 2)

    # Same requests in every run, so a ratio of wall times is the ratio of requests/s and of tokens/s.
    seconds = {way: [run.seconds for run in ways] for way, ways in runs.items()}
    p50 = {way: [float(np.median(run.latencies)) for run in ways] for way, ways in runs.items()}
    return {
        "model": engine.manifest.name,
        "random_weights": args.random_model,
        "requests": args.requests,
        "repeats": args.repeats,
        "threads": args.threads,
        "max_batch_size": args.max_batch_size,
        "batching": "continuous" if BatchingOptions().continuous else f"window {BatchingOptions().window_ms} ms",
        "attention": "none" if args.no_attention else "words",
        "source_tokens": sum(len(r.source_tokens) for r in sequential[0].results),
        **{way: median_run(ways).summary() for way, ways in runs.items()},
        "ratios": {
            "batched_over_sequential_throughput": median_ratio(seconds["sequential"], seconds["batched"]),
            "grpc_over_batched_throughput": median_ratio(seconds["batched"], seconds["grpc"]),
            "grpc_over_batched_p50_latency": median_ratio(p50["grpc"], p50["batched"]),
        },
        "outputs_differing_from_sequential": {
            "batched": max(mismatches(sequential[0], run) for run in batched),
            "grpc": max(mismatches(sequential[0], run) for run in wire),
        },
    }


def main() -> None:
    args = parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        # The model: the repository's, or a random one exported for this run.
        repository = args.models
        if args.random_model:
            repository = pathlib.Path(tmp)
            export_random_model(repository)
        runtime = RuntimeOptions(intra_op_threads=args.threads)
        try:
            registry = load_engines(repository, runtime, BatchingOptions(max_batch_size=args.max_batch_size))
        except ValueError as exc:
            sys.exit(f"error: {exc}\n(no trained model yet? add --random-model)")
        try:
            engine = registry.get(args.model or registry.names()[0])
            requests = build_requests(engine, args.requests, args.max_new_tokens, not args.no_attention)
            with BackgroundServer({name: registry.get(name) for name in registry.names()}) as server:
                # Warm-up: first calls at new shapes allocate; keep that out of every measured run.
                engine.generate(requests[0])
                run_batched(engine, requests[: args.max_batch_size])
                run_grpc(server, requests[:1])

                # The three ways in turn, `repeats` times: a slow spell on a shared machine hits all three.
                runs: dict[str, list[Run]] = {"sequential": [], "batched": [], "grpc": []}
                for _ in range(args.repeats):
                    runs["sequential"].append(run_sequential(engine, requests))
                    runs["batched"].append(run_batched(engine, requests))
                    runs["grpc"].append(run_grpc(server, requests))
        except ValueError as exc:  # an unknown --model
            sys.exit(f"error: {exc}")
        finally:
            registry.close()  # the server closed them already unless something failed first
    print(json.dumps(report(args, engine, runs), indent=2, ensure_ascii=False))


if __name__ == "__main__":
    main()
