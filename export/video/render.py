"""Draws a clip's frames (export/video/clips.py) at any times and size, and writes clips as video files.

Frames are drawn the way export/image/scenes.py draws a scene (the same background, Lanczos-resized emoji
blended by their alpha), each actor at its box and opacity of that instant. Sprites are resized once per
pixel size and kept, so drawing a batch of training clips costs little next to a training step.
"""

from __future__ import annotations

import functools
import io
from collections.abc import Sequence

import numpy as np

from attnserve.export.image.scenes import render_background
from attnserve.export.video.clips import Clip, sample_times


class FrameRenderer:
    """Draws clips from one set of sprites (name -> (h, w, 4) uint8 RGBA)."""

    def __init__(self, sprites: dict[str, np.ndarray]):
        self.sprites = sprites
        self._sized = functools.lru_cache(maxsize=20000)(self._resize)

    def _resize(self, name: str, width: int, height: int) -> np.ndarray:
        from PIL import Image

        sprite = Image.fromarray(self.sprites[name]).resize((width, height), Image.Resampling.LANCZOS)
        return np.asarray(sprite).astype(np.float32)

    def frames(self, clip: Clip, size: int, times: Sequence[float] | None = None) -> np.ndarray:
        """(T, size, size, 3) uint8: the clip at `times` (default: the model's frames, clips.sample_times)."""
        times = sample_times(clip.duration) if times is None else times
        background = render_background(clip.background, size)
        out = np.empty((len(times), size, size, 3), dtype=np.uint8)
        for k, t in enumerate(times):
            image = background.copy()
            for actor in clip.actors:
                box, alpha = actor.at(float(t))
                if alpha > 0:
                    self._blend(image, actor.name, box, alpha, size)
            out[k] = np.clip(np.rint(image), 0, 255)
        return out

    def _blend(self, image: np.ndarray, name: str, box, alpha: float, size: int) -> None:
        """Draws one sprite at `box` (fractions; may reach past the frame) with overall opacity `alpha`."""
        x0, y0, x1, y1 = (round(v * size) for v in box)
        rgba = self._sized(name, max(x1 - x0, 1), max(y1 - y0, 1))
        # The part of the sprite inside the frame.
        cx0, cy0 = max(-x0, 0), max(-y0, 0)
        cx1, cy1 = rgba.shape[1] - max(x0 + rgba.shape[1] - size, 0), rgba.shape[0] - max(y0 + rgba.shape[0] - size, 0)
        if cx1 <= cx0 or cy1 <= cy0:
            return
        part = rgba[cy0:cy1, cx0:cx1]
        a = part[..., 3:] / 255.0 * alpha
        region = image[y0 + cy0 : y0 + cy1, x0 + cx0 : x0 + cx1]
        region[:] = region * (1 - a) + part[..., :3] * a


# Container -> (PyAV format, codec, pixel format).
FORMATS = {"mp4": ("mp4", "libx264", "yuv420p"), "webm": ("webm", "libvpx-vp9", "yuv420p"),
           "webm-vp8": ("webm", "libvpx", "yuv420p"), "gif": ("gif", "gif", "rgb8")}


def encode_video(frames: np.ndarray, fps: int, container: str = "mp4", quality: int = 18) -> bytes:
    """(N, H, W, 3) uint8 frames -> the bytes of a video file (PyAV; H, W even for the YUV codecs).

    Args:
        fps: frames per second of the file.
        container: a key of FORMATS.
        quality: the codec's constant rate factor (x264, VP8/9); lower is closer to the frames.
    """
    import av

    fmt, codec, pix_fmt = FORMATS[container]
    buffer = io.BytesIO()
    with av.open(buffer, mode="w", format=fmt) as out:
        stream = out.add_stream(codec, rate=fps)
        stream.width, stream.height, stream.pix_fmt = frames.shape[2], frames.shape[1], pix_fmt
        if codec != "gif":
            stream.options = {"crf": str(quality), **({"b:v": "0"} if codec.startswith("libvpx") else {})}
        for pixels in frames:
            for packet in stream.encode(av.VideoFrame.from_ndarray(np.ascontiguousarray(pixels), format="rgb24")):
                out.mux(packet)
        for packet in stream.encode():
            out.mux(packet)
    return buffer.getvalue()


def clip_file(renderer: FrameRenderer, clip: Clip, size: int = 64, fps: int = 12, container: str = "mp4") -> bytes:
    """The clip as a video file of `size` pixels at `fps`, frames at the middle of each frame's interval."""
    count = max(int(round(clip.duration * fps)), 1)
    times = (np.arange(count) + 0.5) / fps
    return encode_video(renderer.frames(clip, size, times), fps, container)
