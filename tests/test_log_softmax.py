"""The decode loop's log-softmax (server/decoding/log_softmax.py): ONNX Runtime's kernel on a committed one-node graph."""

from __future__ import annotations

import numpy as np

from attnserve.export.common import server_graphs
from attnserve.server.decoding.log_softmax import GRAPH, log_softmax


def reference(scores: np.ndarray) -> np.ndarray:
    x = scores.astype(np.float64)
    m = x.max(axis=-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=-1, keepdims=True))


def test_the_committed_graph_is_what_its_generator_writes():
    assert GRAPH.read_bytes() == server_graphs.log_softmax().SerializeToString()


def test_log_probabilities_match_a_float64_reference_in_any_shape():
    rng = np.random.default_rng(0)
    scores = (rng.standard_normal((3, 5, 17101)) * 6).astype(np.float32)
    scores[0, 0, :7] = -np.inf  # suppressed tokens
    got = log_softmax(scores)
    assert got.dtype == np.float32 and got.shape == scores.shape
    finite = np.isfinite(scores)
    np.testing.assert_allclose(got[finite], reference(scores)[finite], atol=2e-5)
    assert np.all(got[~finite] == -np.inf)
    np.testing.assert_array_equal(log_softmax(scores[1, 2]), got[1, 2])  # a row alone == the row in a batch
    assert log_softmax(scores[:0]).shape == (0, 5, 17101)
