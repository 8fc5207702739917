"""Exports a trained translator (Transformer or recurrent) to the attnserve model contract (docs/model-contract.md):
encoder.onnx, decoder.onnx (one cached step that also returns its cross-attention), manifest.json and
tokenizer.json, in one version folder of a model repository.

    python -m attnserve.export.translation.onnx_export --checkpoint runs/zh-en/best.pt --out models/translate-zh-en/1
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import pathlib

import torch
from torch import nn
from tokenizers import Tokenizer

from attnserve.export.translation import bpe
from attnserve.export.translation.architectures import load_checkpoint
from attnserve.export.translation.model import Transformer, TransformerConfig

OPSET = 17


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


def kv_names(prefix: str, part: str, layers: int) -> list[str]:
    return [f"{prefix}.{i}.{part}.{kind}" for i in range(layers) for kind in ("key", "value")]


def graph_names(layers: int) -> dict[str, list[str]]:
    return {
        "encoder_inputs": ["input_ids", "attention_mask"],
        "encoder_outputs": ["encoder_hidden_states", *kv_names("present", "encoder", layers)],
        "decoder_inputs": [
            "input_ids",
            "position_ids",
            "decoder_attention_mask",
            "encoder_attention_mask",
            *kv_names("past_key_values", "decoder", layers),
            *kv_names("past_key_values", "encoder", layers),
        ],
        "decoder_outputs": ["logits", *kv_names("present", "decoder", layers), "cross_attentions"],
    }


def export_graphs(model: Transformer, out_dir: pathlib.Path) -> None:
    """Writes encoder.onnx and decoder.onnx with batch, source and cache axes left dynamic."""
    model = model.eval()
    cfg = model.cfg
    export_step_graphs(EncoderGraph(model), DecoderStepGraph(model), out_dir, cfg.vocab_size, cfg.vocab_size,
                       cfg.heads, cfg.d_model // cfg.heads, cfg.decoder_layers)


def export_step_graphs(
    encoder: nn.Module, decoder: nn.Module, out_dir: pathlib.Path, source_vocab: int, target_vocab: int,
    heads: int, d_head: int, layers: int,
) -> None:
    """Traces an encoder and a decoder-step module with the contract's names (graph_names) into
    encoder.onnx and decoder.onnx, batch, source and cache axes dynamic (export/importers/ uses it too)."""
    out_dir = pathlib.Path(out_dir)
    names = graph_names(layers)
    # Example sizes are all different so a wrongly fixed axis shows up in the tests.
    b, s, t = 2, 7, 3
    src = torch.randint(6, source_vocab, (b, s))
    src_mask = torch.ones(b, s, dtype=torch.int64)
    src_mask[1, 5:] = 0
    torch.onnx.export(
        encoder,
        (src, src_mask),
        str(out_dir / "encoder.onnx"),
        input_names=names["encoder_inputs"],
        output_names=names["encoder_outputs"],
        dynamic_axes={
            "input_ids": {0: "batch", 1: "source"},
            "attention_mask": {0: "batch", 1: "source"},
            "encoder_hidden_states": {0: "batch", 1: "source"},
            **{n: {0: "batch", 2: "source"} for n in names["encoder_outputs"][1:]},
        },
        opset_version=OPSET,
        dynamo=False,
        external_data=False,
    )
    past = [torch.randn(b, heads, t, d_head) for _ in range(2 * layers)]
    cross = [torch.randn(b, heads, s, d_head) for _ in range(2 * layers)]
    step_inputs = (
        torch.randint(6, target_vocab, (b, 1)),
        torch.full((b, 1), t, dtype=torch.int64),
        torch.ones(b, t + 1, dtype=torch.int64),
        src_mask,
        *past,
        *cross,
    )
    dynamic = {
        "input_ids": {0: "batch"},
        "position_ids": {0: "batch"},
        "decoder_attention_mask": {0: "batch", 1: "past_plus_one"},
        "encoder_attention_mask": {0: "batch", 1: "source"},
        **{n: {0: "batch", 2: "past"} for n in kv_names("past_key_values", "decoder", layers)},
        **{n: {0: "batch", 2: "source"} for n in kv_names("past_key_values", "encoder", layers)},
        "logits": {0: "batch"},
        **{n: {0: "batch"} for n in kv_names("present", "decoder", layers)},
        "cross_attentions": {0: "batch", 3: "source"},
    }
    torch.onnx.export(
        decoder,
        step_inputs,
        str(out_dir / "decoder.onnx"),
        input_names=names["decoder_inputs"],
        output_names=names["decoder_outputs"],
        dynamic_axes=dynamic,
        opset_version=OPSET,
        dynamo=False,
        external_data=False,
    )


def kv_static_and_state(layers: int, heads: int, d_head: int) -> tuple[list[dict], list[dict]]:
    """The manifest's `static` (the encoder mask, each layer's cross K/V) and `state` (each layer's self
    K/V, appended) of a cached Transformer decoder step."""
    static = [{"from": "attention_mask", "to": "encoder_attention_mask", "batch_axis": 0, "source_axis": 1}]
    static += [
        {"from": src, "to": dst, "batch_axis": 0, "source_axis": 2}
        for src, dst in zip(kv_names("present", "encoder", layers), kv_names("past_key_values", "encoder", layers))
    ]
    state = [
        {
            "input": src,
            "output": dst,
            "update": "append",
            "batch_axis": 0,
            "time_axis": 2,
            "dtype": "float32",
            "shape": ["batch", heads, 0, d_head],
            "init": "zeros",
        }
        for src, dst in zip(kv_names("past_key_values", "decoder", layers), kv_names("present", "decoder", layers))
    ]
    return static, state


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


def translation_manifest(
    tokenizer: Tokenizer,
    name: str,
    version: int,
    description: str,
    attention: dict,
    decoder_inputs: dict,
    static: list[dict],
    state: list[dict],
    model_config: dict,
    **extra,
) -> dict:
    """What every zh-TW <-> en translator's manifest shares around its architecture-specific parts."""
    max_positions = model_config["max_positions"]
    # Requests that name no search get this many beams (the manifest's decoding.beam_size); none = greedy.
    decoding = {"decoding": {"beam_size": extra["default_beam_size"]}} if extra.get("default_beam_size") else {}
    return {
        "format_version": 1,
        "name": name,
        "version": version,
        "task": "translation",
        "description": description,
        "languages": {"source": ["en", "zh-TW"], "target": ["en", "zh-TW"]},
        "tokenizer": {"file": "tokenizer.json", "word_boundary": "metaspace-cjk"},
        "special_tokens": {
            "pad": bpe.PAD_ID,
            "unk": bpe.UNK_ID,
            "eos": bpe.EOS_ID,
            "suppress": list(extra.get("suppress_ids", bpe.suppressed_ids(tokenizer))),
        },
        "decoder_start": bpe.language_token_ids(tokenizer),
        "limits": {
            "max_source_tokens": extra.get("max_source_tokens", max_positions // 2),
            "max_new_tokens": extra.get("max_new_tokens", max_positions // 2),
        },
        **decoding,
        "attention": {**attention, "default_layer": extra.get("attention_layer", -1)},
        "encoder": {"file": "encoder.onnx", "inputs": {"input_ids": "input_ids", "attention_mask": "attention_mask"}},
        "decoder": {"file": "decoder.onnx", "inputs": decoder_inputs, "outputs": {"logits": "logits"}},
        "static": static,
        "state": state,
        "model_config": model_config,
    }


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
        # Imported here: the recurrent exporter builds on this module's shared manifest fields.
        from attnserve.export.translation import recurrent_export

        recurrent_export.export_graphs(model, out_dir)
        manifest = recurrent_export.build_manifest(model.cfg, tokenizer, name, version, **extra)
    write_tokenizer_and_manifest(out_dir, tokenizer, manifest)
    return out_dir


def write_tokenizer_and_manifest(out_dir: pathlib.Path, tokenizer, manifest: dict) -> None:
    """The two files every version folder has beside its graphs (every exporter writes them this way)."""
    tokenizer.save(str(out_dir / "tokenizer.json"))
    (out_dir / "manifest.json").write_text(json.dumps(manifest, indent=2, ensure_ascii=False) + "\n")


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
