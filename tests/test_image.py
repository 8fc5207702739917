"""An image model served end to end: the tiny Show-Attend-Tell captioner (tests/tiny_image.py) takes PNG and
JPEG files over gRPC. Decoding honours EXIF orientation, transparency and 16-bit grey; served == the PyTorch
reference on the same pixels, batched == alone, streamed == unary; a decompression bomb or a broken file is
INVALID_ARGUMENT and too many bytes OUT_OF_RANGE, before anything reaches a batch; `attnserve caption` prints
the caption and draws one heatmap panel per word."""

from __future__ import annotations

import io
import json
import struct
import zlib

import grpc
import numpy as np
import pytest
import torch
from PIL import Image

from attnserve.clients import cli, overlay
from attnserve.clients.client import Client, image_request
from attnserve.export.image.model import normalize
from attnserve.server.edge import app, readiness
from attnserve.server.inputs import preprocessors
from attnserve.api.generation import (
    AttentionGranularity,
    AttentionMatrix,
    AttentionOptions,
    GenerationRequest,
    ImageInput,
    InputKind,
    InputTooLargeError,
)
from attnserve.server.inputs.image import decode, resize
from attnserve.v1 import attnserve_pb2 as pb
from attnserve.v1 import attnserve_pb2_grpc as pb_grpc
from fakes import BATCHING_MODES, WAIT, generate_together
from tiny_image import NAME, captioner, encode, export_repo, pixels

ATOL = 1e-5
SIDE = 16
# (height, width, format): the model's size, larger and smaller, other aspect ratios, lossy and lossless.
IMAGES = [(16, 16, "PNG"), (48, 80, "PNG"), (9, 12, "JPEG"), (300, 200, "JPEG")]


def image_file(i: int) -> bytes:
    height, width, fmt = IMAGES[i]
    return encode(pixels(height, width, seed=i), fmt)


@pytest.fixture(scope="module")
def model():
    return captioner()


@pytest.fixture(scope="module")
def repo(tmp_path_factory, model):
    return export_repo(model, tmp_path_factory.mktemp("image_repo"))


@pytest.fixture(scope="module")
def served(repo):
    """(client, stub, engines): the tiny captioner behind an in-process gRPC server."""
    engines = app.load_engines(app.ServeOptions(models=str(repo)))
    with app.BackgroundServer(engines) as background, Client(background.address, timeout=WAIT) as client:
        with grpc.insecure_channel(background.address) as channel:
            yield client, pb_grpc.AttnServeStub(channel), engines, background.address


@pytest.fixture(scope="module")
def preprocessor(served):
    engine = served[2][NAME]
    return preprocessors.create(engine.manifest, None)


def reference(model, data: bytes) -> tuple[list[int], np.ndarray]:
    """Offline: the server's decoder and resize (tested on their own above), then the PyTorch model's greedy
    decode on pixels normalised by the training code."""
    upright = decode(data, 10**6, SIDE)
    x = normalize(torch.from_numpy(np.array(resize(upright, SIDE, SIDE)))[None], model.cfg)
    outputs, attentions = model.greedy_decode(x, max_new_tokens=model.cfg.max_words)
    return outputs[0], attentions[0].numpy()


def words() -> AttentionOptions:
    return AttentionOptions(enabled=True, granularity=AttentionGranularity.WORDS)



pytestmark = pytest.mark.usefixtures("torch_one_thread")

# ---- decoding ------------------------------------------------------------------------------------------


def test_a_png_of_the_model_size_gives_its_exact_pixels(preprocessor):
    x = pixels(SIDE, SIDE, seed=3)
    source = preprocessor.prepare(GenerationRequest(NAME, image=ImageInput(encode(x))))
    expected = (x.astype(np.float32) / 255 - 0.5) / 0.25
    np.testing.assert_array_equal(source.pixels, expected.transpose(2, 0, 1))
    assert source.length == 16


def test_exif_orientation_is_honoured(preprocessor):
    upright = pixels(24, 40, seed=4)  # wider than tall
    stored = np.ascontiguousarray(np.rot90(upright, k=1))  # as a camera held sideways stores it
    exif = Image.Exif()
    exif[0x0112] = 6  # "rotate 90 degrees clockwise to display"
    turned = preprocessor.prepare(GenerationRequest(NAME, image=ImageInput(encode(stored, exif=exif.tobytes()))))
    plain = preprocessor.prepare(GenerationRequest(NAME, image=ImageInput(encode(upright))))
    ignored = preprocessor.prepare(GenerationRequest(NAME, image=ImageInput(encode(stored))))
    np.testing.assert_array_equal(turned.pixels, plain.pixels)
    assert not np.array_equal(ignored.pixels, plain.pixels)


def test_transparency_is_shown_over_white_and_grey_is_spread_to_rgb(preprocessor):
    rgba = np.zeros((SIDE, SIDE, 4), np.uint8)
    rgba[:8, :, :] = (255, 0, 0, 255)  # opaque red on top, transparent below
    source = preprocessor.prepare(GenerationRequest(NAME, image=ImageInput(encode(rgba))))
    white, red = (1 - 0.5) / 0.25, np.array([2.0, -2.0, -2.0])
    np.testing.assert_allclose(source.pixels[:, 12, 5], [white] * 3)
    np.testing.assert_allclose(source.pixels[:, 2, 5], red)
    grey16 = np.full((SIDE, SIDE), 40000, np.uint16)  # 40000 >> 8 = 156
    for data in (encode(np.full((SIDE, SIDE), 156, np.uint8)), encode(grey16)):
        grey = preprocessor.prepare(GenerationRequest(NAME, image=ImageInput(data)))
        np.testing.assert_allclose(grey.pixels, np.full((3, SIDE, SIDE), (156 / 255 - 0.5) / 0.25), atol=1e-6)


def _png_header(width: int, height: int) -> bytes:
    """A PNG that declares width x height RGB pixels and holds one compressed row of them."""
    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(bytes(1 + 3 * width)))


@pytest.mark.parametrize(
    "data,error,message",
    [
        (_png_header(400, 251), ValueError, "declares 400 x 251 = 100400 pixels, over the 100000 accepted"),
        (_png_header(100_000, 100_000), ValueError, "decompression bomb"),
        (encode(pixels(40, 40, seed=1))[:300], ValueError, "cannot decode the PNG image"),
        (b"\xff\xd8\xff\xe0" + bytes(40), ValueError, "cannot read the JPEG image"),
        (b"GIF89a" + bytes(10), ValueError, "neither a PNG nor a JPEG"),
        (b"", ValueError, "image is empty"),
        (b"\x89PNG\r\n\x1a\n" + bytes(60_000), InputTooLargeError, "image is 60008 bytes; model 'tiny-caption'"),
    ],
)
def test_bad_or_hostile_files_are_refused_before_decoding(preprocessor, data, error, message):
    with pytest.raises(error, match=message):
        preprocessor.prepare(GenerationRequest(NAME, image=ImageInput(data)))


@pytest.mark.parametrize(
    "data,code",
    [(_png_header(100_000, 100_000), grpc.StatusCode.INVALID_ARGUMENT),
     (encode(pixels(40, 40, seed=1))[:300], grpc.StatusCode.INVALID_ARGUMENT),
     (b"\x89PNG\r\n\x1a\n" + bytes(60_000), grpc.StatusCode.OUT_OF_RANGE)],
)
def test_refused_files_get_their_status_over_grpc(served, data, code):
    _, stub, _, _ = served
    with pytest.raises(grpc.RpcError) as raised:
        stub.Generate(pb.GenerateRequest(model=NAME, image=pb.ImageInput(data=data)), timeout=WAIT)
    assert raised.value.code() is code


# ---- served results ------------------------------------------------------------------------------------


@pytest.mark.parametrize("i", range(len(IMAGES)))
def test_a_served_image_equals_the_offline_reference(served, model, i):
    client = served[0]
    result = client.generate(image_request(image_file(i), model=NAME, attention=True, granularity="words"))
    tokens, attention = reference(model, image_file(i))
    assert [t.id for t in result.tokens] == tokens and tokens
    np.testing.assert_allclose(result.attention.weights, attention, atol=ATOL)
    assert result.attention.col_labels[:2] == ["r0c0:0,0,4,4", "r0c1:4,0,8,4"]
    assert result.attention.col_labels[-1] == "r3c3:12,12,16,16" and len(result.source_tokens) == 16
    assert result.attention.row_labels == result.text.split()


@pytest.mark.parametrize("mode", BATCHING_MODES)
def test_a_batch_of_images_equals_each_image_alone(served, repo, mode):
    engines = served[2]
    n = len(IMAGES)
    requests = [GenerationRequest(NAME, image=ImageInput(image_file(i)), attention=words()) for i in range(n)]
    batched = generate_together(repo, NAME, mode, requests)
    for request, result in zip(requests, batched):
        alone = engines[NAME].generate(request, WAIT)
        assert [t.id for t in result.tokens] == [t.id for t in alone.tokens]
        np.testing.assert_allclose(result.attention.weights, alone.attention.weights, atol=ATOL)


@pytest.mark.parametrize("beam_size", [1, 3])
def test_a_streamed_caption_ends_with_the_unary_response(served, beam_size):
    stub = served[1]
    request = pb.GenerateRequest(
        model=NAME, image=pb.ImageInput(data=image_file(1)), decoding=pb.DecodingOptions(beam_size=beam_size),
        attention=pb.AttentionOptions(mode=pb.ATTENTION_MODE_AGGREGATED, granularity=pb.ATTENTION_GRANULARITY_WORDS),
    )
    unary = stub.Generate(request, timeout=WAIT)
    *events, final = list(stub.GenerateStream(request, timeout=WAIT))
    final.response.ClearField("timings")
    unary.ClearField("timings")
    assert final.response == unary and [e.token.token for e in events] == list(unary.tokens)
    assert all(len(e.token.attention) == 16 for e in events)


def test_model_info_states_the_image_size_grid_and_limits(served):
    client, stub = served[:2]
    info = client.get_model(NAME)
    assert info.input_kind is InputKind.IMAGE and info.task == "image-captioning" and info.audio is None
    assert (info.image.width, info.image.height, info.image.grid_rows, info.image.grid_cols) == (16, 16, 4, 4)
    assert info.image.max_bytes == 60_000 and info.image.max_pixels == 100_000 and info.max_source_tokens == 16
    wire = stub.GetModel(pb.GetModelRequest(name=NAME), timeout=WAIT)
    assert wire.input_kind == pb.INPUT_KIND_IMAGE and wire.image.grid_rows == 4 and wire.image.max_pixels == 100_000


def test_a_caption_model_warms_up_with_a_gray_image_of_its_size(served):
    """Readiness: an image model gets a real warm-up generation before it is SERVING, like the others."""
    engine = served[2][NAME]
    request = readiness.warm_up_request(engine.info)
    assert request is not None and Image.open(io.BytesIO(request.image.data)).size == (16, 16)
    result = engine.generate(request, WAIT)
    assert result.model == NAME and len(result.tokens) <= 1


# ---- the command line and the overlay ------------------------------------------------------------------


def test_caption_command_prints_the_caption_and_draws_a_panel_per_word(served, tmp_path, capsys):
    client, _, _, address = served
    path, out = tmp_path / "scene.jpg", tmp_path / "words.png"
    path.write_bytes(image_file(3))
    assert cli.main(["caption", str(path), "--address", address, "--attention", str(out)]) == 0
    text = capsys.readouterr().out.splitlines()[0]
    result = client.generate(image_request(image_file(3), model=NAME, attention=True, granularity="words"))
    assert text == result.text
    sheet = Image.open(out)
    n = len(result.text.split())
    panel_w, panel_h = round(200 * 256 / 300), 256  # a 200 x 300 original: its longer side becomes 256
    assert sheet.width == min(n, 4) * (panel_w + 8) + 8
    assert sheet.height > -(-n // 4) * (panel_h + 8)
    assert cli.main(["caption", str(path), "--address", address, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["text"] == result.text


def test_the_overlay_heats_the_attended_cell_and_maps_cells_onto_the_original():
    labels = [f"r{r}c{c}:{c * 4},{r * 4},{c * 4 + 4},{r * 4 + 4}" for r in range(4) for c in range(4)]
    assert overlay.parse_cells(labels)[:3] == (4, 4, (16, 16))
    weights = np.full((2, 16), 0.01)
    weights[0, 1 * 4 + 2], weights[1, 3 * 4 + 0] = 0.85, 0.85  # word 0: row 1 col 2; word 1: row 3 col 0
    attention = AttentionMatrix(weights.tolist(), ["dog", "bus"], labels, 0, "")
    grey = encode(np.full((160, 320, 3), 128, np.uint8))  # twice as wide as tall; each cell is 80 x 40 pixels
    sheet = np.asarray(overlay.render(grey, attention, panel=320, columns=2)).astype(int)
    label_h = round(max(12, 320 // 14) * 1.6)
    first = sheet[8 + label_h : 8 + label_h + 160, 8 : 8 + 320]
    second = sheet[8 + label_h : 8 + label_h + 160, 336 : 336 + 320]
    red = lambda tile, r, c: tile[r * 40 + 20, c * 80 + 40, 0]  # noqa: E731  the red channel at a cell's centre
    assert red(first, 1, 2) > red(first, 3, 0) + 60 and red(second, 3, 0) > red(second, 1, 2) + 60
    with pytest.raises(ValueError, match="not an image grid cell"):
        overlay.parse_cells(["0.00-0.04"])
