"""Preprocessors for text and images (audio: tests/test_audio.py): what each feeds the encoder, the labels of
its attention columns, its limits in ModelInfo, and the kind each manifest gets."""

from __future__ import annotations

import numpy as np
import pytest

from attnserve.server.inputs import preprocessors
from attnserve.server.inputs.audio import AudioPreprocessor
from attnserve.api.generation import GenerationRequest, ImageInput, InputKind, InputTooLargeError, ModelInfo
from attnserve.server.inputs.image import ImagePreprocessor
from attnserve.server.model.manifest import load_manifest, parse_manifest
from attnserve.server.inputs.preprocessing import TextPreprocessor, TextSource
from attnserve.server.model.tokenization import Tokenizer
from fakes import captioner_manifest, speller_manifest

BASE = ModelInfo("m", 1, "t", "", ["en"], ["en"], 0, 9, 1, 1)


@pytest.fixture(scope="module")
def text(tiny_model_dir) -> TextPreprocessor:
    manifest = load_manifest(tiny_model_dir / "manifest.json")
    return preprocessors.create(manifest, Tokenizer.from_manifest(tiny_model_dir, manifest))


@pytest.fixture(scope="module")
def image() -> ImagePreprocessor:
    data = captioner_manifest()
    data["input"].update(height=4, width=6, channels=3, grid={"rows": 2, "cols": 3}, max_bytes=100)
    return preprocessors.create(parse_manifest(data), None)


def test_each_kind_gets_its_preprocessor(text, image):
    assert type(text) is TextPreprocessor and type(image) is ImagePreprocessor
    assert type(preprocessors.create(parse_manifest(speller_manifest()), None)) is AudioPreprocessor


# ---- text ----------------------------------------------------------------------------------------------


def test_text_columns_are_pieces_and_words(text):
    source = text.prepare(GenerationRequest("tiny-translate", "Open the File menu"))
    assert isinstance(source, TextSource) and source.ids[-1] == text.tokenizer.eos
    tokens = text.source_tokens(source)
    assert [t.id for t in tokens] == list(source.ids) and tokens[-1].piece == "</s>"
    assert text.source_words(source).labels == ("Open", "the", "File", "menu", "</s>")


def test_text_batches_are_right_padded_with_pad(text):
    a, b = (text.prepare(GenerationRequest("tiny-translate", t)) for t in ("Open the File menu", "Save"))
    batch = text.collate([a, b])
    ids, mask = batch.feeds["input_ids"], batch.feeds["attention_mask"]
    assert ids.shape == (2, a.length) and ids.dtype == mask.dtype == np.int64
    assert ids[1, b.length :].tolist() == [text.manifest.special_tokens.pad] * (a.length - b.length)
    assert batch.lengths.tolist() == mask.sum(axis=1).tolist() == [a.length, b.length]


def test_text_refuses_other_kinds_and_describes_its_token_limit(text):
    with pytest.raises(ValueError, match="model 'tiny-translate' takes text input, not image"):
        text.prepare(GenerationRequest("tiny-translate", image=ImageInput(b"\x89PNG")))
    info = text.describe(BASE)
    assert (info.input_kind, info.max_source_tokens, info.audio, info.image) == (InputKind.TEXT, 48, None, None)


# ---- images --------------------------------------------------------------------------------------------


def test_pixels_are_scaled_normalised_and_put_channels_first(image):
    pixels = np.arange(4 * 6 * 3, dtype=np.uint8).reshape(4, 6, 3)
    source = image.source_from_pixels(pixels)
    mean, std = np.array([0.485, 0.456, 0.406]), np.array([0.229, 0.224, 0.225])
    want = ((pixels / 255.0 - mean) / std).transpose(2, 0, 1)
    assert source.pixels.shape == (3, 4, 6) and source.pixels.dtype == np.float32
    np.testing.assert_allclose(source.pixels, want, rtol=1e-6)
    assert source.length == 6
    batch = image.collate([source, source])
    assert batch.feeds["pixel_values"].shape == (2, 3, 4, 6) and batch.lengths.tolist() == [6, 6]


@pytest.mark.parametrize("shape,dtype", [((4, 6), np.uint8), ((6, 4, 3), np.uint8), ((4, 6, 3), np.float32)])
def test_pixels_of_another_size_or_type_are_refused(image, shape, dtype):
    with pytest.raises(ValueError, match=r"model 'caption-en' takes uint8 \(4, 6, 3\)"):
        image.source_from_pixels(np.zeros(shape, dtype))


def test_grid_cells_are_labelled_with_their_pixel_boxes(image):
    source = image.source_from_pixels(np.zeros((4, 6, 3), np.uint8))
    assert [t.piece for t in image.source_tokens(source)] == [
        "r0c0:0,0,2,2", "r0c1:2,0,4,2", "r0c2:4,0,6,2",
        "r1c0:0,2,2,4", "r1c1:2,2,4,4", "r1c2:4,2,6,4",
    ]
    assert parse_manifest(captioner_manifest()).input.grid_rows == 7
    big = preprocessors.create(parse_manifest(captioner_manifest()), None)
    labels = big.cell_labels()
    assert len(labels) == 49 and labels[8] == "r1c1:32,32,64,64" and labels[-1] == "r6c6:192,192,224,224"


@pytest.mark.parametrize(
    "data,error,message",
    [
        (b"", ValueError, "image is empty"),
        (b"GIF89a" + bytes(10), ValueError, "neither a PNG nor a JPEG"),
        (b"\x89PNG\r\n\x1a\n" + bytes(200), InputTooLargeError, "image is 208 bytes; model 'caption-en' accepts"),
        (b"\x89PNG\r\n\x1a\n" + bytes(10), ValueError, "cannot read the PNG image: the file is damaged"),
        (b"\xff\xd8\xff\xe0" + bytes(10), ValueError, "cannot read the JPEG image: the file is damaged"),
    ],
)
def test_image_files_are_checked_before_they_are_decoded(image, data, error, message):
    with pytest.raises(error, match=message):
        image.prepare(GenerationRequest("caption-en", image=ImageInput(data)))


def test_image_describes_its_size_grid_and_bytes(image):
    info = image.describe(BASE)
    assert info.input_kind is InputKind.IMAGE and info.max_source_tokens == 6 and info.audio is None
    assert (info.image.width, info.image.height, info.image.grid_rows, info.image.grid_cols) == (6, 4, 2, 3)
    assert info.image.max_bytes == 100
