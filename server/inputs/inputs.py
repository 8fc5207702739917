"""The manifest's `input` section: what a model reads, one spec per input kind (docs/model-contract.md).

A spec says which encoder inputs (roles) the kind's preprocessor feeds, with what dtype and shape, and the
parameters of its preprocessing (audio: sample rate, log-mel features, time reduction; images: size,
normalisation, grid; video: frames per clip, frame size, normalisation, grid per frame) with the limits a
request must respect. The preprocessors themselves live in server/inputs/preprocessing.py (text), server/inputs/audio.py,
server/inputs/image.py and server/inputs/video.py.
"""

from __future__ import annotations

import dataclasses
import re
from typing import TYPE_CHECKING, ClassVar

from attnserve.server.inputs.features import FEATURE_TYPES, LogMelSpec

if TYPE_CHECKING:
    from attnserve.server.model.manifest import FieldReader

INPUT_KINDS = ("text", "audio", "image", "video")
# An image grid's leading column label (input.grid.leading): a name, never a cell's "r0c0:..." label.
LEADING_LABEL = re.compile(r"^[a-z][a-z0-9_]*$")


@dataclasses.dataclass(frozen=True)
class EncoderInput:
    """What the preprocessor of an input kind feeds to one encoder input: its dtype and shape."""

    dtype: str
    # One entry per axis: a fixed size, or None where sizes vary (batch, sequence length).
    shape: tuple[int | None, ...]


@dataclasses.dataclass(frozen=True)
class TextInputSpec:
    """Text, tokenized with the manifest's tokenizer; EOS ends every source."""

    kind: ClassVar[str] = "text"

    def encoder_inputs(self) -> dict[str, EncoderInput]:
        """Role -> what is fed: token ids (B, S), right-padded with `pad`, and their mask (1 = real token)."""
        return {"input_ids": EncoderInput("int64", (None, None)), "attention_mask": EncoderInput("int64", (None, None))}


@dataclasses.dataclass(frozen=True)
class AudioInputSpec:
    """Audio, resampled to the features' sample rate and turned into log-mel frames (server/inputs/features.py)."""

    kind: ClassVar[str] = "audio"
    features: LogMelSpec
    # Encoder positions per input frame group: the encoder reads T frames (padded to a multiple of this)
    # and attends over T / time_reduction positions; position j covers frames j*r .. j*r + r - 1.
    time_reduction: int
    # Longest accepted audio, in seconds.
    max_seconds: float
    # Largest accepted WAV file, in bytes (raw samples count 4 bytes each).
    max_bytes: int
    # Optional: no output is longer than this many tokens per second of audio (plus one), so a speller
    # caught in a loop stops near the clip's plausible length instead of at max_new_tokens.
    max_tokens_per_second: float | None = None

    def encoder_inputs(self) -> dict[str, EncoderInput]:
        """Role -> what is fed: log-mel frames (B, T, n_mels), right-padded with 0, and their mask (B, T)."""
        return {
            "input_features": EncoderInput("float32", (None, None, self.features.n_mels)),
            "attention_mask": EncoderInput("int64", (None, None)),
        }

    @property
    def seconds_per_column(self) -> float:
        """Audio time one encoder position (attention column) stands for."""
        return self.features.hop_length * self.time_reduction / self.features.sample_rate_hz


@dataclasses.dataclass(frozen=True)
class ImageInputSpec:
    """An image scaled to [0, 1], normalised per channel, read by the encoder as a grid of cells."""

    kind: ClassVar[str] = "image"
    # Pixels of the model's input, and its channels (1 = grey, 3 = RGB).
    height: int
    width: int
    channels: int
    # Per channel: pixel / 255, minus mean, divided by std.
    mean: tuple[float, ...]
    std: tuple[float, ...]
    # The encoder's output grid: one encoder position (attention column) per cell, row by row.
    grid_rows: int
    grid_cols: int
    # Largest accepted image file, in bytes.
    max_bytes: int
    # Most pixels (width x height) an image may declare; more is refused before decoding (decompression bombs).
    max_pixels: int = 40_000_000
    # Labels of encoder positions before the grid that stand for no cell (ViT's class token: ("cls",));
    # each is an attention column of its own, first. () = the grid alone.
    leading: tuple[str, ...] = ()

    @property
    def columns(self) -> int:
        """Attention columns (encoder positions): the leading ones, then one per cell."""
        return len(self.leading) + self.grid_rows * self.grid_cols

    def encoder_inputs(self) -> dict[str, EncoderInput]:
        """Role -> what is fed: normalised pixels (B, C, H, W); every image has the same size, so no mask."""
        return {"pixel_values": EncoderInput("float32", (None, self.channels, self.height, self.width))}


@dataclasses.dataclass(frozen=True)
class VideoInputSpec:
    """A clip sampled to a fixed number of frames, each read like an image: a grid of cells per frame."""

    kind: ClassVar[str] = "video"
    # Frames the encoder reads per clip: the frames showing the middle of `frames` equal stretches of it.
    frames: int
    # Pixels of each frame of the model's input, and its channels (1 = grey, 3 = RGB).
    height: int
    width: int
    channels: int
    # Per channel: pixel / 255, minus mean, divided by std.
    mean: tuple[float, ...]
    std: tuple[float, ...]
    # The encoder's grid per frame: one attention column per (frame, cell), frame by frame, row by row.
    grid_rows: int
    grid_cols: int
    # Longest accepted clip, in seconds (the container's duration, or stills / frames_per_second).
    max_seconds: float
    # Largest accepted video file (or sum of still files), in bytes.
    max_bytes: int
    # Most pixels (width x height) a frame may declare; more is refused before any frame is decoded.
    max_pixels: int
    # Most frames a file may hold (or stills a request may list); past it decoding stops and refuses the clip.
    max_frames: int

    def encoder_inputs(self) -> dict[str, EncoderInput]:
        """Role -> what is fed: normalised frames (B, T, C, H, W); every clip gives `frames` frames, no mask."""
        return {"pixel_values": EncoderInput("float32", (None, None, self.channels, self.height, self.width))}

    @property
    def cells(self) -> int:
        return self.grid_rows * self.grid_cols


InputSpec = TextInputSpec | AudioInputSpec | ImageInputSpec | VideoInputSpec


def parse_input(r: FieldReader) -> InputSpec:
    """The spec of the manifest's `input` (text when absent).

    Raises:
        ValueError: a field is missing, mistyped or inconsistent; the message names the file and field.
    """
    if "input" not in r.data:
        return TextInputSpec()
    spec = r.obj("input")
    kind = spec.string("kind")
    if kind == "text":
        return TextInputSpec()
    if kind == "audio":
        return _audio_input(spec)
    if kind == "image":
        return _image_input(spec)
    if kind == "video":
        return _video_input(spec)
    spec.fail(f"kind {kind!r} is not one of {list(INPUT_KINDS)}")


def _audio_input(r: FieldReader) -> AudioInputSpec:
    f = r.obj("features")
    kind = f.string("type")
    if kind not in FEATURE_TYPES:
        f.fail(f"type {kind!r} is not one of {list(FEATURE_TYPES)}")
    values = dict(
        sample_rate_hz=r.integer("sample_rate_hz", 1),
        n_mels=f.integer("n_mels", 1),
        window_ms=f.number("window_ms", positive=True),
        shift_ms=f.number("shift_ms", positive=True),
        n_fft=f.integer("n_fft", 1, default=None),
        f_min=f.number("f_min", default=0.0),
        f_max=f.number("f_max", positive=True, default=None),
        log_floor=f.number("log_floor", positive=True),
        # Whisper's variant (server/inputs/features.py); defaults: the bundled recognizer's features.
        mel_scale=f.string("mel_scale", default="htk"),
        filter_norm=f.get("filter_norm", (str, type(None)), default=None),
        center=f.get("center", bool, default=False),
        log=f.string("log", default="ln"),
        dynamic_range=f.number("dynamic_range", positive=True, default=None),
        add=f.number("add", default=0.0),
        divide=f.number("divide", positive=True, default=1.0),
        pad_seconds=f.number("pad_seconds", positive=True, default=None),
    )
    try:
        features = LogMelSpec(**values)
    except ValueError as exc:  # a combination of fields that does not work, e.g. a window longer than n_fft
        f.fail(str(exc))
    return AudioInputSpec(
        features=features,
        time_reduction=r.integer("time_reduction", 1),
        max_seconds=r.number("max_seconds", positive=True),
        max_bytes=r.integer("max_bytes", 1),
        max_tokens_per_second=r.number("max_tokens_per_second", positive=True, default=None),
    )


def _image_input(r: FieldReader) -> ImageInputSpec:
    channels = r.integer("channels", 1)
    if channels not in (1, 3):
        r.fail(f"channels {channels} is not 1 (grey) or 3 (RGB)")
    normalize, grid = r.obj("normalize"), r.obj("grid")
    spec = ImageInputSpec(
        height=r.integer("height", 1),
        width=r.integer("width", 1),
        channels=channels,
        mean=normalize.numbers("mean", channels),
        std=normalize.numbers("std", channels, positive=True),
        grid_rows=grid.integer("rows", 1),
        grid_cols=grid.integer("cols", 1),
        max_bytes=r.integer("max_bytes", 1),
        max_pixels=r.integer("max_pixels", 1, default=ImageInputSpec.max_pixels),
        leading=grid.strings("leading") if "leading" in grid.data else (),
    )
    if spec.grid_rows > spec.height or spec.grid_cols > spec.width:
        grid.fail(f"{spec.grid_rows} x {spec.grid_cols} cells do not fit a {spec.height} x {spec.width} image")
    if not all(LEADING_LABEL.match(label) for label in spec.leading):
        grid.fail_field("leading", f"labels must be lower-case names without ':' (e.g. cls), got {list(spec.leading)}")
    return spec


def _video_input(r: FieldReader) -> VideoInputSpec:
    channels = r.integer("channels", 1)
    if channels not in (1, 3):
        r.fail(f"channels {channels} is not 1 (grey) or 3 (RGB)")
    normalize, grid, limits = r.obj("normalize"), r.obj("grid"), r.obj("limits")
    spec = VideoInputSpec(
        frames=r.integer("frames", 1),
        height=r.integer("height", 1),
        width=r.integer("width", 1),
        channels=channels,
        mean=normalize.numbers("mean", channels),
        std=normalize.numbers("std", channels, positive=True),
        grid_rows=grid.integer("rows", 1),
        grid_cols=grid.integer("cols", 1),
        max_seconds=limits.number("max_seconds", positive=True),
        max_bytes=limits.integer("max_bytes", 1),
        max_pixels=limits.integer("max_pixels", 1),
        max_frames=limits.integer("max_frames", 1),
    )
    if spec.grid_rows > spec.height or spec.grid_cols > spec.width:
        grid.fail(f"{spec.grid_rows} x {spec.grid_cols} cells do not fit a {spec.height} x {spec.width} frame")
    return spec
