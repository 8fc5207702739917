"""Word timestamps from a speller's attention: the monotonic path and the word spans read along it."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from attnserve.api.generation import WordTiming
from attnserve.server.attention.timestamps import monotonic_path, word_timings
from attnserve.server.model.tokenization import Words


def brute_force_path(attention: np.ndarray) -> tuple[int, ...]:
    """Every non-decreasing column sequence, scored by summed log attention; the best one."""
    rows, cols = attention.shape
    log = np.log(np.maximum(attention, 1e-12))
    paths = itertools.combinations_with_replacement(range(cols), rows)  # sorted tuples = non-decreasing paths
    return max(paths, key=lambda p: sum(log[r, c] for r, c in enumerate(p)))


@pytest.mark.parametrize("seed", range(12))
def test_the_path_is_the_best_non_decreasing_one(seed):
    rng = np.random.default_rng(seed)
    rows, cols = rng.integers(1, 6), rng.integers(1, 7)
    attention = rng.dirichlet(np.full(cols, 0.3), size=rows)
    path = monotonic_path(attention)
    assert np.all(np.diff(path) >= 0)
    log = np.log(np.maximum(attention, 1e-12))
    best = brute_force_path(attention)
    assert sum(log[r, c] for r, c in enumerate(path)) == pytest.approx(sum(log[r, c] for r, c in enumerate(best)))


def test_a_glance_back_does_not_move_a_character_behind_the_one_before():
    attention = np.array([[0.1, 0.8, 0.1, 0.0], [0.7, 0.2, 0.1, 0.0], [0.0, 0.1, 0.2, 0.7]])
    assert attention.argmax(1).tolist() == [1, 0, 3]  # per-row argmax goes backwards
    assert monotonic_path(attention).tolist() == [1, 1, 3]


def test_words_span_their_characters_columns_without_the_opening_space():
    # "go on": pieces ▁ g o ▁ o n over 6 columns of 80 ms; the spaces look at the gaps.
    pieces = ["▁", "g", "o", "▁", "o", "n"]
    words = Words((0, 3), ("go", "on"))
    cols = np.eye(6)[[0, 1, 2, 3, 4, 5]] * 0.9 + 0.1 / 6
    starts, ends = np.arange(6) * 0.08, np.minimum(np.arange(1, 7) * 0.08, 0.45)
    timings = word_timings(cols, pieces, words, starts, ends)
    assert timings == [WordTiming("go", pytest.approx(0.08), pytest.approx(0.24)),
                       WordTiming("on", pytest.approx(0.32), pytest.approx(0.45))]  # the clip ends at 0.45 s


def test_no_output_or_no_columns_gives_no_words():
    assert word_timings(np.zeros((0, 3)), [], Words((), ()), np.zeros(3), np.ones(3)) == []
    assert word_timings(np.zeros((2, 0)), ["▁", "a"], Words((0,), ("a",)), np.zeros(0), np.zeros(0)) == []
