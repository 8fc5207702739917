"""Translator size against this machine's budget: what a wider or deeper Transformer costs to train and to serve.

    .venv/bin/python bench/model_size.py --out bench/results/model_size.json

For each shape (d_model, layers each side, d_ff; 4 heads up to d 256, else d / 64) with the bundled
translator's vocabulary:
- parameters and the float32 model folder's size (both graphs hold the tied embedding table);
- training target tokens/s, float32 and with bf16 autocast (`train --cpu-bf16`), over the same batches of
  real training pairs (about 3,000 target tokens each), the shapes' steps interleaved so that a busy
  spell of the machine hits all;
- the served decoder step (ONNX Runtime, graphs exported from the shape's random weights) at batch 1 and
  32, 20 cached positions, 30 source positions, median of repeated runs.
One thread for everything: the serving default, and the training default leaves the other core to the
rest of the machine. The weights are random; only the costs are measured, not quality.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import random
import statistics
import tempfile
import time

import numpy as np
import onnxruntime as ort
import torch

from attnserve.export.translation import bpe, onnx_export, train
from attnserve.export.translation.model import Transformer, TransformerConfig

SHAPES = [(256, 3, 1024), (384, 3, 1536), (512, 3, 2048), (256, 6, 1024)]


def make_model(d_model: int, layers: int, d_ff: int, vocab: int) -> Transformer:
    torch.manual_seed(0)
    heads = 4 if d_model <= 256 else d_model // 64
    return Transformer(TransformerConfig(vocab_size=vocab, d_model=d_model, heads=heads, d_ff=d_ff,
                                         encoder_layers=layers, decoder_layers=layers))


def training_seconds(model: Transformer, batch, cpu_bf16: bool) -> float:
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
    started = time.perf_counter()
    loss, n = train.loss_on(model, batch, 0.1, cpu_bf16)
    optimizer.zero_grad(set_to_none=True)
    (loss / n).backward()
    optimizer.step()
    return time.perf_counter() - started


def decoder_step_ms(folder: pathlib.Path, cfg: TransformerConfig, batch: int, repeats: int) -> float:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(str(folder / "decoder.onnx"), options, providers=["CPUExecutionProvider"])
    past, source, head_dim = 20, 30, cfg.d_model // cfg.heads
    feeds = {}
    for arg in session.get_inputs():
        if arg.name == "input_ids":
            feeds[arg.name] = np.full((batch, 1), 7, np.int64)
        elif arg.name == "position_ids":
            feeds[arg.name] = np.full((batch, 1), past, np.int64)
        elif arg.name == "decoder_attention_mask":
            feeds[arg.name] = np.ones((batch, past + 1), np.int64)
        elif arg.name == "encoder_attention_mask":
            feeds[arg.name] = np.ones((batch, source), np.int64)
        else:  # past_key_values.{i}.{decoder|encoder}.{key|value}
            length = past if ".decoder." in arg.name else source
            feeds[arg.name] = np.random.default_rng(0).standard_normal(
                (batch, cfg.heads, length, head_dim)).astype(np.float32)
    session.run(None, feeds)
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        session.run(None, feeds)
        times.append(time.perf_counter() - started)
    return 1e3 * statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model-dir", type=pathlib.Path, default=pathlib.Path("models/translate-zh-en/5"),
                        help="whose tokenizer (vocabulary) the shapes use")
    parser.add_argument("--corpus", type=pathlib.Path, default=pathlib.Path("data/corpus/train.tsv"))
    parser.add_argument("--steps", type=int, default=4, help="training steps per shape and precision")
    parser.add_argument("--repeats", type=int, default=50, help="decoder steps timed per shape and batch")
    parser.add_argument("--out", type=pathlib.Path)
    args = parser.parse_args()
    torch.set_num_threads(1)
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(args.model_dir / "tokenizer.json"))
    vocab = tokenizer.get_vocab_size()
    pairs = random.Random(0).sample(train.read_pairs(args.corpus), 20000)
    examples = train.make_examples(pairs, tokenizer, 128)
    batches = [train.collate(examples, b) for b in train.make_batches(examples, 3000, random.Random(0))]
    batches = random.Random(1).sample(batches, args.steps + 1)
    models = {shape: make_model(*shape, vocab).train() for shape in SHAPES}
    seconds = {(shape, bf16): [] for shape in SHAPES for bf16 in (False, True)}
    tokens = sum(int((b[3] != bpe.PAD_ID).sum()) for b in batches[1:])
    for i, batch in enumerate(batches):
        for shape, model in models.items():
            for bf16 in (False, True):
                spent = training_seconds(model, batch, bf16)
                if i:  # the first batch warms up
                    seconds[shape, bf16].append(spent)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for shape, model in models.items():
            folder = pathlib.Path(tmp) / "x".join(map(str, shape))
            folder.mkdir()
            onnx_export.export_graphs(model.eval(), folder)
            size = sum(p.stat().st_size for p in folder.glob("*.onnx"))
            rows.append({
                "d_model": shape[0], "layers": shape[1], "d_ff": shape[2],
                "parameters_m": round(sum(p.numel() for p in model.parameters()) / 1e6, 2),
                "graphs_mb": round(size / 1e6, 1),
                "train_tokens_per_s_fp32": round(tokens / sum(seconds[shape, False])),
                "train_tokens_per_s_bf16": round(tokens / sum(seconds[shape, True])),
                **{f"step_ms_batch_{b}": round(decoder_step_ms(folder, model.cfg, b, args.repeats), 2) for b in (1, 32)},
            })
    base = rows[0]
    print("| d_model | layers | d_ff | parameters | graphs | train tok/s fp32 / bf16 | vs bundled (bf16) "
          "| step batch 1 / 32 | vs bundled |\n|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['d_model']} | {r['layers']}+{r['layers']} | {r['d_ff']} | {r['parameters_m']}M | {r['graphs_mb']} MB "
              f"| {r['train_tokens_per_s_fp32']:,} / {r['train_tokens_per_s_bf16']:,} "
              f"| {r['train_tokens_per_s_bf16'] / base['train_tokens_per_s_bf16']:.2f} "
              f"| {r['step_ms_batch_1']} / {r['step_ms_batch_32']} ms "
              f"| {r['step_ms_batch_1'] / base['step_ms_batch_1']:.2f} / {r['step_ms_batch_32'] / base['step_ms_batch_32']:.2f} |")
    if args.out:
        args.out.write_text(json.dumps({"tokens_per_shape_and_precision": tokens, "rows": rows}, indent=2) + "\n")


if __name__ == "__main__":
    main()
