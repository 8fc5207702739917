"""Decoder-step latency: ONNX Runtime vs PyTorch eager on the same weights, measured side by side.

    python bench/decoder_step.py [--checkpoint RUN/best.pt] [--threads 1] [--past 20] [--source 24]

Without --checkpoint it builds a random model with the shipped model's shape. Reports the median step time
at batch 1 and 16 for both runtimes and their ratio. Needs the `export` extra (torch).
"""

from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import tempfile
import time

import numpy as np
import onnxruntime as ort
import torch

from attnserve.export.common.onnx_graphs import graph_names
from attnserve.export.translation.architectures import load_checkpoint
from attnserve.export.translation.model import Transformer, TransformerConfig
from attnserve.export.translation.onnx_export import export_graphs


def median_seconds(fn, repeats: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def step_feeds(cfg: TransformerConfig, batch: int, past: int, source: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    dh = cfg.d_model // cfg.heads
    names = graph_names(cfg.decoder_layers)["decoder_inputs"]
    feeds = {
        "input_ids": rng.integers(6, cfg.vocab_size, (batch, 1)).astype(np.int64),
        "position_ids": np.full((batch, 1), past, np.int64),
        "decoder_attention_mask": np.ones((batch, past + 1), np.int64),
        "encoder_attention_mask": np.ones((batch, source), np.int64),
    }
    for name in names[4:]:
        length = past if ".decoder." in name else source
        feeds[name] = rng.standard_normal((batch, cfg.heads, length, dh)).astype(np.float32)
    return feeds


def torch_step(model: Transformer, feeds: dict[str, np.ndarray]):
    t = {k: torch.from_numpy(v) for k, v in feeds.items()}
    layers = model.cfg.decoder_layers
    past = [(t[f"past_key_values.{i}.decoder.key"], t[f"past_key_values.{i}.decoder.value"]) for i in range(layers)]
    cross = [(t[f"past_key_values.{i}.encoder.key"], t[f"past_key_values.{i}.encoder.value"]) for i in range(layers)]
    mask = t["decoder_attention_mask"].bool()[:, None, None, :]

    def run():
        with torch.inference_mode():
            model.decode(t["input_ids"], t["position_ids"], mask, past, cross, t["encoder_attention_mask"])

    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkpoint", type=pathlib.Path)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--past", type=int, default=20, help="cached target positions")
    parser.add_argument("--source", type=int, default=24, help="source tokens")
    parser.add_argument("--repeats", type=int, default=200)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.checkpoint:
        model, _ = load_checkpoint(args.checkpoint)
    else:
        model = Transformer(TransformerConfig(vocab_size=16000, dropout=0.0)).eval()
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = args.threads
    opts.inter_op_num_threads = 1
    with tempfile.TemporaryDirectory() as tmp:
        export_graphs(model, pathlib.Path(tmp))
        session = ort.InferenceSession(str(pathlib.Path(tmp) / "decoder.onnx"), opts, providers=["CPUExecutionProvider"])
    results = {"threads": args.threads, "past": args.past, "source": args.source, "batches": {}}
    for batch in (1, 16):
        feeds = step_feeds(model.cfg, batch, args.past, args.source)
        onnx_s = median_seconds(lambda: session.run(None, feeds), args.repeats)
        torch_s = median_seconds(torch_step(model, feeds), args.repeats)
        results["batches"][batch] = {
            "onnxruntime_ms": round(onnx_s * 1e3, 3),
            "pytorch_eager_ms": round(torch_s * 1e3, 3),
            "pytorch_over_onnxruntime": round(torch_s / onnx_s, 2),
        }
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
