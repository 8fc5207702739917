"""The recurrent translator: the lectures' first step, attention added to an RNN encoder-decoder.

A bidirectional LSTM `Encoder` reads the source; an LSTM `Decoder` emits one token per step, querying the
encoder states with attention (Bahdanau et al. 2015's additive score by default, Luong et al. 2015's
multiplicative "general" score selectable), and feeds its attentional vector into the next step (Luong's
input feeding).

The step follows Luong et al.: the LSTM updates its state first, the new state is the query, and the
attentional vector h~ = tanh(W_c [context; h]) gives the logits through the tied embedding matrix. What is
constant for a request is computed once by `encode()`: the encoder states, their projection into the score
space (`keys`; the additive score's W_k s_j or the general score's W s_j), and the decoder's initial
state. The recurrent state (h, c, h~) is *replaced* every step, unlike the Transformer's appended K/V cache.

The backward direction reads each row reversed *within its own length*, so padding never flows into a
real position: outputs are identical whether a sentence is encoded alone or in a padded batch, and training
keeps fast padded batches (packed LSTMs are ~50x slower to train on CPU).
"""

from __future__ import annotations

import dataclasses
import math

import torch
from torch import nn
from torch.nn import functional as F

from attnserve.export.common.recurrent_layers import AdditiveAttention, greedy_search, reverse_within_length

ATTENTION_SCORES = ("additive", "multiplicative")


@dataclasses.dataclass(frozen=True)
class RecurrentConfig:
    vocab_size: int
    # Embedding width; also the width of the attentional vector h~ (so the output projection is tied).
    embed_dim: int = 256
    # Hidden units of each encoder LSTM direction.
    encoder_hidden: int = 256
    # Stacked bidirectional encoder layers.
    encoder_layers: int = 2
    # Hidden units of the decoder LSTM.
    decoder_hidden: int = 512
    # "additive" (Bahdanau) or "multiplicative" (Luong's general score).
    attention: str = "additive"
    # Width of the additive score's hidden layer (unused by the multiplicative score).
    attention_dim: int = 256
    dropout: float = 0.2
    # Longest source or target the exporter advertises in the manifest limits.
    max_positions: int = 512
    pad_id: int = 0

    def __post_init__(self):
        if self.attention not in ATTENTION_SCORES:
            raise ValueError(f"attention must be one of {ATTENTION_SCORES}, got {self.attention!r}")


class Encoder(nn.Module):
    """Embedded source -> bidirectional LSTM states (B, S, 2 * encoder_hidden)."""

    def __init__(self, cfg: RecurrentConfig):
        super().__init__()
        self.forward_layers = nn.ModuleList()
        self.backward_layers = nn.ModuleList()
        width = cfg.embed_dim
        for _ in range(cfg.encoder_layers):
            self.forward_layers.append(nn.LSTM(width, cfg.encoder_hidden, batch_first=True))
            self.backward_layers.append(nn.LSTM(width, cfg.encoder_hidden, batch_first=True))
            width = 2 * cfg.encoder_hidden
        self.dropout = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """x (B, S, E), mask (B, S) int -> states (B, S, 2He), zero on padding."""
        lengths = mask.sum(1)
        for i, (fwd, bwd) in enumerate(zip(self.forward_layers, self.backward_layers)):
            if i > 0:
                x = self.dropout(x)
            # Explicit zero states sized from x: otherwise the ONNX exporter bakes the example's batch in.
            zeros = x.new_zeros(1, x.shape[0], fwd.hidden_size)
            # Padding sits after each row's real steps in both directions, so it never reaches them.
            ahead, _ = fwd(x, (zeros, zeros))
            behind, _ = bwd(reverse_within_length(x, lengths), (zeros, zeros))
            x = torch.cat([ahead, reverse_within_length(behind, lengths)], dim=-1)
        return x * mask[:, :, None].to(x.dtype)


class MultiplicativeAttention(nn.Module):
    """Luong's general score h^T W s_j; W s_j is computed once per request."""

    def __init__(self, query_dim: int, memory_dim: int):
        super().__init__()
        self.key_proj = nn.Linear(memory_dim, query_dim, bias=False)

    def keys(self, memory: torch.Tensor) -> torch.Tensor:
        """(B, S, M) -> (B, S, Q)."""
        return self.key_proj(memory)

    def scores(self, query: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
        """query (B, Q), keys (B, S, Q) -> (B, S)."""
        return (keys @ query[:, :, None])[..., 0]


class Decoder(nn.Module):
    """One LSTM layer with attention and input feeding; `step()` is the exported decoder graph."""

    def __init__(self, cfg: RecurrentConfig):
        super().__init__()
        memory = 2 * cfg.encoder_hidden
        self.cell = nn.LSTMCell(cfg.embed_dim + cfg.embed_dim, cfg.decoder_hidden)
        if cfg.attention == "additive":
            self.attention = AdditiveAttention(cfg.decoder_hidden, memory, cfg.attention_dim)
        else:
            self.attention = MultiplicativeAttention(cfg.decoder_hidden, memory)
        self.combine = nn.Linear(memory + cfg.decoder_hidden, cfg.embed_dim)
        self.init_proj = nn.Linear(memory, 2 * cfg.decoder_hidden)
        self.dropout = nn.Dropout(cfg.dropout)

    def initial_state(self, memory: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """h0, c0 (B, Hd) from the masked mean of the encoder states."""
        m = mask[:, :, None].to(memory.dtype)
        mean = (memory * m).sum(1) / m.sum(1).clamp(min=1.0)  # (B, M)
        h, c = torch.tanh(self.init_proj(mean)).chunk(2, dim=-1)
        return h, c

    def step(self, embedded, h, c, feed, memory, keys, mask):
        """One target position for every row.

        Args:
            embedded: (B, E) embedding of the previous token.
            h, c: (B, Hd) LSTM state; feed: (B, E) the previous attentional vector (zeros at the start).
            memory: (B, S, M) encoder states; keys: (B, S, A) their score-space projection.
            mask: (B, S) 1 for real source tokens.

        Returns:
            attentional vector (B, E), new h and c (B, Hd), attention weights (B, S) (0 on padding).
        """
        h, c = self.cell(torch.cat([embedded, feed], dim=-1), (h, c))
        scores = self.attention.scores(h, keys)  # (B, S)
        scores = scores.masked_fill(mask == 0, torch.finfo(scores.dtype).min)
        weights = scores.softmax(dim=-1)
        context = (weights[:, None, :] @ memory)[:, 0]  # (B, M)
        attentional = torch.tanh(self.combine(torch.cat([context, h], dim=-1)))
        return self.dropout(attentional), h, c, weights


class RecurrentTranslator(nn.Module):
    """Bidirectional LSTM encoder + attentional LSTM decoder with tied embeddings (shared by both languages)."""

    # The family name its checkpoints record (common/training.py).
    ARCH = "recurrent"

    def __init__(self, cfg: RecurrentConfig):
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.embed_dim, padding_idx=cfg.pad_id)
        nn.init.normal_(self.embed.weight, std=cfg.embed_dim**-0.5)
        self.encoder = Encoder(cfg)
        self.decoder = Decoder(cfg)
        self.dropout = nn.Dropout(cfg.dropout)

    def embed_tokens(self, ids: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.embed(ids) * math.sqrt(self.cfg.embed_dim))

    def encode(self, input_ids: torch.Tensor, attention_mask: torch.Tensor):
        """(B, S) source -> memory (B, S, M), keys (B, S, A), initial h and c (B, Hd)."""
        memory = self.encoder(self.embed_tokens(input_ids), attention_mask)
        keys = self.decoder.attention.keys(memory)
        h, c = self.decoder.initial_state(memory, attention_mask)
        return memory, keys, h, c

    def initial_feed(self, batch: int) -> torch.Tensor:
        return torch.zeros(batch, self.cfg.embed_dim)

    def project(self, attentional: torch.Tensor) -> torch.Tensor:
        """(..., E) -> (..., V) logits with the tied embedding matrix (see Transformer.project for the bias)."""
        return F.linear(attentional, self.embed.weight, self.embed.weight.new_zeros(self.cfg.vocab_size))

    def decode_step(self, input_ids, h, c, feed, memory, keys, attention_mask):
        """input_ids (B,) -> logits (B, V), new h, c, feed and the step's attention (B, S)."""
        attentional, h, c, weights = self.decoder.step(
            self.embed_tokens(input_ids), h, c, feed, memory, keys, attention_mask
        )
        return self.project(attentional), h, c, attentional, weights

    def forward(self, src, src_mask, tgt_in, tgt_mask):
        """Teacher-forced training pass: (B, S) source, (B, T) shifted target -> logits (B, T, V)."""
        memory, keys, h, c = self.encode(src, src_mask)
        feed = self.initial_feed(src.shape[0]).to(memory.dtype)
        embedded = self.embed_tokens(tgt_in)  # (B, T, E)
        outputs = []
        for t in range(tgt_in.shape[1]):
            feed, h, c, _ = self.decoder.step(embedded[:, t], h, c, feed, memory, keys, src_mask)
            outputs.append(feed)
        # One projection for all positions: the vocabulary matmul dominates, the loop stays small.
        return self.project(torch.stack(outputs, dim=1))

    @torch.no_grad()
    def greedy_decode(self, input_ids, attention_mask, start_ids, eos_id: int, max_new_tokens: int, suppress_ids=()):
        """Reference greedy search (PyTorch, batch-synchronous) for parity tests and evaluation.

        Returns, like Transformer.greedy_decode, per row the generated ids (EOS excluded) and a
        (steps, 1, 1, S) attention tensor (one layer, one head).
        """
        memory, keys, h, c = self.encode(input_ids, attention_mask)
        state = [h, c, self.initial_feed(input_ids.shape[0])]

        def step(ids):
            logits, state[0], state[1], state[2], weights = self.decode_step(ids, *state, memory, keys, attention_mask)
            return logits, weights

        outputs, attentions = greedy_search(step, start_ids, eos_id, max_new_tokens, suppress_ids)
        return outputs, [torch.stack(a)[:, None, None] if a else torch.zeros(0) for a in attentions]
