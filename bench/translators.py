"""Decode speed of two (or more) served translators side by side, on the same sentences, in one run.

    .venv/bin/python bench/translators.py --models translate-zh-en,translate-zh-en-rnn
    .venv/bin/python bench/translators.py --split data/corpus/test.tsv --sentences 64 --repeats 3

For each model, through its serving engine (ONNX Runtime, one intra-op thread, the manifest-driven decode
loop), greedy, both directions:
- `batch_1`: the sentences one at a time; generated tokens per second.
- `batch_32`: the same sentences submitted at once, batches of up to 32 rows.
- `step_ms_by_position`: one decoder step's time (median, batch 1 and 32) by output position, decoding a
  fixed sentence to 256 tokens without stopping: a Transformer's step grows with its KV cache, an LSTM
  step stays flat.
Ratios are the first model's figure over each other's, per repeat, then the median.
"""

from __future__ import annotations

import argparse
import pathlib
import statistics
import time

import numpy as np

from attnserve.server.decoding.batch import Batch
from attnserve.server.engine.batcher import BatchingOptions
from attnserve.server.decoding.decoding import decode
from attnserve.server.engine.engine import ModelEngine
from attnserve.api.generation import DecodingOptions, GenerationRequest
from attnserve.server.decoding.prepared import PreparedRequest
from attnserve.server.inputs.preprocessing import TextSource
from attnserve.server.engine.registry import load_engine
from attnserve.server.model.repository import find_models
from attnserve.server.model.runtime import RuntimeOptions
from attnserve.server.decoding.search import GreedySearch
from attnserve.export.common.reports import emit

# Output positions whose step time is reported (each bucket's median over the steps in it).
POSITION_BUCKETS = [(0, 16), (16, 64), (64, 128), (128, 256)]
LONG_SENTENCE = "Open the File menu, choose Save As, type a new name for the document and press Enter."


def read_sentences(split: pathlib.Path, count: int) -> list[tuple[str, str]]:
    """(text, target language) pairs: every other test pair from English, the rest from Chinese."""
    pairs = [line.split("\t") for line in split.read_text(encoding="utf-8").splitlines() if "\t" in line]
    step = max(len(pairs) // count, 1)
    chosen = pairs[::step][:count]
    return [(en, "zh-TW") if i % 2 == 0 else (zh, "en") for i, (en, zh) in enumerate(chosen)]


def requests(name: str, sentences) -> list[GenerationRequest]:
    return [GenerationRequest(name, text, target, DecodingOptions(max_new_tokens=128, beam_size=1))
            for text, target in sentences]


def tokens_per_second(engine: ModelEngine, batch: list[GenerationRequest], together: bool) -> float:
    started = time.perf_counter()
    if together:
        results = [f.result() for f in [engine.submit(r) for r in batch]]
    else:
        results = [engine.generate(r) for r in batch]
    return sum(len(r.tokens) for r in results) / (time.perf_counter() - started)


def step_times(engine: ModelEngine, rows: int, steps: int = 256) -> dict[str, float]:
    """Median decoder-step milliseconds per position bucket, `rows` copies of one sentence, never stopping."""
    source = TextSource(tuple(engine.tokenizer.encode(LONG_SENTENCE)))
    start = engine.manifest.decoder_start["zh-TW"]
    prepared = [
        PreparedRequest(GenerationRequest(engine.manifest.name, LONG_SENTENCE), source, "zh-TW", start, steps, 1, None)
        for _ in range(rows)
    ]
    batch = Batch.build(engine.manifest, engine.runtime, engine.preprocessor.collate([p.source for p in prepared]))
    times, last = [], time.perf_counter()
    for _ in decode(batch, GreedySearch(prepared, eos=-1)):  # eos -1: no row ever ends early
        now = time.perf_counter()
        times.append(now - last)
        last = now
    return {f"{lo}-{hi - 1}": 1000 * statistics.median(times[lo:hi]) for lo, hi in POSITION_BUCKETS}


def measure(engine: ModelEngine, sentences) -> dict:
    batch = requests(engine.manifest.name, sentences)
    tokens_per_second(engine, batch[:4], together=False)  # warm up sessions and allocator
    return {
        "batch_1_tokens_per_s": tokens_per_second(engine, batch, together=False),
        "batch_32_tokens_per_s": tokens_per_second(engine, batch, together=True),
        "step_ms_by_position_batch_1": step_times(engine, 1),
        "step_ms_by_position_batch_32": step_times(engine, 32),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repository", type=pathlib.Path, default=pathlib.Path("models"))
    parser.add_argument("--models", default="translate-zh-en,translate-zh-en-rnn", help="comma-separated names")
    parser.add_argument("--split", type=pathlib.Path, default=pathlib.Path("data/corpus/test.tsv"))
    parser.add_argument("--sentences", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1, help="intra-op threads per session")
    parser.add_argument("--out", type=pathlib.Path)
    args = parser.parse_args()

    names = args.models.split(",")
    found = find_models(args.repository)
    batching = BatchingOptions(max_batch_size=32, window_ms=5.0, max_queue_size=1024)
    engines = {n: load_engine(found[n], RuntimeOptions(intra_op_threads=args.threads), batching) for n in names}
    sentences = read_sentences(args.split, args.sentences)
    try:
        # Models take turns within each repeat, so a slow spell on a shared machine hits all of them.
        runs = [{n: measure(engines[n], sentences) for n in names} for _ in range(args.repeats)]
    finally:
        for engine in engines.values():
            engine.close()

    report = {"sentences": len(sentences), "repeats": args.repeats, "threads": args.threads, "models": {}, "ratios": {}}
    for n in names:
        report["models"][n] = median_of(runs, n)
    first = names[0]
    for other in names[1:]:
        report["ratios"][f"{first}_over_{other}"] = {
            key: statistics.median(r[first][key] / r[other][key] for r in runs)
            for key in ("batch_1_tokens_per_s", "batch_32_tokens_per_s")
        }
    emit(report, args.out)


def median_of(runs: list[dict], name: str) -> dict:
    """Per figure (and per position bucket), the median over repeats."""
    out = {}
    for key, value in runs[0][name].items():
        if isinstance(value, dict):
            out[key] = {b: round(statistics.median(r[name][key][b] for r in runs), 3) for b in value}
        else:
            out[key] = round(statistics.median(r[name][key] for r in runs), 1)
    return out


if __name__ == "__main__":
    main()
