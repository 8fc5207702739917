"""An imported OPUS-MT checkpoint served by attnserve against CTranslate2 converting the same checkpoint.

    .venv/bin/pip install -e '.[cpu,export,bench]'
    .venv/bin/python bench/import_ctranslate2.py --work /work/data/import-bench [--clients 32 --seconds 30]

The checkpoint has opus-mt-zh-en's real sizes (d_model 512, 6+6 layers, 8 heads, FFN 2048, 65,001 pieces,
the published config.json and generation_config.json) and random weights (tests/tiny_marian.py with
`real_sizes`: no hub access here). It is imported with `attnserve import` and converted with CTranslate2's
own `TransformersConverter` (float32). Then, greedy, one intra-op thread on both sides:
- outputs: every sentence through the server (gRPC `Generate`) and through `Translator.translate_batch`,
  compared token by token;
- attnserve: `attnserve serve` (continuous batching, the default) under --clients concurrent gRPC clients
  for --seconds (bench/concurrency.py's closed loop), generated tokens/s and the server's peak RSS; with
  --engine-process also the server with its engine in a child process;
- attnserve in process: the engine alone (no gRPC, no clients sharing the CPU), all sentences at once;
- CTranslate2: `translate_batch` over the same sentences, max_batch_size = --clients, repeated for
  --seconds, in a child process of its own (fed MarianTokenizer's pieces, no transformers loaded) so its peak
  RSS is its own;
- load times: the import, the server's start until it reports SERVING, the conversion, the Translator.
Every request is capped at --max-new-tokens on both sides (random weights rarely choose EOS).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import pathlib
import resource
import subprocess
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "tests"))  # tiny_marian.py

from concurrency import ServerProcess, closed_loop  # bench/, beside this script
from import_setup import import_and_convert

from attnserve.clients.client import AsyncClient
from attnserve.api.generation import GREEDY, DecodingOptions, GenerationRequest
from attnserve.export.common.reports import emit

NAME = "opus-mt-zh-en-random"


def prepare(work: pathlib.Path) -> tuple[pathlib.Path, pathlib.Path, pathlib.Path, dict]:
    """Builds, imports and converts the checkpoint once (kept under --work); returns the folders and times."""
    import tiny_marian

    return import_and_convert(work, NAME, lambda checkpoint: tiny_marian.build(checkpoint, real_sizes=True))


def sentences(count: int) -> list[str]:
    import tiny_marian

    return [line for line in tiny_marian.lines(count * 3, seed=21) if line.strip()][:count]


async def served(address: str, texts: list[str], max_new: int) -> list[list[str]]:
    options = DecodingOptions(max_new_tokens=max_new, beam_size=1)
    async with AsyncClient(address, timeout=600) as client:
        results = await asyncio.gather(*(client.generate(GenerationRequest(NAME, t, "", options)) for t in texts))
    return [[t.piece for t in r.tokens] for r in results]


def in_process(repo: pathlib.Path, texts: list[str], max_new: int, seconds: float) -> dict:
    """The engine alone, in this process: every sentence submitted at once (continuous batching, up to 32
    rows), repeated for `seconds`, as bench/ctranslate2_compare.py's batch_32: no gRPC, no clients."""
    from attnserve.server.engine.batcher import BatchingOptions
    from attnserve.server.engine.registry import load_engine
    from attnserve.server.model.repository import find_models
    from attnserve.server.model.runtime import RuntimeOptions

    started = time.perf_counter()
    engine = load_engine(find_models(repo)[NAME], RuntimeOptions(), BatchingOptions())
    load_s = time.perf_counter() - started
    requests = [GenerationRequest(NAME, t, "", DecodingOptions(max_new, 1)) for t in texts]
    try:
        [f.result() for f in [engine.submit(r) for r in requests]]  # warm-up
        tokens, started = 0, time.perf_counter()
        while time.perf_counter() - started < seconds:
            tokens += sum(len(f.result().tokens) for f in [engine.submit(r) for r in requests])
        elapsed = time.perf_counter() - started
    finally:
        engine.close()
    return {"tokens_per_s": tokens / elapsed, "load_s": load_s}


def ctranslate2_child(args: argparse.Namespace) -> None:
    """The CTranslate2 side, in its own process: prints one JSON line."""
    import ctranslate2

    sources = json.loads(args.sources.read_text())  # tokenized by the parent: no transformers in this RSS
    started = time.perf_counter()
    translator = ctranslate2.Translator(str(args.ctranslate2), device="cpu", compute_type="float32",
                                        intra_threads=1, inter_threads=1)
    load_s = time.perf_counter() - started

    def run():
        return translator.translate_batch(sources, beam_size=1, max_batch_size=args.clients,
                                          max_decoding_length=args.max_new_tokens)

    outputs = [r.hypotheses[0] for r in run()]
    tokens, started = 0, time.perf_counter()
    while time.perf_counter() - started < args.seconds:
        tokens += sum(len(r.hypotheses[0]) for r in run())
    elapsed = time.perf_counter() - started
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps({"tokens_per_s": tokens / elapsed, "load_s": load_s, "peak_rss_mb": rss, "outputs": outputs}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work", type=pathlib.Path, default=pathlib.Path("/work/data/import-bench"))
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--sentences", type=int, default=96)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--engine-process", action="store_true",
                        help="also serve with --engine-process (the engine in a child process, apart from gRPC)")
    parser.add_argument("--out", type=pathlib.Path, help="also write the report here (JSON)")
    parser.add_argument("--ctranslate2-child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--sources", type=pathlib.Path, help=argparse.SUPPRESS)
    parser.add_argument("--ctranslate2", type=pathlib.Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.ctranslate2_child:
        return ctranslate2_child(args)
    args.work.mkdir(parents=True, exist_ok=True)
    checkpoint, repo, ct2, times = prepare(args.work)
    texts = sentences(args.sentences)

    report = dict(times)
    requests = [GenerationRequest(NAME, t, "", DecodingOptions(args.max_new_tokens, GREEDY.beam_size)) for t in texts]
    servers = {"attnserve": []} | ({"attnserve_engine_process": ["--engine-process"]} if args.engine_process else {})
    for label, flags in servers.items():
        started = time.perf_counter()
        server = ServerProcess(repo, ["--model", NAME, *flags])
        report[f"{label}_start_s"] = time.perf_counter() - started
        try:
            if label == "attnserve":
                ours = asyncio.run(served(server.address, texts, args.max_new_tokens))
            load = asyncio.run(closed_loop(server.address, requests, args.clients, args.seconds, unary=True))
            report[label] = {**load, "peak_rss_mb": server.peak_rss_mb()}
        finally:
            server.stop()
    report["attnserve_in_process"] = in_process(repo, texts, args.max_new_tokens, args.seconds)
    from transformers import MarianTokenizer

    tokenizer = MarianTokenizer.from_pretrained(str(checkpoint), local_files_only=True)
    sources = args.work / "sources.json"  # MarianTokenizer's pieces, </s> included, as CTranslate2 takes them
    sources.write_text(json.dumps([tokenizer.convert_ids_to_tokens(tokenizer(t).input_ids) for t in texts]))
    child = subprocess.run(
        [sys.executable, __file__, "--ctranslate2-child", "--sources", str(sources), "--ctranslate2", str(ct2),
         "--clients", str(args.clients), "--seconds", str(args.seconds), "--sentences", str(args.sentences),
         "--max-new-tokens", str(args.max_new_tokens)],
        check=True, capture_output=True, text=True)
    theirs = json.loads(child.stdout.strip().splitlines()[-1])
    outputs = theirs.pop("outputs")
    report["ctranslate2"] = theirs
    report["outputs_identical"] = f"{sum(a == b for a, b in zip(ours, outputs))}/{len(texts)}"
    for label in servers:
        report[f"speed_ratio_{label}"] = report[label]["tokens_per_s"] / theirs["tokens_per_s"]
    report["speed_ratio_in_process"] = report["attnserve_in_process"]["tokens_per_s"] / theirs["tokens_per_s"]
    report["sizes_mb"] = {p.name: p.stat().st_size / 2**20 for p in sorted((repo / NAME / "1").iterdir())}
    emit(report, args.out)


if __name__ == "__main__":
    main()
