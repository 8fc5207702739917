"""A ~10-minute recording of held-out sentences in a held-out voice, transcribed long-form by the bundled
recognizer: WER, word-time error and its drift towards the end, time to transcribe, and an SRT excerpt.

    python bench/longform.py --corpus /work/data/longform/corpus --out /work/data/longform/run

The recording: test-split sentences of the translation corpus (never trained on), read by flite's `slt`
voice (held out of training), joined by pauses drawn from 0.5-1.5 s, with faint noise (-60 dBFS), as one
16 kHz WAV. flite times its own words, so every reference word has a time. The same recording is also cut
at the middle of every pause (oracle cuts: where the sentences are known to be) and each piece decoded as
a request of its own, in the same run, so the figures read as "voice activity cuts against known cuts".

Drift: the signed start error of every word heard right (matched by a sequence alignment), against its
time in the recording: the median in the first and the last minute, and the slope of a line fitted
through all of them (ms per minute). Offsets that accumulated along the recording would show as a slope.

    python bench/longform.py --recorded /work/data/real-speech --out /work/data/longform/recorded

`--recorded` builds the recording from the recorded corpus's `test_real_heldout` clips instead (Drascula's
ten characters and the Asterisk voice, never trained on), in a shuffled order, joined the same way. Those
clips come without word times, so the timing figure is coarser: the share of words heard right whose
served start lies inside their own clip (within 0.25 s), over the whole recording and in its first and last
minute; a drift of a clip's length or more would empty the last minute's share.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import json
import pathlib
import random
import sys
import time

import numpy as np

from attnserve.clients import subtitles
from attnserve.clients.client import Client, audio_request
from attnserve.export.speech.engines import Flite
from attnserve.export.speech.scoring import error_rate
from attnserve.export.speech.synthesizer import Request
from attnserve.export.speech.text import select
from attnserve.server.edge import app
from attnserve.server.inputs.audio import resample
from attnserve.server.engine.registry import load_engine
from attnserve.api.generation import DecodingOptions, GenerationResult
from attnserve.server.engine.longform import LongFormEngine, LongFormOptions
from attnserve.server.model.repository import find_models

RATE = 16000
NAME = "speech-en"


@dataclasses.dataclass
class Clip:
    text: str  # the normalised transcript
    samples: np.ndarray  # (N,) float32 at RATE
    words: list[tuple[str, float, float]]  # (word, start, end) within the clip; the clip's span if untimed
    timed: bool = True  # the words carry their own times (synthesized), not the clip's span (recorded)


def sentences(corpus: pathlib.Path, seed: int) -> list[str]:
    """The corpus's test sentences that the speech corpus would read (its own selection), shuffled."""
    pairs = [line.split("\t")[0] for line in (corpus / "test.tsv").read_text().splitlines()]
    sources = (corpus / "test.source").read_text().splitlines()
    chosen, _ = select([(en, source, "test") for en, source in zip(pairs, sources)])
    spoken = [s.spoken for s in chosen if 4 <= len(s.words) <= 20]
    random.Random(seed).shuffle(spoken)
    return spoken


def synthesize(spoken: list[str], seconds: float) -> list[Clip]:
    from attnserve.export.speech.text import normalise

    flite, clips, total = Flite(), [], 0.0
    for sentence in spoken:
        out = flite.synthesize(Request(sentence, "slt"))
        x = resample(out.samples.astype(np.float32) / 32768, out.sample_rate, RATE)
        words = normalise(sentence).split()
        clips.append(Clip(" ".join(words), x, [(w, s, e) for w, (s, e) in zip(words, out.words)]))
        total += len(x) / RATE + 1.0
        if total >= seconds:
            break
    return clips


def recorded(corpus: pathlib.Path, seconds: float, seed: int) -> list[Clip]:
    """Held-out recorded clips (export/speech/real.py's `test_real_heldout`), shuffled, until `seconds`."""
    import soundfile

    from attnserve.export.speech import manifest

    rows = manifest.read(corpus / "test_real_heldout.jsonl")
    random.Random(seed).shuffle(rows)
    clips, total = [], 0.0
    for row in rows:
        x, rate = soundfile.read(corpus / row["path"], dtype="float32")
        span = len(x) / rate
        clips.append(Clip(row["text"], x, [(w, 0.0, span) for w in row["text"].split()], timed=False))
        total += span + 1.0
        if total >= seconds:
            break
    return clips


def inside_own_clip(result: GenerationResult, reference: list[tuple[str, float, float]], seconds: float,
                    slack: float = 0.25) -> dict:
    """Share of the words heard right whose served start lies in their own clip's span: overall, and in the
    first and last minute of the recording."""
    hits = [(lo, lo - slack <= start <= hi + slack) for (_, lo, hi), start in heard_right(result, reference)]
    share = lambda pick: round(float(np.mean([h for t, h in hits if pick(t)])), 3) if any(pick(t) for t, _ in hits) else None  # noqa: E731
    return {"words_matched": len(hits), "words_inside_their_clip": share(lambda t: True),
            "words_inside_their_clip_first_minute": share(lambda t: t < 60),
            "words_inside_their_clip_last_minute": share(lambda t: t > seconds - 60)}


def join(clips: list[Clip], seed: int):
    """(samples, every reference word with its time in the recording, each clip's first word's start, and
    the oracle cuts: each clip's (start, end) sample with half of the pause on either side)."""
    rng = np.random.default_rng(seed)
    parts, words, starts, t, pauses = [], [], [], 0.0, []
    for clip in clips:
        pause = np.zeros(round(rng.uniform(0.5, 1.5) * RATE), dtype=np.float32)
        parts += [pause, clip.samples]
        pauses.append(len(pause))
        t += len(pause) / RATE
        starts.append(t + clip.words[0][1])  # where its first word starts (flite leads with silence)
        words += [(w, s + t, e + t) for w, s, e in clip.words]
        t += len(clip.samples) / RATE
    parts.append(np.zeros(RATE // 2, dtype=np.float32))
    x = np.concatenate(parts)
    pauses.append(RATE // 2)
    bounds, at = [], 0
    for i, clip in enumerate(clips):
        at += pauses[i]
        bounds.append((at - pauses[i] // 2, at + len(clip.samples) + pauses[i + 1] // 2))
        at += len(clip.samples)
    return x + 1e-3 * rng.standard_normal(len(x)).astype(np.float32), words, starts, bounds


def heard_right(result: GenerationResult, reference: list[tuple[str, float, float]]):
    """(reference word, served start) of every word heard right, matched by a sequence alignment."""
    served, ref = [w.word for w in result.words], [w for w, _, _ in reference]
    for block in difflib.SequenceMatcher(None, served, ref, autojunk=False).get_matching_blocks():
        for k in range(block.size):
            yield reference[block.b + k], result.words[block.a + k].start_seconds


def start_errors(result: GenerationResult, reference: list[tuple[str, float, float]]) -> np.ndarray:
    """(M, 2): reference start and signed start error (s) of every word heard right."""
    return np.array([(r[1], start - r[1]) for r, start in heard_right(result, reference)])


def drift(errors: np.ndarray, seconds: float) -> dict:
    t, e = errors[:, 0], errors[:, 1]
    first, last = e[t < 60], e[t > seconds - 60]
    # A line through each minute's median: single words matched to the wrong reference word would tilt
    # a least-squares line through all of them.
    minutes = np.arange(int(seconds // 60) + 1)
    medians = [np.median(e[(t >= 60 * m) & (t < 60 * (m + 1))]) for m in minutes if ((t >= 60 * m) & (t < 60 * (m + 1))).any()]
    slope = np.polyfit(np.arange(len(medians)), medians, 1)[0]
    return {
        "words_matched": int(len(e)),
        "median_abs_start_error_ms": round(1000 * float(np.median(np.abs(e))), 1),
        "p90_abs_start_error_ms": round(1000 * float(np.percentile(np.abs(e), 90)), 1),
        "median_signed_error_first_minute_ms": round(1000 * float(np.median(first)), 1),
        "median_signed_error_last_minute_ms": round(1000 * float(np.median(last)), 1),
        "median_abs_error_last_minute_ms": round(1000 * float(np.median(np.abs(last))), 1),
        "drift_slope_ms_per_minute": round(1000 * float(slope), 2),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--corpus", type=pathlib.Path, help="a built translation corpus (flite slt reads its test sentences)")
    source.add_argument("--recorded", type=pathlib.Path, help="export/speech/real.py's output: its held-out recordings")
    parser.add_argument("--models", default="models")
    parser.add_argument("--out", type=pathlib.Path, required=True, help="folder for the WAV, SRT and figures")
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--beam-size", type=int, default=0, help="0 = the model's default")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--padding", type=float, default=None, help="segmentation padding_seconds (default: the server's)")
    parser.add_argument("--in-flight", type=int, default=None, help="segments_in_flight (default: the server's)")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)

    if args.recorded:
        clips = recorded(args.recorded, args.minutes * 60, args.seed)
    else:
        clips = synthesize(sentences(args.corpus, args.seed), args.minutes * 60)
    x, reference, starts, oracle = join(clips, args.seed)
    seconds = len(x) / RATE
    wav = wav_bytes(x)
    (args.out / "recording.wav").write_bytes(wav)
    options = LongFormOptions()
    if args.padding is not None:
        options = dataclasses.replace(options, segmentation=dataclasses.replace(options.segmentation,
                                                                                padding_seconds=args.padding))
    if args.in_flight is not None:
        options = dataclasses.replace(options, segments_in_flight=args.in_flight)
    engine = LongFormEngine(load_engine(find_models(args.models)[NAME]), options)
    decoding = DecodingOptions(beam_size=args.beam_size)
    with app.BackgroundServer({NAME: engine}) as server, Client(server.address, timeout=3600) as client:
        began = time.perf_counter()
        result = [e for e in client.stream(dataclasses.replace(audio_request(wav, model=NAME), decoding=decoding))][-1]
        long_seconds = time.perf_counter() - began
        began = time.perf_counter()
        alone = []
        for begin in range(0, len(oracle), 64):  # under the queue bound, each piece queued once per speed
            futures = [engine.submit(dataclasses.replace(audio_request(wav_bytes(x[lo:hi]), model=NAME),
                                                         decoding=decoding)) for lo, hi in oracle[begin : begin + 64]]
            alone += [f.result(3600) for f in futures]
        alone_seconds = time.perf_counter() - began

    truth = " ".join(c.text for c in clips)
    errors = start_errors(result, reference) if clips[0].timed else None
    srt = subtitles.srt(subtitles.result_cues(result))
    (args.out / "recording.srt").write_text(srt)
    figures = {
        "recording_seconds": round(seconds, 1),
        "sentences": len(clips),
        "reference_words": len(reference),
        "segments": len(result.segments),
        "wer_long_form": round(error_rate([result.text], [truth], "word"), 4),
        "cer_long_form": round(error_rate([result.text], [truth], "char"), 4),
        "wer_oracle_cuts": round(error_rate([" ".join(r.text for r in alone)], [truth], "word"), 4),
        "transcribe_seconds_long_form": round(long_seconds, 1),
        "transcribe_seconds_oracle_cuts": round(alone_seconds, 1),
        "real_time_factor_long_form": round(long_seconds / seconds, 4),
        "long_form_over_oracle_cuts_time": round(long_seconds / alone_seconds, 3),
        "segments_starting_within_0.5s_before_a_sentence": _near(result, starts),
        **(drift(errors, seconds) if clips[0].timed else inside_own_clip(result, reference, seconds)),
        "source": "recorded test_real_heldout" if args.recorded else "flite slt (held-out voice)",
        "beam_size": args.beam_size or "model default",
        "padding_seconds": options.segmentation.padding_seconds,
        "segments_in_flight": options.segments_in_flight,
    }
    (args.out / "figures.json").write_text(json.dumps(figures, indent=2) + "\n")
    print(json.dumps(figures, indent=2))
    print("\n".join(srt.split("\n\n")[-4:]))
    return 0


def wav_bytes(x: np.ndarray) -> bytes:
    import io

    import soundfile

    out = io.BytesIO()
    soundfile.write(out, x, RATE, format="WAV", subtype="PCM_16")
    return out.getvalue()


def _near(result: GenerationResult, starts: list[float]) -> float:
    """Share of segments that start at most 0.5 s before a sentence's first word (a cut in the pause before it)."""
    hits = sum(any(0 <= s - seg.start_seconds <= 0.5 for s in starts) for seg in result.segments)
    return round(hits / max(len(result.segments), 1), 3)


if __name__ == "__main__":
    sys.exit(main())
