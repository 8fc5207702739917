"""Random recording channels for training audio: what a microphone, a room, a phone line or a codec do.

The synthesized corpus is studio-clean at 16 kHz and the games are 11 kHz MP3 or 8-bit audio band-limited
to ~4 kHz: left alone, bandwidth and cleanliness tell the model which kind of speech it hears. Every
training copy therefore passes through a random channel (`sample`), drawn per copy and seeded:

- speed (sox `speed`, pitch and tempo together) 0.85-1.15;
- a room: an impulse response from `rooms` (pyroomacoustics image-source shoeboxes, when installed) or
  sox `reverb`;
- a band: sox `sinc` high-pass 50-400 Hz and low-pass 3-7.5 kHz, or none;
- a codec round trip through sox: GSM 06.10 or AMR-NB (8 kHz phone codecs), MP3 at 16-48 kbit/s, Ogg
  Vorbis, 8-bit unsigned, mu-law, or none;
- additive white, pink or brown noise at 0-30 dB SNR (export/speech/augment.py's noise);
- an output peak level of -30 to -1 dBFS.
"""

from __future__ import annotations

import dataclasses
import functools
import random
import subprocess

import numpy as np

from attnserve.export.speech.augment import _noise

SAMPLE_RATE = 16_000
# sox arguments that encode 16 kHz input into each codec, and the rate it is decoded at.
CODECS = {
    "gsm": (["-r", "8000", "-t", "gsm"], 8000),
    "amr-nb": (["-r", "8000", "-t", "amr-nb"], 8000),
    "mp3": (None, SAMPLE_RATE),  # bit rate drawn per copy
    "vorbis": (["-t", "vorbis", "-C", "0"], SAMPLE_RATE),
    "u8": (["-r", "11025", "-t", "raw", "-e", "unsigned", "-b", "8"], 11025),
    "mu-law": (["-r", "8000", "-t", "raw", "-e", "mu-law", "-b", "8"], 8000),
}


@dataclasses.dataclass(frozen=True)
class Channel:
    speed: float = 1.0
    room: int | None = None  # index into rooms()
    reverb: int = 0  # sox reverberance (without a room impulse response)
    highpass: int = 0  # Hz, 0 = none
    lowpass: int = 0  # Hz, 0 = none
    codec: str = ""
    bitrate: int = 0  # kbit/s, MP3 only
    noise_snr: float | None = None
    noise_color: str = "white"
    peak_db: float = -3.0

    def changes(self) -> dict:
        default = Channel()
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                if getattr(self, f.name) != getattr(default, f.name)}


def sample(rng: random.Random, rooms_available: int) -> Channel:
    """A random channel; about one copy in eight keeps the clip's own band and codec."""
    kw: dict = {}
    if rng.random() < 0.6:
        kw["speed"] = round(rng.uniform(0.85, 1.15), 3)
    if rng.random() < 0.35:
        if rooms_available:
            kw["room"] = rng.randrange(rooms_available)
        else:
            kw["reverb"] = rng.randint(10, 70)
    if rng.random() < 0.5:
        kw["highpass"] = rng.choice((50, 100, 200, 300, 400))
        kw["lowpass"] = rng.choice((3000, 3400, 4000, 5000, 6000, 7500))
    if rng.random() < 0.5:
        kw["codec"] = rng.choice(sorted(CODECS))
        if kw["codec"] == "mp3":
            kw["bitrate"] = rng.choice((16, 24, 32, 48))
    if rng.random() < 0.6:
        kw["noise_snr"] = round(rng.uniform(0.0, 30.0), 1)
        kw["noise_color"] = rng.choice(("white", "pink", "brown"))
    kw["peak_db"] = round(rng.uniform(-30.0, -1.0), 1)
    return Channel(**kw)


# The channel's effects by name, with the fields each one sets: what `keep` and `mix --effects` select.
EFFECTS = {
    "speed": ("speed",),
    "room": ("room", "reverb"),
    "band": ("highpass", "lowpass"),
    "codec": ("codec", "bitrate"),
    "noise": ("noise_snr", "noise_color"),
    "level": ("peak_db",),
}


def check_effects(effects: tuple[str, ...]) -> None:
    unknown = set(effects) - set(EFFECTS)
    if unknown:
        raise ValueError(f"unknown channel effects {sorted(unknown)}; known: {sorted(EFFECTS)}")


def keep(chosen: Channel, effects: tuple[str, ...]) -> Channel:
    """`chosen` with only the named effects left on (the others at their defaults): a single-effect ablation
    draws the full channel and keeps one part, so each copy hears exactly what the full channel gives it."""
    check_effects(effects)
    default = Channel()
    off = {name: getattr(default, name) for effect, names in EFFECTS.items() if effect not in effects for name in names}
    return dataclasses.replace(chosen, **off)


@functools.lru_cache(maxsize=1)
def rooms(count: int = 48, seed: int = 0) -> tuple[np.ndarray, ...]:
    """Room impulse responses at 16 kHz (empty without pyroomacoustics): shoebox rooms 3-10 m wide, RT60
    0.2-0.9 s, a source and a microphone at random places."""
    try:
        import pyroomacoustics as pra
    except ImportError:
        return ()
    rng = np.random.default_rng(seed)
    out = []
    while len(out) < count:
        size = rng.uniform([3, 3, 2.4], [10, 8, 4])
        rt60 = rng.uniform(0.2, 0.9)
        try:
            absorption, order = pra.inverse_sabine(rt60, size)
        except ValueError:
            continue
        room = pra.ShoeBox(size, fs=SAMPLE_RATE, materials=pra.Material(absorption), max_order=min(order, 12))
        room.add_source(rng.uniform(0.5, size - 0.5))
        room.add_microphone(rng.uniform(0.5, size - 0.5))
        room.compute_rir()
        rir = np.asarray(room.rir[0][0], dtype=np.float64)
        out.append(rir / np.abs(rir).max())
    return tuple(out)


def _sox(data: bytes, in_args: list[str], out_args: list[str], effects: list[str] = ()) -> bytes:
    cmd = ["sox", "-R", "-V1", *in_args, "-", *out_args, "-", *effects]
    run = subprocess.run(cmd, input=data, capture_output=True)
    if run.returncode != 0:
        raise RuntimeError(f"sox failed ({' '.join(cmd)}): {run.stderr.decode(errors='replace')[-300:]}")
    return run.stdout


_FLOAT = ["-t", "raw", "-e", "floating-point", "-b", "32", "-c", "1"]


def _float_args(rate: int) -> list[str]:
    return [*_FLOAT, "-r", str(rate)]


def apply(samples: np.ndarray, channel: Channel, seed: int) -> np.ndarray:
    """16 kHz int16 samples through `channel`; 16 kHz int16 out."""
    x = samples.astype(np.float32) / 32768
    effects = []
    if channel.speed != 1.0:
        effects += ["speed", f"{channel.speed:.4f}"]
    if channel.reverb:
        effects += ["reverb", str(channel.reverb)]
    if effects:  # back to 16 kHz after a speed change, before the band (sox's sinc needs the final rate)
        effects += ["rate", "-h", str(SAMPLE_RATE)]
    if channel.highpass:
        effects += ["sinc", f"{channel.highpass}-{channel.lowpass}"]
    if effects:  # one sox process less for the copies that need none
        x = np.frombuffer(_sox(x.tobytes(), _float_args(SAMPLE_RATE), _FLOAT, effects), np.float32)
    x = x.astype(np.float64)
    if channel.room is not None:
        from scipy import signal  # the rooms' extra (pyroomacoustics brings it)

        x = signal.fftconvolve(x, rooms()[channel.room])[: len(x)]
    x = x / (np.abs(x).max() or 1.0) * 0.7  # headroom for the codec
    if channel.codec:
        x = _codec_round_trip(x, channel)
    if channel.noise_snr is not None and x.size:
        x = x + _noise(x, channel.noise_snr, channel.noise_color, np.random.default_rng(seed))
    peak = float(np.abs(x).max()) if x.size else 0.0
    if peak > 0:
        x = x * (10 ** (channel.peak_db / 20) / peak)
    return np.clip(np.round(x * 32767), -32768, 32767).astype(np.int16)


def _codec_round_trip(x: np.ndarray, channel: Channel) -> np.ndarray:
    encode, rate = CODECS[channel.codec]
    if channel.codec == "mp3":
        encode = ["-t", "mp3", "-C", str(channel.bitrate)]
    raw = x.astype(np.float32).tobytes()
    coded = _sox(raw, _float_args(SAMPLE_RATE), ["-c", "1", *encode])
    decode_args = encode if encode[-2:] != ["-C", "0"] else encode[:-2]
    if channel.codec == "mp3":
        decode_args = ["-t", "mp3"]
    if decode_args and decode_args[0] == "-r":  # raw and phone formats need their rate to be read back
        decode_args = ["-c", "1", *decode_args]
    y = _sox(coded, decode_args, _FLOAT, ["rate", "-h", str(SAMPLE_RATE)])
    out = np.frombuffer(y, np.float32).astype(np.float64)
    return out[: len(x)] if len(out) >= len(x) else np.pad(out, (0, len(x) - len(out)))
