"""The encoder and cached decoder-step graphs of a BART-family transformers model (Marian, M2M100, mBART), written
against the model's own modules so that the graphs compute what its eager forward computes.

transformers' forward keeps its cache in Python objects and numbers positions by cache length, one length
for the whole batch. The contract's decoder step instead takes each row's position and a mask over cache
slots (rows of one call are at different steps, with holes in their caches: docs/model-contract.md), and
returns every layer's and head's cross-attention. So the step is re-assembled here from the model's
submodules (projections, norms, feed-forward, embeddings), in the model's own order of operations:

    x = embed(ids) * embed_scale + positions[position_ids + offset]   (then layernorm_embedding: mBART)
    per layer (post-norm: sublayer, residual, norm; pre-norm: norm, sublayer, residual):
        self-attention over the cache and the new token, cross-attention over the encoder, feed-forward
    final norm (pre-norm models), logits = lm_head(x) + final_logits_bias

tests/test_import_marian.py checks every output against the eager model (`output_attentions`).
"""

from __future__ import annotations

import dataclasses

import torch
from torch import nn

from attnserve.export.common.onnx_graphs import export_step_graphs, kv_static_and_state


@dataclasses.dataclass(frozen=True)
class Layout:
    """How one family arranges the shared BART blocks."""

    # True: each sublayer reads norm(x) and adds to x (M2M100); False: norm(x + sublayer(x)) (Marian, BART).
    pre_norm: bool
    # Added to every position before the table is read (M2M100: padding_idx + 1; Marian: 0).
    position_offset: int = 0
    # M2M100: a pad token reads the table's zero row at this id (transformers numbers pads padding_idx);
    # None: every token reads its position's row.
    pad_position: int | None = None


class Parts(nn.Module):
    """The submodules both graphs read, pulled out of a `...ForConditionalGeneration` model."""

    def __init__(self, model: nn.Module, layout: Layout, positions: torch.Tensor):
        super().__init__()
        core = model.model
        self.layout = layout
        self.encoder_layers, self.decoder_layers = core.encoder.layers, core.decoder.layers
        # Whisper's encoder reads features through convolutions, not an embedding table.
        self.encoder_embed, self.decoder_embed = getattr(core.encoder, "embed_tokens", None), core.decoder.embed_tokens
        self.encoder_scale, self.decoder_scale = _embed_scale(core.encoder), _embed_scale(core.decoder)
        self.encoder_norm = getattr(core.encoder, "layer_norm", None)  # pre-norm models' final norms
        self.decoder_norm = getattr(core.decoder, "layer_norm", None)
        self.lm_head = model.get_output_embeddings()  # lm_head; Whisper's proj_out
        bias = getattr(model, "final_logits_bias", None)
        self.register_buffer("logits_bias", bias[0].detach().clone() if bias is not None else None, persistent=False)
        # mBART: a norm right after the embeddings, on each side; None elsewhere.
        self.encoder_embed_norm = getattr(core.encoder, "layernorm_embedding", None)
        self.decoder_embed_norm = getattr(core.decoder, "layernorm_embedding", None)
        encoder_positions, decoder_positions = positions if isinstance(positions, tuple) else (positions, positions)
        self.register_buffer("encoder_positions", encoder_positions.detach().clone(), persistent=False)  # (P, D)
        self.register_buffer("decoder_positions", decoder_positions.detach().clone(), persistent=False)  # (P, D)

    def embed(self, side: str, ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Token embeddings plus position rows of one side ("encoder" or "decoder"), normed where the family
        norms them."""
        rows = positions + self.layout.position_offset
        if self.layout.pad_position is not None:
            rows = torch.where(ids == self.layout.pad_position, torch.full_like(rows, self.layout.pad_position), rows)
        parts = ("embed", "scale", "positions", "embed_norm")
        embed, scale, table, norm = (getattr(self, f"{side}_{part}") for part in parts)
        x = embed(ids) * scale + table[rows]
        return x if norm is None else norm(x)

    def block(self, x: torch.Tensor, norm: nn.Module, sublayer) -> torch.Tensor:
        """One residual block in the family's norm order; `sublayer` maps (B, T, D) to (B, T, D)."""
        if self.layout.pre_norm:
            return x + sublayer(norm(x))
        return norm(x + sublayer(x))


def _embed_scale(side: nn.Module) -> float:
    # Marian keeps the scale on the encoder/decoder; M2M100's scaled embedding module applies it itself.
    return float(getattr(side, "embed_scale", 1.0) or 1.0)


def split_heads(x: torch.Tensor, heads: int) -> torch.Tensor:
    b, t, d = x.shape
    return x.view(b, t, heads, d // heads).transpose(1, 2)  # (B, H, T, Dh)


def merge_heads(x: torch.Tensor) -> torch.Tensor:
    b, h, t, dh = x.shape
    return x.transpose(1, 2).reshape(b, t, h * dh)  # (B, T, D)


def _masked_softmax(scores: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    # transformers adds finfo.min where the mask is 0; exp() then gives the same exact zeros.
    return scores.masked_fill(~mask, torch.finfo(scores.dtype).min).softmax(dim=-1)


def attend(attn: nn.Module, x: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor):
    """Queries of x (B, Tq, D) over k, v (B, H, Tk, Dh) where mask (B, 1, 1|Tq, Tk) is True.

    Returns the output (B, Tq, D) and the weights (B, H, Tq, Tk)."""
    q = split_heads(attn.q_proj(x), k.shape[1])
    weights = _masked_softmax(torch.matmul(q, k.transpose(2, 3)) * attn.scaling, mask)
    return attn.out_proj(merge_heads(torch.matmul(weights, v))), weights


def project_kv(attn: nn.Module, x: torch.Tensor, heads: int) -> tuple[torch.Tensor, torch.Tensor]:
    return split_heads(attn.k_proj(x), heads), split_heads(attn.v_proj(x), heads)


def feed_forward(layer: nn.Module):
    return lambda h: layer.fc2(layer.activation_fn(layer.fc1(h)))


class EncoderGraph(nn.Module):
    """input_ids, attention_mask -> encoder_hidden_states, then each decoder layer's cross K/V."""

    def __init__(self, parts: Parts, encoder_heads: int, decoder_heads: int):
        super().__init__()
        self.parts, self.encoder_heads, self.decoder_heads = parts, encoder_heads, decoder_heads

    def forward(self, input_ids, attention_mask):
        p = self.parts
        positions = torch.arange(input_ids.shape[1], device=input_ids.device).expand_as(input_ids)
        x = p.embed("encoder", input_ids, positions)  # (B, S, D)
        mask = attention_mask.bool()[:, None, None, :]  # (B, 1, 1, S)
        for layer in p.encoder_layers:
            def self_attention(h, layer=layer):
                k, v = project_kv(layer.self_attn, h, self.encoder_heads)
                return attend(layer.self_attn, h, k, v, mask)[0]
            x = p.block(x, layer.self_attn_layer_norm, self_attention)
            x = p.block(x, layer.final_layer_norm, feed_forward(layer))
        if p.encoder_norm is not None:
            x = p.encoder_norm(x)
        cross = [project_kv(layer.encoder_attn, x, self.decoder_heads) for layer in p.decoder_layers]
        return (x, *[t for kv in cross for t in kv])


class DecoderStepGraph(nn.Module):
    """One cached step for every row (the decoder table of docs/model-contract.md)."""

    def __init__(self, parts: Parts, heads: int):
        super().__init__()
        self.parts, self.heads = parts, heads

    def forward(self, input_ids, position_ids, decoder_attention_mask, encoder_attention_mask, *caches):
        p, n = self.parts, len(self.parts.decoder_layers)
        self_mask = decoder_attention_mask.bool()[:, None, None, :]  # (B, 1, 1, T+1)
        cross_mask = encoder_attention_mask.bool()[:, None, None, :]  # (B, 1, 1, S)
        x = p.embed("decoder", input_ids, position_ids)  # (B, 1, D)
        new_kv, cross_weights = [], []
        for i, layer in enumerate(p.decoder_layers):
            past_k, past_v = caches[2 * i], caches[2 * i + 1]  # (B, H, T, Dh)
            cross_k, cross_v = caches[2 * n + 2 * i], caches[2 * n + 2 * i + 1]  # (B, H, S, Dh)

            def self_attention(h, layer=layer, past_k=past_k, past_v=past_v):
                k, v = project_kv(layer.self_attn, h, self.heads)  # (B, H, 1, Dh)
                new_kv.extend((k, v))
                return self._attend_cached(layer.self_attn, h, past_k, past_v, k, v, self_mask)

            def cross_attention(h, layer=layer, cross_k=cross_k, cross_v=cross_v):
                out, weights = attend(layer.encoder_attn, h, cross_k, cross_v, cross_mask)
                cross_weights.append(weights[:, :, 0])  # (B, H, S)
                return out

            x = p.block(x, layer.self_attn_layer_norm, self_attention)
            x = p.block(x, layer.encoder_attn_layer_norm, cross_attention)
            x = p.block(x, layer.final_layer_norm, feed_forward(layer))
        if p.decoder_norm is not None:
            x = p.decoder_norm(x)
        # From 2-D input with a bias the exporter emits one Gemm(transB=1) reading the (tied) table itself;
        # without one it folds a transposed copy of it into the graph (133 MB at opus-mt's 65,001 x 512).
        weight = p.lm_head.weight
        bias = p.logits_bias if p.logits_bias is not None else weight.new_zeros(weight.shape[0])
        logits = nn.functional.linear(x[:, 0], weight, bias)  # (B, V)
        return (logits, *new_kv, torch.stack(cross_weights, dim=1))  # cross_attentions (B, L, H, S)

    def _attend_cached(self, attn, h, past_k, past_v, new_k, new_v, mask):
        """Attention over the cache and the new position without concatenating the cache (as the bundled
        Transformer's MultiHeadAttention.attend_cached): only the scores are joined."""
        q = split_heads(attn.q_proj(h), self.heads)  # (B, H, 1, Dh)
        scores = torch.cat([torch.matmul(q, past_k.transpose(2, 3)), torch.matmul(q, new_k.transpose(2, 3))], -1)
        weights = _masked_softmax(scores * attn.scaling, mask)
        on_past, on_new = weights.split([past_k.shape[2], 1], dim=-1)
        return attn.out_proj(merge_heads(torch.matmul(on_past, past_v) + torch.matmul(on_new, new_v)))


def export(model: nn.Module, layout: Layout, positions: torch.Tensor | tuple[torch.Tensor, torch.Tensor],
           out_dir) -> None:
    """Writes encoder.onnx and decoder.onnx of `model` (eval mode) into out_dir.

    Args:
        positions: (P, D) the position table both sides read, or the encoder's and the decoder's own (mBART's
            learned tables).
    """
    cfg = model.config
    parts = Parts(model.eval(), layout, positions).eval()
    heads = cfg.decoder_attention_heads
    export_step_graphs(
        EncoderGraph(parts, cfg.encoder_attention_heads, heads), DecoderStepGraph(parts, heads), out_dir,
        source_vocab=parts.encoder_embed.num_embeddings, target_vocab=parts.decoder_embed.num_embeddings,
        heads=heads, d_head=cfg.d_model // heads, layers=cfg.decoder_layers,
    )
    model.eval()  # torch.onnx.export leaves the modules in training mode


def manifest_graph_fields(config) -> dict:
    """The manifest fields that describe the two graphs written by `export` (attention, encoder, decoder,
    static, state), the same for every BART-family importer."""
    layers, heads = config.decoder_layers, config.decoder_attention_heads
    static, state = kv_static_and_state(layers, heads, config.d_model // heads)
    return {
        "attention": {"output": "cross_attentions", "layers": layers, "heads": heads},
        "encoder": {"file": "encoder.onnx", "inputs": {"input_ids": "input_ids", "attention_mask": "attention_mask"}},
        "decoder": {"file": "decoder.onnx",
                    "inputs": {"input_ids": "input_ids", "position_ids": "position_ids",
                               "self_attention_mask": "decoder_attention_mask"},
                    "outputs": {"logits": "logits"}},
        "static": static,
        "state": state,
    }
