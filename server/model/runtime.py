"""ONNX Runtime sessions for one model: the encoder graph and the one-step decoder graph.

Calls block; the batcher runs them on its worker thread only.
"""

from __future__ import annotations

import dataclasses
import pathlib
from collections.abc import Mapping

import numpy as np
import onnxruntime as ort

from attnserve.server.model.device_state import DeviceState
from attnserve.server.model.residency import Residency
from attnserve.server.model.runtime_options import PROVIDERS, RuntimeOptions  # noqa: F401  (re-exported)
from attnserve.server.model.shared_weights import shared_initializers

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


def _open_session(path: pathlib.Path, options: RuntimeOptions,
                  initializers: Mapping[str, ort.OrtValue] = {}) -> ort.InferenceSession:
    session_options = ort.SessionOptions()
    for name, value in initializers.items():  # used instead of the graph's own copy (shared_weights.py)
        session_options.add_initializer(name, value)
    session_options.intra_op_num_threads = options.intra_op_threads
    session_options.inter_op_num_threads = options.inter_op_threads
    session_options.enable_cpu_mem_arena = options.cpu_memory_arena
    providers = options.providers()
    try:
        session = ort.InferenceSession(str(path), session_options, providers=providers)
    except Exception as exc:  # ORT raises its own exception types for unreadable or invalid graphs.
        raise ValueError(f"{path}: ONNX Runtime cannot load the graph: {exc}") from exc
    if options.device == "cuda" and PROVIDERS["cuda"] not in session.get_providers():
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
        fixed_encoder_shapes: bool = False,
    ):
        self.options = options
        self.variant = variant  # the manifest variant these graphs are ("" = the default graphs)
        paths = [pathlib.Path(encoder_path), pathlib.Path(decoder_path)]
        # Kept alive as long as the sessions: they read these buffers instead of copies of their own.
        self.shared_weights: dict[str, ort.OrtValue] = {}
        if options.share_weights and options.device == "cpu":  # on CUDA each session holds device copies anyway
            self.shared_weights = {name: ort.OrtValue.ortvalue_from_numpy(array)
                                   for name, array in shared_initializers(paths).items()}
        # An encoder that always reads one shape (Whisper's 30 s window) keeps ONNX Runtime's arena: its large
        # buffers are then allocated once, not per call (16 whisper-tiny-sized clips: 15.8 s against 21.6 s).
        encoder_options = dataclasses.replace(options, cpu_memory_arena=True) if fixed_encoder_shapes else options
        self._encoder = _open_session(paths[0], encoder_options, self.shared_weights)
        self._decoder = _open_session(paths[1], options, self.shared_weights)
        self.encoder_signature = _signature(paths[0], self._encoder)
        self.decoder_signature = _signature(paths[1], self._decoder)
        self._encoder_outputs = list(self.encoder_signature.outputs)
        self._decoder_outputs = list(self.decoder_signature.outputs)
        # Device copies of the decoder inputs that a batch keeps between steps, with IO binding.
        self.device_state: DeviceState | None = None
        if options.binds_io:
            self.device_state = DeviceState(self._decoder, self._decoder_outputs, options.device, options.device_id)

    @property
    def decoder_bytes(self) -> int:
        """The decoder graph's size: about what one decoder call reads of weights (the scheduler's measure of
        what one more call costs)."""
        return self.decoder_signature.path.stat().st_size

    @property
    def providers(self) -> list[str]:
        """Providers the decoder session actually runs on."""
        return self._decoder.get_providers()

    def encode(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Runs the encoder once; returns every graph output by name."""
        return dict(zip(self._encoder_outputs, self._encoder.run(self._encoder_outputs, dict(feeds))))

    def decode_step(self, feeds: Mapping[str, np.ndarray], residency: Residency | None = None) -> dict[str, np.ndarray]:
        """Runs one decoder step; returns every graph output by name.

        Args:
            residency: which feeds the batch keeps unchanged between steps; with IO binding their device
                copies are reused (without it, or without IO binding, every feed is copied in).
        """
        if self.device_state is None or residency is None:
            return dict(zip(self._decoder_outputs, self._decoder.run(self._decoder_outputs, dict(feeds))))
        try:
            return self.device_state.run(feeds, residency)
        except Exception:
            self.device_state.forget()  # a step that failed half way may have updated some copies
            raise
