"""CTC prefix scores (server/decoding/ctc_prefix.py) against brute force over every alignment, alone and batched."""

import itertools

import numpy as np
import pytest

from attnserve.server.decoding.ctc_prefix import CTCPrefixScorer

BLANK, EOS = 0, 1  # labels are 2..


def random_log_probs(rng, t, v):
    """(T, V) normalised log-probabilities; EOS is never a CTC label (its column -inf)."""
    z = rng.normal(size=(t, v)) * 2
    z[:, EOS] = -np.inf
    return (z - np.log(np.exp(z).sum(-1, keepdims=True))).astype(np.float32)


def collapse(path):
    out = []
    for k, s in enumerate(path):
        if s != BLANK and (k == 0 or s != path[k - 1]):
            out.append(s)
    return tuple(out)


def brute_force(x):
    """{labelling: probability} summed over every frame-level path (T x V small)."""
    totals = {}
    for path in itertools.product([s for s in range(x.shape[1]) if s != EOS], repeat=x.shape[0]):
        p = np.exp(sum(x[t, s] for t, s in enumerate(path)))
        totals[collapse(path)] = totals.get(collapse(path), 0.0) + p
    return totals


def prefix_probability(totals, prefix):
    return sum(p for labels, p in totals.items() if labels[: len(prefix)] == tuple(prefix))


def feed(scorer, tokens):
    """Scores each token's extension in turn; returns the summed deltas (log P of the prefix or labelling)."""
    total = np.zeros(len(scorer))
    for column in np.asarray(tokens).T:
        total += scorer.score()[np.arange(len(scorer)), column]
        scorer.advance(column)
    return total


@pytest.mark.parametrize("prefix", [(2,), (3, 3), (2, 3, 2), (3, 2, 2, 3)])
def test_prefix_scores_equal_brute_force_sums_over_alignments(prefix):
    rng = np.random.default_rng(len(prefix))
    x = random_log_probs(rng, 5, 4)
    totals = brute_force(x)
    scorer = CTCPrefixScorer(x[None], np.array([5]), BLANK, EOS)
    got = feed(scorer, np.array([prefix]))
    assert got[0] == pytest.approx(np.log(prefix_probability(totals, prefix)), abs=1e-4)
    # EOS scores the complete labelling: log P(prefix | x).
    complete = scorer.prefix[0] + scorer.score()[0, EOS]
    assert complete == pytest.approx(np.log(totals[tuple(prefix)]), abs=1e-4)


def test_the_empty_prefix_ends_with_the_all_blank_path_and_the_blank_is_never_a_candidate():
    x = random_log_probs(np.random.default_rng(0), 4, 4)
    scores = CTCPrefixScorer(x[None], np.array([4]), BLANK, EOS).score()
    assert scores[0, EOS] == pytest.approx(x[:, BLANK].sum(), abs=1e-5)
    assert scores[0, BLANK] == -np.inf


def test_a_labelling_longer_than_the_frames_allow_is_impossible():
    x = random_log_probs(np.random.default_rng(1), 3, 4)
    scorer = CTCPrefixScorer(x[None], np.array([3]), BLANK, EOS)
    feed(scorer, np.array([[2, 2]]))  # a repeat needs a blank between: 3 frames at least
    assert scorer.score()[0, 2] == -np.inf  # "2 2 2" needs 5 frames


def test_rows_of_different_lengths_batched_score_as_they_do_alone():
    rng = np.random.default_rng(2)
    clips = [random_log_probs(rng, t, 5) for t in (9, 4, 7)]
    prefixes = np.array([[2, 3, 3], [4, 2, 4], [3, 3, 2]])
    padded = np.zeros((3, 9, 5), dtype=np.float32)
    for row, x in enumerate(clips):
        padded[row, : len(x)] = x
    batched = CTCPrefixScorer(padded, np.array([9, 4, 7]), BLANK, EOS)
    feed(batched, prefixes)
    together = batched.score()
    for row, x in enumerate(clips):
        alone = CTCPrefixScorer(x[None], np.array([len(x)]), BLANK, EOS)
        feed(alone, prefixes[row : row + 1])
        np.testing.assert_allclose(together[row], alone.score()[0], rtol=1e-5, atol=1e-5)


def test_select_and_concatenate_keep_each_rows_state():
    rng = np.random.default_rng(3)
    a = CTCPrefixScorer(random_log_probs(rng, 6, 5)[None], np.array([6]), BLANK, EOS)
    b = CTCPrefixScorer(random_log_probs(rng, 8, 5)[None], np.array([8]), BLANK, EOS)
    feed(a, np.array([[2, 4]]))
    feed(b, np.array([[3]]))
    expected_a, expected_b = a.score()[0], b.score()[0]
    joined = CTCPrefixScorer.concatenate([a, b])
    joined.select(np.array([1, 0, 0]))  # b, then a twice (beams)
    scores = joined.score()
    np.testing.assert_allclose(scores[0], expected_b, atol=1e-6)
    np.testing.assert_allclose(scores[1], expected_a, atol=1e-6)
    np.testing.assert_allclose(scores[2], expected_a, atol=1e-6)
    # The two copies of a diverge once they choose different tokens.
    joined.advance(np.array([2, 3, 4]))
    after = joined.score()
    assert not np.allclose(after[1], after[2])


def test_lengths_outside_the_frames_are_refused():
    x = np.zeros((2, 4, 3), dtype=np.float32)
    with pytest.raises(ValueError, match="lengths must be in 1..4"):
        CTCPrefixScorer(x, np.array([4, 5]), BLANK, EOS)
    with pytest.raises(ValueError, match="1 lengths for 2 rows"):
        CTCPrefixScorer(x, np.array([4]), BLANK, EOS)


def forward_prefix_score(x, labels):
    """log P(labels are a prefix of the labelling) for one clip (T, V), by the textbook CTC forward pass
    (Graves 2012, ch. 7) over the states blank, l1, blank, l2, ..., summed over the frame at which the last
    label is entered from an earlier state."""
    states = [BLANK]
    for label in labels:
        states += [label, BLANK]
    last = 2 * len(labels) - 1  # the state of the last label
    alpha = np.full(len(states), -np.inf)
    alpha[0] = x[0, BLANK]
    alpha[1] = x[0, labels[0]]
    total = alpha[last] if last == 1 else -np.inf
    for t in range(1, len(x)):
        previous = alpha.copy()
        for s, label in enumerate(states):
            come = [previous[s]] + ([previous[s - 1]] if s >= 1 else [])
            if s >= 2 and label != BLANK and label != states[s - 2]:
                come.append(previous[s - 2])  # skip the blank between two different labels
            entered = np.logaddexp.reduce(come[1:]) if len(come) > 1 else -np.inf
            if s == last:
                total = np.logaddexp(total, entered + x[t, label])
            alpha[s] = np.logaddexp.reduce(come) + x[t, label]
    return total


def test_prefix_scores_on_longer_batched_clips_equal_the_textbook_recursion():
    rng = np.random.default_rng(4)
    lengths = np.array([40, 23, 31])
    padded = np.zeros((3, 40, 6), dtype=np.float32)
    for row, t in enumerate(lengths):
        padded[row, :t] = random_log_probs(rng, t, 6)
    prefixes = rng.integers(2, 6, size=(3, 8))
    prefixes[:, 3] = prefixes[:, 2]  # a repeated label, which needs a blank between
    scorer = CTCPrefixScorer(padded, lengths, BLANK, EOS)
    totals = feed(scorer, prefixes)
    for row, t in enumerate(lengths):
        expected = forward_prefix_score(padded[row, :t].astype(np.float64), list(prefixes[row]))
        assert totals[row] == pytest.approx(expected, abs=1e-3)
