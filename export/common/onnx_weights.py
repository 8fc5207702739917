"""Reading a model's weights back out of its exported graphs (the translator's and the speller's
recover_weights.py): the exporter keeps each named parameter's name, under the traced module's `model.`."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import numpy_helper

PREFIX = "model."


def initializer_values(graph: onnx.GraphProto) -> dict[str, np.ndarray]:
    """Every initializer by name, and by the names Identity nodes give it (equal tensors are stored once)."""
    values = {init.name: numpy_helper.to_array(init) for init in graph.initializer}
    for node in graph.node:
        if node.op_type == "Identity" and node.input[0] in values:
            values[node.output[0]] = values[node.input[0]]
    return values
