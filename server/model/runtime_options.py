"""How a model's ONNX Runtime sessions run: device, threads, variant, memory.

Kept apart from `runtime` so that code which only passes these options along (the gRPC process of
`attnserve serve --engine-process`, which never runs a graph) does not import onnxruntime.
"""

from __future__ import annotations

import dataclasses

from attnserve.server.model.option_fields import bounded, check

DEVICES = ("cpu", "cuda")
PROVIDERS = {"cpu": "CPUExecutionProvider", "cuda": "CUDAExecutionProvider"}


@dataclasses.dataclass(frozen=True)
class RuntimeOptions:
    # "cpu", or "cuda" for the CUDA execution provider (needs onnxruntime-gpu and a GPU).
    device: str = bounded("cpu", choices=DEVICES)
    # CUDA device ordinal when device == "cuda".
    device_id: int = bounded(0, least=0)
    # Threads one operator may use; 1 keeps several models (and the batcher) from fighting over cores; 0 =
    # ONNX Runtime's default (every core).
    intra_op_threads: int = bounded(1, least=0)
    # Threads for running independent graph branches in parallel (0 = ONNX Runtime's default).
    inter_op_threads: int = bounded(1, least=0)
    # Manifest variant whose graphs to run where a model has it (e.g. "int8"); None = the default graphs.
    variant: str | None = None
    # ONNX Runtime's CPU memory arena. Off by default: shapes change every step (batch rows, cache length),
    # the arena keeps every size it ever served, and without it the served translator peaked 28 MB lower
    # under 32-64 clients at the same speed (decoder step at batch 1/8/32 within 1-8%, bench/README.md).
    cpu_memory_arena: bool = False
    # Load a weight the encoder and decoder graphs both carry (tied embeddings) once for both sessions, on
    # the CPU (server/model/shared_weights.py): 17 MB less for translate-zh-en.
    share_weights: bool = True
    # Keep the decoder's static inputs and K/V cache on the device between steps (server/model/device_state.py).
    # None: on for CUDA, off for the CPU (where it only adds a copy; tests turn it on to compare).
    io_binding: bool | None = None

    def __post_init__(self):
        check(self)

    @property
    def binds_io(self) -> bool:
        """Whether the decoder runs with IO binding (`io_binding`, or its default for the device)."""
        return self.device == "cuda" if self.io_binding is None else self.io_binding

    def providers(self) -> list[str | tuple[str, dict]]:
        """The execution providers to ask for, best first.

        Raises:
            ValueError: CUDA asked for but this onnxruntime build has no CUDA provider.
        """
        if self.device == "cpu":
            return [PROVIDERS["cpu"]]
        import onnxruntime as ort  # only here: see the module docstring

        available = ort.get_available_providers()
        if PROVIDERS["cuda"] not in available:
            raise ValueError(
                f"device 'cuda' asked for, but this onnxruntime build offers only {available}; "
                "install the `gpu` extra (onnxruntime-gpu) on a machine with CUDA, or use device 'cpu'"
            )
        return [(PROVIDERS["cuda"], {"device_id": self.device_id}), PROVIDERS["cpu"]]
