"""Attention explanations: computed by hand on a small matrix, and carried over gRPC only with attention."""

from __future__ import annotations

import math

import numpy as np
import pytest

from attnserve.clients.client import Client, translation_request
from attnserve.server.attention.explanation import NEGLECT_THRESHOLD, explain
from conftest import TINY_MODEL_NAME

# Three output words over four source words, the last one the source's end token.
WEIGHTS = [
    [0.7, 0.2, 0.0, 0.1],
    [0.1, 0.8, 0.05, 0.05],
    [0.5, 0.5, 0.0, 0.0],  # a tie: the first column wins
]


def test_explanation_of_a_hand_made_matrix():
    explanation = explain(WEIGHTS, 4, ignored_columns=[3])
    assert explanation.alignment == [0, 1, 0]
    assert explanation.coverage == pytest.approx([1.3, 1.5, 0.05, 0.15])
    h = lambda *p: -sum(x * math.log(x) for x in p)  # noqa: E731
    assert explanation.entropy == pytest.approx([h(0.7, 0.2, 0.1), h(0.1, 0.8, 0.05, 0.05), math.log(2)])
    assert explanation.neglected == [False, False, True, False]  # column 2 got 0.05 < 0.1
    assert explanation.neglect_threshold == NEGLECT_THRESHOLD
    assert explain(WEIGHTS, 4).neglected == [False, False, True, False]  # 0.15 is enough for column 3
    assert explain(WEIGHTS, 4, neglect_threshold=0.2).neglected == [False, False, True, True]
    assert explain(WEIGHTS, 4, [3], neglect_threshold=0.2).neglected == [False, False, True, False]


def test_one_hot_rows_have_zero_entropy_and_an_empty_matrix_explains_nothing():
    explanation = explain(np.eye(3), 3)
    assert explanation.entropy == [0.0, 0.0, 0.0] and explanation.alignment == [0, 1, 2]
    empty = explain([], 4)
    assert empty.alignment == [] and empty.entropy == [] and empty.coverage == [0.0] * 4


@pytest.mark.parametrize("granularity", ["pieces", "words"])
def test_explanations_come_over_grpc_with_the_attention_only(tiny_server, granularity):
    background, _ = tiny_server
    with Client(background.address) as client:
        request = translation_request(
            "Open the File menu", to="en", attention=True, granularity=granularity, model=TINY_MODEL_NAME,
            max_new_tokens=6,
        )
        result = client.generate(request)
        plain = client.generate(translation_request("Open the File menu", to="en", model=TINY_MODEL_NAME))
    matrix = result.attention
    assert plain.attention is None
    expected = explain(matrix.weights, len(matrix.col_labels), ignored_columns=[len(matrix.col_labels) - 1])
    got = matrix.explanation
    assert got.alignment == expected.alignment and got.neglected == expected.neglected
    np.testing.assert_allclose(got.coverage, expected.coverage, rtol=1e-6)  # float32 on the wire
    np.testing.assert_allclose(got.entropy, expected.entropy, rtol=1e-6, atol=1e-7)
    assert len(got.alignment) == len(matrix.row_labels) and len(got.coverage) == len(matrix.col_labels)
    assert matrix.col_labels[-1] == "</s>" and got.neglected[-1] is False
