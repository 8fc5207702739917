"""The encoder and cached decoder-step graphs of a transformers `WhisperForConditionalGeneration`, written
against the model's own modules (as seq2seq_graphs.py does for the BART family).

    encoder: log-mel (B, T, n_mels) -> transpose -> conv1 + GELU -> conv2 (stride 2) + GELU
             -> + embed_positions (the first T / 2 rows) -> pre-norm layers -> layer_norm
             -> each decoder layer's cross K/V, and the encoder mask at the encoder's rate (B, T / 2)
    decoder step: seq2seq_graphs.DecoderStepGraph with Layout(pre_norm=True): learned positions
             (embed_positions.weight[position_ids]), no embedding scale, tied proj_out, no logits bias

Whisper's cross-attention has no mask (every frame of the 30 s window is real input, padding included);
the step still reads `encoder_attention_mask` so the contract's decoder table is unchanged, and the encoder
outputs it all ones, derived from its input mask (so the exporter keeps that input). tests/test_import_whisper.py
checks every output against the eager model (`output_attentions`).
"""

from __future__ import annotations

import pathlib

import torch
from torch import nn

from attnserve.export.importers import seq2seq_graphs
from attnserve.export.importers.seq2seq_graphs import merge_heads, project_kv, split_heads
from attnserve.export.common.onnx_graphs import kv_names, trace

LAYOUT = seq2seq_graphs.Layout(pre_norm=True)


class WhisperEncoderGraph(nn.Module):
    """input_features (B, T, M), attention_mask (B, T) -> encoder_hidden_states (B, T/2, D),
    encoder_attention_mask (B, T/2), then each decoder layer's cross K/V (B, H, T/2, Dh)."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.encoder, self.decoder_layers = model.model.encoder, model.model.decoder.layers
        self.parts = seq2seq_graphs.Parts(model, LAYOUT, model.model.decoder.embed_positions.weight)
        cfg = model.config
        self.encoder_heads, self.decoder_heads = cfg.encoder_attention_heads, cfg.decoder_attention_heads

    def forward(self, input_features, attention_mask):
        enc, p = self.encoder, self.parts
        x = nn.functional.gelu(enc.conv1(input_features.transpose(1, 2)))  # (B, D, T)
        x = nn.functional.gelu(enc.conv2(x)).transpose(1, 2)  # (B, T/2, D)
        x = x + enc.embed_positions.weight[: x.shape[1]]
        frames = attention_mask[:, ::2][:, : x.shape[1]]  # (B, T/2) the mask at the encoder's rate
        for layer in enc.layers:
            def self_attention(h, layer=layer):
                return _unmasked_attention(layer.self_attn, h, self.encoder_heads)
            x = p.block(x, layer.self_attn_layer_norm, self_attention)
            x = p.block(x, layer.final_layer_norm, seq2seq_graphs.feed_forward(layer))
        x = enc.layer_norm(x)
        cross = [project_kv(layer.encoder_attn, x, self.decoder_heads) for layer in self.decoder_layers]
        return (x, torch.ones_like(frames), *[t for kv in cross for t in kv])


def _unmasked_attention(attn: nn.Module, x: torch.Tensor, heads: int) -> torch.Tensor:
    """Self-attention of x (B, T, D) over every position: Whisper masks no frame, so the graph spends no
    masking op on the (B, H, 1500, 1500) scores, and the scaling goes on the queries, 23 times smaller."""
    q, (k, v) = split_heads(attn.q_proj(x) * attn.scaling, heads), project_kv(attn, x, heads)  # (B, H, T, Dh)
    weights = torch.matmul(q, k.transpose(2, 3)).softmax(dim=-1)  # (B, H, T, T)
    return attn.out_proj(merge_heads(torch.matmul(weights, v)))


def export(model: nn.Module, out_dir: pathlib.Path) -> None:
    """Writes encoder.onnx and decoder.onnx of `model` into out_dir, batch (and cache) axes dynamic."""
    model.eval()
    cfg, out_dir = model.config, pathlib.Path(out_dir)
    layers, heads = cfg.decoder_layers, cfg.decoder_attention_heads
    d_head, frames = cfg.d_model // heads, 2 * cfg.max_source_positions
    encoder = WhisperEncoderGraph(model).eval()
    decoder = seq2seq_graphs.DecoderStepGraph(encoder.parts, heads).eval()
    b, t, s = 2, 3, cfg.max_source_positions  # unequal example sizes: a wrongly fixed axis shows in the tests
    cross = kv_names("present", "encoder", layers)
    trace(
        encoder, (torch.randn(b, frames, cfg.num_mel_bins), torch.ones(b, frames, dtype=torch.int64)),
        str(out_dir / "encoder.onnx"), input_names=["input_features", "attention_mask"],
        output_names=["encoder_hidden_states", "encoder_attention_mask", *cross],
        dynamic_axes={"input_features": {0: "batch"}, "attention_mask": {0: "batch"},
                      "encoder_hidden_states": {0: "batch"}, "encoder_attention_mask": {0: "batch"},
                      **{n: {0: "batch"} for n in cross}},
    )
    past, past_cross = kv_names("past_key_values", "decoder", layers), kv_names("past_key_values", "encoder", layers)
    present = kv_names("present", "decoder", layers)
    step_inputs = (torch.randint(0, cfg.vocab_size, (b, 1)), torch.full((b, 1), t, dtype=torch.int64),
                   torch.ones(b, t + 1, dtype=torch.int64), torch.ones(b, s, dtype=torch.int64),
                   *[torch.randn(b, heads, t, d_head) for _ in past], *[torch.randn(b, heads, s, d_head) for _ in past_cross])
    trace(
        decoder, step_inputs, str(out_dir / "decoder.onnx"),
        input_names=["input_ids", "position_ids", "decoder_attention_mask", "encoder_attention_mask", *past, *past_cross],
        output_names=["logits", *present, "cross_attentions"],
        dynamic_axes={"input_ids": {0: "batch"}, "position_ids": {0: "batch"},
                      "decoder_attention_mask": {0: "batch", 1: "past_plus_one"}, "encoder_attention_mask": {0: "batch"},
                      **{n: {0: "batch", 2: "past"} for n in past}, **{n: {0: "batch"} for n in past_cross},
                      "logits": {0: "batch"}, **{n: {0: "batch"} for n in present}, "cross_attentions": {0: "batch"}},
    )
    model.eval()  # torch.onnx.export leaves the modules in training mode


def manifest_graph_fields(config) -> dict:
    """The manifest's attention, encoder, decoder, static and state fields for the graphs `export` writes."""
    fields = seq2seq_graphs.manifest_graph_fields(config)
    fields["encoder"] = {"file": "encoder.onnx",
                         "inputs": {"input_features": "input_features", "attention_mask": "attention_mask"}}
    fields["static"][0] = {"from": "encoder_attention_mask", "to": "encoder_attention_mask", "batch_axis": 0,
                           "source_axis": 1}
    return fields
