"""Attention aggregation: layer choice, head mean, and word merging that keeps rows summing to 1."""

from __future__ import annotations

import numpy as np
import pytest

from attnserve.server.attention.attention import attention_matrix, combine_heads, merge_words
from attnserve.api.generation import AttentionReduction
from attnserve.server.model.tokenization import Words


def random_attention(steps=5, layers=3, heads=4, sources=6, seed=0):
    """(steps, layers, heads, S) softmax rows, like a decoder's cross-attention."""
    x = np.random.default_rng(seed).standard_normal((steps, layers, heads, sources)).astype(np.float32)
    e = np.exp(x)
    return e / e.sum(-1, keepdims=True)


def test_combine_heads_reads_one_layer_and_averages_heads():
    w = random_attention()
    np.testing.assert_allclose(combine_heads(w, 1), w[:, 1].mean(axis=1), rtol=1e-6)
    np.testing.assert_array_equal(combine_heads(w, -1), combine_heads(w, 2))
    with pytest.raises(ValueError, match="attention layer 3 is out of range for a model with 3 layers"):
        combine_heads(w, 3)


def test_chosen_heads_are_combined_by_mean_or_max():
    w = random_attention()
    np.testing.assert_allclose(combine_heads(w, 1, [2]), w[:, 1, 2], rtol=1e-6)
    np.testing.assert_allclose(combine_heads(w, 1, [0, 3]), w[:, 1, [0, 3]].mean(axis=1), rtol=1e-6)
    np.testing.assert_allclose(combine_heads(w, 0, [], AttentionReduction.MAX), w[:, 0].max(axis=1), rtol=1e-6)
    np.testing.assert_allclose(combine_heads(w, 0, [1, 2], AttentionReduction.MAX), w[:, 0, [1, 2]].max(axis=1))
    matrix = attention_matrix(w, 1, list("abcde"), list("uvwxyz"), heads=(0, 3), reduction=AttentionReduction.MAX)
    assert matrix.reduction == "layer 1 of 3, max over heads 0, 3, pieces"
    assert attention_matrix(w, 1, list("abcde"), list("uvwxyz")).reduction == "layer 1 of 3, mean over 4 heads, pieces"


def test_merge_words_sums_columns_and_averages_rows():
    m = np.array([[0.1, 0.2, 0.7], [0.3, 0.3, 0.4], [0.5, 0.25, 0.25]])
    # rows: words {0, 1} and {2}; columns: words {0} and {1, 2}
    got = merge_words(m, [0, 2], [0, 1])
    np.testing.assert_allclose(got, [[0.2, 0.8], [0.5, 0.5]])


def test_rows_sum_to_one_for_pieces_and_words():
    w = random_attention(steps=5, sources=6)
    pieces = attention_matrix(w, -1, list("abcde"), list("uvwxyz"))
    words = attention_matrix(
        w, -1, list("abcde"), list("uvwxyz"), Words((0, 1, 4), ("a", "bcd", "e")), Words((0, 3), ("uvw", "xyz"))
    )
    np.testing.assert_allclose(np.sum(pieces.weights, axis=1), 1.0, atol=1e-5)
    np.testing.assert_allclose(np.sum(words.weights, axis=1), 1.0, atol=1e-5)
    assert np.shape(words.weights) == (3, 2) and words.row_labels == ["a", "bcd", "e"]
    assert words.col_labels == ["uvw", "xyz"]
    # the merged matrix is the piece matrix, columns summed and rows averaged
    p = np.array(pieces.weights)
    np.testing.assert_allclose(words.weights[1], [p[1:4, :3].sum(1).mean(), p[1:4, 3:].sum(1).mean()], rtol=1e-6)


def test_matrix_labels_layer_and_reduction():
    w = random_attention(steps=2, layers=3, heads=4, sources=3)
    m = attention_matrix(w, -2, ["x", "y"], ["a", "b", "</s>"])
    assert m.layer == 1 and m.row_labels == ["x", "y"] and m.col_labels == ["a", "b", "</s>"]
    assert m.reduction == "layer 1 of 3, mean over 4 heads, pieces"
    np.testing.assert_allclose(m.weights, w[:, 1].mean(1), rtol=1e-6)
    assert isinstance(m.weights[0][0], float)


def test_no_output_tokens_gives_an_empty_matrix():
    w = np.zeros((0, 2, 4, 3), dtype=np.float32)
    m = attention_matrix(w, 0, [], ["a", "b", "</s>"], Words((), ()), Words((0, 1, 2), ("a", "b", "</s>")))
    assert m.weights == [] and m.row_labels == [] and m.col_labels == ["a", "b", "</s>"]
