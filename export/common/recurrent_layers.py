"""The pieces the recurrent families share (the translator, the speller, the image and clip captioners):
Bahdanau's additive attention, a BiLSTM's reversal within each row's length, and the PyTorch references'
batch-synchronous greedy loop that the ONNX parity tests decode against."""

from __future__ import annotations

import torch
from torch import nn


def reverse_within_length(x: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """Reverses each row's first `lengths[b]` steps and leaves its padding in place.

    x: (B, S, D); lengths: (B,). Applying it twice gives x back.
    """
    s = x.shape[1]
    t = torch.arange(s, device=x.device)[None, :]  # (1, S)
    lengths = lengths[:, None]  # (B, 1)
    index = torch.where(t < lengths, lengths - 1 - t, t)  # (B, S)
    return x.gather(1, index[:, :, None].expand_as(x))


class AdditiveAttention(nn.Module):
    """Bahdanau's score v^T tanh(W_q h + W_k s_j); W_k s_j is computed once per request."""

    def __init__(self, query_dim: int, memory_dim: int, attention_dim: int):
        super().__init__()
        self.key_proj = nn.Linear(memory_dim, attention_dim, bias=False)
        self.query_proj = nn.Linear(query_dim, attention_dim)
        self.v = nn.Linear(attention_dim, 1, bias=False)

    def keys(self, memory: torch.Tensor) -> torch.Tensor:
        """(B, S, M) -> (B, S, A)."""
        return self.key_proj(memory)

    def scores(self, query: torch.Tensor, keys: torch.Tensor, location: torch.Tensor | None = None) -> torch.Tensor:
        """query (B, Q), keys (B, S, A), optional location features (B, S, A) -> (B, S)."""
        energy = keys + self.query_proj(query)[:, None, :]
        if location is not None:
            energy = energy + location
        return self.v(torch.tanh(energy))[..., 0]


def greedy_search(step, start_ids: torch.Tensor, eos_id: int, max_new_tokens: int, suppress_ids=()):
    """The batch-synchronous greedy loop of the recurrent references (translator and speller).

    Args:
        step: (B,) previous ids -> logits (B, V) and the step's attention (B, S); it carries its own state.
        start_ids: (B,) the decoder's first input per row.

    Returns:
        Per row the generated ids (EOS excluded) and the list of its steps' attention rows, each (S,).
    """
    b = start_ids.shape[0]
    ids = start_ids
    done = torch.zeros(b, dtype=torch.bool)
    outputs, attentions = [[] for _ in range(b)], [[] for _ in range(b)]
    for n in range(max_new_tokens + 1):
        logits, weights = step(ids)
        logits[:, list(suppress_ids)] = float("-inf")
        ids = logits.argmax(-1)
        for row in range(b):
            if done[row]:
                continue
            if ids[row].item() == eos_id or n == max_new_tokens:
                done[row] = True
                continue
            outputs[row].append(ids[row].item())
            attentions[row].append(weights[row])
        if done.all():
            break
    return outputs, attentions
