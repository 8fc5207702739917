"""Audio input: WAV files and raw samples -> mono samples at the model's rate -> log-mel frames.

`AudioPreprocessor.prepare` checks the cheap things first, so that a request over a limit is refused
before its audio is decoded: the byte size, then the header (format, channels, rate), then the duration the
header implies; only then are samples converted, checked for NaN/infinity, averaged to mono, resampled
(windowed-sinc, numpy only) and turned into features (server/inputs/features.py).

The encoder reduces time by the manifest's `time_reduction` r: a clip of T frames is padded to a multiple of
r frames and gives ceil(T / r) encoder positions; attention column j stands for frames j*r .. j*r + r - 1,
labelled with the time span they shift over, "start-end" in seconds.
"""

from __future__ import annotations

import dataclasses
import math
import struct
from collections.abc import Sequence

import numpy as np

from attnserve.server.inputs.features import frame_count, log_mel
from attnserve.api.generation import (
    AudioInput,
    AudioInputInfo,
    GenerationRequest,
    InputKind,
    InputTooLargeError,
    ModelInfo,
    Token,
    WordTiming,
)
from attnserve.server.inputs.inputs import AudioInputSpec
from attnserve.server.inputs.preprocessing import EncoderBatch, Preprocessor, pad_batch
from attnserve.server.attention import alignment
from attnserve.server.attention.timestamps import word_timings
from attnserve.server.model.tokenization import Words

# WAVE format tags: integer PCM, IEEE float, and the extensible header whose sub-format GUID holds one of those.
_PCM, _FLOAT, _EXTENSIBLE = 1, 3, 0xFFFE
# (format tag, bits per sample) -> sample dtype and the divisor that maps it to [-1, 1].
_SAMPLE_TYPES = {
    (_PCM, 16): (np.dtype("<i2"), 32768.0),
    (_PCM, 32): (np.dtype("<i4"), 2147483648.0),
    (_FLOAT, 32): (np.dtype("<f4"), 1.0),
    (_FLOAT, 64): (np.dtype("<f8"), 1.0),
}
# Sample rates are resampled by a polyphase filter with one phase per output sample of the reduced ratio
# in/out = a/b; rates whose ratio to the model's needs more phases than this are refused.
MAX_RATE_RATIO_TERM = 1000
MIN_SAMPLE_RATE_HZ, MAX_SAMPLE_RATE_HZ = 4000, 384000
# Blocks of the resampler's output computed at once (bounds its working memory for long recordings).
_RESAMPLE_CHUNK_BLOCKS = 8192


@dataclasses.dataclass(frozen=True)
class Wav:
    """A parsed WAV header and its undecoded sample bytes."""

    sample_rate_hz: int
    channels: int
    frames: int  # samples per channel
    dtype: np.dtype  # of one stored sample
    scale: float  # divisor mapping stored samples to [-1, 1]
    data: memoryview  # frames * channels samples, interleaved

    def samples(self) -> np.ndarray:
        """(frames,) float32 mono: the channels averaged, in [-1, 1] for integer PCM."""
        x = np.frombuffer(self.data, dtype=self.dtype, count=self.frames * self.channels)
        x = x.reshape(self.frames, self.channels).astype(np.float64) / self.scale  # (N, C)
        return x.mean(axis=1).astype(np.float32)


def read_wav(data: bytes) -> Wav:
    """Parses a RIFF/WAVE file's header; the samples are converted only when asked for.

    Raises:
        ValueError: not a WAV file, a format other than 16/32-bit PCM or 32/64-bit float, more than two
            channels, or a header that contradicts itself.
    """
    view = memoryview(data)
    if len(view) < 12 or bytes(view[:4]) != b"RIFF" or bytes(view[8:12]) != b"WAVE":
        kind = "an RF64 file (WAV over 4 GB)" if bytes(view[:4]) == b"RF64" else "not a WAV file"
        raise ValueError(f"audio data is {kind}: send a RIFF/WAVE file or raw samples")
    fmt, body, pos = None, None, 12
    while pos + 8 <= len(view) and body is None:
        chunk, size = bytes(view[pos : pos + 4]), int.from_bytes(view[pos + 4 : pos + 8], "little")
        if chunk == b"fmt ":
            fmt = bytes(view[pos + 8 : pos + 8 + size])
        elif chunk == b"data":
            body = view[pos + 8 : pos + 8 + size]  # a streamed file may state more bytes than it has
        pos += 8 + size + (size & 1)  # chunks are padded to an even size
    if fmt is None or body is None:
        raise ValueError(f"the WAV file has no {'fmt' if fmt is None else 'data'} chunk")
    return _wav(fmt, body)


def _wav(fmt: bytes, body: memoryview) -> Wav:
    if len(fmt) < 16:
        raise ValueError(f"the WAV fmt chunk is {len(fmt)} bytes; a valid one has at least 16")
    tag, channels, rate, _, block_align, bits = struct.unpack("<HHIIHH", fmt[:16])
    if tag == _EXTENSIBLE and len(fmt) >= 26:
        tag = struct.unpack("<H", fmt[24:26])[0]  # the first two bytes of the sub-format GUID
    if (tag, bits) not in _SAMPLE_TYPES:
        name = {_PCM: "integer PCM", _FLOAT: "float"}.get(tag, f"format tag {tag:#x}")
        raise ValueError(f"unsupported WAV format: {bits}-bit {name}; send 16- or 32-bit PCM or 32- or 64-bit float")
    if channels not in (1, 2):
        raise ValueError(f"unsupported WAV file with {channels} channels; send mono or stereo")
    dtype, scale = _SAMPLE_TYPES[(tag, bits)]
    if block_align != channels * dtype.itemsize:
        raise ValueError(
            f"the WAV header is inconsistent: block align {block_align} for {channels} x {bits}-bit samples"
        )
    return Wav(rate, channels, len(body) // block_align, dtype, scale, body)


def rate_ratio(orig_hz: int, new_hz: int) -> tuple[int, int]:
    """The reduced ratio a/b = orig/new that `resample` filters with.

    Raises:
        ValueError: a rate outside MIN..MAX_SAMPLE_RATE_HZ, or a ratio with a term over MAX_RATE_RATIO_TERM.
    """
    if not MIN_SAMPLE_RATE_HZ <= orig_hz <= MAX_SAMPLE_RATE_HZ:
        raise ValueError(f"unsupported sample rate {orig_hz} Hz: use {MIN_SAMPLE_RATE_HZ}..{MAX_SAMPLE_RATE_HZ} Hz")
    g = math.gcd(orig_hz, new_hz)
    a, b = orig_hz // g, new_hz // g
    if max(a, b) > MAX_RATE_RATIO_TERM:
        raise ValueError(
            f"unsupported sample rate {orig_hz} Hz: resampling it to {new_hz} Hz needs a {a}:{b} filter; "
            "use a common rate (8000, 11025, 16000, 22050, 24000, 32000, 44100, 48000 Hz, ...)"
        )
    return a, b


def resample(x: np.ndarray, orig_hz: int, new_hz: int, zero_crossings: int = 6, rolloff: float = 0.99) -> np.ndarray:
    """Band-limited resampling by a Hann-windowed sinc filter (the algorithm of torchaudio's default).

    The ratio is reduced to a/b; every output sample of a block of b is a dot product of a + 2w input
    samples with one of b precomputed kernels.

    Args:
        x: (N,) samples at `orig_hz`.
        orig_hz, new_hz: sample rates.
        zero_crossings: sinc lobes on each side of the kernel's centre (filter sharpness).
        rolloff: cutoff as a fraction of the lower Nyquist frequency (room for the transition band).

    Returns:
        (ceil(N * new / orig),) float32.

    Raises:
        ValueError: see rate_ratio.
    """
    if orig_hz == new_hz:
        return np.asarray(x, dtype=np.float32)
    a, b = rate_ratio(orig_hz, new_hz)
    cutoff = min(a, b) * rolloff  # in cycles per block of a input samples
    width = math.ceil(zero_crossings * a / cutoff)  # input samples on each side of the centre
    t = -np.arange(b)[:, None] / b + np.arange(-width, width + a)[None, :] / a  # (b, K) in input blocks
    t = np.clip(t * cutoff, -zero_crossings, zero_crossings)
    window = np.cos(t * np.pi / zero_crossings / 2) ** 2
    kernels = np.sinc(t) * window * (cutoff / a)  # (b, K), K = a + 2 * width
    x = np.asarray(x)
    # Block i reads x[i*a - width : i*a - width + K], zeros outside x. A chunk of blocks at a time, padded
    # on its own: neither the whole padded signal nor the (n, K) window matrix of an hour is ever built.
    n, k = len(x) // a + 1, kernels.shape[1]
    out = np.empty((n, b), dtype=np.float32)
    for lo in range(0, n, _RESAMPLE_CHUNK_BLOCKS):
        hi = min(lo + _RESAMPLE_CHUNK_BLOCKS, n)
        start, stop = lo * a - width, (hi - 1) * a - width + k  # the chunk's span of x
        part = np.pad(x[max(start, 0) : min(stop, len(x))].astype(np.float64),
                      (max(-start, 0), max(stop - len(x), 0)))
        blocks = np.lib.stride_tricks.sliding_window_view(part, k)[::a]  # (hi - lo, K)
        out[lo:hi] = blocks @ kernels.T
    return out.reshape(-1)[: math.ceil(len(x) * b / a)]


@dataclasses.dataclass(frozen=True, eq=False)
class AudioSource:
    features: np.ndarray  # (T, n_mels) float32 log-mel frames
    seconds: float  # duration of the audio at the model's rate
    length: int  # encoder positions: ceil(T / time_reduction)


class AudioPreprocessor(Preprocessor):
    """Audio: WAV or raw samples -> log-mel frames; columns are time spans of `time_reduction` frames."""

    kind = InputKind.AUDIO
    times_words = True

    @property
    def spec(self) -> AudioInputSpec:
        return self.manifest.input

    def prepare(self, request: GenerationRequest) -> AudioSource:
        self._check_kind(request)
        audio = request.audio
        if audio is None:
            raise ValueError(f"model '{self.manifest.name}' takes audio input; the request has none")
        samples, _ = self.samples(audio)
        features = log_mel(samples, self.spec.features)  # (T, n_mels)
        seconds = len(samples) / self.spec.features.sample_rate_hz
        if len(features) == 0:
            raise ValueError(
                f"audio is {seconds:.3f} s long, shorter than one {self.spec.features.window_ms:g} ms analysis window"
            )
        return AudioSource(features, seconds, -(-len(features) // self.spec.time_reduction))

    def samples(self, audio: AudioInput) -> tuple[np.ndarray, int]:
        """(N,) float32 mono samples at the model's rate, and that rate, after every limit and check."""
        samples, rate = self._read(audio)
        model_rate = self.spec.features.sample_rate_hz
        return resample(samples, rate, model_rate), model_rate

    def _read(self, audio: AudioInput) -> tuple[np.ndarray, int]:
        """(N,) float32 mono samples and their rate, after every limit and sanity check."""
        if audio.wav and audio.samples is not None:
            raise ValueError("set one of AudioInput data (a WAV file) and samples, not both")
        size = len(audio.wav) if audio.samples is None else 4 * len(audio.samples)
        if size > self.spec.max_bytes:
            raise InputTooLargeError(
                f"audio is {size} bytes; model '{self.manifest.name}' accepts at most {self.spec.max_bytes} bytes"
            )
        if audio.samples is not None:
            if audio.sample_rate_hz <= 0:
                raise ValueError("raw audio samples need their sample_rate_hz")
            self._check_rate_and_duration(audio.sample_rate_hz, len(audio.samples))
            samples = np.asarray(audio.samples, dtype=np.float32).reshape(-1)
            rate = audio.sample_rate_hz
        elif audio.wav:
            wav = read_wav(audio.wav)
            if audio.sample_rate_hz not in (0, wav.sample_rate_hz):
                raise ValueError(
                    f"sample_rate_hz {audio.sample_rate_hz} differs from the WAV header's {wav.sample_rate_hz} Hz; "
                    "leave it 0 for WAV data"
                )
            self._check_rate_and_duration(wav.sample_rate_hz, wav.frames)
            samples, rate = wav.samples(), wav.sample_rate_hz
        else:
            raise ValueError("audio is empty: set AudioInput data (a WAV file) or samples")
        if not np.isfinite(samples).all():
            raise ValueError("audio holds non-finite samples (NaN or infinity)")
        return samples, rate

    def _check_rate_and_duration(self, rate: int, frames: int) -> None:
        """Checks what the header tells, before any sample is converted."""
        rate_ratio(rate, self.spec.features.sample_rate_hz)
        if frames == 0:
            raise ValueError("audio is empty: it holds no samples")
        seconds, limit = frames / rate, self.spec.max_seconds
        if seconds > limit:
            raise InputTooLargeError(
                f"audio is {seconds:.2f} s long; model '{self.manifest.name}' accepts at most {limit:g} s"
            )

    def collate(self, sources: Sequence[AudioSource]) -> EncoderBatch:
        inputs = self.manifest.encoder.inputs
        features, mask = pad_batch([s.features for s in sources], 0.0, self.spec.time_reduction)  # (B, T, M), (B, T)
        lengths = np.array([s.length for s in sources], dtype=np.int64)
        return EncoderBatch({inputs["input_features"]: features, inputs["attention_mask"]: mask}, lengths)

    def source_tokens(self, source: AudioSource) -> list[Token]:
        return [Token(label, -1, 0.0) for label in self.column_labels(len(source.features))]

    def column_labels(self, frames: int) -> list[str]:
        """ "start-end" in seconds of each encoder position of a clip of `frames` frames."""
        r, features = self.spec.time_reduction, self.spec.features
        shift = features.hop_length / features.sample_rate_hz  # seconds per frame
        digits = 2 if round(r * shift * 1000) % 10 == 0 else 3  # whole centiseconds per position, or not
        return [f"{start:.{digits}f}-{end:.{digits}f}" for start, end in zip(*self.column_spans(frames))]

    def column_spans(self, frames: int) -> tuple[np.ndarray, np.ndarray]:
        """Start and end in seconds of each encoder position of a clip of `frames` frames.

        Position j stands for frames j*r .. j*r + r - 1; frame k covers the time it shifts over,
        [k, k + 1) times the frame shift, so the spans tile the clip without overlap.
        """
        r, features = self.spec.time_reduction, self.spec.features
        shift = features.hop_length / features.sample_rate_hz  # seconds per frame
        starts = np.arange(0, frames, r)
        return starts * shift, np.minimum(starts + r, frames) * shift

    def output_budget(self, source: AudioSource) -> int | None:
        rate = self.spec.max_tokens_per_second
        return None if rate is None else math.ceil(rate * source.seconds) + 1

    def word_timings(self, source: AudioSource, attention: np.ndarray, pieces: Sequence[str], words: Words,
                     confidences: Sequence[float] | None = None) -> list[WordTiming]:
        return word_timings(attention, pieces, words, *self.column_spans(len(source.features)), confidences)

    def aligned_word_timings(self, source: AudioSource, rows: np.ndarray, words: Words, special: Sequence[bool],
                             median_width: int, confidences: Sequence[float] | None = None) -> list[WordTiming]:
        # Only the frames of the audio itself (a fixed window's padding cut off), as transformers' num_frames.
        features = self.spec.features
        samples = round(source.seconds * features.sample_rate_hz)
        columns = min(-(-samples // features.hop_length) // self.spec.time_reduction, rows.shape[-1])
        return alignment.word_timings(rows[..., :columns], words, special, median_width, self.spec.seconds_per_column,
                                      confidences)

    def describe(self, info: ModelInfo) -> ModelInfo:
        spec = self.spec
        rate = spec.features.sample_rate_hz
        longest = frame_count(math.floor(spec.max_seconds * rate), spec.features)
        audio = AudioInputInfo(rate, spec.max_seconds, spec.max_bytes, spec.seconds_per_column,
                               speeds=self.manifest.decoding.speeds,
                               word_lm=self.manifest.word_language_model is not None)
        return dataclasses.replace(
            info, input_kind=self.kind, max_source_tokens=-(-longest // spec.time_reduction), audio=audio
        )
