"""The translation Transformer (Vaswani et al. 2017) in PyTorch, written so one code path serves training,
cached step-by-step decoding and ONNX export.

Differences from the paper, on purpose: pre-layer-norm residual blocks (train stably without a long warm-up
on small data) and tied input/output embeddings shared by both languages.
"""

from __future__ import annotations

import dataclasses
import math

import torch
from torch import nn
from torch.nn import functional as F


@dataclasses.dataclass(frozen=True)
class TransformerConfig:
    vocab_size: int
    # Width of every residual stream and embedding.
    d_model: int = 256
    # Attention heads per layer; d_model must divide evenly.
    heads: int = 4
    # Inner width of the position-wise feed-forward block.
    d_ff: int = 1024
    encoder_layers: int = 3
    decoder_layers: int = 3
    dropout: float = 0.1
    # Longest source or target sequence the sinusoid table covers.
    max_positions: int = 512
    pad_id: int = 0


def sinusoidal_positions(max_positions: int, d_model: int) -> torch.Tensor:
    """Returns the paper's fixed sinusoid table, shape (max_positions, d_model)."""
    position = torch.arange(max_positions, dtype=torch.float32)[:, None]
    rate = torch.exp(torch.arange(0, d_model, 2, dtype=torch.float32) * (-math.log(10000.0) / d_model))
    table = torch.zeros(max_positions, d_model)
    table[:, 0::2] = torch.sin(position * rate)
    table[:, 1::2] = torch.cos(position * rate)
    return table


def subsequent_mask(size: int) -> torch.Tensor:
    """(size, size) bool mask, True where query i may attend key j (j <= i)."""
    return torch.ones(size, size, dtype=torch.bool).tril()


class MultiHeadAttention(nn.Module):
    """Scaled dot-product attention over `heads` subspaces; keys/values can be projected once and reused."""

    def __init__(self, d_model: int, heads: int, dropout: float):
        super().__init__()
        assert d_model % heads == 0, "d_model must be divisible by heads"
        self.heads = heads
        self.d_head = d_model // heads
        self.q_proj = nn.Linear(d_model, d_model)
        self.k_proj = nn.Linear(d_model, d_model)
        self.v_proj = nn.Linear(d_model, d_model)
        self.out_proj = nn.Linear(d_model, d_model)
        self.dropout = nn.Dropout(dropout)

    def split_heads(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        return x.view(b, t, self.heads, self.d_head).transpose(1, 2)  # (B, H, T, Dh)

    def project_kv(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(B, T, D) -> keys and values, each (B, H, T, Dh)."""
        return self.split_heads(self.k_proj(x)), self.split_heads(self.v_proj(x))

    def attend(
        self, x: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Queries from x (B, Tq, D) attend to k, v (B, H, Tk, Dh) where mask (B, 1, Tq, Tk) is True.

        Returns the output (B, Tq, D) and the attention weights (B, H, Tq, Tk).
        """
        q = self.split_heads(self.q_proj(x))  # (B, H, Tq, Dh)
        weights = self._weights(q @ k.transpose(-2, -1), mask)  # (B, H, Tq, Tk)
        return self._merge_heads(self.dropout(weights) @ v), weights

    def attend_cached(
        self, x: torch.Tensor, past_k: torch.Tensor, past_v: torch.Tensor, new_k: torch.Tensor,
        new_v: torch.Tensor, mask: torch.Tensor,
    ) -> torch.Tensor:
        """attend() over the cache followed by the new positions, without concatenating the cache.

        The same arithmetic as attend(x, cat(past_k, new_k), cat(past_v, new_v), mask), but only the
        (B, H, Tq, Tp + Tq) scores are joined, so a decoder step never copies the (B, H, Tp, Dh) cache: its
        cost stays flat as the cache grows (a server writes new slots into preallocated buffers).

        Args:
            past_k, past_v: (B, H, Tp, Dh); new_k, new_v: (B, H, Tq, Dh); mask: (B, 1, Tq, Tp + Tq).
        """
        q = self.split_heads(self.q_proj(x))  # (B, H, Tq, Dh)
        scores = torch.cat([q @ past_k.transpose(-2, -1), q @ new_k.transpose(-2, -1)], dim=-1)
        weights = self.dropout(self._weights(scores, mask))
        on_past, on_new = weights.split([past_k.shape[2], new_k.shape[2]], dim=-1)
        return self._merge_heads(on_past @ past_v + on_new @ new_v)

    def _weights(self, scores: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        scores = scores / math.sqrt(self.d_head)
        # A finite fill keeps fully padded query rows (training) free of NaN; exp() still gives exact zeros.
        return scores.masked_fill(~mask, torch.finfo(scores.dtype).min).softmax(dim=-1)

    def _merge_heads(self, out: torch.Tensor) -> torch.Tensor:
        b, _, tq, _ = out.shape  # (B, H, Tq, Dh)
        return self.out_proj(out.transpose(1, 2).reshape(b, tq, -1))


class PositionwiseFeedForward(nn.Module):
    def __init__(self, d_model: int, d_ff: int, dropout: float):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(d_model, d_ff), nn.ReLU(), nn.Dropout(dropout), nn.Linear(d_ff, d_model))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class EncoderLayer(nn.Module):
    def __init__(self, cfg: TransformerConfig):
        super().__init__()
        self.self_attn = MultiHeadAttention(cfg.d_model, cfg.heads, cfg.dropout)
        self.feed_forward = PositionwiseFeedForward(cfg.d_model, cfg.d_ff, cfg.dropout)
        self.norm1 = nn.LayerNorm(cfg.d_model)
        self.norm2 = nn.LayerNorm(cfg.d_model)
        self.dropout = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        h = self.norm1(x)
        k, v = self.self_attn.project_kv(h)
        x = x + self.dropout(self.self_attn.attend(h, k, v, mask)[0])
        return x + self.dropout(self.feed_forward(self.norm2(x)))


class DecoderLayer(nn.Module):
    """Masked self-attention over a K/V cache, encoder-decoder attention, feed-forward."""

    def __init__(self, cfg: TransformerConfig):
        super().__init__()
        self.self_attn = MultiHeadAttention(cfg.d_model, cfg.heads, cfg.dropout)
        self.cross_attn = MultiHeadAttention(cfg.d_model, cfg.heads, cfg.dropout)
        self.feed_forward = PositionwiseFeedForward(cfg.d_model, cfg.d_ff, cfg.dropout)
        self.norm1 = nn.LayerNorm(cfg.d_model)
        self.norm2 = nn.LayerNorm(cfg.d_model)
        self.norm3 = nn.LayerNorm(cfg.d_model)
        self.dropout = nn.Dropout(cfg.dropout)

    def forward(self, x, past_k, past_v, self_mask, cross_k, cross_v, cross_mask):
        """One pass over the Tq new target positions.

        Args:
            x: (B, Tq, D) new positions.
            past_k, past_v: (B, H, Tp, Dh) cached self-attention keys/values (Tp may be 0).
            self_mask: (B, 1, Tq, Tp + Tq) bool.
            cross_k, cross_v: (B, H, S, Dh) encoder keys/values of this layer.
            cross_mask: (B, 1, 1, S) bool.

        Returns:
            x (B, Tq, D), the new keys and values (B, H, Tq, Dh), cross-attention weights (B, H, Tq, S).
        """
        h = self.norm1(x)
        new_k, new_v = self.self_attn.project_kv(h)
        x = x + self.dropout(self.self_attn.attend_cached(h, past_k, past_v, new_k, new_v, self_mask))
        out, cross_weights = self.cross_attn.attend(self.norm2(x), cross_k, cross_v, cross_mask)
        x = x + self.dropout(out)
        x = x + self.dropout(self.feed_forward(self.norm3(x)))
        return x, new_k, new_v, cross_weights


class Transformer(nn.Module):
    # The family name its checkpoints record (common/training.py).
    ARCH = "transformer"

    def __init__(self, cfg: TransformerConfig):
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.d_model, padding_idx=cfg.pad_id)
        nn.init.normal_(self.embed.weight, std=cfg.d_model**-0.5)
        self.register_buffer("positions", sinusoidal_positions(cfg.max_positions, cfg.d_model), persistent=False)
        self.encoder_layers = nn.ModuleList(EncoderLayer(cfg) for _ in range(cfg.encoder_layers))
        self.decoder_layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.decoder_layers))
        self.encoder_norm = nn.LayerNorm(cfg.d_model)
        self.decoder_norm = nn.LayerNorm(cfg.d_model)
        self.dropout = nn.Dropout(cfg.dropout)

    def embed_tokens(self, ids: torch.Tensor, position_ids: torch.Tensor) -> torch.Tensor:
        """(B, T) ids and positions -> (B, T, D) scaled embeddings plus sinusoids."""
        x = self.embed(ids) * math.sqrt(self.cfg.d_model) + self.positions[position_ids]
        return self.dropout(x)

    def encode(self, input_ids: torch.Tensor, attention_mask: torch.Tensor):
        """Returns encoder states (B, S, D) and each decoder layer's cross K/V, each (B, H, S, Dh)."""
        positions = torch.arange(input_ids.shape[1], device=input_ids.device).expand_as(input_ids)
        x = self.embed_tokens(input_ids, positions)
        mask = attention_mask.bool()[:, None, None, :]  # (B, 1, 1, S)
        for layer in self.encoder_layers:
            x = layer(x, mask)
        x = self.encoder_norm(x)
        cross_kv = [layer.cross_attn.project_kv(x) for layer in self.decoder_layers]
        return x, cross_kv

    def decode(self, input_ids, position_ids, self_mask, past_kv, cross_kv, encoder_attention_mask):
        """Runs the decoder over new positions given a cache.

        Args:
            input_ids, position_ids: (B, Tq).
            self_mask: (B, 1, Tq, Tp + Tq) bool.
            past_kv: per layer (k, v), each (B, H, Tp, Dh).
            cross_kv: per layer (k, v), each (B, H, S, Dh).
            encoder_attention_mask: (B, S) int or bool.

        Returns:
            logits (B, Tq, V), per layer new (k, v) each (B, H, Tq, Dh), cross weights (B, L, H, Tq, S).
        """
        hidden, new_kv, weights = self.decode_hidden(
            input_ids, position_ids, self_mask, past_kv, cross_kv, encoder_attention_mask
        )
        return self.project(hidden), new_kv, weights

    def decode_hidden(self, input_ids, position_ids, self_mask, past_kv, cross_kv, encoder_attention_mask):
        """decode() up to the final layer norm: returns hidden states (B, Tq, D) instead of logits."""
        x = self.embed_tokens(input_ids, position_ids)
        cross_mask = encoder_attention_mask.bool()[:, None, None, :]
        new_kv, weights = [], []
        for layer, (pk, pv), (ck, cv) in zip(self.decoder_layers, past_kv, cross_kv):
            x, k, v, w = layer(x, pk, pv, self_mask, ck, cv, cross_mask)
            new_kv.append((k, v))
            weights.append(w)
        return self.decoder_norm(x), new_kv, torch.stack(weights, dim=1)

    def project(self, hidden: torch.Tensor) -> torch.Tensor:
        """(..., D) -> (..., V) logits with the tied embedding matrix.

        With 2-D input and a bias, the ONNX exporter emits one Gemm(transB=1) that reads the embedding
        itself; without a bias (or with `x @ W.T`) it folds a transposed 16 MB copy of the table into the graph.
        """
        return F.linear(hidden, self.embed.weight, self.embed.weight.new_zeros(self.cfg.vocab_size))

    def empty_cache(self, batch: int, device: torch.device | None = None) -> list[tuple[torch.Tensor, torch.Tensor]]:
        shape = (batch, self.cfg.heads, 0, self.cfg.d_model // self.cfg.heads)
        return [(torch.zeros(shape, device=device), torch.zeros(shape, device=device)) for _ in self.decoder_layers]

    def forward(self, src, src_mask, tgt_in, tgt_mask):
        """Teacher-forced training pass: (B, S) source, (B, T) shifted target -> logits (B, T, V)."""
        _, cross_kv = self.encode(src, src_mask)
        t = tgt_in.shape[1]
        positions = torch.arange(t, device=tgt_in.device).expand_as(tgt_in)
        self_mask = subsequent_mask(t).to(src.device)[None, None] & tgt_mask.bool()[:, None, None, :]
        cache = self.empty_cache(src.shape[0], src.device)
        logits, _, _ = self.decode(tgt_in, positions, self_mask, cache, cross_kv, src_mask)
        return logits

    @torch.no_grad()
    def greedy_decode(
        self, input_ids, attention_mask, start_ids, eos_id: int, max_new_tokens: int, use_cache=True, suppress_ids=()
    ):
        """Reference greedy search (PyTorch, batch-synchronous) for parity tests and evaluation.

        Args:
            input_ids, attention_mask: (B, S) padded source.
            start_ids: (B,) decoder start token per row (the target-language token).
            use_cache: False re-runs the decoder over the whole prefix every step (the uncached reference).
            suppress_ids: tokens never to emit (the manifest's `special_tokens.suppress`).

        Returns:
            A list per row of generated ids (EOS excluded) and per row a (steps, L, H, S) attention tensor.
        """
        b = input_ids.shape[0]
        _, cross_kv = self.encode(input_ids, attention_mask)
        prefix = start_ids[:, None]  # (B, 1)
        cache = self.empty_cache(b)
        done = torch.zeros(b, dtype=torch.bool)
        outputs, attentions = [[] for _ in range(b)], [[] for _ in range(b)]
        for step in range(max_new_tokens + 1):
            if use_cache:
                ids, pos = prefix[:, -1:], torch.full((b, 1), step)
                mask = torch.ones(b, 1, 1, step + 1, dtype=torch.bool)
                logits, new_kv, w = self.decode(ids, pos, mask, cache, cross_kv, attention_mask)
                cache = [(torch.cat([pk, k], 2), torch.cat([pv, v], 2)) for (pk, pv), (k, v) in zip(cache, new_kv)]
            else:
                t = prefix.shape[1]
                pos = torch.arange(t).expand(b, t)
                mask = subsequent_mask(t)[None, None].expand(b, 1, t, t)
                logits, _, w = self.decode(prefix, pos, mask, self.empty_cache(b), cross_kv, attention_mask)
            logits = logits[:, -1]
            logits[:, list(suppress_ids)] = float("-inf")
            next_ids = logits.argmax(-1)
            for row in range(b):
                if done[row]:
                    continue
                if next_ids[row].item() == eos_id or step == max_new_tokens:
                    done[row] = True
                    continue
                outputs[row].append(next_ids[row].item())
                attentions[row].append(w[row, :, :, -1])
            if done.all():
                break
            prefix = torch.cat([prefix, next_ids[:, None]], dim=1)
        return outputs, [torch.stack(a) if a else torch.zeros(0) for a in attentions]
