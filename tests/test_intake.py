"""Per-model intake (server/edge/intake.py, server/engine/decoded_size.py): bounded queue, decoded-bytes budget read
from headers, callers who left dropped before preprocessing, and one model's flood kept off another's path."""

from __future__ import annotations

import concurrent.futures
import dataclasses
import io
import threading
import time
import wave

import grpc
import numpy as np
import pytest
from PIL import Image
from prometheus_client import REGISTRY

from attnserve.api import generation
from attnserve.server.edge import app
from attnserve.server.engine import decoded_size
from attnserve.api.generation import AudioInput, GenerationRequest, ImageInput, OverloadedError, VideoInput
from attnserve.server.edge.intake import Intake, IntakeOptions
from attnserve.v1 import attnserve_pb2 as pb
from attnserve.v1 import attnserve_pb2_grpc as pb_grpc
from fakes import WAIT, FakeEngine


def _png(width: int, height: int, mode: str = "RGB") -> bytes:
    out = io.BytesIO()
    Image.new(mode, (width, height)).save(out, "PNG")
    return out.getvalue()


def _image(data: bytes) -> GenerationRequest:
    return GenerationRequest("m", image=ImageInput(data))


def test_decoded_size_is_read_from_headers():
    png = _png(3000, 2000)
    assert len(png) < 100_000  # cheap to send
    assert decoded_size.decoded_bytes(_image(png)) == 3000 * 2000 * 3
    assert decoded_size.decoded_bytes(_image(_png(100, 50, "L"))) == 100 * 50
    jpeg = io.BytesIO()
    Image.new("RGB", (640, 480)).save(jpeg, "JPEG")
    assert decoded_size.decoded_bytes(_image(jpeg.getvalue())) == 640 * 480 * 3
    wav = io.BytesIO()
    with wave.open(wav, "wb") as w:
        w.setnchannels(2)
        w.setsampwidth(2)
        w.setframerate(8000)
        w.writeframes(b"\0" * 4 * 8000)  # 1 s of stereo
    audio = GenerationRequest("m", audio=AudioInput(wav=wav.getvalue()))
    assert decoded_size.decoded_bytes(audio) == 8000 * 2 * 4
    raw = GenerationRequest("m", audio=AudioInput(samples=np.zeros(1000, np.float32), sample_rate_hz=8000))
    assert decoded_size.decoded_bytes(raw) == 4000
    assert decoded_size.decoded_bytes(_image(b"\x89PNG garbage")) == len(b"\x89PNG garbage")  # the wire size
    import soundfile

    flac = io.BytesIO()
    soundfile.write(flac, np.zeros((44100 * 3, 2), np.float32), 44100, format="FLAC")  # silence: tiny on the wire
    assert len(flac.getvalue()) < 20_000
    assert decoded_size.decoded_bytes(GenerationRequest("m", audio=AudioInput(wav=flac.getvalue()))) == 44100 * 3 * 4


def test_a_clips_decoded_size_counts_every_frame_from_headers():
    stills = VideoInput(frames=(_png(640, 480), _png(320, 240, "L")), frames_per_second=2)
    assert decoded_size.decoded_bytes(GenerationRequest("m", video=stills)) == 640 * 480 * 3 + 320 * 240
    pytest.importorskip("av")
    from attnserve.export.video.render import encode_video

    clip = encode_video(np.full((12, 64, 96, 3), 90, np.uint8), 10, "mp4")
    assert len(clip) < 12 * 64 * 96 * 3 / 4  # far smaller on the wire
    assert decoded_size.decoded_bytes(GenerationRequest("m", video=VideoInput(data=clip))) == 12 * 64 * 96 * 3
    garbage = VideoInput(data=b"\x1a\x45\xdf\xa3 not a webm")
    assert decoded_size.decoded_bytes(GenerationRequest("m", video=garbage)) == len(garbage.data)


def _blocked(intake: Intake) -> threading.Event:
    """Occupies the intake's one thread until the returned event is set."""
    release, started = threading.Event(), threading.Event()

    def hold(_request):
        started.set()
        release.wait(WAIT)

    intake.submit(hold, GenerationRequest("m", "x"))
    assert started.wait(WAIT)
    return release


def test_queue_bound_and_decoded_budget_refuse_before_anything_is_decoded():
    intake = Intake("m", IntakeOptions(workers=1, max_queued=2, max_decoded_bytes=10_000_000))
    release = _blocked(intake)
    calls = []
    try:
        big = _image(_png(1500, 1500))  # 6.75 MB decoded
        queued = intake.submit(calls.append, big)
        with pytest.raises(OverloadedError, match="--max-decoded-mb") as over_budget:
            intake.submit(calls.append, big)
        assert over_budget.value.reason == "decoded_bytes"
        small = GenerationRequest("m", "x")
        intake.submit(calls.append, small)
        with pytest.raises(OverloadedError, match="waiting for preprocessing") as full:
            intake.submit(calls.append, small)
        assert full.value.reason == "preprocess_queue_full"
        assert intake.queued == 2 and intake.decoded_bytes >= 6_750_000
    finally:
        release.set()
    queued.result(WAIT)
    intake.close()
    assert calls[0] is big and intake.queued == 0


def test_a_caller_who_left_is_dropped_before_preprocessing():
    intake = Intake("m", IntakeOptions(workers=1))
    release = _blocked(intake)
    calls = []
    cancelled = intake.submit(calls.append, GenerationRequest("m", "cancelled"))
    expired = intake.submit(calls.append, GenerationRequest("m", "expired"), deadline=time.monotonic())
    assert cancelled.cancel()
    release.set()
    with pytest.raises(TimeoutError, match="deadline passed while the request waited"):
        expired.result(WAIT)
    assert calls == [] and intake.queued == 0 and intake.decoded_bytes == 0
    intake.close()


class _SlowImageFake(FakeEngine):
    """An image model whose submit takes the time decoding a large image would, and counts its calls."""

    def __init__(self, gate: threading.Event):
        super().__init__("fake-image")
        image = generation.ImageInputInfo(16, 16, 2, 2, 100_000, 1_000_000)
        self.info = dataclasses.replace(self.info, input_kind=generation.InputKind.IMAGE, image=image)
        self.decoding = 0
        self.decoded = 0
        self._gate = gate

    def submit(self, request, on_token=None):
        self.decoding += 1
        self._gate.wait(WAIT)
        self.decoded += 1
        self.decoding -= 1
        return super().submit(request, on_token)


def test_one_models_flood_does_not_delay_another_model():
    """Every preprocessing slot of the image model is taken and its queue full; the text model's requests
    are answered all the same (before the flood's decoding ends), and the flood past the queue bound is
    refused at once. Before intakes, the text model's submissions queued behind the flood's on asyncio's
    shared executor: a cheap request to another model timed out at 60 s."""
    gate = threading.Event()
    text, image = FakeEngine(), _SlowImageFake(gate)
    options = IntakeOptions(workers=2, max_queued=4)
    png = _png(16, 16)
    with app.BackgroundServer({text.info.name: text, image.info.name: image}, intake_options=options) as bg, \
            grpc.insecure_channel(bg.address) as channel, concurrent.futures.ThreadPoolExecutor(16) as pool:
        generate = pb_grpc.AttnServeStub(channel).Generate
        flood = pb.GenerateRequest(model="fake-image", image=pb.ImageInput(data=png))

        def send_image(_):
            try:
                generate(flood, timeout=WAIT)
                return grpc.StatusCode.OK
            except grpc.RpcError as error:
                return error.code()

        outcomes = [pool.submit(send_image, i) for i in range(12)]
        _wait_for(lambda: image.decoding == 2 and bg.server.intakes["fake-image"].queued == 4)
        depth = REGISTRY.get_sample_value("attnserve_preprocess_queue_depth", {"model": "fake-image"})
        answers = [generate(pb.GenerateRequest(model="fake-translate", text=pb.TextInput(text=f"t{i}")),
                            timeout=WAIT).text for i in range(5)]
        assert answers == [f"{i}t" for i in range(5)]
        assert image.decoded == 0  # all of it while the flood was still being decoded
        gate.set()
        codes = [outcome.result() for outcome in outcomes]
    assert depth == 4
    assert codes.count(grpc.StatusCode.RESOURCE_EXHAUSTED) == 12 - 6 and codes.count(grpc.StatusCode.OK) == 6


def _wait_for(predicate) -> None:
    deadline = time.monotonic() + WAIT
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)
