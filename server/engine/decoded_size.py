"""How many bytes a request's input takes once decoded, read from its headers without decoding it.

Why: the wire size says little about the work and memory an input costs. A solid-colour 6300 x 6300 PNG is
131 KB on the wire and 119 MB of pixels (about a second of both cores to decode); a WAV's samples become
float32 and then float64 while they are averaged to mono. The preprocessing budget (server/edge/intake.py)
counts these bytes, so a flood of cheap-to-send, costly-to-decode inputs is refused before any of it is
decoded. Headers only: Pillow's `Image.open` reads a PNG's IHDR or a JPEG's SOF and decodes nothing until
asked; a WAV's header is parsed by `audio.read_wav`, which copies no sample; a video file's container is
opened (PyAV reads its stream headers) and no frame is decoded.

Inputs that cannot be read here count as their wire size: the preprocessor refuses them, with its own
message, when it gets to them.
"""

from __future__ import annotations

import io

from attnserve.api.generation import GenerationRequest, VideoInput

# A decoded sample, as the preprocessing budget counts it (float32).
SAMPLE_BYTES = 4
# Bytes per pixel of each Pillow mode once decoded (modes not listed: 4).
_MODE_BYTES = {"1": 1, "L": 1, "P": 1, "LA": 2, "PA": 2, "RGB": 3, "YCbCr": 3, "LAB": 3, "HSV": 3,
               "RGBA": 4, "RGBX": 4, "CMYK": 4, "I;16": 2, "I": 4, "F": 4}


def decoded_bytes(request: GenerationRequest) -> int:
    """Bytes the request's input decodes to (text: its UTF-8 bound), from headers only; never raises."""
    if request.image is not None and request.image.data:
        return max(image_bytes(request.image.data), len(request.image.data))
    if request.video is not None:
        return max(video_bytes(request.video), len(request.video.data) + sum(map(len, request.video.frames)))
    if request.audio is not None:
        if request.audio.samples is not None:
            return len(request.audio.samples) * SAMPLE_BYTES
        return max(audio_file_bytes(request.audio.wav), len(request.audio.wav))
    return len(request.text) * 4


def image_bytes(data: bytes) -> int:
    """Pixels x bytes per pixel a PNG or JPEG header declares; 0 if it cannot be read."""
    from PIL import Image  # imported on first use, as server/inputs/image.py does

    try:
        with Image.open(io.BytesIO(data), formats=["PNG", "JPEG"]) as image:
            width, height = image.size
            return width * height * _MODE_BYTES.get(image.mode, 4)
    except Exception:  # anything unreadable is the preprocessor's to refuse, with its message
        return 0


def video_bytes(video: VideoInput) -> int:
    """A clip's stills' pixels (each as image_bytes), or a video file's declared frames x pixels x 3 (RGB);
    0 if unreadable. Every frame is decoded whole before it is resized, so this is the work, not the memory."""
    if video.frames:
        return sum(map(image_bytes, video.frames))
    from attnserve.server.inputs.video_files import declared_frame_bytes

    return declared_frame_bytes(video.data)


def audio_seconds(request: GenerationRequest) -> float:
    """The duration of the request's audio, from its WAV header or its raw samples; 0 if unreadable."""
    from attnserve.server.inputs.audio import read_wav

    audio = request.audio
    if audio is None:
        return 0.0
    if audio.samples is not None:
        return len(audio.samples) / audio.sample_rate_hz if audio.sample_rate_hz > 0 else 0.0
    try:
        wav = read_wav(audio.wav)
    except Exception:
        return 0.0
    return wav.frames / wav.sample_rate_hz if wav.sample_rate_hz > 0 else 0.0


def audio_file_bytes(data: bytes) -> int:
    """Samples a file's header declares x SAMPLE_BYTES: every channel of a WAV (read whole), one channel of
    the compressed formats (decoded to mono block by block); 0 if it cannot be read."""
    from attnserve.server.inputs import audio_files

    try:
        header = audio_files.probe(data)
    except Exception:
        return 0
    channels = header.channels if header.format == "wav" else 1
    return header.frames * channels * SAMPLE_BYTES
