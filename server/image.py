"""Image input: the contract an image-captioning model will be served by.

An image model's encoder reads normalised pixels (B, C, H, W) of one fixed size and attends over a grid of
cells, one encoder position per cell, row by row (manifest `input`: size, channels, normalisation, grid).
Attention column j is cell (j // cols, j % cols), labelled "r<row>c<col>:x0,y0,x1,y1" with its pixel box
in the model's input (x1, y1 exclusive).

Decoding PNG or JPEG files is not served yet (it needs an image library; it comes with the first image
model): `prepare` checks the bytes and then raises NotImplementedError. `source_from_pixels` is the step after
decoding: it checks and normalises decoded pixels.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from attnserve.server.generation import (
    GenerationRequest,
    ImageInputInfo,
    InputKind,
    InputTooLargeError,
    ModelInfo,
    Token,
)
from attnserve.server.inputs import ImageInputSpec
from attnserve.server.preprocessing import EncoderBatch, Preprocessor

# Leading bytes of the formats an image model will take.
_SIGNATURES = {b"\x89PNG\r\n\x1a\n": "PNG", b"\xff\xd8\xff": "JPEG"}


@dataclasses.dataclass(frozen=True, eq=False)
class ImageSource:
    pixels: np.ndarray  # (C, H, W) float32, normalised
    length: int  # grid cells


class ImagePreprocessor(Preprocessor):
    """Images: decoded pixels -> normalised (C, H, W); columns are grid cells with their pixel boxes."""

    kind = InputKind.IMAGE

    @property
    def spec(self) -> ImageInputSpec:
        return self.manifest.input

    def prepare(self, request: GenerationRequest) -> ImageSource:
        self._check_kind(request)
        if request.image is None or not request.image.data:
            raise ValueError("image is empty: set ImageInput data to a PNG or JPEG file")
        data = request.image.data
        if len(data) > self.spec.max_bytes:
            raise InputTooLargeError(
                f"image is {len(data)} bytes; model '{self.manifest.name}' accepts at most {self.spec.max_bytes} bytes"
            )
        kind = next((name for magic, name in _SIGNATURES.items() if data.startswith(magic)), None)
        if kind is None:
            raise ValueError("image data is neither a PNG nor a JPEG file")
        raise NotImplementedError(f"{kind} decoding is not served yet; image models come with it")

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
        return ImageSource(np.ascontiguousarray(x.transpose(2, 0, 1)), s.grid_rows * s.grid_cols)  # (C, H, W)

    def collate(self, sources: Sequence[ImageSource]) -> EncoderBatch:
        pixels = np.stack([s.pixels for s in sources])  # (B, C, H, W): one size, nothing to pad
        lengths = np.array([s.length for s in sources], dtype=np.int64)
        return EncoderBatch({self.manifest.encoder.inputs["pixel_values"]: pixels}, lengths)

    def source_tokens(self, source: ImageSource) -> list[Token]:
        return [Token(label, -1, 0.0) for label in self.cell_labels()]

    def cell_labels(self) -> list[str]:
        """ "r<row>c<col>:x0,y0,x1,y1" of every grid cell, row by row; boxes in input pixels, x1/y1 exclusive."""
        s = self.spec
        xs = [round(c * s.width / s.grid_cols) for c in range(s.grid_cols + 1)]
        ys = [round(r * s.height / s.grid_rows) for r in range(s.grid_rows + 1)]
        return [
            f"r{r}c{c}:{xs[c]},{ys[r]},{xs[c + 1]},{ys[r + 1]}" for r in range(s.grid_rows) for c in range(s.grid_cols)
        ]

    def describe(self, info: ModelInfo) -> ModelInfo:
        s = self.spec
        image = ImageInputInfo(s.width, s.height, s.grid_rows, s.grid_cols, s.max_bytes)
        return dataclasses.replace(info, input_kind=self.kind, max_source_tokens=s.grid_rows * s.grid_cols, image=image)
