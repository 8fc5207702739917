"""Writes the small graphs the server runs beside the models' own, committed next to its code.

    python -m attnserve.export.common.server_graphs            # rewrites them; tests check they are current

- server/decoding/log_softmax.onnx: LogSoftmax over the last axis of a (rows, vocabulary) float32 tensor. The decode
  loop turns each step's scores into log-probabilities with it (server/decoding/log_softmax.py): ONNX Runtime's kernel
  is vectorised where numpy's float32 `exp` is not.
- server/model/cache_append.onnx: `updated = Where(slot, new, past)`, a step's new slot written into an
  appended-state buffer kept on the device (server/model/device_state.py). `new` is the slot (length 1 on the time
  axis), `slot` a boolean of the buffer's rank, True at the slot written and length 1 on every other axis;
  broadcasting does the rest, for any rank and time axis.
- server/model/grow_cache.onnx: `Pad(Slice(past, cut, used), spare)` along the time axis: stacked cache buffers
  kept on the device reallocated as the host's are (leading slots no row attends cut, spare slots added).
- server/model/copy_rows.onnx: `ScatterND(data, targets, GatherND(data, sources))`: rows of tensors stacked on the
  device copied into others there (beams kept twice, rows moved into free slots), (tensor, row) pairs.
- server/model/write_rows.onnx: `updated = ScatterND(data, rows, values)`: rows of tensors stacked on the device
  (`rows` holds (tensor, row) pairs) rewritten from the host (rows joining a batch, beams copied:
  server/model/device_state.py).

Serving needs no `onnx` package, so the graphs are committed.
"""

from __future__ import annotations

import argparse
import pathlib

import onnx
from onnx import TensorProto, helper

SERVER = pathlib.Path(__file__).resolve().parents[2] / "server"


def log_softmax() -> onnx.ModelProto:
    return _model(
        "log_softmax", [helper.make_node("LogSoftmax", ["scores"], ["log_probs"], axis=-1)],
        [helper.make_tensor_value_info("scores", TensorProto.FLOAT, ["rows", "vocabulary"])],
        [helper.make_tensor_value_info("log_probs", TensorProto.FLOAT, ["rows", "vocabulary"])],
    )


def cache_append() -> onnx.ModelProto:
    return _model(
        "cache_append", [helper.make_node("Where", ["slot", "new", "past"], ["updated"])],
        [helper.make_tensor_value_info("slot", TensorProto.BOOL, None),
         helper.make_tensor_value_info("new", TensorProto.FLOAT, None),
         helper.make_tensor_value_info("past", TensorProto.FLOAT, None)],
        [helper.make_tensor_value_info("updated", TensorProto.FLOAT, None)],
    )


def write_rows() -> onnx.ModelProto:
    return _model(
        "write_rows", [helper.make_node("ScatterND", ["data", "rows", "values"], ["updated"])],
        [helper.make_tensor_value_info("data", TensorProto.FLOAT, None),
         helper.make_tensor_value_info("rows", TensorProto.INT64, ["rows", 2]),
         helper.make_tensor_value_info("values", TensorProto.FLOAT, None)],
        [helper.make_tensor_value_info("updated", TensorProto.FLOAT, None)],
    )


def grow_cache() -> onnx.ModelProto:
    return _model(
        "grow_cache",
        [helper.make_node("Slice", ["past", "start", "stop", "axis"], ["kept"]),
         helper.make_node("Pad", ["kept", "pads"], ["updated"], mode="constant")],
        [helper.make_tensor_value_info("past", TensorProto.FLOAT, None),
         helper.make_tensor_value_info("start", TensorProto.INT64, [1]),
         helper.make_tensor_value_info("stop", TensorProto.INT64, [1]),
         helper.make_tensor_value_info("axis", TensorProto.INT64, [1]),
         helper.make_tensor_value_info("pads", TensorProto.INT64, ["twice_rank"])],
        [helper.make_tensor_value_info("updated", TensorProto.FLOAT, None)],
    )


def copy_rows() -> onnx.ModelProto:
    return _model(
        "copy_rows",
        [helper.make_node("GatherND", ["data", "sources"], ["values"]),
         helper.make_node("ScatterND", ["data", "targets", "values"], ["updated"])],
        [helper.make_tensor_value_info("data", TensorProto.FLOAT, None),
         helper.make_tensor_value_info("sources", TensorProto.INT64, ["rows", 2]),
         helper.make_tensor_value_info("targets", TensorProto.INT64, ["rows", 2])],
        [helper.make_tensor_value_info("updated", TensorProto.FLOAT, None)],
    )


# File under server/ -> the function that builds it.
GRAPHS = {"decoding/log_softmax.onnx": log_softmax, "model/cache_append.onnx": cache_append,
          "model/write_rows.onnx": write_rows, "model/grow_cache.onnx": grow_cache, "model/copy_rows.onnx": copy_rows}


def _model(name: str, nodes: list[onnx.NodeProto], inputs: list, outputs: list) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, name, inputs, outputs)
    # IR 8 / opset 17: what the pinned onnxruntime reads (the exporters' graphs use the same opset).
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8,
                             producer_name="attnserve")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=pathlib.Path, default=SERVER, help="server/ folder to write them under")
    args = parser.parse_args()
    for name, build in GRAPHS.items():
        (args.out / name).write_bytes(build().SerializeToString())
        print(f"wrote {args.out / name}")


if __name__ == "__main__":
    main()
