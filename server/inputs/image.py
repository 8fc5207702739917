"""Image input: PNG or JPEG files -> the model's size and channels -> normalised pixels read as a grid of cells.

`ImagePreprocessor.prepare` checks the cheap things first, so that a hostile file is refused before it is
decoded: the byte size (OUT_OF_RANGE past `max_bytes`), the signature (PNG or JPEG), then the size the
header declares (a decompression bomb, more than `max_pixels`, is INVALID_ARGUMENT). Only then are pixels
decoded (a large JPEG at the smallest DCT scale that still covers the model's size), turned upright by their
EXIF orientation, flattened onto white if they have transparency, converted to the model's channels and
resized to its input (Pillow's antialiasing bilinear filter; the aspect ratio is not kept: the whole image
is squeezed into the model's input, so every cell maps back to one rectangle of the original).

An image model's encoder reads normalised pixels (B, C, H, W) of one fixed size and attends over a grid of
cells, one encoder position per cell, row by row (manifest `input`: size, channels, normalisation, grid).
Attention column j is cell (j // cols, j % cols), labelled "r<row>c<col>:x0,y0,x1,y1" with its pixel box
in the model's input (x1, y1 exclusive); a client scales the boxes by the original's size over the input's.
An encoder may hold positions before the grid that stand for no cell (ViT's class token): manifest
`input.grid.leading` names them ("cls"), and they come first, labelled with those names, the cells after.
"""

from __future__ import annotations

import dataclasses
import io
from collections.abc import Sequence

import numpy as np
from PIL import Image, ImageOps

from attnserve.api.generation import (
    GenerationRequest,
    ImageInputInfo,
    InputKind,
    InputTooLargeError,
    ModelInfo,
    Token,
)
from attnserve.server.inputs.inputs import ImageInputSpec
from attnserve.server.inputs.preprocessing import EncoderBatch, Preprocessor

# Leading bytes of the formats an image model takes, and Pillow's name of each.
_SIGNATURES = {b"\x89PNG\r\n\x1a\n": "PNG", b"\xff\xd8\xff": "JPEG"}
# Transparent pixels are shown over this colour.
BACKGROUND = (255, 255, 255)


def decode(data: bytes, max_pixels: int, min_side: int = 0) -> Image.Image:
    """An upright RGB or L image from PNG or JPEG bytes.

    Args:
        data: the file.
        max_pixels: most pixels the header may declare.
        min_side: a JPEG may be decoded at a reduced DCT scale (1/2, 1/4, 1/8) that keeps both sides at
            least this long; 0 = full size.

    Raises:
        ValueError: another format, a declared size over `max_pixels`, or a file that does not decode.
    """
    kind = next((name for magic, name in _SIGNATURES.items() if data.startswith(magic)), None)
    if kind is None:
        raise ValueError("image data is neither a PNG nor a JPEG file")
    try:
        image = Image.open(io.BytesIO(data), formats=[kind])
    except Image.DecompressionBombError as exc:  # Pillow's own ceiling, far above any sane max_pixels
        raise ValueError(f"{kind} image refused as a decompression bomb: {exc}") from None
    except Image.UnidentifiedImageError:
        raise ValueError(f"cannot read the {kind} image: the file is damaged or is not a {kind} file") from None
    except (OSError, SyntaxError, ValueError) as exc:
        raise ValueError(f"cannot read the {kind} image: {exc}") from None
    width, height = image.size
    if width * height > max_pixels:
        raise ValueError(
            f"{kind} image declares {width} x {height} = {width * height} pixels, over the {max_pixels} accepted "
            "(a decompression bomb, or simply too large: scale it down)"
        )
    if kind == "JPEG" and min_side > 0:
        image.draft(image.mode, (min_side, min_side))
    try:
        image.load()
        image = ImageOps.exif_transpose(image)
    except (OSError, SyntaxError, ValueError, Image.DecompressionBombError) as exc:
        raise ValueError(f"cannot decode the {kind} image: {exc}") from None
    return flatten(image)


def flatten(image: Image.Image) -> Image.Image:
    """RGB or L (grey): transparency over BACKGROUND, 16-bit grey reduced to 8 bits, palettes expanded."""
    if image.mode in ("I;16", "I;16B", "I;16L", "I"):
        return Image.fromarray((np.asarray(image, dtype=np.uint32) >> 8).clip(0, 255).astype(np.uint8), "L")
    if image.mode in ("RGBA", "LA", "PA") or (image.mode == "P" and "transparency" in image.info):
        rgba = image.convert("RGBA")
        flat = Image.new("RGBA", rgba.size, (*BACKGROUND, 255))
        return Image.alpha_composite(flat, rgba).convert("RGB")
    return image if image.mode in ("RGB", "L") else image.convert("RGB")


def resize(image: Image.Image, width: int, height: int, channels: int = 3) -> np.ndarray:
    """(height, width, channels) uint8: the whole image squeezed to the model's size (training uses it too)."""
    image = image.convert("L" if channels == 1 else "RGB")
    if image.size != (width, height):
        image = image.resize((width, height), Image.Resampling.BILINEAR)
    pixels = np.asarray(image, dtype=np.uint8)
    return pixels[..., None] if channels == 1 else pixels


@dataclasses.dataclass(frozen=True, eq=False)
class ImageSource:
    pixels: np.ndarray  # (C, H, W) float32, normalised
    length: int  # grid cells


class ImagePreprocessor(Preprocessor):
    """Images: PNG/JPEG -> normalised (C, H, W) of the model's size; columns are grid cells with pixel boxes."""

    kind = InputKind.IMAGE

    @property
    def spec(self) -> ImageInputSpec:
        return self.manifest.input

    def prepare(self, request: GenerationRequest) -> ImageSource:
        self._check_kind(request)
        if request.image is None or not request.image.data:
            raise ValueError("image is empty: set ImageInput data to a PNG or JPEG file")
        data, s = request.image.data, self.spec
        if len(data) > s.max_bytes:
            raise InputTooLargeError(
                f"image is {len(data)} bytes; model '{self.manifest.name}' accepts at most {s.max_bytes} bytes"
            )
        image = decode(data, s.max_pixels, max(s.width, s.height))
        return self.source_from_pixels(resize(image, s.width, s.height, s.channels))

    def source_from_pixels(self, pixels: np.ndarray) -> ImageSource:
        """Checks and normalises decoded pixels.

        Args:
            pixels: (H, W, C) uint8, the model's size and channels.

        Raises:
            ValueError: another size, channel count or dtype.
        """
        s = self.spec
        want = (s.height, s.width, s.channels)
        if pixels.dtype != np.uint8 or pixels.shape != want:
            raise ValueError(f"image is {pixels.dtype} {pixels.shape}; model '{self.manifest.name}' takes uint8 {want}")
        x = pixels.astype(np.float32) / 255.0  # (H, W, C)
        x = (x - np.array(s.mean, dtype=np.float32)) / np.array(s.std, dtype=np.float32)
        return ImageSource(np.ascontiguousarray(x.transpose(2, 0, 1)), s.columns)  # (C, H, W)

    def collate(self, sources: Sequence[ImageSource]) -> EncoderBatch:
        pixels = np.stack([s.pixels for s in sources])  # (B, C, H, W): one size, nothing to pad
        lengths = np.array([s.length for s in sources], dtype=np.int64)
        return EncoderBatch({self.manifest.encoder.inputs["pixel_values"]: pixels}, lengths)

    def source_tokens(self, source: ImageSource) -> list[Token]:
        return [Token(label, -1, 0.0) for label in self.cell_labels()]

    def cell_labels(self) -> list[str]:
        """The leading columns' names, then "r<row>c<col>:x0,y0,x1,y1" of every grid cell, row by row; boxes
        in input pixels, x1/y1 exclusive."""
        s = self.spec
        return [*s.leading, *(f"r{r}c{c}:{x0},{y0},{x1},{y1}" for r, c, (x0, y0, x1, y1) in cell_boxes(
            s.height, s.width, s.grid_rows, s.grid_cols))]

    def describe(self, info: ModelInfo) -> ModelInfo:
        s = self.spec
        image = ImageInputInfo(s.width, s.height, s.grid_rows, s.grid_cols, s.max_bytes, s.max_pixels)
        return dataclasses.replace(info, input_kind=self.kind, max_source_tokens=s.columns, image=image)


def cell_boxes(height: int, width: int, rows: int, cols: int) -> list[tuple[int, int, tuple[int, int, int, int]]]:
    """(row, col, (x0, y0, x1, y1)) of every grid cell, row by row, in input pixels (x1, y1 exclusive)."""
    xs = [round(c * width / cols) for c in range(cols + 1)]
    ys = [round(r * height / rows) for r in range(rows + 1)]
    return [(r, c, (xs[c], ys[r], xs[c + 1], ys[r + 1])) for r in range(rows) for c in range(cols)]
