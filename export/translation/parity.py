"""How far the exported graphs are from the PyTorch model they came from: the max absolute difference of
every output, over a few batch sizes, source lengths and cache lengths unlike the export example's
(the recurrent translator has no cache: its decoder state is random instead).

    python -m attnserve.export.translation.parity --checkpoint RUN/best.pt --model-dir models/translate-zh-en/1
"""

from __future__ import annotations

import argparse
import json
import pathlib

import numpy as np
import onnxruntime as ort
import torch

from attnserve.export.common.onnx_graphs import graph_names
from attnserve.export.translation import bpe
from attnserve.export.translation import recurrent_export
from attnserve.export.translation.architectures import load_checkpoint
from attnserve.export.translation.model import Transformer
from attnserve.export.translation.recurrent import RecurrentTranslator

# (batch, source length, cache length): batch 1 and > 1, an empty cache and a long one.
CASES = [(1, 5, 0), (1, 31, 12), (6, 17, 0), (6, 40, 25)]


def _source(vocab: int, batch: int, length: int, rng) -> tuple[np.ndarray, np.ndarray]:
    ids = rng.integers(6, vocab, (batch, length)).astype(np.int64)
    mask = np.ones_like(ids)
    for row in range(1, batch):  # rows of different lengths: padding on every row but the first
        mask[row, length - row * length // (batch + 1) :] = 0
    ids[mask == 0] = bpe.PAD_ID
    return ids, mask


def case_differences(model: Transformer, encoder, decoder, batch: int, length: int, past: int, rng) -> dict:
    cfg = model.cfg
    names = graph_names(cfg.decoder_layers)
    ids, mask = _source(cfg.vocab_size, batch, length, rng)
    onnx_enc = encoder.run(None, {"input_ids": ids, "attention_mask": mask})
    t = torch.from_numpy
    with torch.no_grad():
        states, cross_kv = model.encode(t(ids), t(mask))
    torch_enc = [states] + [x for kv in cross_kv for x in kv]
    diffs = {n: float(np.abs(o - p.numpy()).max()) for n, o, p in zip(names["encoder_outputs"], onnx_enc, torch_enc)}

    dh = cfg.d_model // cfg.heads
    cache = [rng.standard_normal((batch, cfg.heads, past, dh)).astype(np.float32) for _ in range(2 * cfg.decoder_layers)]
    token = rng.integers(6, cfg.vocab_size, (batch, 1)).astype(np.int64)
    position = np.full((batch, 1), past, np.int64)
    self_mask = np.ones((batch, past + 1), np.int64)
    feeds = dict(zip(names["decoder_inputs"], [token, position, self_mask, mask, *cache, *onnx_enc[1:]]))
    onnx_dec = decoder.run(None, feeds)
    with torch.no_grad():
        past_kv = [(t(cache[2 * i]), t(cache[2 * i + 1])) for i in range(cfg.decoder_layers)]
        logits, new_kv, weights = model.decode(
            t(token), t(position), t(self_mask).bool()[:, None, None, :], past_kv, cross_kv, t(mask)
        )
    torch_dec = [logits[:, 0]] + [x for kv in new_kv for x in kv] + [weights[:, :, :, 0]]
    diffs.update({n: float(np.abs(o - p.numpy()).max()) for n, o, p in zip(names["decoder_outputs"], onnx_dec, torch_dec)})
    return diffs


def recurrent_case_differences(model: RecurrentTranslator, encoder, decoder, batch: int, length: int, _past, rng):
    """As case_differences for the recurrent translator: its state is random, not a cache of some length."""
    cfg = model.cfg
    ids, mask = _source(cfg.vocab_size, batch, length, rng)
    onnx_enc = encoder.run(None, {"input_ids": ids, "attention_mask": mask})
    t = torch.from_numpy
    with torch.no_grad():
        torch_enc = model.encode(t(ids), t(mask))
    diffs = {n: float(np.abs(o - p.numpy()).max()) for n, o, p in zip(recurrent_export.ENCODER_OUTPUTS, onnx_enc, torch_enc)}

    state = [rng.standard_normal((batch, getattr(cfg, width))).astype(np.float32) for *_, width in recurrent_export.STATE]
    token = rng.integers(6, cfg.vocab_size, (batch, 1)).astype(np.int64)
    memory, keys = onnx_enc[:2]
    onnx_dec = decoder.run(None, dict(zip(recurrent_export.DECODER_INPUTS, [token, mask, memory, keys, *state])))
    with torch.no_grad():
        torch_dec = model.decode_step(t(token[:, 0]), *map(t, state), t(memory), t(keys), t(mask))
    torch_dec = list(torch_dec[:4]) + [torch_dec[4][:, None, None, :]]
    diffs.update({n: float(np.abs(o - p.numpy()).max()) for n, o, p in zip(recurrent_export.DECODER_OUTPUTS, onnx_dec, torch_dec)})
    return diffs


def max_abs_differences(model: torch.nn.Module, model_dir: pathlib.Path, seed: int = 0) -> dict[str, float]:
    """Per output name, the largest |ONNX Runtime - PyTorch| over CASES."""
    model = model.eval()
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    encoder = ort.InferenceSession(str(model_dir / "encoder.onnx"), options, providers=["CPUExecutionProvider"])
    decoder = ort.InferenceSession(str(model_dir / "decoder.onnx"), options, providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(seed)
    differences = recurrent_case_differences if isinstance(model, RecurrentTranslator) else case_differences
    worst: dict[str, float] = {}
    for batch, length, past in CASES:
        for name, diff in differences(model, encoder, decoder, batch, length, past, rng).items():
            worst[name] = max(worst.get(name, 0.0), diff)
    return worst


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkpoint", type=pathlib.Path, required=True)
    parser.add_argument("--model-dir", type=pathlib.Path, required=True)
    args = parser.parse_args()
    model, _ = load_checkpoint(args.checkpoint)
    worst = max_abs_differences(model, args.model_dir)
    summary = {
        "cases": [{"batch": b, "source": s, "cache": p} for b, s, p in CASES],
        "max_abs_diff": max(worst.values()),
        "logits": worst["logits"],
        "cross_attentions": worst["cross_attentions"],
        "per_output": worst,
    }
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
