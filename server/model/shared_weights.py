"""Weights that a model's encoder and decoder graphs both carry, loaded once for both sessions.

A Transformer with tied embeddings exports the same token-embedding table into each graph, and each ONNX
Runtime session kept its own copy: 17.5 MB twice for translate-zh-en (17,101 x 256 float32). ONNX Runtime
takes a tensor the caller owns in place of a graph's initializer of the same name
(`SessionOptions.add_initializer`), so one array can serve both sessions. Measured on translate-zh-en, with
identical outputs: a served translator idles at 162 MB instead of 179 (197 instead of 214 with
`--engine-process`).

The initializers are found by walking the file's protobuf wire format (three nested messages, five fields)
over a memory map, so serving needs neither the `onnx` package nor a parsed copy of a graph: the only
memory this costs is the shared arrays themselves.
"""

from __future__ import annotations

import hashlib
import mmap
import pathlib
from collections.abc import Iterator, Sequence

import numpy as np

# Initializers smaller than this are not worth sharing (biases, norms, shapes).
MIN_SHARED_BYTES = 1 << 20
# ONNX TensorProto.DataType -> numpy dtype, for the types a graph's large weights come in.
_DTYPES = {1: np.float32, 2: np.uint8, 3: np.int8, 6: np.int32, 7: np.int64, 10: np.float16, 11: np.float64}
# onnx.proto's field numbers: ModelProto.graph, GraphProto.initializer, and the TensorProto fields read here.
_GRAPH, _INITIALIZER = 7, 5
_DIMS, _DATA_TYPE, _NAME, _RAW_DATA, _DATA_LOCATION = 1, 2, 8, 9, 14
_EXTERNAL = 1  # TensorProto.DataLocation.EXTERNAL: the bytes live in another file


def _varint(buf, at: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = buf[at]
        at += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, at
        shift += 7


def _fields(buf, start: int, end: int) -> Iterator[tuple[int, int, int | tuple[int, int]]]:
    """(field number, wire type, value) of each field of the message in buf[start:end]; a length-delimited
    field's value is its (start, end)."""
    at = start
    while at < end:
        key, at = _varint(buf, at)
        number, kind = key >> 3, key & 7
        if kind == 0:
            value, at = _varint(buf, at)
        elif kind == 1:
            value, at = 0, at + 8
        elif kind == 5:
            value, at = 0, at + 4
        elif kind == 2:
            length, at = _varint(buf, at)
            value, at = (at, at + length), at + length
        else:
            raise ValueError(f"unsupported protobuf wire type {kind} (not an ONNX model?)")
        yield number, kind, value


def _initializers(buf) -> Iterator[tuple[str, int, tuple[int, ...], tuple[int, int]]]:
    """(name, data type, shape, raw data span) of each initializer held in the file itself."""
    for number, kind, graph in _fields(buf, 0, len(buf)):
        if number != _GRAPH or kind != 2:
            continue
        for number, kind, tensor in _fields(buf, *graph):
            if number != _INITIALIZER or kind != 2:
                continue
            name, data_type, dims, raw, location = "", 0, [], None, 0
            for field, kind, value in _fields(buf, *tensor):
                if field == _DIMS and kind == 0:
                    dims.append(value)
                elif field == _DIMS and kind == 2:  # packed
                    at, end = value
                    while at < end:
                        dim, at = _varint(buf, at)
                        dims.append(dim)
                elif field == _DATA_TYPE:
                    data_type = value
                elif field == _NAME:
                    name = bytes(buf[value[0]:value[1]]).decode("utf-8")
                elif field == _RAW_DATA:
                    raw = value
                elif field == _DATA_LOCATION:
                    location = value
            if raw is not None and location != _EXTERNAL:
                yield name, data_type, tuple(dims), raw


def shared_initializers(graphs: Sequence[pathlib.Path]) -> dict[str, np.ndarray]:
    """The large initializers that every one of `graphs` holds under the same name with the same type,
    shape and bytes, as arrays (name -> array) to hand each session. A file that is not a readable ONNX
    model shares nothing (ONNX Runtime then says what is wrong with it)."""
    if len(graphs) < 2:
        return {}
    try:
        found = [_read(path, lambda view, start, end: hashlib.sha256(view[start:end]).hexdigest())
                 for path in graphs]  # per graph: name -> (type, shape, digest)
        names = {name for name, key in found[0].items() if all(other.get(name) == key for other in found[1:])}
        if not names:
            return {}
        arrays = _read(graphs[0], lambda view, start, end: np.frombuffer(view[start:end], np.uint8).copy(), names)
    except (ValueError, IndexError, OSError):
        return {}
    return {name: raw.view(_DTYPES[data_type]).reshape(dims) for name, (data_type, dims, raw) in arrays.items()}


def _read(path: pathlib.Path, take, only: set[str] | None = None) -> dict[str, tuple]:
    """name -> (data type, shape, take(view, start, end)) of the file's large initializers (those in `only`)."""
    with open(path, "rb") as file, mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as buf:
        view = memoryview(buf)
        try:
            return {
                name: (data_type, dims, take(view, start, end))
                for name, data_type, dims, (start, end) in _initializers(view)
                if end - start >= MIN_SHARED_BYTES and data_type in _DTYPES and (only is None or name in only)
            }
        finally:
            view.release()
