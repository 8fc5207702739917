"""A weight both graphs of a model carry is loaded once for both sessions (server/model/shared_weights.py), and the
sessions compute exactly what they compute with copies of their own."""

from __future__ import annotations

import pathlib

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from attnserve.server.model import shared_weights
from attnserve.server.model.repository import find_models, open_runtime
from attnserve.server.model.runtime import RuntimeOptions

BUNDLED = pathlib.Path(__file__).parents[1] / "models"
LARGE = shared_weights.MIN_SHARED_BYTES // 4  # float32 values in a tensor just large enough to share


def write_graph(path: pathlib.Path, weights: dict[str, np.ndarray]) -> pathlib.Path:
    """A graph that returns the sum of its (float32) initializers' sums."""
    names = list(weights)
    nodes = [helper.make_node("ReduceSum", [name], [f"{name}_sum"], keepdims=0) for name in names]
    nodes.append(helper.make_node("Sum", [f"{name}_sum" for name in names], ["total"]))
    graph = helper.make_graph(nodes, "g", [], [helper.make_tensor_value_info("total", TensorProto.FLOAT, [])],
                              [numpy_helper.from_array(w, name) for name, w in weights.items()])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def test_only_large_identical_weights_of_the_same_name_are_shared(tmp_path):
    rng = np.random.default_rng(0)
    same, small = rng.standard_normal(LARGE, dtype=np.float32), np.ones(16, np.float32)
    a = write_graph(tmp_path / "a.onnx", {"table": same, "other": same + 1, "bias": small})
    b = write_graph(tmp_path / "b.onnx", {"table": same, "other": same + 2, "bias": small})
    shared = shared_weights.shared_initializers([a, b])
    assert list(shared) == ["table"]  # "other" differs, "bias" is too small to matter
    np.testing.assert_array_equal(shared["table"], same)
    assert shared_weights.shared_initializers([a]) == {}
    broken = tmp_path / "broken.onnx"
    broken.write_bytes(b"\xff" * 64)  # not protobuf: shares nothing, and ONNX Runtime will say what is wrong
    assert shared_weights.shared_initializers([a, broken]) == {}


@pytest.mark.bundled
def test_the_translators_sessions_share_their_embedding_and_compute_the_same():
    if not (BUNDLED / "translate-zh-en").is_dir():
        pytest.skip("no bundled translator")
    model = find_models(BUNDLED, only=["translate-zh-en"])["translate-zh-en"]
    shared, own = open_runtime(model), open_runtime(model, RuntimeOptions(share_weights=False))
    assert list(shared.shared_weights) == ["model.embed.weight"] and own.shared_weights == {}
    feeds = {"input_ids": np.array([[900, 41, 7, 1200, 2]], np.int64), "attention_mask": np.ones((1, 5), np.int64)}
    encoded = [runtime.encode(feeds) for runtime in (shared, own)]
    for name in encoded[1]:
        np.testing.assert_array_equal(encoded[0][name], encoded[1][name])
    step = {"input_ids": np.array([[4]], np.int64), "position_ids": np.zeros((1, 1), np.int64),
            "decoder_attention_mask": np.ones((1, 1), np.int64), "encoder_attention_mask": feeds["attention_mask"]}
    for spec in model.manifest.static:
        step[spec.target] = {**feeds, **encoded[1]}[spec.source]
    for spec in model.manifest.state:
        step[spec.input] = np.zeros((1, 4, 0, 64), np.float32)
    outputs = [runtime.decode_step(step) for runtime in (shared, own)]
    for name in outputs[1]:
        np.testing.assert_array_equal(outputs[0][name], outputs[1][name])
