"""The encoder and cached decoder-step graphs of a transformers VisionEncoderDecoderModel with a ViT encoder
and a GPT-2 decoder with cross-attention (nlpconnect/vit-gpt2-image-captioning), written against the model's
own modules so that the graphs compute what its eager forward computes.

    encoder: pixel_values (B, C, H, W) -> ViT embeddings (class token + patches + positions), ViT layers,
             final layernorm -> (B, 1 + rows * cols, Dv) -> enc_to_dec_proj where the widths differ ->
             each GPT-2 layer's cross K/V (c_attn of the encoder states)
    decoder step: x = wte(ids) + wpe(position_ids); per GPT-2 block (pre-norm):
             x += attn(ln_1(x)) over the cache and the new token; x += crossattention(ln_cross_attn(x));
             x += mlp(ln_2(x)); then ln_f, logits = x @ wte^T (the tied lm_head)

ViT runs as transformers runs it (its modules called in ViTModel's order, the pooler left out: the decoder
reads the last hidden states). The step is re-assembled from GPT-2's modules because transformers' forward
numbers positions by cache length for the whole batch, while the contract's step takes each row's position
and a mask over cache slots (docs/model-contract.md). Every image has the same size, so the cross-attention
has no mask; it returns every layer's and head's weights as `cross_attentions` (B, L, H, 1 + rows * cols).
tests/test_import_vision_encoder_decoder.py checks every output against the eager model.
"""

from __future__ import annotations

import pathlib

import torch
from torch import nn

from attnserve.export.common.onnx_graphs import kv_names, kv_static_and_state, trace
from attnserve.export.importers.seq2seq_graphs import merge_heads, split_heads


class EncoderGraph(nn.Module):
    """pixel_values -> each decoder layer's cross K/V (B, H, S, Dh), S = 1 + rows * cols."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.vit = model.encoder
        self.proj = getattr(model, "enc_to_dec_proj", None)  # only where ViT's width differs from GPT-2's
        self.blocks = model.decoder.transformer.h
        self.heads = model.decoder.config.n_head

    def forward(self, pixel_values):
        x = self.vit.embeddings(pixel_values)  # (B, S, Dv)
        for layer in self.vit.layers:  # every image fills the grid: no attention mask
            x = layer(x, None)
        x = self.vit.layernorm(x)
        if self.proj is not None:
            x = self.proj(x)  # (B, S, D)
        cross = []
        for block in self.blocks:
            k, v = block.crossattention.c_attn(x).split(x.shape[-1], dim=2)
            cross += [split_heads(k, self.heads), split_heads(v, self.heads)]
        return tuple(cross)


class DecoderStepGraph(nn.Module):
    """One cached GPT-2 step for every row: input_ids, position_ids, decoder_attention_mask, the self K/V
    cache, the cross K/V -> logits, the new self K/V, cross_attentions."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.gpt2 = model.decoder.transformer
        self.lm_head = model.decoder.lm_head
        self.heads = model.decoder.config.n_head

    def forward(self, input_ids, position_ids, decoder_attention_mask, *caches):
        g, n = self.gpt2, len(self.gpt2.h)
        self_mask = decoder_attention_mask.bool()[:, None, None, :]  # (B, 1, 1, T+1)
        x = g.wte(input_ids) + g.wpe(position_ids)  # (B, 1, D)
        new_kv, cross_weights = [], []
        for i, block in enumerate(g.h):
            past_k, past_v = caches[2 * i], caches[2 * i + 1]  # (B, H, T, Dh)
            cross_k, cross_v = caches[2 * n + 2 * i], caches[2 * n + 2 * i + 1]  # (B, H, S, Dh)
            q, k, v = (split_heads(t, self.heads) for t in block.attn.c_attn(block.ln_1(x)).split(x.shape[-1], dim=2))
            new_kv += [k, v]
            x = x + block.attn.c_proj(_cached_attention(q, past_k, past_v, k, v, self_mask, block.attn.scaling))
            q = split_heads(block.crossattention.q_attn(block.ln_cross_attn(x)), self.heads)  # (B, H, 1, Dh)
            weights = (torch.matmul(q, cross_k.transpose(2, 3)) * block.crossattention.scaling).softmax(-1)
            cross_weights.append(weights[:, :, 0])  # (B, H, S)
            x = x + block.crossattention.c_proj(merge_heads(torch.matmul(weights, cross_v)))
            x = x + block.mlp(block.ln_2(x))
        x = g.ln_f(x)
        # A bias makes the exporter emit one Gemm reading the tied table instead of a transposed copy of it.
        weight = self.lm_head.weight
        logits = nn.functional.linear(x[:, 0], weight, weight.new_zeros(weight.shape[0]))  # (B, V)
        return (logits, *new_kv, torch.stack(cross_weights, dim=1))  # cross_attentions (B, L, H, S)


def _cached_attention(q, past_k, past_v, new_k, new_v, mask, scaling):
    """GPT-2 self-attention of the new position over the cache and itself, the cache never concatenated
    (only the scores are joined); masked slots get finfo.min, as transformers' causal mask gives them."""
    scores = torch.cat([torch.matmul(q, past_k.transpose(2, 3)), torch.matmul(q, new_k.transpose(2, 3))], -1)
    weights = (scores * scaling).masked_fill(~mask, torch.finfo(scores.dtype).min).softmax(-1)
    on_past, on_new = weights.split([past_k.shape[2], 1], dim=-1)
    return merge_heads(torch.matmul(on_past, past_v) + torch.matmul(on_new, new_v))  # (B, 1, D)


def export(model: nn.Module, out_dir: pathlib.Path) -> None:
    """Writes encoder.onnx and decoder.onnx of `model` (eval mode) into out_dir; batch and cache axes dynamic."""
    model.eval()
    vit, gpt = model.config.encoder, model.config.decoder
    layers, heads, d_head = gpt.n_layer, gpt.n_head, gpt.n_embd // gpt.n_head
    cross_names = kv_names("present", "encoder", layers)
    pixels = torch.randn(2, vit.num_channels, vit.image_size, vit.image_size)
    trace(EncoderGraph(model).eval(), (pixels,), str(out_dir / "encoder.onnx"),
          input_names=["pixel_values"], output_names=cross_names,
          dynamic_axes={"pixel_values": {0: "batch"}, **{n: {0: "batch"} for n in cross_names}})
    b, t, s = 2, 3, source_length(vit)
    past = [torch.randn(b, heads, t, d_head) for _ in range(2 * layers)]
    cross = [torch.randn(b, heads, s, d_head) for _ in range(2 * layers)]
    inputs = (torch.randint(0, gpt.vocab_size, (b, 1)), torch.full((b, 1), t, dtype=torch.int64),
              torch.ones(b, t + 1, dtype=torch.int64), *past, *cross)
    past_names = kv_names("past_key_values", "decoder", layers)
    cross_inputs = kv_names("past_key_values", "encoder", layers)
    present = kv_names("present", "decoder", layers)
    trace(
        DecoderStepGraph(model).eval(), inputs, str(out_dir / "decoder.onnx"),
        input_names=["input_ids", "position_ids", "decoder_attention_mask", *past_names, *cross_inputs],
        output_names=["logits", *present, "cross_attentions"],
        dynamic_axes={"input_ids": {0: "batch"}, "position_ids": {0: "batch"},
                      "decoder_attention_mask": {0: "batch", 1: "past_plus_one"},
                      **{n: {0: "batch", 2: "past"} for n in past_names}, **{n: {0: "batch"} for n in cross_inputs},
                      "logits": {0: "batch"}, **{n: {0: "batch"} for n in present}, "cross_attentions": {0: "batch"}})
    model.eval()  # torch.onnx.export leaves the modules in training mode


def source_length(vit_config) -> int:
    """Encoder positions: the class token, then one per patch."""
    return 1 + (vit_config.image_size // vit_config.patch_size) ** 2


def manifest_graph_fields(config) -> dict:
    """The manifest fields describing the graphs `export` writes: attention, encoder, decoder, static (each
    layer's cross K/V; no encoder mask: every image fills the grid), state (each layer's self K/V)."""
    gpt = config.decoder
    layers, heads = gpt.n_layer, gpt.n_head
    static, state = kv_static_and_state(layers, heads, gpt.n_embd // heads)
    return {
        "attention": {"output": "cross_attentions", "layers": layers, "heads": heads},
        "encoder": {"file": "encoder.onnx", "inputs": {"pixel_values": "pixel_values"}},
        "decoder": {"file": "decoder.onnx",
                    "inputs": {"input_ids": "input_ids", "position_ids": "position_ids",
                               "self_attention_mask": "decoder_attention_mask"},
                    "outputs": {"logits": "logits"}},
        "static": [s for s in static if s["from"] != "attention_mask"],
        "state": state,
    }
