"""ONNX Runtime sessions for one model: the encoder graph and the one-step decoder graph.

Calls block; the batcher runs them on its worker thread only.
"""

from __future__ import annotations

import dataclasses
import pathlib
from collections.abc import Mapping

import numpy as np
import onnxruntime as ort

DEVICES = ("cpu", "cuda")
_PROVIDERS = {"cpu": "CPUExecutionProvider", "cuda": "CUDAExecutionProvider"}
# ONNX Runtime's type strings for the dtypes the contract uses.
_ORT_DTYPES = {
    "tensor(float)": "float32",
    "tensor(float16)": "float16",
    "tensor(double)": "float64",
    "tensor(int64)": "int64",
    "tensor(int32)": "int32",
    "tensor(bool)": "bool",
}


@dataclasses.dataclass(frozen=True)
class RuntimeOptions:
    # "cpu", or "cuda" for the CUDA execution provider (needs onnxruntime-gpu and a GPU).
    device: str = "cpu"
    # CUDA device ordinal when device == "cuda".
    device_id: int = 0
    # Threads one operator may use; 1 keeps several models (and the batcher) from fighting over cores.
    intra_op_threads: int = 1
    # Threads for running independent graph branches in parallel.
    inter_op_threads: int = 1
    # Manifest variant whose graphs to run where a model has it (e.g. "int8"); None = the default graphs.
    variant: str | None = None

    def __post_init__(self):
        if self.device not in DEVICES:
            raise ValueError(f"RuntimeOptions.device must be one of {list(DEVICES)}, got {self.device!r}")
        if self.intra_op_threads < 0 or self.inter_op_threads < 0:
            raise ValueError("RuntimeOptions thread counts must be >= 0 (0 = ONNX Runtime's default)")

    def providers(self) -> list[str | tuple[str, dict]]:
        """The execution providers to ask for, best first.

        Raises:
            ValueError: CUDA asked for but this onnxruntime build has no CUDA provider.
        """
        if self.device == "cpu":
            return [_PROVIDERS["cpu"]]
        available = ort.get_available_providers()
        if _PROVIDERS["cuda"] not in available:
            raise ValueError(
                f"device 'cuda' asked for, but this onnxruntime build offers only {available}; "
                "install the `gpu` extra (onnxruntime-gpu) on a machine with CUDA, or use device 'cpu'"
            )
        return [(_PROVIDERS["cuda"], {"device_id": self.device_id}), _PROVIDERS["cpu"]]


@dataclasses.dataclass(frozen=True)
class TensorSignature:
    name: str
    # numpy dtype name, e.g. "float32"; the ORT type string if it has no numpy twin.
    dtype: str
    # One entry per axis: a size, or the symbolic name (None when unnamed) of a dynamic axis.
    shape: tuple[int | str | None, ...]

    @property
    def rank(self) -> int:
        return len(self.shape)


@dataclasses.dataclass(frozen=True)
class GraphSignature:
    # The graph's file, for error messages.
    path: pathlib.Path
    inputs: Mapping[str, TensorSignature]
    outputs: Mapping[str, TensorSignature]


def _signature(path: pathlib.Path, session: ort.InferenceSession) -> GraphSignature:
    def convert(args) -> dict[str, TensorSignature]:
        return {a.name: TensorSignature(a.name, _ORT_DTYPES.get(a.type, a.type), tuple(a.shape)) for a in args}

    return GraphSignature(path, convert(session.get_inputs()), convert(session.get_outputs()))


def _open_session(path: pathlib.Path, options: RuntimeOptions) -> ort.InferenceSession:
    session_options = ort.SessionOptions()
    session_options.intra_op_num_threads = options.intra_op_threads
    session_options.inter_op_num_threads = options.inter_op_threads
    providers = options.providers()
    try:
        session = ort.InferenceSession(str(path), session_options, providers=providers)
    except Exception as exc:  # ORT raises its own exception types for unreadable or invalid graphs.
        raise ValueError(f"{path}: ONNX Runtime cannot load the graph: {exc}") from exc
    if options.device == "cuda" and _PROVIDERS["cuda"] not in session.get_providers():
        raise ValueError(
            f"{path}: the CUDA provider failed to start (is a GPU visible?); running on {session.get_providers()}"
        )
    return session


class Runtime:
    """The encoder and decoder sessions of one model version.

    Args:
        encoder_path: encoder.onnx.
        decoder_path: decoder.onnx.
        options: device and threading.

    Raises:
        ValueError: a graph cannot be loaded, or CUDA was asked for and is unavailable.
    """

    def __init__(
        self,
        encoder_path: pathlib.Path,
        decoder_path: pathlib.Path,
        options: RuntimeOptions = RuntimeOptions(),
        variant: str = "",
    ):
        self.options = options
        self.variant = variant  # the manifest variant these graphs are ("" = the default graphs)
        self._encoder = _open_session(pathlib.Path(encoder_path), options)
        self._decoder = _open_session(pathlib.Path(decoder_path), options)
        self.encoder_signature = _signature(pathlib.Path(encoder_path), self._encoder)
        self.decoder_signature = _signature(pathlib.Path(decoder_path), self._decoder)
        self._encoder_outputs = list(self.encoder_signature.outputs)
        self._decoder_outputs = list(self.decoder_signature.outputs)

    @property
    def providers(self) -> list[str]:
        """Providers the decoder session actually runs on."""
        return self._decoder.get_providers()

    def encode(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Runs the encoder once; returns every graph output by name."""
        return dict(zip(self._encoder_outputs, self._encoder.run(self._encoder_outputs, dict(feeds))))

    def decode_step(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Runs one decoder step; returns every graph output by name."""
        return dict(zip(self._decoder_outputs, self._decoder.run(self._decoder_outputs, dict(feeds))))
