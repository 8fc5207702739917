"""A video model served end to end: the tiny clip captioner (tests/tiny_video.py) takes MP4, WebM (VP8, VP9),
animated GIF files and PNG/JPEG stills. Each container decodes to the frames it was made from, sampled at the
middle of equal stretches of the clip; served == the PyTorch reference on the same frames, batched == alone;
files over a limit or broken are refused with the limit named, before anything big is decoded; responses
label every (frame, cell) column and carry each word's timeline and heatmap."""

from __future__ import annotations

import io

import grpc
import numpy as np
import pytest
import torch
from PIL import Image

from attnserve.clients import cli, filmstrip
from attnserve.export.video.model import normalize
from attnserve.export.video.render import encode_video
from attnserve.server.edge import app, readiness
from attnserve.server.inputs import preprocessors
from attnserve.api.generation import (
    AttentionGranularity,
    AttentionOptions,
    GenerationRequest,
    InputKind,
    InputTooLargeError,
    VideoInput,
)
from attnserve.server.inputs.video_files import read_clip, sample
from attnserve.v1 import attnserve_pb2 as pb
from attnserve.v1 import attnserve_pb2_grpc as pb_grpc
from fakes import BATCHING_MODES, WAIT, generate_together
from tiny_video import FRAMES, LIMITS, NAME, SIDE, frames, video_model, video_repo  # noqa: F401 (fixtures)

pytest.importorskip("av")
pytestmark = pytest.mark.usefixtures("torch_one_thread")

ATOL = 1e-5
# (container, frames, height, width, fps): every format, other sizes and aspect ratios, several lengths.
CLIPS = [("mp4", 12, 32, 48, 10), ("webm", 7, 16, 16, 5), ("webm-vp8", 20, 48, 32, 12), ("gif", 9, 24, 24, 6)]


def clip_file(i: int) -> bytes:
    container, count, height, width, fps = CLIPS[i]
    return encode_video(frames(count, height, width, seed=i), fps, container)


def png(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(array).save(buffer, "PNG")
    return buffer.getvalue()


def words() -> AttentionOptions:
    return AttentionOptions(enabled=True, granularity=AttentionGranularity.WORDS)


@pytest.fixture(scope="module")
def model(video_model):
    return video_model


@pytest.fixture(scope="module")
def repo(video_repo):
    return video_repo


@pytest.fixture(scope="module")
def served(repo):
    """(stub, engines, address): the tiny clip captioner behind an in-process gRPC server."""
    engines = app.load_engines(app.ServeOptions(models=str(repo)))
    with app.BackgroundServer(engines) as background, grpc.insecure_channel(background.address) as channel:
        yield pb_grpc.AttnServeStub(channel), engines, background.address


@pytest.fixture(scope="module")
def preprocessor(served):
    return preprocessors.create(served[1][NAME].manifest, None)


# ---- decoding ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("i", range(len(CLIPS)))
def test_each_container_decodes_to_its_frames_at_their_times(preprocessor, i):
    container, count, height, width, fps = CLIPS[i]
    original = frames(count, height, width, seed=i)
    clip = read_clip(VideoInput(clip_file(i)), preprocessor.spec, NAME)
    assert len(clip.frames) == count
    # GIF stores each frame's delay in hundredths of a second: 1/6 s is 0.16 or 0.17.
    np.testing.assert_allclose(clip.starts, np.arange(count) / fps, atol=5e-3)
    assert clip.duration == pytest.approx(count / fps, abs=5e-3)
    # Lossy codecs at a high quality: each frame is close to the original, resized as the server resizes.
    from attnserve.server.inputs.image import resize

    for decoded, source in zip(clip.frames, original):
        expected = resize(Image.fromarray(source), SIDE, SIDE).astype(float)
        assert np.abs(decoded.astype(float) - expected).mean() < (12 if container == "gif" else 6)


def test_stills_are_exact_and_sampled_at_the_middle_of_equal_stretches(preprocessor):
    stills = frames(10, SIDE, SIDE, seed=7)
    source = preprocessor.prepare(GenerationRequest(NAME, video=VideoInput(frames=tuple(png(f) for f in stills),
                                                                               frames_per_second=4)))
    # 10 frames at 4 fps last 2.5 s; 4 samples at 0.3125, 0.9375, 1.5625, 2.1875 s show frames 1, 3, 6, 8.
    np.testing.assert_allclose(source.times, [0.3125, 0.9375, 1.5625, 2.1875])
    expected = (stills[[1, 3, 6, 8]].astype(np.float32) / 255 - 0.5) / 0.25
    np.testing.assert_array_equal(source.pixels, expected.transpose(0, 3, 1, 2))
    assert source.length == FRAMES * 16


def test_a_clip_shorter_than_the_sample_count_repeats_frames():
    from attnserve.server.inputs.video_files import DecodedClip

    clip = DecodedClip([np.full((2, 2, 3), k, np.uint8) for k in range(2)], np.array([0.0, 0.5]), 1.0)
    chosen, times = sample(clip, 4)
    assert [int(f[0, 0, 0]) for f in chosen] == [0, 0, 1, 1] and list(times) == [0.125, 0.375, 0.625, 0.875]


def _gif(count: int, height: int, width: int) -> bytes:
    """`count` frames of one colour each, alternating (Pillow would merge equal frames into one)."""
    images = [Image.new("RGB", (width, height), (20, 120, 200) if k % 2 else (200, 60, 20)) for k in range(count)]
    buffer = io.BytesIO()
    images[0].save(buffer, "GIF", save_all=True, append_images=images[1:], duration=50)
    return buffer.getvalue()


@pytest.mark.parametrize(
    "video,error,message",
    [
        (VideoInput(_gif(1, 2000, 2000)), ValueError, r"2000 x 2000 = 4000000 pixels, over the 76800 accepted"),
        (VideoInput(b"\x00\x00\x00\x18ftypmp42" + bytes(200)), ValueError, "cannot read the MP4 file"),
        (VideoInput(b"RIFF" + bytes(100)), ValueError, "not an MP4, WebM or GIF file"),
        (VideoInput(), ValueError, "video is empty"),
        (VideoInput(frames=(b"\x89PNG\r\n\x1a\n",), frames_per_second=2), ValueError, "still 0: cannot"),
        (VideoInput(frames=(b"x",)), ValueError, "frames_per_second"),
        (VideoInput(b"GIF89a" + bytes(LIMITS["max_bytes"])), InputTooLargeError,
         f"of {LIMITS['max_bytes'] + 6} bytes; model 'tiny-video' accepts at most {LIMITS['max_bytes']} bytes"),
        (VideoInput(frames=(b"x",) * 61, frames_per_second=30), InputTooLargeError, "61 stills; .* at most 60 frames"),
        (VideoInput(frames=(b"x",) * 50, frames_per_second=10), InputTooLargeError, r"lasts 5.00 s; .* at most 4 s"),
    ],
)
def test_bad_or_hostile_clips_are_refused_naming_the_limit(preprocessor, video, error, message):
    with pytest.raises(error, match=message):
        preprocessor.prepare(GenerationRequest(NAME, video=video))


@pytest.mark.parametrize(
    "data,message",
    [(_gif(80, 8, 8), "more than 60 frames|declares 80 frames"),
     (encode_video(frames(50, 16, 16, seed=3), 10, "mp4"), r"lasts 5.0\d s; .* at most 4 s")],
    ids=["gif-80-frames", "mp4-5-seconds"],
)
def test_long_files_are_refused_out_of_range(preprocessor, data, message):
    with pytest.raises(InputTooLargeError, match=message):
        preprocessor.prepare(GenerationRequest(NAME, video=VideoInput(data)))


@pytest.mark.parametrize(
    "data,code",
    [(_gif(1, 2000, 2000), grpc.StatusCode.INVALID_ARGUMENT), (b"RIFF" + bytes(100), grpc.StatusCode.INVALID_ARGUMENT),
     (_gif(80, 8, 8), grpc.StatusCode.OUT_OF_RANGE)],
    ids=["pixels", "format", "frames"],
)
def test_refused_clips_get_their_status_over_grpc(served, data, code):
    with pytest.raises(grpc.RpcError) as raised:
        served[0].Generate(pb.GenerateRequest(model=NAME, video=pb.VideoInput(data=data)), timeout=WAIT)
    assert raised.value.code() is code


# ---- served results ------------------------------------------------------------------------------------


def reference(model, data: bytes, spec) -> tuple[list[int], np.ndarray]:
    """Offline: the server's decoding and sampling (tested above), then the PyTorch model's greedy decode on
    frames normalised by the training code."""
    chosen, _ = sample(read_clip(VideoInput(data), spec, NAME), FRAMES)
    x = normalize(torch.from_numpy(np.stack(chosen))[None], model.cfg)
    outputs, attentions = model.greedy_decode(x, max_new_tokens=model.cfg.max_words)
    return outputs[0], attentions[0].numpy()


@pytest.mark.parametrize("i", range(len(CLIPS)))
def test_a_served_clip_equals_the_offline_reference_with_timelines_and_heatmaps(served, preprocessor, model, i):
    stub, engines = served[:2]
    request = pb.GenerateRequest(model=NAME, video=pb.VideoInput(data=clip_file(i)), attention=pb.AttentionOptions(
        mode=pb.ATTENTION_MODE_AGGREGATED, granularity=pb.ATTENTION_GRANULARITY_WORDS))
    response = stub.Generate(request, timeout=WAIT)
    tokens, attention = reference(model, clip_file(i), preprocessor.spec)
    assert [t.id for t in response.tokens] == tokens and tokens
    weights = np.array(response.attention.weights).reshape(response.attention.rows, response.attention.cols)
    np.testing.assert_allclose(weights, attention, atol=ATOL)
    labels = [t.piece for t in response.source_tokens]
    times = (np.arange(FRAMES) + 0.5) * CLIPS[i][1] / CLIPS[i][4] / FRAMES
    assert labels[0] == f"f0@{times[0]:.3f}s:r0c0:0,0,4,4" and labels[-1] == f"f3@{times[3]:.3f}s:r3c3:12,12,16,16"
    assert [f.word for f in response.frames] == response.text.split()
    for row, f in zip(attention, response.frames):
        grid = row.reshape(FRAMES, 16)
        np.testing.assert_allclose(f.timeline, grid.sum(1), atol=1e-5)
        assert f.peak_frame == int(grid.sum(1).argmax()) and list(f.frame_seconds) == pytest.approx(times, abs=1e-3)
        np.testing.assert_allclose(f.heatmap, grid[f.peak_frame], atol=1e-5)


@pytest.mark.parametrize("mode", BATCHING_MODES)
def test_a_batch_of_clips_equals_each_clip_alone(served, repo, mode):
    engines = served[1]
    requests = [GenerationRequest(NAME, video=VideoInput(clip_file(i)), attention=words()) for i in range(len(CLIPS))]
    batched = generate_together(repo, NAME, mode, requests)
    for request, result in zip(requests, batched):
        alone = engines[NAME].generate(request, WAIT)
        assert [t.id for t in result.tokens] == [t.id for t in alone.tokens]
        np.testing.assert_allclose(result.attention.weights, alone.attention.weights, atol=ATOL)
        np.testing.assert_allclose([f.timeline for f in result.frames], [f.timeline for f in alone.frames], atol=ATOL)


def test_a_video_model_warms_up_with_gray_stills_of_its_size(served):
    """Readiness: a video model gets a real warm-up generation (stills: no PyAV needed) before it is SERVING."""
    engine = served[1][NAME]
    request = readiness.warm_up_request(engine.info)
    assert request is not None and len(request.video.frames) == FRAMES and not request.video.data
    assert Image.open(io.BytesIO(request.video.frames[0])).size == (SIDE, SIDE)
    result = engine.generate(request, WAIT)
    assert result.model == NAME and len(result.tokens) <= 1


def test_model_info_states_the_frames_grid_and_limits(served):
    stub, engines = served[:2]
    info = engines[NAME].info
    assert info.input_kind is InputKind.VIDEO and info.task == "video-captioning" and info.max_source_tokens == 64
    v = info.video
    assert (v.frames, v.width, v.height, v.grid_rows, v.grid_cols) == (FRAMES, SIDE, SIDE, 4, 4)
    assert (v.max_seconds, v.max_bytes, v.max_pixels, v.max_frames) == tuple(LIMITS.values())
    wire = stub.GetModel(pb.GetModelRequest(name=NAME), timeout=WAIT)
    assert wire.input_kind == pb.INPUT_KIND_VIDEO and wire.video.max_frames == 60 and wire.video.frames == FRAMES


# ---- the command line ----------------------------------------------------------------------------------


def test_caption_command_prints_the_caption_and_timelines_and_draws_the_strip(served, tmp_path, capsys):
    engines, address = served[1], served[2]
    path, out = tmp_path / "clip.mp4", tmp_path / "frames.png"
    path.write_bytes(clip_file(0))
    assert cli.main(["caption", str(path), "--address", address, "--attention", str(out)]) == 0
    lines = capsys.readouterr().out.splitlines()
    result = engines[NAME].generate(GenerationRequest(NAME, video=VideoInput(clip_file(0)), attention=words()), WAIT)
    assert lines[0] == result.text
    assert lines[1:1 + len(result.frames)] == filmstrip.text_timelines(result.attention).splitlines()
    peak = result.frames[0]
    assert f"peak {peak.frame_seconds[peak.peak_frame]:.2f} s" in lines[1]
    sheet = Image.open(out)
    assert sheet.height == len(result.frames) * (128 + 24 + 6) + 6  # a line of 128-pixel frames per word
    assert cli.main(["caption", str(path), "--address", address, "--json"]) == 0
    assert json_text(capsys.readouterr().out) == result.text


def json_text(out: str) -> str:
    import json

    return json.loads(out)["text"]


# ---- the web gateway -----------------------------------------------------------------------------------


def test_the_gateway_captions_an_uploaded_clip_with_its_frames_and_timelines(served):
    pytest.importorskip("aiohttp", reason="the web gateway needs the `web` extra (aiohttp)")
    import json
    import urllib.request

    from gateway_thread import BackgroundGateway

    engines, address = served[1], served[2]
    with BackgroundGateway(address) as web:
        for content_type, data in (("video/mp4", clip_file(0)), ("video/gif", clip_file(3))):
            request = urllib.request.Request(f"{web.url}/api/generate?model={NAME}", data=data,
                                             headers={"Content-Type": content_type})
            with urllib.request.urlopen(request, timeout=WAIT) as response:
                body = json.loads(response.read())
            alone = engines[NAME].generate(GenerationRequest(NAME, video=VideoInput(data), attention=words()), WAIT)
            assert body["text"] == alone.text and body["columns"]["kind"] == "frames"
            assert body["columns"]["times"] == pytest.approx(alone.frames[0].frame_seconds, abs=1e-3)
            assert body["columns"]["boxes"][:2] == [[0, 0, 4, 4], [4, 0, 8, 4]] and len(body["columns"]["boxes"]) == 16
            np.testing.assert_allclose([f["timeline"] for f in body["frames"]], [f.timeline for f in alone.frames],
                                       atol=1e-6)
