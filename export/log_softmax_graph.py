"""Writes server/log_softmax.onnx: one LogSoftmax over the last axis of a (rows, vocabulary) float32 tensor.

    python -m attnserve.export.log_softmax_graph            # rewrites the file; tests check it is current

The server runs it with ONNX Runtime, whose kernel is vectorised, to turn each step's scores into
log-probabilities (server/log_softmax.py); serving needs no `onnx` package, so the graph is committed.
"""

from __future__ import annotations

import argparse
import pathlib

import onnx
from onnx import TensorProto, helper

GRAPH = pathlib.Path(__file__).resolve().parents[1] / "server" / "log_softmax.onnx"


def build() -> onnx.ModelProto:
    node = helper.make_node("LogSoftmax", ["scores"], ["log_probs"], axis=-1)
    graph = helper.make_graph(
        [node], "log_softmax",
        [helper.make_tensor_value_info("scores", TensorProto.FLOAT, ["rows", "vocabulary"])],
        [helper.make_tensor_value_info("log_probs", TensorProto.FLOAT, ["rows", "vocabulary"])],
    )
    # IR 8 / opset 17: what the pinned onnxruntime reads (the exporters' graphs use the same opset).
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8,
                             producer_name="attnserve")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=pathlib.Path, default=GRAPH)
    args = parser.parse_args()
    args.out.write_bytes(build().SerializeToString())
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
