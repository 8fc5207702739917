"""Video input: a clip -> a fixed number of frames at the model's size -> normalised pixels read as (frame, cell).

`VideoPreprocessor.prepare` decodes the request's video file or stills (server/inputs/video_files.py: every limit
is checked before anything big is decoded), samples the manifest's `frames` frames (the one showing at the
middle of each of `frames` equal stretches of the clip), and normalises them as an image model's pixels.

The encoder reads (B, T, C, H, W) and attends over T x G positions, frame-major: column t * G + g is cell g
(row by row, as for images) of frame t, labelled "f<t>@<seconds>s:r<row>c<col>:x0,y0,x1,y1" with the time
the frame shows and the cell's pixel box in the model's input (x1, y1 exclusive). Every clip gives the same
T, so the encoder takes no mask.

With attention, a response also carries each output row's attention over the clip (`frame_attention`):
summed per frame (a timeline) and over the cells of its most-attended frame (a heatmap).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from attnserve.api.generation import (
    AttentionMatrix,
    FrameAttention,
    GenerationRequest,
    InputKind,
    ModelInfo,
    Token,
    VideoInputInfo,
)
from attnserve.server.inputs.image import cell_boxes
from attnserve.server.inputs.inputs import VideoInputSpec
from attnserve.server.inputs.preprocessing import EncoderBatch, Preprocessor
from attnserve.server.inputs.video_files import read_clip, sample


@dataclasses.dataclass(frozen=True, eq=False)
class VideoSource:
    pixels: np.ndarray  # (T, C, H, W) float32, normalised
    times: np.ndarray  # (T,) seconds each sampled frame shows
    duration: float  # seconds the clip lasts
    length: int  # attention columns: T x cells


class VideoPreprocessor(Preprocessor):
    """Clips: video files or stills -> `frames` normalised frames; columns are (frame, cell) pairs."""

    kind = InputKind.VIDEO

    @property
    def spec(self) -> VideoInputSpec:
        return self.manifest.input

    def prepare(self, request: GenerationRequest) -> VideoSource:
        self._check_kind(request)
        if request.video is None:
            raise ValueError(f"model '{self.manifest.name}' takes video input; the request has none")
        clip = read_clip(request.video, self.spec, self.manifest.name)
        frames, times = sample(clip, self.spec.frames)
        return self.source_from_frames(np.stack(frames), times, clip.duration)

    def source_from_frames(self, frames: np.ndarray, times: np.ndarray, duration: float) -> VideoSource:
        """Checks and normalises sampled frames.

        Args:
            frames: (T, H, W, C) uint8 at the model's size and channels; times: (T,) seconds each shows.

        Raises:
            ValueError: another size, channel count or dtype.
        """
        s = self.spec
        want = (s.height, s.width, s.channels)
        if frames.dtype != np.uint8 or frames.ndim != 4 or frames.shape[1:] != want:
            raise ValueError(f"frames are {frames.dtype} {frames.shape}; model '{self.manifest.name}' takes uint8 "
                             f"(T, {', '.join(map(str, want))})")
        x = frames.astype(np.float32) / 255.0  # (T, H, W, C)
        x = (x - np.array(s.mean, dtype=np.float32)) / np.array(s.std, dtype=np.float32)
        pixels = np.ascontiguousarray(x.transpose(0, 3, 1, 2))  # (T, C, H, W)
        return VideoSource(pixels, np.asarray(times, dtype=np.float64), float(duration), len(frames) * s.cells)

    def collate(self, sources: Sequence[VideoSource]) -> EncoderBatch:
        pixels = np.stack([s.pixels for s in sources])  # (B, T, C, H, W): one frame count, nothing to pad
        lengths = np.array([s.length for s in sources], dtype=np.int64)
        return EncoderBatch({self.manifest.encoder.inputs["pixel_values"]: pixels}, lengths)

    def source_tokens(self, source: VideoSource) -> list[Token]:
        return [Token(label, -1, 0.0) for label in self.column_labels(source.times)]

    def column_labels(self, times: Sequence[float]) -> list[str]:
        """ "f<t>@<seconds>s:r<row>c<col>:x0,y0,x1,y1" of every (frame, cell), frame by frame, row by row."""
        s = self.spec
        cells = cell_boxes(s.height, s.width, s.grid_rows, s.grid_cols)
        return [f"f{t}@{when:.3f}s:r{r}c{c}:{x0},{y0},{x1},{y1}" for t, when in enumerate(times)
                for r, c, (x0, y0, x1, y1) in cells]

    def frame_attention(self, source: VideoSource, attention: AttentionMatrix) -> list[FrameAttention]:
        return frame_attention(np.asarray(attention.weights, dtype=np.float64), attention.row_labels, source.times,
                               self.spec.cells)

    def describe(self, info: ModelInfo) -> ModelInfo:
        s = self.spec
        video = VideoInputInfo(s.frames, s.width, s.height, s.grid_rows, s.grid_cols, s.max_seconds, s.max_bytes,
                               s.max_pixels, s.max_frames)
        return dataclasses.replace(info, input_kind=self.kind, max_source_tokens=s.frames * s.cells, video=video)


def frame_attention(weights: np.ndarray, labels: Sequence[str], times: np.ndarray, cells: int) -> list[FrameAttention]:
    """Each row's timeline (its weights summed per frame) and heatmap (its weights on its peak frame's cells).

    Args:
        weights: (R, T * cells) attention rows over frame-major (frame, cell) columns.
        labels: the R rows' labels; times: (T,) the seconds each frame shows.
    """
    if weights.size == 0:
        return []
    grid = weights.reshape(len(weights), len(times), cells)  # (R, T, G)
    timeline = grid.sum(-1)  # (R, T)
    peaks = timeline.argmax(-1)  # (R,)
    return [FrameAttention(label, timeline[r].tolist(), [float(t) for t in times], int(peaks[r]),
                           grid[r, peaks[r]].tolist()) for r, label in enumerate(labels)]
