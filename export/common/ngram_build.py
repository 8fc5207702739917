"""Builds a token n-gram language model (server/decoding/ngram_lm.py) from token sequences: interpolated Witten-Bell
estimates (Witten & Bell 1991), the usual choice for character LMs, with rare contexts pruned.

    p_0(w)     = (c(w) + 1) / (N + V)                                   add-one over the whole vocabulary
    p_k(w | h) = (c(h, w) + T(h) p(w | h')) / (c(h) + T(h))             h' = h without its oldest token

c counts, T(h) the number of distinct tokens seen after h. Contexts seen fewer than `min_count` times are
left out; the server then uses the longest context that is kept, which is what p(w | h') above is.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from attnserve.server.decoding.ngram_lm import NgramLanguageModel


def _windows(sequences: Sequence[Sequence[int]], order: int, start_id: int, eos_id: int) -> tuple[np.ndarray, np.ndarray]:
    """(M, order - 1) histories (token id + 1, newest last, 0 before the start) and (M,) next tokens, one
    per token of every sequence and its end."""
    width = max(order - 1, 1)
    histories, targets = [], []
    for seq in sequences:
        stream = np.concatenate([np.zeros(width - 1, dtype=np.int64), [start_id + 1],
                                 np.asarray(seq, dtype=np.int64) + 1])
        n = len(seq) + 1
        index = np.arange(n)[:, None] + np.arange(width)[None, :]
        histories.append(stream[index])
        targets.append(np.concatenate([np.asarray(seq, dtype=np.int64), [eos_id]]))
    return np.concatenate(histories), np.concatenate(targets)


def _history_of(keys: np.ndarray, length: int, width: int, base: int) -> np.ndarray:
    """(n, width) histories whose last `length` tokens make the given context keys."""
    history = np.zeros((len(keys), width), dtype=np.int64)
    rest = keys.copy()
    for i in range(length):
        history[:, width - 1 - i] = rest % base
        rest //= base
    return history


def build(sequences: Sequence[Sequence[int]], vocab_size: int, order: int, start_id: int, eos_id: int,
          min_count: int = 2) -> NgramLanguageModel:
    """An order-`order` LM (contexts of up to order - 1 tokens) over ids 0..vocab_size-1.

    Args:
        sequences: token ids without start or end token.
        start_id: the decoder start token, which opens every context.
        eos_id: predicted after each sequence's last token.
        min_count: contexts of one or more tokens seen fewer times are left out.
    """
    if order < 1 or min_count < 1:
        raise ValueError(f"order and min_count must be >= 1, got {order} and {min_count}")
    histories, targets = _windows(sequences, order, start_id, eos_id)
    base = vocab_size + 1
    unigram = np.bincount(targets, minlength=vocab_size).astype(np.float64)
    keys = [np.zeros(1, dtype=np.int64)]
    log_probs = [np.log((unigram + 1) / (unigram.sum() + vocab_size))[None, :]]
    width = histories.shape[1]
    context = np.zeros(len(targets), dtype=np.int64)
    for length in range(1, order):
        context = context + histories[:, width - length] * base ** (length - 1)
        pairs, pair_counts = np.unique(context * vocab_size + targets, return_counts=True)
        pair_context, pair_token = pairs // vocab_size, pairs % vocab_size
        contexts, row = np.unique(pair_context, return_inverse=True)
        total = np.bincount(row, weights=pair_counts)
        kept = total >= min_count
        if not kept.any():
            break
        counts = np.zeros((len(contexts), vocab_size))
        counts[row, pair_token] = pair_counts
        counts, total, contexts = counts[kept], total[kept], contexts[kept]
        types = (counts > 0).sum(axis=1)
        shorter = NgramLanguageModel(keys, log_probs).score(_history_of(contexts, length - 1, width, base))
        p = (counts + types[:, None] * np.exp(shorter)) / (total + types)[:, None]
        keys.append(contexts)
        log_probs.append(np.log(p))
    return NgramLanguageModel(keys, log_probs)


def bits_per_token(model: NgramLanguageModel, sequences: Sequence[Sequence[int]], start_id: int, eos_id: int,
                   chunk: int = 65536) -> float:
    """Cross-entropy in bits per predicted token (each sequence's end included)."""
    histories, targets = _windows(sequences, model.order, start_id, eos_id)
    total = 0.0
    for i in range(0, len(targets), chunk):
        scores = model.score(histories[i : i + chunk])
        total -= scores[np.arange(len(scores)), targets[i : i + chunk]].sum()
    return total / len(targets) / np.log(2)
