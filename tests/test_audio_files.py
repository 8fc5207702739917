"""server/inputs/audio_files.py: the formats people have decode to the samples they hold; bad files are named."""

from __future__ import annotations

import io

import numpy as np
import pytest

from attnserve.server.inputs import audio_files
from fakes import wav_bytes

RATE = 16000
SECONDS = 2.0


def chirp(rate: int = RATE, channels: int = 1) -> np.ndarray:
    t = np.arange(round(SECONDS * rate)) / rate
    x = 0.3 * np.sin(2 * np.pi * (200 + 300 * t) * t)
    return np.stack([x, 0.5 * x], axis=1)[:, :channels] if channels > 1 else x.astype(np.float32)


def sndfile_bytes(x: np.ndarray, rate: int, fmt: str) -> bytes:
    import soundfile

    out = io.BytesIO()
    soundfile.write(out, x, rate, format=fmt)
    return out.getvalue()


def m4a_bytes(x: np.ndarray, rate: int) -> bytes:
    av = pytest.importorskip("av")
    out = io.BytesIO()
    with av.open(out, mode="w", format="mp4") as container:
        stream = container.add_stream("aac", rate=rate)
        stream.layout = "mono"
        frame = av.AudioFrame.from_ndarray(x[None, :].astype(np.float32), format="fltp", layout="mono")
        frame.sample_rate = rate
        for packet in [*stream.encode(frame), *stream.encode(None)]:
            container.mux(packet)
    return out.getvalue()


def aligned_correlation(a: np.ndarray, b: np.ndarray, max_shift: int = 4096) -> float:
    """Best correlation of b against a over shifts of b (lossy codecs delay the start by their priming)."""
    best = 0.0
    for shift in range(0, max_shift, 16):
        n = min(len(a), len(b) - shift)
        if n < len(a) // 2:
            break
        best = max(best, float(np.corrcoef(a[:n], b[shift : shift + n])[0, 1]))
    return best


@pytest.mark.parametrize("fmt, lossless", [("FLAC", True), ("OGG", False), ("MP3", False)])
def test_sndfile_formats_decode_to_their_samples(fmt, lossless):
    x = chirp(22050, channels=2)
    data = sndfile_bytes(x, 22050, fmt)
    header = audio_files.probe(data)
    assert (header.format, header.sample_rate_hz, header.channels) == (fmt.lower(), 22050, 2)
    assert abs(header.seconds - SECONDS) < 0.1
    samples = audio_files.decode(data, header)
    mono = x.mean(axis=1)
    if lossless:  # 16-bit FLAC: the channels' mean of the 16-bit samples
        np.testing.assert_allclose(samples, mono, atol=2 / 32768)
    else:
        assert aligned_correlation(mono, samples) > 0.95


def test_m4a_decodes_through_pyav():
    x = chirp()
    data = m4a_bytes(x, RATE)
    header = audio_files.probe(data)
    assert (header.format, header.sample_rate_hz, header.channels) == ("m4a", RATE, 1)
    assert abs(header.seconds - SECONDS) < 0.1
    assert aligned_correlation(x, audio_files.decode(data, header)) > 0.95
    assert "m4a" in audio_files.formats()


def test_wav_is_read_by_the_servers_own_parser():
    x = chirp()
    data = wav_bytes(x, RATE)
    header = audio_files.probe(data)
    assert header == audio_files.AudioHeader("wav", RATE, 1, len(x))
    np.testing.assert_allclose(audio_files.decode(data, header), x, atol=1 / 32768)


def test_a_long_stereo_wav_decodes_block_by_block_to_the_parsers_samples():
    from attnserve.server.inputs.audio import read_wav

    x = np.tile(chirp(channels=2), (10, 1))  # 20 s: more than one block of frames
    data = wav_bytes(x, RATE)
    np.testing.assert_array_equal(audio_files.decode(data, audio_files.probe(data)), read_wav(data).samples())


@pytest.mark.parametrize("data, message", [
    (b"hello world, not audio at all", "not a file format this server reads: send WAV, FLAC, Ogg"),
    (b"fLaC" + bytes(200), "cannot read the FLAC file"),
    (b"OggS" + bytes(200), "cannot read the OGG file"),
    (b"\x00\x00\x00\x18ftypM4A " + bytes(100), "cannot read the M4A file"),
])
def test_files_that_do_not_decode_are_named(data, message):
    with pytest.raises(ValueError, match=message):
        audio_files.probe(data)


def test_a_truncated_file_is_refused_not_half_read():
    data = sndfile_bytes(chirp(), RATE, "FLAC")
    header = audio_files.probe(data[: len(data) // 2])  # the header is whole
    with pytest.raises(ValueError, match="cannot decode the FLAC file: .*lost sync"):
        audio_files.decode(data[: len(data) // 2], header)


def test_formats_lists_what_this_install_decodes():
    assert audio_files.formats()[:4] == ("wav", "flac", "ogg", "mp3")
