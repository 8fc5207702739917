"""The n-gram LM used for shallow fusion: its tables equal interpolated Witten-Bell computed by brute force from
the counts, every distribution sums to one, pruned contexts back off to their longest kept suffix, the
per-row state follows the tokens fed, and a broken file is refused with its name."""

from __future__ import annotations

import itertools
from collections import Counter

import numpy as np
import pytest

from attnserve.export.common.ngram_build import bits_per_token, build
from attnserve.server.decoding.ngram_lm import LanguageModelState, NgramLanguageModel

V, START, EOS = 7, 3, 2
CORPUS = [[4, 5, 6, 4, 5], [5, 5, 6], [6, 4, 5, 6, 6, 4], [4, 4], [5, 6, 4, 5, 5, 6, 4]]


def brute_force(corpus, order: int, context: tuple, min_count: int = 1) -> np.ndarray:
    """p(. | context) from the definition; context holds None before the start, then START, then tokens."""
    follow: dict[tuple, Counter] = {}
    for seq in corpus:
        stream = [None] * (order - 2) + [START] + list(seq)
        for i, target in enumerate(list(seq) + [EOS]):
            history = stream[: order - 2 + 1 + i]
            for k in range(0, order):
                follow.setdefault(tuple(history[len(history) - k:]) if k else (), Counter())[target] += 1
    unigram = follow[()]
    p = np.array([(unigram[w] + 1) / (sum(unigram.values()) + V) for w in range(V)])
    for k in range(1, order):
        h = tuple(context[len(context) - k:])
        seen = follow.get(h)
        if len(h) < k or seen is None or sum(seen.values()) < min_count:
            break
        total, types = sum(seen.values()), len(seen)
        p = np.array([(seen[w] + types * p[w]) for w in range(V)]) / (total + types)
    return p


def history(context: tuple, order: int) -> np.ndarray:
    digits = [0 if t is None else t + 1 for t in context][-(order - 1):]
    return np.array([[0] * (order - 1 - len(digits)) + digits])


def contexts(order: int):
    """Every context the corpus makes, and some it never makes."""
    seen = set()
    for seq in CORPUS:
        stream = [None] * (order - 2) + [START] + list(seq)
        for i in range(len(seq) + 1):
            seen.add(tuple(stream[i : i + order - 1]))
    novel = {(None,) * (order - 3) + (START, 6, 6), (None,) * (order - 2) + (START,)}
    return sorted(seen | {c[-(order - 1):] for c in novel}, key=str)


@pytest.mark.parametrize("order", [3, 4])
def test_tables_equal_witten_bell_from_the_counts(order):
    lm = build(CORPUS, V, order, START, EOS, min_count=1)
    for context in contexts(order):
        expected = brute_force(CORPUS, order, context)
        np.testing.assert_allclose(np.exp(lm.score(history(context, order))[0]), expected, rtol=1e-6)


def test_every_distribution_sums_to_one_and_nothing_is_impossible():
    lm = build(CORPUS, V, 4, START, EOS, min_count=1)
    for table in lm.log_probs:
        assert np.all(np.isfinite(table))
        np.testing.assert_allclose(np.exp(table.astype(np.float64)).sum(axis=1), 1.0, rtol=1e-6)


def test_a_pruned_context_backs_off_to_its_longest_kept_suffix():
    pruned = build(CORPUS, V, 4, START, EOS, min_count=3)
    for context in contexts(4):
        expected = brute_force(CORPUS, 4, context, min_count=3)
        np.testing.assert_allclose(np.exp(pruned.score(history(context, 4))[0]), expected, rtol=1e-6)
    full = build(CORPUS, V, 4, START, EOS, min_count=1)
    assert sum(map(len, pruned.keys)) < sum(map(len, full.keys))


def test_the_state_follows_the_tokens_fed_and_is_gathered_with_its_rows():
    lm = build(CORPUS, V, 4, START, EOS, min_count=1)
    sequences = [[START, 4, 5], [START, 6], [START, 5, 5, 6]]
    state = LanguageModelState.start(lm, 3)
    for step in range(4):
        tokens = np.array([seq[step] if step < len(seq) else EOS for seq in sequences])
        state.advance(tokens)
    fed = [seq + [EOS] * (4 - len(seq)) for seq in sequences]
    for row, seq in enumerate(fed):
        expected = brute_force(CORPUS, 4, tuple([None] * 2 + seq)[-3:])
        np.testing.assert_allclose(np.exp(state.score()[row]), expected, rtol=1e-6)
    scores = state.score()
    state.select(np.array([2, 0, 0]))
    np.testing.assert_array_equal(state.score(), scores[[2, 0, 0]])
    joined = LanguageModelState.concatenate([state, LanguageModelState.start(lm, 1)])
    np.testing.assert_array_equal(joined.score()[:3], scores[[2, 0, 0]])


def test_a_saved_model_loads_with_its_scores(tmp_path):
    lm = build(CORPUS, V, 4, START, EOS, min_count=1)
    lm.save(tmp_path / "lm.npz")
    loaded = NgramLanguageModel.load(tmp_path / "lm.npz")
    assert (loaded.order, loaded.vocab_size) == (4, V)
    every = np.array(list(itertools.product(range(V + 1), repeat=3)))
    np.testing.assert_allclose(loaded.score(every), lm.score(every), atol=2e-3)  # stored in float16


def test_held_out_text_like_the_training_text_costs_fewer_bits_than_uniform():
    lm = build(CORPUS, V, 4, START, EOS, min_count=1)
    assert bits_per_token(lm, [[4, 5, 6, 4], [5, 6, 4, 5]], START, EOS) < np.log2(V)


@pytest.mark.parametrize("content", [b"not numpy", None])
def test_a_broken_file_is_refused_with_its_name(tmp_path, content):
    path = tmp_path / "lm.npz"
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(ValueError, match="lm.npz: not a readable n-gram language model"):
        NgramLanguageModel.load(path)
