"""Video files and still frames -> the frames of a clip at the model's size, with the time each one shows.

A request carries a video file (MP4/H.264, WebM/VP8/VP9, animated GIF) or a list of still PNG/JPEG frames
with their rate. Everything cheap is checked before anything big is decoded, each check naming its limit:

  bytes     the file (or all stills together) against `max_bytes`                      OUT_OF_RANGE
  format    the file's signature: MP4 (`ftyp` box), WebM/Matroska (EBML), GIF          INVALID_ARGUMENT
  header    the stream's declared width x height against `max_pixels` (a bomb)          INVALID_ARGUMENT
            the declared duration against `max_seconds`, frame count against `max_frames`  OUT_OF_RANGE
  decoding  every frame again: its own size (streams may change size), its time and the running count,
            so a file whose header lies is stopped at the first frame past a limit     as above

Frames are decoded with FFmpeg through PyAV (the `video` extra); each is resized to the model's size as soon
as it is decoded (server/inputs/image.py's resize, the one training uses), so a clip never holds more than
`max_frames` small frames. Stills need only Pillow. Without PyAV a video file is UNIMPLEMENTED with a message
that says how to install it; stills still work.
"""

from __future__ import annotations

import dataclasses
import io
import math

import numpy as np

from attnserve.api.generation import InputTooLargeError, VideoInput
from attnserve.server.inputs.image import decode as decode_image
from attnserve.server.inputs.image import flatten, resize
from attnserve.server.inputs.inputs import VideoInputSpec

# Container -> a test on the file's first bytes, and FFmpeg's demuxer for it.
_CONTAINERS = {
    "MP4": (lambda head: head[4:8] == b"ftyp", "mp4"),
    "WebM": (lambda head: head.startswith(b"\x1a\x45\xdf\xa3"), "matroska"),
    "GIF": (lambda head: head[:6] in (b"GIF87a", b"GIF89a"), "gif"),
}

# Pixel formats with transparency (a GIF's palette frames among them).
_ALPHA = {"rgba", "bgra", "argb", "abgr", "yuva420p", "pal8", "ya8"}


@dataclasses.dataclass(frozen=True)
class DecodedClip:
    """Every frame of a clip at the model's size, and when each one starts showing."""

    frames: list[np.ndarray]  # (H, W, C) uint8 each
    starts: np.ndarray  # (N,) seconds, non-decreasing
    duration: float  # seconds the clip lasts


def read_clip(video: VideoInput, spec: VideoInputSpec, model: str) -> DecodedClip:
    """Decodes a request's clip after the checks above.

    Raises:
        InputTooLargeError: over max_bytes, max_seconds or max_frames.
        ValueError: no clip, both a file and stills, an unknown format, a frame over max_pixels, a file that
            does not decode, or no frames at all.
        NotImplementedError: a video file, and PyAV is not installed.
    """
    if video.data and video.frames:
        raise ValueError("set one of VideoInput data (a video file) and frames (stills), not both")
    size = len(video.data) if video.data else sum(len(f) for f in video.frames)
    if size > spec.max_bytes:
        what = "video file" if video.data else f"{len(video.frames)} stills"
        raise InputTooLargeError(f"{what} of {size} bytes; model '{model}' accepts at most {spec.max_bytes} bytes")
    if video.data:
        clip = _read_file(video.data, spec, model)
    elif video.frames:
        clip = _read_stills(video, spec, model)
    else:
        raise ValueError("video is empty: set VideoInput data to a video file, or frames to PNG/JPEG stills")
    if not clip.frames:
        raise ValueError("the video holds no frames")
    return clip


def _read_stills(video: VideoInput, spec: VideoInputSpec, model: str) -> DecodedClip:
    rate, count = video.frames_per_second, len(video.frames)
    if not rate > 0 or not math.isfinite(rate):
        raise ValueError(f"stills need their frames_per_second (a positive number), got {rate}")
    if count > spec.max_frames:
        raise InputTooLargeError(f"{count} stills; model '{model}' accepts at most {spec.max_frames} frames")
    _check_seconds(count / rate, spec, model, f"{count} stills at {rate:g} frames per second")
    frames = []
    for i, data in enumerate(video.frames):
        try:
            image = decode_image(data, spec.max_pixels, max(spec.width, spec.height))
        except ValueError as exc:
            raise ValueError(f"still {i}: {exc}") from None
        frames.append(resize(image, spec.width, spec.height, spec.channels))
    return DecodedClip(frames, np.arange(count) / rate, count / rate)


def _container(data: bytes) -> tuple[str, str]:
    for name, (matches, demuxer) in _CONTAINERS.items():
        if matches(data[:16]):
            return name, demuxer
    raise ValueError("video data is not an MP4, WebM or GIF file")


def _read_file(data: bytes, spec: VideoInputSpec, model: str) -> DecodedClip:
    name, demuxer = _container(data)
    try:
        import av
    except ImportError:
        raise NotImplementedError(
            "this server cannot decode video files: PyAV is not installed (pip install 'attnserve[video]'); "
            "send the clip's frames as PNG or JPEG stills instead"
        ) from None
    try:
        with av.open(io.BytesIO(data), format=demuxer) as container:
            if not container.streams.video:
                raise ValueError(f"the {name} file has no video stream")
            stream = container.streams.video[0]
            _check_header(stream, container, spec, model, name)
            return _decode_frames(container, stream, spec, model, name)
    except av.FFmpegError as exc:
        raise ValueError(f"cannot read the {name} file: {exc}") from None


def declared_frame_bytes(data: bytes) -> int:
    """Frames x width x height x 3 a video file's header declares (count from its duration and rate where
    the header has none); 0 if it cannot be read here. Opens the container, decodes nothing."""
    try:
        _, demuxer = _container(data)
        import av

        with av.open(io.BytesIO(data), format=demuxer) as container:
            stream = container.streams.video[0]
            frames = stream.frames
            if not frames and container.duration:
                frames = math.ceil(container.duration / 1e6 * _rate(stream))
            return int(frames) * stream.codec_context.width * stream.codec_context.height * 3
    except Exception:  # unreadable here: the preprocessor refuses it, with its message
        return 0


def _check_header(stream, container, spec: VideoInputSpec, model: str, name: str) -> None:
    """Limits the stream's header declares, before any frame is decoded."""
    width, height = stream.codec_context.width, stream.codec_context.height
    _check_pixels(width, height, spec, name)
    if container.duration is not None and container.duration > 0:
        _check_seconds(container.duration / 1e6, spec, model, f"the {name} file")  # microseconds
    if stream.frames and stream.frames > spec.max_frames:
        raise InputTooLargeError(
            f"the {name} file declares {stream.frames} frames; model '{model}' accepts at most {spec.max_frames}"
        )


def _decode_frames(container, stream, spec: VideoInputSpec, model: str, name: str) -> DecodedClip:
    frames, starts = [], []
    for frame in container.decode(stream):
        if len(frames) == spec.max_frames:
            raise InputTooLargeError(f"the {name} file holds more than {spec.max_frames} frames, the most model "
                                     f"'{model}' accepts")
        _check_pixels(frame.width, frame.height, spec, name)
        start = float(frame.time) if frame.time is not None else len(frames) / _rate(stream)
        _check_seconds(start, spec, model, f"the {name} file")
        # Transparent GIF pixels are shown over white, as an image's are.
        image = flatten(frame.reformat(format="rgba").to_image() if frame.format.name in _ALPHA else frame.to_image())
        frames.append(resize(image, spec.width, spec.height, spec.channels))
        starts.append(start)
    if not frames:
        return DecodedClip([], np.zeros(0), 0.0)
    starts = np.maximum.accumulate(np.asarray(starts) - starts[0])  # first frame at 0; reordered pts kept monotone
    step = float(np.median(np.diff(starts))) if len(starts) > 1 else 1 / _rate(stream)
    duration = float(starts[-1] + step)
    _check_seconds(duration, spec, model, f"the {name} file")
    return DecodedClip(frames, starts, duration)


def _rate(stream) -> float:
    rate = stream.average_rate or stream.guessed_rate
    return float(rate) if rate else 25.0


def _check_pixels(width: int, height: int, spec: VideoInputSpec, name: str) -> None:
    if width <= 0 or height <= 0:
        raise ValueError(f"the {name} file declares a frame of {width} x {height} pixels")
    if width * height > spec.max_pixels:
        raise ValueError(
            f"the {name} file declares frames of {width} x {height} = {width * height} pixels, over the "
            f"{spec.max_pixels} accepted per frame (a decompression bomb, or simply too large: scale it down)"
        )


def _check_seconds(seconds: float, spec: VideoInputSpec, model: str, what: str) -> None:
    if seconds > spec.max_seconds:
        raise InputTooLargeError(
            f"{what} lasts {seconds:.2f} s; model '{model}' accepts at most {spec.max_seconds:g} s"
        )


def sample(clip: DecodedClip, count: int) -> tuple[list[np.ndarray], np.ndarray]:
    """`count` frames of the clip: the frame showing at the middle of each of `count` equal stretches (a
    frame shows from its start to the next one's), and those times (export/video/clips.py samples the same)."""
    times = (np.arange(count) + 0.5) * clip.duration / count
    return frames_at(clip, times), times


def frames_at(clip: DecodedClip, times: np.ndarray) -> list[np.ndarray]:
    """The frame showing at each of `times` (seconds)."""
    index = np.clip(np.searchsorted(clip.starts, times, side="right") - 1, 0, len(clip.frames) - 1)
    return [clip.frames[i] for i in index]
