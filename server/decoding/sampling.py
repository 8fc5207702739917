"""Sampling: each token drawn at random from the model's distribution, reshaped by temperature, top-k, top-p.

Each request owns a random generator seeded with its own seed and draws exactly one uniform number per
step, whatever else runs in its batch, so a seed gives the same output alone or batched. The draw is an
inverse-CDF lookup over the kept tokens in a fixed order (most likely first, ties by id), computed in
float64. Greedy requests of the same batch keep taking the most likely token. The reported log-probability
is the model's (after the output rules), not that of the reshaped distribution the token was drawn from.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from attnserve.api.generation import SamplingOptions
from attnserve.server.decoding.prepared import PreparedRequest
from attnserve.server.decoding.search import GreedySearch


class SampledSearch(GreedySearch):
    """Greedy search whose sampling requests draw their token instead of taking the most likely one."""

    def __init__(self, requests: Sequence[PreparedRequest], eos: int, length_budget: np.ndarray | None = None):
        super().__init__(requests, eos, length_budget)
        self._generators = [
            None if r.sampling is None else np.random.Generator(np.random.PCG64(r.sampling.seed)) for r in requests
        ]

    def _choose(self, logits: np.ndarray, row_request: np.ndarray) -> np.ndarray:
        tokens = logits.argmax(axis=-1)  # (B,)
        for row, index in enumerate(row_request):
            generator = self._generators[index]
            if generator is not None:
                tokens[row] = draw_token(logits[row], self.requests[index].sampling, generator.random())
        return tokens


def draw_token(logits: np.ndarray, options: SamplingOptions, uniform: float) -> int:
    """Draws one token.

    Args:
        logits: (V,) one row's logits (-inf = never).
        options: temperature, top_k and top_p (the seed is the caller's business).
        uniform: a number in [0, 1) from the request's generator.

    Returns:
        The token id.
    """
    order = np.argsort(-logits, kind="stable")  # (V,) most likely first, ties by id
    x = logits[order].astype(np.float64) / options.temperature  # (V,)
    kept = int(np.isfinite(x).sum()) or 1
    if options.top_k:
        kept = min(kept, options.top_k)
    p = np.exp(x[:kept] - x[0])  # (kept,)
    p /= p.sum()
    if options.top_p < 1.0:
        # The fewest most-likely tokens whose probabilities reach top_p (at least one).
        kept = min(int(np.searchsorted(np.cumsum(p), options.top_p)) + 1, kept)
        p = p[:kept] / p[:kept].sum()
    pick = min(int(np.searchsorted(np.cumsum(p), uniform, side="right")), kept - 1)
    return int(order[pick])
