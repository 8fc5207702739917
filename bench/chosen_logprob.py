"""Greedy's log-probability: a full-vocabulary log-softmax vs the chosen token's only, against a decode step.

    python bench/chosen_logprob.py [--model models/translate-zh-en] [--repeats 200]

Runs the served model's decoder at a realistic position (20 steps into a real sentence), then times, in
interleaved rounds on the same logits: the decoder step itself, greedy's token + log-probability the old
way (log_softmax over the vocabulary, then one entry) and the new way (`decoding.chosen_logprobs`: the
row's logsumexp only). Prints medians and what the saving is as a share of a whole step, per batch size.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from attnserve.server.decoding.batch import Batch
from attnserve.api.generation import GenerationRequest
from attnserve.server.decoding.log_softmax import log_softmax
from attnserve.server.inputs.preprocessors import create
from attnserve.server.model.repository import find_models, open_runtime
from attnserve.server.decoding.search import chosen_logprobs
from attnserve.server.model.tokenization import Tokenizer

SENTENCE = "Open the File menu, then choose Save to keep the current document."


def old_way(logits: np.ndarray) -> np.ndarray:
    tokens = logits.argmax(axis=-1)
    return np.take_along_axis(log_softmax(logits), tokens[:, None], axis=1)[:, 0]


def new_way(logits: np.ndarray) -> np.ndarray:
    return chosen_logprobs(logits, logits.argmax(axis=-1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="models")
    parser.add_argument("--name", default="translate-zh-en")
    parser.add_argument("--repeats", type=int, default=200)
    args = parser.parse_args()
    version = find_models(args.model)[args.name]
    runtime = open_runtime(version)
    tokenizer = Tokenizer.from_manifest(version.path, version.manifest)
    preprocessor = create(version.manifest, tokenizer)
    print(f"{'batch':>5} {'vocab':>6} {'step ms':>8} {'old ms':>7} {'new ms':>7} {'saved / step':>12}")
    for size in (1, 8, 32):
        source = preprocessor.prepare(GenerationRequest(args.name, SENTENCE, "zh-TW"))
        batch = Batch.build(version.manifest, runtime, preprocessor.collate([source] * size))
        tokens = np.full(size, version.manifest.decoder_start["zh-TW"])
        for _ in range(20):
            tokens = batch.step(tokens).logits.argmax(axis=-1)
        logits = batch.step(tokens).logits
        assert np.array_equal(old_way(logits), new_way(logits))  # the same float32 arithmetic
        times = {"step": [], "old": [], "new": []}
        for _ in range(args.repeats):  # interleaved, so drift hits all three alike
            for name, fn in (("old", lambda: old_way(logits)), ("new", lambda: new_way(logits))):
                started = time.perf_counter()
                fn()
                times[name].append(time.perf_counter() - started)
            clone = Batch.__new__(Batch)
            clone.__dict__ = {**batch.__dict__, "_state": dict(batch._state)}  # the step must not grow `batch`
            started = time.perf_counter()
            clone.step(tokens)
            times["step"].append(time.perf_counter() - started)
        step, old, new = (statistics.median(times[k]) * 1e3 for k in ("step", "old", "new"))
        print(f"{size:>5} {logits.shape[1]:>6} {step:8.3f} {old:7.3f} {new:7.3f} {(old - new) / step:11.1%}")


if __name__ == "__main__":
    main()
