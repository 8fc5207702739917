"""Readiness: a real warm-up inference per model before it is reported SERVING, and health's List RPC.

Health statuses are kept under "" (the server), "attnserve.v1.AttnServe" and each model's name. A model
is SERVING only after one real generation went through its engine (sessions built, first-call
allocations made); a model that failed to load or to warm up is NOT_SERVING under its name.
"""

from __future__ import annotations

import io
import logging

import numpy as np
from grpc_health.v1 import health, health_pb2
from PIL import Image

from attnserve.api import generation

logger = logging.getLogger(__name__)


class HealthServicer(health.aio.HealthServicer):
    """grpc's health servicer plus `List` (every known service and its status), which it leaves UNIMPLEMENTED."""

    async def List(self, request: health_pb2.HealthListRequest, context) -> health_pb2.HealthListResponse:
        statuses = {name: health_pb2.HealthCheckResponse(status=status) for name, status in self._server_status.items()}
        return health_pb2.HealthListResponse(statuses=statuses)


def warm_up_request(info: generation.ModelInfo) -> generation.GenerationRequest | None:
    """A one-token request of the model's input kind (text, half a second of silence, a gray image of the
    model's size, a clip of gray stills); None for a kind without one."""
    decoding = generation.DecodingOptions(max_new_tokens=1)
    if info.input_kind is generation.InputKind.TEXT:
        return generation.GenerationRequest(model=info.name, text="warm up", decoding=decoding, request_id="warm-up")
    if info.input_kind is generation.InputKind.AUDIO:
        rate = info.audio.sample_rate_hz
        silence = generation.AudioInput(samples=np.zeros(rate // 2, dtype=np.float32), sample_rate_hz=rate)
        return generation.GenerationRequest(model=info.name, audio=silence, decoding=decoding, request_id="warm-up")
    if info.input_kind is generation.InputKind.IMAGE:
        gray = io.BytesIO()
        Image.new("RGB", (info.image.width, info.image.height), (128, 128, 128)).save(gray, format="PNG")
        image = generation.ImageInput(data=gray.getvalue())
        return generation.GenerationRequest(model=info.name, image=image, decoding=decoding, request_id="warm-up")
    if info.input_kind is generation.InputKind.VIDEO:  # stills: a server without PyAV warms up too
        gray = io.BytesIO()
        Image.new("RGB", (info.video.width, info.video.height), (128, 128, 128)).save(gray, format="PNG")
        clip = generation.VideoInput(frames=(gray.getvalue(),) * info.video.frames, frames_per_second=info.video.frames)
        return generation.GenerationRequest(model=info.name, video=clip, decoding=decoding, request_id="warm-up")
    return None


def warm_up(engine, timeout: float = 300.0) -> None:
    """Runs one real generation through `engine` (blocking).

    Raises:
        Exception: whatever the engine raised; the model is not ready.
    """
    request = warm_up_request(engine.info)
    if request is None:
        logger.info("model %r: no warm-up for %s input", engine.info.name, engine.info.input_kind.value)
        return
    future = engine.submit(request)
    try:
        future.result(timeout)
    finally:
        engine.cancel(future)
