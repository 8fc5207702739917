"""The one decode loop, for every model the manifest can describe.

`decode()` steps a `Batch` (server/decoding/batch.py: the model-side tensors, one decoder call per step) and lets a
`DecodeStrategy` (server/decoding/search.py: greedy, beam; server/decoding/sampling.py: sampled) choose each step's tokens
and rows, until no row is left. The loop knows no architecture: a model's recurrent state and its logit
changes (suppressed tokens, joint CTC scores, LM fusion) are the batch's, as its manifest describes them.
Finished requests come out of `decode()` at the step they finish, so a caller can answer them while the
rest of the batch continues. Everything here is numpy plus the model's ONNX Runtime sessions (and the
shared log-softmax graph, server/decoding/log_softmax.py); nothing imports grpc or asyncio.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np

from attnserve.server.decoding.batch import Batch
from attnserve.server.decoding.constrained_search import ConstrainedBeamSearch
from attnserve.server.decoding.prepared import PreparedRequest
from attnserve.server.decoding.sampling import SampledSearch
from attnserve.server.decoding.search import BeamSearch, DecodeStrategy, GreedySearch, StepEvents


def decode(batch: Batch, strategy: DecodeStrategy) -> Iterator[StepEvents]:
    """The decode loop: step the batch, let the strategy pick tokens and rows, until no row is left.

    Yields:
        One StepEvents per step; finished requests appear in the step they finish.
    """
    selection = strategy.start()
    batch.select(selection.rows)
    while len(batch):
        out = batch.step(selection.tokens)
        selection, events = strategy.advance(out.logits, out.attention)
        batch.select(selection.rows)
        yield events


def make_strategy(
    requests: Sequence[PreparedRequest], eos: int, length_budget: np.ndarray | None = None
) -> DecodeStrategy:
    """The strategy for requests that share one beam size (sampling and greedy rows share one batch).

    `length_budget` (N,): most new tokens per request from the encoder's length hint (Batch.length_budget).

    Raises:
        ValueError: the requests have different beam sizes (the caller batches them apart).
    """
    sizes = {r.beam_size for r in requests}
    if len(sizes) != 1:
        raise ValueError(f"one batch needs one beam size, got {sorted(sizes)}")
    size = sizes.pop()
    if size > 1:
        constrained = any(r.constraints for r in requests)
        return (ConstrainedBeamSearch if constrained else BeamSearch)(requests, eos, length_budget)
    if any(r.sampling is not None for r in requests):
        return SampledSearch(requests, eos, length_budget)
    return GreedySearch(requests, eos, length_budget)
