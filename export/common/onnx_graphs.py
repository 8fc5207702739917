"""What every exporter shares: the opset, the contract's names and tracing for a cached encoder-decoder step
(the Transformer translator and export/importers/ use it), and the two files beside a version's graphs.

The step graphs follow docs/model-contract.md's decoder table: `past_key_values.{i}.decoder.key` in,
`present.{i}.decoder.key` out, the encoder's cross K/V as `present.{i}.encoder.*` handed to the decoder as
static inputs, and the step's cross-attention as `cross_attentions`.
"""

from __future__ import annotations

import json
import pathlib

import torch
from torch import nn

OPSET = 17


def trace(module: nn.Module, example: tuple, path: str, **names_and_axes) -> None:
    """torch.onnx.export as every exporter here runs it: the legacy TorchScript exporter (it keeps LSTM time and
    batch axes dynamic; the dynamo exporter fixes them to the example's), at OPSET, weights inside the file."""
    torch.onnx.export(module, example, path, **names_and_axes, opset_version=OPSET, dynamo=False,
                      external_data=False)


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
    _trace_part("encoder", encoder, (src, src_mask), out_dir, names, _encoder_axes(names))
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
    _trace_part("decoder", decoder, step_inputs, out_dir, names, _decoder_axes(layers))


def _trace_part(part: str, module: nn.Module, example: tuple, out_dir: pathlib.Path,
                names: dict[str, list[str]], axes: dict) -> None:
    """Writes `part`.onnx ("encoder" or "decoder") with the contract's input and output names for it."""
    trace(module, example, str(out_dir / f"{part}.onnx"), input_names=names[f"{part}_inputs"],
          output_names=names[f"{part}_outputs"], dynamic_axes=axes)


def _encoder_axes(names: dict[str, list[str]]) -> dict:
    return {
        "input_ids": {0: "batch", 1: "source"},
        "attention_mask": {0: "batch", 1: "source"},
        "encoder_hidden_states": {0: "batch", 1: "source"},
        **{n: {0: "batch", 2: "source"} for n in names["encoder_outputs"][1:]},
    }


def _decoder_axes(layers: int) -> dict:
    return {
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


def write_tokenizer_and_manifest(out_dir: pathlib.Path, tokenizer, manifest: dict) -> None:
    """The two files every version folder has beside its graphs (every exporter writes them this way)."""
    tokenizer.save(str(out_dir / "tokenizer.json"))
    (out_dir / "manifest.json").write_text(json.dumps(manifest, indent=2, ensure_ascii=False) + "\n")
