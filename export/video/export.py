"""Exports a trained clip captioner to the model contract (docs/model-contract.md, video input):
encoder.onnx, decoder.onnx, tokenizer.json and manifest.json.

    python -m attnserve.export.video.export --checkpoint RUN/best.pt --out models/caption-video/1

encoder.onnx runs the per-frame CNN and the BiLSTM over frames on (B, T, 3, H, W) normalised frames and gives
the (frame, cell) memory (B, T*G, D), its attention keys and the speller's first h and c. The batch axis and
the frame axis T are dynamic (the legacy TorchScript exporter, opset 17, keeps the LSTM's sequence axis
symbolic), so the same graph reads clips sampled to any number of frames. decoder.onnx is the image
captioner's speller step unchanged (export/image/export.py), h and c `replace` state. Ends with a parity check
of ONNX Runtime against PyTorch at batch sizes and frame counts unlike the export example's.
"""

from __future__ import annotations

import argparse
import json
import pathlib

import numpy as np
import torch
from tokenizers import Tokenizer
from torch import nn

from attnserve.export.image.export import (
    DECODER_INPUTS,
    DECODER_OUTPUTS,
    ENCODER_OUTPUTS,
    STATE,
    STATIC,
    DecoderStepGraph,
    chained_parity,
    graph_sections,
)
from attnserve.export.common.onnx_graphs import trace, write_tokenizer_and_manifest
from attnserve.export.video import vocabulary
from attnserve.export.video.model import VideoShowAttendTell

# (batch, frames) pairs the parity check runs: the export example is (2, 3).
PARITY_SHAPES = ((1, 8), (3, 5), (2, 12), (4, 1))
# Serving limits written into the manifest.
LIMITS = {"max_seconds": 10.0, "max_bytes": 16 * 2**20, "max_pixels": 1920 * 1080, "max_frames": 600}


class EncoderGraph(nn.Module):
    """pixel_values (B, T, 3, H, W) -> (frame, cell) memory, its keys, the speller's first h and c."""

    def __init__(self, model: VideoShowAttendTell):
        super().__init__()
        self.model = model

    def forward(self, pixel_values):
        return self.model.encode(pixel_values)


def export_graphs(model: VideoShowAttendTell, out_dir: pathlib.Path) -> None:
    """Writes encoder.onnx (batch and frame axes dynamic) and decoder.onnx (batch and source axes dynamic)."""
    model = model.eval()
    size = model.cfg.frame_size
    frames = torch.randn(2, 3, 3, size, size)  # (B, T, C, H, W): T unlike the served count, so it stays symbolic
    with torch.no_grad():
        memory, keys, h, c = model.encode(frames)
    batch, batch_source = {0: "batch"}, {0: "batch", 1: "source"}
    trace(
        EncoderGraph(model).eval(), (frames,), str(out_dir / "encoder.onnx"),
        input_names=["pixel_values"], output_names=ENCODER_OUTPUTS,
        dynamic_axes={"pixel_values": {0: "batch", 1: "frames"}, **{n: batch_source for n in STATIC},
                      **{n: batch for n in ENCODER_OUTPUTS if n not in STATIC}},
    )
    ids = torch.tensor([[vocabulary.START_ID], [vocabulary.START_ID + 5]])
    trace(
        DecoderStepGraph(model).eval(), (ids, memory, keys, h, c), str(out_dir / "decoder.onnx"),
        input_names=DECODER_INPUTS, output_names=DECODER_OUTPUTS,
        dynamic_axes={**{n: batch_source for n in STATIC},
                      **{n: batch for n in ["input_ids", "logits", *(n for s in STATE for n in s[:2])]},
                      "cross_attentions": {0: "batch", 3: "source"}},
    )


def build_manifest(model: VideoShowAttendTell, name: str, version: int, limits: dict | None = None,
                   description: str | None = None) -> dict:
    """The video manifest: (frame, cell) memory and keys are static; h and c are replaced state."""
    cfg = model.cfg
    return {
        "format_version": 1,
        "name": name,
        "version": version,
        "task": "video-captioning",
        "description": description or (
            f"English clip captioner (words): {cfg.frames} frames of {cfg.frame_size} x {cfg.frame_size}, a CNN "
            f"per frame to {cfg.grid} x {cfg.grid} cells, a BiLSTM over frames, an LSTM speller attending over "
            "every (frame, cell)"),
        "languages": {"source": ["en"], "target": ["en"]},
        "tokenizer": {"file": "tokenizer.json", "word_boundary": "metaspace-cjk"},
        "special_tokens": {"pad": vocabulary.PAD_ID, "unk": vocabulary.UNK_ID, "eos": vocabulary.EOS_ID,
                           "suppress": vocabulary.suppressed_ids()},
        "decoder_start": {"en": vocabulary.START_ID},
        "input": {
            "kind": "video", "frames": cfg.frames, "height": cfg.frame_size, "width": cfg.frame_size, "channels": 3,
            "normalize": {"mean": list(cfg.mean), "std": list(cfg.std)},
            "grid": {"rows": cfg.grid, "cols": cfg.grid},
            "limits": dict(limits or LIMITS),
        },
        **graph_sections(cfg),
    }


def export_model(model: VideoShowAttendTell, tokenizer: Tokenizer, out_dir: pathlib.Path, name: str = "caption-video",
                 **manifest_options) -> pathlib.Path:
    """Writes the whole version folder (its name is the version) and returns it."""
    out_dir = pathlib.Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    export_graphs(model, out_dir)
    write_tokenizer_and_manifest(out_dir, tokenizer, build_manifest(model, name, int(out_dir.name), **manifest_options))
    return out_dir


def parity(model: VideoShowAttendTell, model_dir: pathlib.Path, shapes=PARITY_SHAPES, steps: int = 6,
           seed: int = 0) -> dict:
    """Largest |ONNX Runtime - PyTorch| per output over random clips of each (batch, frames) shape, the decoder
    chained `steps` steps (both sides fed the same tokens, each its own state)."""
    rng, model, size = np.random.default_rng(seed), model.eval(), model.cfg.frame_size
    clips = (torch.from_numpy(rng.normal(0, 1, (batch, frames, 3, size, size)).astype(np.float32))
             for batch, frames in shapes)
    return chained_parity(model, model_dir, clips, steps, rng, vocabulary.START_ID)


def main() -> None:
    from attnserve.export.video.train import load_model

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkpoint", type=pathlib.Path, required=True)
    parser.add_argument("--out", type=pathlib.Path, required=True, help="version folder, e.g. models/caption-video/1")
    parser.add_argument("--name", default="caption-video")
    args = parser.parse_args()
    torch.set_num_threads(1)
    model, tokenizer, _ = load_model(args.checkpoint)
    export_model(model, tokenizer, args.out, args.name)
    worst = parity(model, args.out)
    print(json.dumps({"exported": str(args.out), "parity_shapes": PARITY_SHAPES, "max_abs_diff": worst}, indent=2))


if __name__ == "__main__":
    main()
