"""Exports the recurrent translator to the model contract (docs/model-contract.md).

encoder.onnx computes everything constant for a request once: the encoder states, their score-space
projection (`encoder_keys`) and the decoder's initial LSTM state. decoder.onnx runs one step; its state
(LSTM h and c, and the attentional vector fed into the next step) is *replaced* every step, and its
`cross_attentions` output has one layer and one head. Uses the legacy TorchScript exporter, which keeps
LSTM time axes dynamic (the dynamo exporter fixes them to the example's size).
"""

from __future__ import annotations

import dataclasses
import pathlib

import torch
from tokenizers import Tokenizer
from torch import nn

from attnserve.export.common.onnx_graphs import trace
from attnserve.export.translation.manifest import translation_manifest
from attnserve.export.translation.recurrent import RecurrentConfig, RecurrentTranslator

# Decoder state: (past input, present output, width attribute of the config).
STATE = [
    ("past_state.hidden", "present_state.hidden", "decoder_hidden"),
    ("past_state.cell", "present_state.cell", "decoder_hidden"),
    ("past_state.attentional", "present_state.attentional", "embed_dim"),
]
INITIAL_STATE = ["initial_state.hidden", "initial_state.cell"]

ENCODER_INPUTS = ["input_ids", "attention_mask"]
ENCODER_OUTPUTS = ["encoder_hidden_states", "encoder_keys", *INITIAL_STATE]
DECODER_INPUTS = [
    "input_ids",
    "encoder_attention_mask",
    "encoder_hidden_states",
    "encoder_keys",
    *(past for past, _, _ in STATE),
]
DECODER_OUTPUTS = ["logits", *(present for _, present, _ in STATE), "cross_attentions"]


class EncoderGraph(nn.Module):
    """input_ids, attention_mask -> encoder states, their keys, initial decoder h and c."""

    def __init__(self, model: RecurrentTranslator):
        super().__init__()
        self.model = model

    def forward(self, input_ids, attention_mask):
        return self.model.encode(input_ids, attention_mask)


class DecoderStepGraph(nn.Module):
    """One decoder step for every row; the state outputs replace the state inputs."""

    def __init__(self, model: RecurrentTranslator):
        super().__init__()
        self.model = model

    def forward(self, input_ids, encoder_attention_mask, memory, keys, h, c, feed):
        logits, h, c, feed, weights = self.model.decode_step(
            input_ids[:, 0], h, c, feed, memory, keys, encoder_attention_mask
        )
        return logits, h, c, feed, weights[:, None, None, :]  # attention (B, 1 layer, 1 head, S)


def example_inputs(cfg: RecurrentConfig) -> tuple[tuple, tuple]:
    """Encoder and decoder example inputs; sizes all differ so a wrongly fixed axis shows up in the tests."""
    b, s = 2, 7
    src = torch.randint(6, cfg.vocab_size, (b, s))
    mask = torch.ones(b, s, dtype=torch.int64)
    mask[1, 5:] = 0
    memory = torch.randn(b, s, 2 * cfg.encoder_hidden)
    keys = torch.randn(b, s, cfg.attention_dim if cfg.attention == "additive" else cfg.decoder_hidden)
    state = [torch.randn(b, getattr(cfg, width)) for _, _, width in STATE]
    return (src, mask), (torch.randint(6, cfg.vocab_size, (b, 1)), mask, memory, keys, *state)


def export_graphs(model: RecurrentTranslator, out_dir: pathlib.Path) -> None:
    """Writes encoder.onnx and decoder.onnx with the batch and source axes left dynamic."""
    model = model.eval()
    encoder_example, decoder_example = example_inputs(model.cfg)
    batch_source = {0: "batch", 1: "source"}
    trace(
        EncoderGraph(model),
        encoder_example,
        str(out_dir / "encoder.onnx"),
        input_names=ENCODER_INPUTS,
        output_names=ENCODER_OUTPUTS,
        dynamic_axes={
            **{name: batch_source for name in ENCODER_INPUTS + ENCODER_OUTPUTS[:2]},
            **{name: {0: "batch"} for name in INITIAL_STATE},
        },
    )
    trace(
        DecoderStepGraph(model),
        decoder_example,
        str(out_dir / "decoder.onnx"),
        input_names=DECODER_INPUTS,
        output_names=DECODER_OUTPUTS,
        dynamic_axes={
            **{name: batch_source for name in DECODER_INPUTS[1:4]},
            **{name: {0: "batch"} for name in ["input_ids", "logits", *(n for s in STATE for n in s[:2])]},
            "cross_attentions": {0: "batch", 3: "source"},
        },
    )


def build_manifest(cfg: RecurrentConfig, tokenizer: Tokenizer, name: str, version: int, **extra) -> dict:
    """Encoder states, keys and mask are static; h and c start from the encoder, h~ from zeros; all replaced."""
    static = [
        {"from": "attention_mask", "to": "encoder_attention_mask", "batch_axis": 0, "source_axis": 1},
        {"from": "encoder_hidden_states", "to": "encoder_hidden_states", "batch_axis": 0, "source_axis": 1},
        {"from": "encoder_keys", "to": "encoder_keys", "batch_axis": 0, "source_axis": 1},
    ]
    inits = [{"from": name} for name in INITIAL_STATE] + ["zeros"]
    state = [
        {
            "input": past,
            "output": present,
            "update": "replace",
            "batch_axis": 0,
            "dtype": "float32",
            "shape": ["batch", getattr(cfg, width)],
            "init": init,
        }
        for (past, present, width), init in zip(STATE, inits)
    ]
    score = "additive (Bahdanau)" if cfg.attention == "additive" else "multiplicative (Luong)"
    return translation_manifest(
        tokenizer,
        name,
        version,
        description=extra.pop("description", f"Traditional Chinese <-> English BiLSTM + LSTM, {score} attention"),
        attention={"output": "cross_attentions", "layers": 1, "heads": 1},
        decoder_inputs={"input_ids": "input_ids"},
        static=static,
        state=state,
        model_config=dataclasses.asdict(cfg),
        **extra,
    )
