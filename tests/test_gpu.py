"""The CUDA provider gives what the CPU provider gives, with the decoder's state kept on the GPU between steps
(IO binding, the default there) and without. Skipped where onnxruntime-gpu or a GPU is missing."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest

from attnserve.server.engine.batcher import BatchingOptions
from attnserve.api.generation import AttentionOptions, GenerationRequest
from attnserve.server.engine.registry import load_engines
from attnserve.server.model.runtime import RuntimeOptions

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        "CUDAExecutionProvider" not in ort.get_available_providers(), reason="needs onnxruntime-gpu and CUDA"
    ),
]

TEXTS = ["知識就是力量。", "Open the File menu, then choose Save.", "這個按鈕會關閉視窗"]


def results(repository, device: str, io_binding: bool | None = None):
    registry = load_engines(repository, RuntimeOptions(device=device, io_binding=io_binding), BatchingOptions())
    try:
        engine = registry.get("tiny-translate")
        assert (engine.runtime.device_state is not None) == (device == "cuda" and io_binding is not False)
        futures = [
            engine.submit(GenerationRequest("tiny-translate", t, lang, attention=AttentionOptions(enabled=True)))
            for t in TEXTS
            for lang in ("en", "zh-TW")
        ]
        return [f.result(timeout=120) for f in futures]
    finally:
        registry.close()


@pytest.mark.parametrize("io_binding", [None, False], ids=["state kept on the GPU", "host feeds"])
def test_cuda_equals_cpu(tiny_model_repo, io_binding):
    for cpu, cuda in zip(results(tiny_model_repo, "cpu"), results(tiny_model_repo, "cuda", io_binding)):
        assert [t.id for t in cuda.tokens] == [t.id for t in cpu.tokens]
        np.testing.assert_allclose(cuda.attention.weights, cpu.attention.weights, atol=1e-3)
