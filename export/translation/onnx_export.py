"""Exports a trained translator (Transformer or recurrent) to the attnserve model contract (docs/model-contract.md):
encoder.onnx, decoder.onnx (one cached step that also returns its cross-attention), manifest.json and
tokenizer.json, in one version folder of a model repository.

    python -m attnserve.export.translation.onnx_export --checkpoint runs/zh-en/best.pt --out models/translate-zh-en/1
"""

from __future__ import annotations

import argparse
import dataclasses
import pathlib

import torch
from torch import nn
from tokenizers import Tokenizer

from attnserve.export.common.onnx_graphs import export_step_graphs, kv_static_and_state, write_tokenizer_and_manifest
from attnserve.export.translation import recurrent_export
from attnserve.export.translation.architectures import load_checkpoint
from attnserve.export.translation.manifest import translation_manifest
from attnserve.export.translation.model import Transformer, TransformerConfig


class EncoderGraph(nn.Module):
    """input_ids, attention_mask -> encoder_hidden_states, then cross K/V per decoder layer."""

    def __init__(self, model: Transformer):
        super().__init__()
        self.model = model

    def forward(self, input_ids, attention_mask):
        states, cross_kv = self.model.encode(input_ids, attention_mask)
        return (states, *[t for kv in cross_kv for t in kv])


class DecoderStepGraph(nn.Module):
    """One cached decoder step for every row; see the decoder table in docs/model-contract.md."""

    def __init__(self, model: Transformer):
        super().__init__()
        self.model = model
        self.layers = model.cfg.decoder_layers

    def forward(self, input_ids, position_ids, decoder_attention_mask, encoder_attention_mask, *caches):
        n = self.layers
        past_kv = [(caches[2 * i], caches[2 * i + 1]) for i in range(n)]
        cross_kv = [(caches[2 * n + 2 * i], caches[2 * n + 2 * i + 1]) for i in range(n)]
        self_mask = decoder_attention_mask.bool()[:, None, None, :]  # (B, 1, 1, T+1)
        hidden, new_kv, weights = self.model.decode_hidden(
            input_ids, position_ids, self_mask, past_kv, cross_kv, encoder_attention_mask
        )
        logits = self.model.project(hidden[:, 0])  # (B, V), from 2-D input so the embedding is not copied
        # weights (B, L, H, 1, S) -> (B, L, H, S)
        return (logits, *[t for kv in new_kv for t in kv], weights[:, :, :, 0])


def export_graphs(model: Transformer, out_dir: pathlib.Path) -> None:
    """Writes encoder.onnx and decoder.onnx with batch, source and cache axes left dynamic."""
    model = model.eval()
    cfg = model.cfg
    export_step_graphs(EncoderGraph(model), DecoderStepGraph(model), out_dir, cfg.vocab_size, cfg.vocab_size,
                       cfg.heads, cfg.d_model // cfg.heads, cfg.decoder_layers)


def build_manifest(cfg: TransformerConfig, tokenizer: Tokenizer, name: str, version: int, **extra) -> dict:
    """The manifest for a Transformer: cross K/V and the encoder mask are static, self K/V is appended state."""
    layers, dh = cfg.decoder_layers, cfg.d_model // cfg.heads
    static, state = kv_static_and_state(layers, cfg.heads, dh)
    return translation_manifest(
        tokenizer,
        name,
        version,
        description=extra.pop("description", "Traditional Chinese <-> English Transformer"),
        attention={"output": "cross_attentions", "layers": layers, "heads": cfg.heads},
        decoder_inputs={
            "input_ids": "input_ids",
            "position_ids": "position_ids",
            "self_attention_mask": "decoder_attention_mask",
        },
        static=static,
        state=state,
        model_config=dataclasses.asdict(cfg),
        **extra,
    )


def export_model(
    model: torch.nn.Module, tokenizer: Tokenizer, out_dir: pathlib.Path, name: str, version: int, **extra
) -> pathlib.Path:
    """Writes the whole version folder of a Transformer or a recurrent translator and returns it."""
    out_dir = pathlib.Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    if isinstance(model, Transformer):
        export_graphs(model, out_dir)
        manifest = build_manifest(model.cfg, tokenizer, name, version, **extra)
    else:
        recurrent_export.export_graphs(model, out_dir)
        manifest = recurrent_export.build_manifest(model.cfg, tokenizer, name, version, **extra)
    write_tokenizer_and_manifest(out_dir, tokenizer, manifest)
    return out_dir


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkpoint", type=pathlib.Path, required=True)
    parser.add_argument("--out", type=pathlib.Path, required=True, help="version folder, e.g. models/NAME/1")
    parser.add_argument("--name", default="translate-zh-en")
    parser.add_argument("--max-source-tokens", type=int, default=256)
    parser.add_argument("--max-new-tokens", type=int, default=256)
    parser.add_argument(
        "--attention-layer", type=int, default=-1, help="layer served when a request names none (the best aligned)"
    )
    parser.add_argument("--default-beam-size", type=int,
                        help="beams for requests that name no search (unset: greedy)")
    args = parser.parse_args()
    model, tokenizer = load_checkpoint(args.checkpoint)
    version = int(args.out.name)
    export_model(
        model,
        tokenizer,
        args.out,
        args.name,
        version,
        max_source_tokens=args.max_source_tokens,
        max_new_tokens=args.max_new_tokens,
        attention_layer=args.attention_layer,
        default_beam_size=args.default_beam_size,
    )
    print(f"exported {args.name} v{version} to {args.out}")


if __name__ == "__main__":
    main()
