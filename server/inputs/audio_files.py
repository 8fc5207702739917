"""Audio files in the formats people have, decoded by real decoders: never by hand.

WAV is read by our own parser (server/inputs/audio.py, which the short-clip path has always used); FLAC, Ogg
(Vorbis, Opus) and MP3 by libsndfile (PyPI `soundfile`, whose wheel carries it); M4A/MP4 audio (AAC, ALAC)
by FFmpeg (PyPI `av`, the `m4a` extra: its wheel carries FFmpeg, too heavy for every server). A file's
format is told by its magic bytes, never by a name.

`probe` reads only the header (rate, channels, frames), so that limits are checked before anything big is
decoded; `decode` then returns mono float32 samples at the file's own rate, read in blocks so that a long
stereo file is never held at full width.
"""

from __future__ import annotations

import dataclasses
import io

import numpy as np

from attnserve.server.inputs.audio import read_wav

# Formats read by libsndfile, by its own names (soundfile.SoundFile.format).
_SNDFILE = {"flac": "FLAC", "ogg": "OGG", "mp3": "MP3"}
# Frames decoded at a time by libsndfile.
_BLOCK_FRAMES = 1 << 18


@dataclasses.dataclass(frozen=True)
class AudioHeader:
    """What a file's header says, before any sample is decoded."""

    format: str  # "wav", "flac", "ogg", "mp3" or "m4a"
    sample_rate_hz: int
    channels: int
    frames: int  # samples per channel (from the stated duration where the container gives no count)

    @property
    def seconds(self) -> float:
        return self.frames / self.sample_rate_hz if self.sample_rate_hz else 0.0


def sniff(data: bytes) -> str:
    """The format of a file, from its first bytes.

    Raises:
        ValueError: none that this server reads.
    """
    head = bytes(data[:12])
    if head[:4] in (b"RIFF", b"RF64") and head[8:12] == b"WAVE":
        return "wav"
    if head[:4] == b"fLaC":
        return "flac"
    if head[:4] == b"OggS":
        return "ogg"
    if head[:3] == b"ID3" or (len(head) >= 2 and head[0] == 0xFF and head[1] & 0xE0 == 0xE0):
        return "mp3"  # an ID3 tag, or an MPEG audio frame's sync word
    if head[4:8] == b"ftyp":
        return "m4a"
    raise ValueError("audio data is not a file format this server reads: send WAV, FLAC, Ogg (Vorbis, Opus), "
                     "MP3 or M4A, or raw samples")


def formats() -> tuple[str, ...]:
    """The formats this installation decodes (WAV always; the others when their decoder is installed)."""
    found = ["wav"]
    try:
        import soundfile

        available = soundfile.available_formats()
        found += [name for name, sf_name in _SNDFILE.items() if sf_name in available]
    except (ImportError, OSError):  # no wheel, or a system without libsndfile
        pass
    try:
        import av  # noqa: F401

        found.append("m4a")
    except ImportError:
        pass
    return tuple(found)


def probe(data: bytes) -> AudioHeader:
    """The file's header.

    Raises:
        ValueError: an unknown, unsupported or damaged file, or a format whose decoder is not installed (the
            message says how to install it).
    """
    fmt = sniff(data)
    if fmt == "wav":
        wav = read_wav(data)
        return AudioHeader(fmt, wav.sample_rate_hz, wav.channels, wav.frames)
    if fmt == "m4a":
        with _av_container(data) as container:
            stream = _av_stream(container)
            seconds = float(stream.duration * stream.time_base) if stream.duration else container.duration / 1e6
            rate = stream.codec_context.sample_rate
            return AudioHeader(fmt, rate, stream.codec_context.channels, round(seconds * rate))
    with _SoundFile(data, fmt) as f:
        return AudioHeader(fmt, f.samplerate, f.channels, f.frames)


def decode(data: bytes, header: AudioHeader) -> np.ndarray:
    """(N,) float32 mono samples at header.sample_rate_hz: the channels averaged.

    Raises:
        ValueError: the file does not decode (damaged or truncated).
    """
    if header.format == "wav":
        return _wav_samples(data)
    if header.format == "m4a":
        return _decode_av(data)
    # Filled in place, not concatenated: an hour at 44.1 kHz is 600 MB of float32 once, not twice.
    out, filled, extra = np.empty(header.frames, dtype=np.float32), 0, []
    with _SoundFile(data, header.format) as f:
        try:
            for block in f.blocks(_BLOCK_FRAMES, dtype="float32", always_2d=True):  # (n, C)
                mono = block.mean(axis=1, dtype=np.float32)
                n = min(len(mono), len(out) - filled)
                out[filled : filled + n] = mono[:n]
                filled += n
                if n < len(mono):  # more than the header said (an estimated MP3 length)
                    extra.append(mono[n:])
        except RuntimeError as exc:  # soundfile.LibsndfileError
            raise ValueError(f"cannot decode the {header.format.upper()} file: {exc}") from None
    return np.concatenate([out[:filled], *extra]) if extra else out[:filled]


def _wav_samples(data: bytes) -> np.ndarray:
    """Wav.samples() (the same arithmetic), a block of frames at a time: never an hour in float64."""
    wav = read_wav(data)
    out = np.empty(wav.frames, dtype=np.float32)
    for lo in range(0, wav.frames, _BLOCK_FRAMES):
        n = min(_BLOCK_FRAMES, wav.frames - lo)
        x = np.frombuffer(wav.data, wav.dtype, n * wav.channels, lo * wav.channels * wav.dtype.itemsize)
        out[lo : lo + n] = (x.reshape(n, wav.channels).astype(np.float64) / wav.scale).mean(axis=1)
    return out


class _SoundFile:
    """soundfile.SoundFile over the bytes, its import and open errors turned into ValueErrors."""

    def __init__(self, data: bytes, fmt: str):
        try:
            import soundfile
        except (ImportError, OSError) as exc:
            raise ValueError(f"this server cannot read {fmt.upper()} files: its soundfile package is missing "
                             f"({exc}); pip install soundfile, or send WAV") from None
        try:
            self._file = soundfile.SoundFile(io.BytesIO(data))
        except RuntimeError as exc:  # soundfile.LibsndfileError: damaged, truncated, or another codec
            raise ValueError(f"cannot read the {fmt.upper()} file: {exc}") from None

    def __enter__(self):
        return self._file

    def __exit__(self, *exc_info) -> None:
        self._file.close()


def _av_container(data: bytes):
    try:
        import av
    except ImportError:
        raise ValueError("this server cannot read M4A files: install the m4a extra (pip install 'attnserve[m4a]', "
                         "which brings FFmpeg's PyAV), or send WAV, FLAC, Ogg or MP3") from None
    try:
        return av.open(io.BytesIO(data), mode="r")
    except av.FFmpegError as exc:
        raise ValueError(f"cannot read the M4A file: {exc}") from None


def _av_stream(container):
    if not container.streams.audio:
        raise ValueError("the M4A file holds no audio stream")
    return container.streams.audio[0]


def _decode_av(data: bytes) -> np.ndarray:
    import av

    out = []
    with _av_container(data) as container:
        stream = _av_stream(container)
        planar = av.AudioResampler(format="fltp")  # float planes at the stream's own rate and layout
        try:
            for frame in container.decode(stream):
                for converted in planar.resample(frame):
                    out.append(converted.to_ndarray().mean(axis=0, dtype=np.float32))  # (C, n) -> (n,)
        except av.FFmpegError as exc:
            raise ValueError(f"cannot decode the M4A file: {exc}") from None
    return np.concatenate(out) if out else np.zeros(0, dtype=np.float32)
