"""Exports a trained Show-Attend-Tell checkpoint to the model contract (docs/model-contract.md, image input):
encoder.onnx, decoder.onnx, tokenizer.json (the words) and manifest.json.

    python -m attnserve.export.image.export --checkpoint RUN/best.pt --out models/caption-emoji/1

encoder.onnx runs the convolutional Encoder on normalised pixels and computes what is constant for an image:
the grid features (one attention column per cell, row by row), their attention keys and the speller's first
h and c. decoder.onnx is one Speller step; h and c are `replace` state, so the server's one decode loop
(batching, beam search, streaming) runs it like the other recurrent models. Every image has the same grid,
so the encoder takes no mask and the decoder none. Exported with the legacy TorchScript exporter (opset
17), ending with a parity check of ONNX Runtime against PyTorch at batch sizes unlike the export example's.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import pathlib

import numpy as np
import torch
from tokenizers import Tokenizer
from torch import nn

from attnserve.export.common.onnx_graphs import trace, write_tokenizer_and_manifest
from attnserve.export.image import vocabulary
from attnserve.export.image.model import ShowAttendTell

# Decoder state: (past input, present output, the encoder output it starts from).
STATE = [("past_state.hidden", "present_state.hidden", "initial_state.hidden"),
         ("past_state.cell", "present_state.cell", "initial_state.cell")]
ENCODER_OUTPUTS = ["encoder_hidden_states", "encoder_keys", "initial_state.hidden", "initial_state.cell"]
STATIC = ["encoder_hidden_states", "encoder_keys"]
DECODER_INPUTS = ["input_ids", *STATIC, *(past for past, _, _ in STATE)]
DECODER_OUTPUTS = ["logits", *(present for _, present, _ in STATE), "cross_attentions"]
PARITY_BATCHES = (1, 3, 5)


class EncoderGraph(nn.Module):
    """pixel_values -> grid features, their keys, the speller's first h and c."""

    def __init__(self, model: ShowAttendTell):
        super().__init__()
        self.model = model

    def forward(self, pixel_values):
        return self.model.encode(pixel_values)


class DecoderStepGraph(nn.Module):
    """One speller step for every row; the state outputs replace the state inputs."""

    def __init__(self, model: ShowAttendTell):
        super().__init__()
        self.model = model

    def forward(self, input_ids, memory, keys, h, c):
        logits, h, c, weights = self.model.speller.step(input_ids[:, 0], h, c, memory, keys)
        return logits, h, c, weights[:, None, None, :]  # attention (B, 1 layer, 1 head, S)


def export_graphs(model: ShowAttendTell, out_dir: pathlib.Path) -> None:
    """Writes encoder.onnx and decoder.onnx with the batch axis dynamic (and the decoder's source axis).

    The wrappers are made in eval mode: the exporter puts each back in the mode it found it in, and a new
    module's is training, which would leave `model` training (dropout on) after its export.
    """
    model = model.eval()
    cfg = model.cfg
    pixels = torch.randn(2, 3, cfg.image_size, cfg.image_size)
    with torch.no_grad():
        memory, keys, h, c = model.encode(pixels)
    batch, batch_source = {0: "batch"}, {0: "batch", 1: "source"}
    trace(
        EncoderGraph(model).eval(), (pixels,), str(out_dir / "encoder.onnx"),
        input_names=["pixel_values"], output_names=ENCODER_OUTPUTS,
        dynamic_axes={"pixel_values": batch, **{n: batch for n in ENCODER_OUTPUTS}},
    )
    ids = torch.tensor([[vocabulary.START_ID], [vocabulary.START_ID + 5]])
    trace(
        DecoderStepGraph(model).eval(), (ids, memory, keys, h, c), str(out_dir / "decoder.onnx"),
        input_names=DECODER_INPUTS, output_names=DECODER_OUTPUTS,
        dynamic_axes={**{n: batch_source for n in STATIC},
                      **{n: batch for n in ["input_ids", "logits", *(n for s in STATE for n in s[:2])]},
                      "cross_attentions": {0: "batch", 3: "source"}},
    )


def build_manifest(model: ShowAttendTell, name: str, version: int, max_bytes: int = 8 * 2**20,
                   max_pixels: int = 40_000_000, description: str | None = None) -> dict:
    """The image manifest: grid features and keys are static; h and c are replaced state."""
    cfg = model.cfg
    return {
        "format_version": 1,
        "name": name,
        "version": version,
        "task": "image-captioning",
        "description": description or (
            f"English image captioner (words): {cfg.image_size} x {cfg.image_size} CNN encoder to a grid of "
            f"{cfg.grid} x {cfg.grid} cells + LSTM speller with soft attention (show, attend and tell)"
        ),
        "languages": {"source": ["en"], "target": ["en"]},
        "tokenizer": {"file": "tokenizer.json", "word_boundary": "metaspace-cjk"},
        "special_tokens": {"pad": vocabulary.PAD_ID, "unk": vocabulary.UNK_ID, "eos": vocabulary.EOS_ID,
                           "suppress": vocabulary.suppressed_ids()},
        "decoder_start": {"en": vocabulary.START_ID},
        "input": {
            "kind": "image", "height": cfg.image_size, "width": cfg.image_size, "channels": 3,
            "normalize": {"mean": list(cfg.mean), "std": list(cfg.std)},
            "grid": {"rows": cfg.grid, "cols": cfg.grid},
            "max_bytes": max_bytes, "max_pixels": max_pixels,
        },
        **graph_sections(cfg),
    }


def graph_sections(cfg) -> dict:
    """The manifest's graph half, the same for the image and the clip captioner: the attention, the graphs'
    names, the (memory, keys) static inputs and the replaced (h, c) state."""
    state = [
        {"input": past, "output": present, "update": "replace", "batch_axis": 0, "dtype": "float32",
         "shape": ["batch", cfg.decoder_hidden], "init": {"from": init}}
        for past, present, init in STATE
    ]
    return {
        "limits": {"max_new_tokens": cfg.max_words},
        "attention": {"output": "cross_attentions", "layers": 1, "heads": 1, "default_layer": -1},
        "encoder": {"file": "encoder.onnx", "inputs": {"pixel_values": "pixel_values"}},
        "decoder": {"file": "decoder.onnx", "inputs": {"input_ids": "input_ids"}, "outputs": {"logits": "logits"}},
        "static": [{"from": n, "to": n, "batch_axis": 0, "source_axis": 1} for n in STATIC],
        "state": state,
        "model_config": dataclasses.asdict(cfg),
    }


def export_model(model: ShowAttendTell, tokenizer: Tokenizer, out_dir: pathlib.Path, name: str = "caption-emoji",
                 **manifest_options) -> pathlib.Path:
    """Writes the whole version folder (its name is the version) and returns it."""
    out_dir = pathlib.Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    export_graphs(model, out_dir)
    write_tokenizer_and_manifest(out_dir, tokenizer, build_manifest(model, name, int(out_dir.name), **manifest_options))
    return out_dir


def parity(model: ShowAttendTell, model_dir: pathlib.Path, batches=PARITY_BATCHES, steps: int = 6,
           seed: int = 0) -> dict:
    """Largest |ONNX Runtime - PyTorch| per output over random images, the decoder chained `steps` steps.

    Both sides get the same tokens step by step, each its own state, so differences accumulate as served.
    """
    rng, model, size = np.random.default_rng(seed), model.eval(), model.cfg.image_size
    images = (torch.from_numpy(rng.normal(0, 1, (batch, 3, size, size)).astype(np.float32)) for batch in batches)
    return chained_parity(model, model_dir, images, steps, rng, vocabulary.START_ID)


def chained_parity(model: nn.Module, model_dir: pathlib.Path, inputs, steps: int, rng, start_id: int) -> dict:
    """Largest |ONNX Runtime - PyTorch| per output of the graphs in `model_dir` over each `pixel_values` of
    `inputs`, the decoder chained `steps` steps on random tokens from `rng` (the image and clip captioners'
    graphs share their inputs, outputs and state)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    encoder = ort.InferenceSession(str(model_dir / "encoder.onnx"), options, providers=["CPUExecutionProvider"])
    decoder = ort.InferenceSession(str(model_dir / "decoder.onnx"), options, providers=["CPUExecutionProvider"])
    worst: dict[str, float] = {}

    def record(names, onnx, torch_):
        for n, o, p in zip(names, onnx, torch_):
            worst[n] = max(worst.get(n, 0.0), float(np.abs(o - p.numpy()).max()))

    for pixels in inputs:
        batch = pixels.shape[0]
        onnx_enc = encoder.run(None, {"pixel_values": pixels.numpy()})
        with torch.no_grad():
            memory, keys, h, c = model.encode(pixels)
        record(ENCODER_OUTPUTS, onnx_enc, [memory, keys, h, c])
        onnx_state = onnx_enc[2:4]
        for _ in range(steps):
            ids = torch.from_numpy(rng.integers(start_id, model.cfg.vocab_size, (batch,)))
            feeds = [ids[:, None].numpy(), onnx_enc[0], onnx_enc[1], *onnx_state]
            onnx_dec = decoder.run(None, dict(zip(DECODER_INPUTS, feeds)))
            with torch.no_grad():
                logits, h, c, weights = model.speller.step(ids, h, c, memory, keys)
            record(DECODER_OUTPUTS, onnx_dec, [logits, h, c, weights[:, None, None, :]])
            onnx_state = onnx_dec[1:3]
    return worst


def main() -> None:
    from attnserve.export.image.train import load_model

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkpoint", type=pathlib.Path, required=True)
    parser.add_argument("--out", type=pathlib.Path, required=True, help="version folder, e.g. models/caption-emoji/1")
    parser.add_argument("--name", default="caption-emoji")
    args = parser.parse_args()
    torch.set_num_threads(1)
    model, tokenizer, _ = load_model(args.checkpoint)
    export_model(model, tokenizer, args.out, args.name)
    worst = parity(model, args.out)
    print(json.dumps({"exported": str(args.out), "parity_batches": PARITY_BATCHES, "max_abs_diff": worst}, indent=2))


if __name__ == "__main__":
    main()
