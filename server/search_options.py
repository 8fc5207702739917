"""Checks a request's search options (n-best, sampling, minimum length, repetition guard) in one place.

Each message names the option, the value sent and what would be accepted; the gRPC edge reports every
one as INVALID_ARGUMENT. Beam size and max_new_tokens are checked before these (server/engine.py).
"""

from __future__ import annotations

import dataclasses
import math
import secrets

from attnserve.server.generation import DecodingOptions, SamplingOptions


def check_search(options: DecodingOptions, max_new_tokens: int) -> None:
    """Raises ValueError naming the first option out of range or the first conflict.

    Args:
        options: the request's options; its beam_size already checked.
        max_new_tokens: the request's resolved token limit.
    """
    n, beams = options.num_return_sequences, options.beam_size
    if not 1 <= n <= beams:
        raise ValueError(
            f"num_return_sequences {n} is out of range: use 1..{beams} (at most beam_size, {beams}); "
            f"raise beam_size for more"
        )
    if not 0 <= options.min_new_tokens <= max_new_tokens:
        raise ValueError(
            f"min_new_tokens {options.min_new_tokens} is out of range: use 0..{max_new_tokens} "
            f"(at most max_new_tokens)"
        )
    if options.no_repeat_ngram_size < 0:
        raise ValueError(f"no_repeat_ngram_size {options.no_repeat_ngram_size} is out of range: use 0 (off) or more")
    if options.sampling is not None:
        _check_sampling(options.sampling, beams)
    w = options.reverse_weight
    if not (math.isfinite(w) and w >= 0):
        raise ValueError(f"reverse_weight {w} is out of range: use 0 (off) or a number > 0 (0.1 is a good start)")
    if w > 0 and beams < 2:  # sampling, refused above unless beam_size is 1, is caught here too
        raise ValueError(
            f"reverse_weight reranks a beam's candidates: use beam_size 2 or more (got {beams}) and no sampling"
        )


def _check_sampling(sampling: SamplingOptions, beams: int) -> None:
    if beams != 1:
        raise ValueError(
            f"sampling and beam search do not combine: beam_size is {beams}; use beam_size 1 to sample, "
            f"or leave sampling unset to search"
        )
    t = sampling.temperature
    if not (math.isfinite(t) and t > 0):
        raise ValueError(f"temperature {t} is out of range: use a number > 0 (1 = the model's distribution)")
    if sampling.top_k < 0:
        raise ValueError(f"top_k {sampling.top_k} is out of range: use 0 (no limit) or more")
    p = sampling.top_p
    if not (math.isfinite(p) and 0 < p <= 1):
        raise ValueError(f"top_p {p} is out of range: use a number in (0, 1] (1 = every token)")
    if sampling.seed is not None and not 0 <= sampling.seed < 2**64:
        raise ValueError(f"seed {sampling.seed} is out of range: use 0..2**64-1")


def with_seed(sampling: SamplingOptions | None) -> SamplingOptions | None:
    """The sampling options with a seed: the request's own, or a fresh random one."""
    if sampling is None or sampling.seed is not None:
        return sampling
    return dataclasses.replace(sampling, seed=secrets.randbits(64))
