"""Scores an exported speech model through the serving engine (ONNX Runtime, dynamic batching): CER and WER
on corpus splits, overall and per voice, and how well its attention places words in time.

    python -m attnserve.export.speech.evaluate --model-dir models/speech-en/1 --corpus data/speech \\
        --splits test_seen test_heldout_voices --out models/speech-en/scores.json

Word timing compares the server's word timestamps (the `words` of every audio response, read from the
attention: server/attention/timestamps.py) with the synthesizer's own word times in the corpus: each recognised
word that matches a reference word (the two word sequences aligned by their longest matching blocks), on
clips whose corpus word times are exact, gives a start error and an end error.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import difflib
import json
import pathlib
import tempfile
import time

import numpy as np

from attnserve.export.common.serving import open_engine
from attnserve.export.speech import manifest as corpus_manifest
from attnserve.export.speech.scoring import error_rate
from attnserve.export.common.reports import emit

ESPEAK = "espeak-ng"


def voice_group(row: dict) -> str:
    """The voice a score is reported under: espeak-ng variants by accent, other engines by voice."""
    if row["engine"] == ESPEAK:
        return f"{ESPEAK}:{row['voice'].split('+')[0]}"
    return f"{row['engine']}:{row['voice']}"


@contextlib.contextmanager
def decoding_variant(model_dir: pathlib.Path, ctc_weight: float | None, length_hint: bool,
                     lm: pathlib.Path | None = None, lm_weight: float | None = None,
                     speeds: list[float] | None = None, word_lm: bool | dict = True):
    """The version folder as given, or a temporary copy (graphs linked, not copied) whose manifest sets the
    CTC weight of joint decoding, drops the length hint, fuses an n-gram LM (`lm`, else the model's own)
    with `lm_weight`, reads each clip at `speeds` ([1.0]: once), or drops its word LM (`word_lm` False) or
    sets its weights (a dict of word_language_model fields): decoding choices measured on one exported model."""
    if ctc_weight is None and length_hint and lm is None and lm_weight is None and speeds is None and word_lm is True:
        yield model_dir
        return
    manifest = json.loads((model_dir / "manifest.json").read_text())
    if word_lm is False:
        manifest.pop("word_language_model", None)
    elif isinstance(word_lm, dict):
        if "word_language_model" not in manifest:
            raise ValueError(f"{model_dir}: the model has no word LM (manifest word_language_model)")
        manifest["word_language_model"].update(word_lm)
    if speeds is not None:
        manifest.setdefault("decoding", {})["speeds"] = speeds
    if ctc_weight is not None:
        if "ctc" not in manifest["encoder"]:
            raise ValueError(f"{model_dir}: the model has no CTC head for joint decoding (manifest encoder.ctc)")
        manifest["encoder"]["ctc"]["weight"] = ctc_weight
    if not length_hint:
        manifest["encoder"].pop("length_hint", None)
    if lm is not None:
        manifest["language_model"] = {"file": "lm-variant.npz"}
    if lm_weight is not None:
        if "language_model" not in manifest:
            raise ValueError(f"{model_dir}: the model has no language model (manifest language_model); pass --lm")
        manifest["language_model"]["weight"] = lm_weight
    with tempfile.TemporaryDirectory() as tmp:
        copy = pathlib.Path(tmp) / model_dir.parent.name / model_dir.name
        copy.mkdir(parents=True)
        for f in model_dir.iterdir():
            if f.name != "manifest.json":
                (copy / f.name).symlink_to(f.resolve())
        if lm is not None:
            (copy / "lm-variant.npz").symlink_to(lm.resolve())
        (copy / "manifest.json").write_text(json.dumps(manifest, indent=2))
        yield copy


def noisy(wav: bytes, snr_db: float, seed: int):
    """The clip with white noise at `snr_db` below its own power (seeded: the same noise every run), as raw
    samples: how the recognizer fares off clean synthesized audio."""
    from attnserve.server.inputs.audio import read_wav
    from attnserve.api.generation import AudioInput

    clip = read_wav(wav)
    samples = clip.samples().astype(np.float64)
    power = float(np.mean(samples**2)) or 1e-12
    noise = np.random.default_rng(seed).standard_normal(len(samples)) * np.sqrt(power / 10 ** (snr_db / 10))
    return AudioInput(samples=np.clip(samples + noise, -1, 1).astype(np.float32), sample_rate_hz=clip.sample_rate_hz)


def transcribe(engine, corpus: pathlib.Path, rows: list[dict], beam_size: int, attention: bool,
               noise_snr_db: float | None = None, decoding=None) -> list:
    """Served results in row order; clips are submitted shortest first so batches pad little.

    Args:
        decoding: None, or (DecodingOptions, row) -> the options to send that row with (e.g. its hotwords).
    """
    from attnserve.api.generation import (AttentionGranularity, AttentionOptions, AudioInput, DecodingOptions,
                                             GenerationRequest)

    def audio(i: int) -> AudioInput:
        wav = (corpus / rows[i]["path"]).read_bytes()
        return AudioInput(wav=wav) if noise_snr_db is None else noisy(wav, noise_snr_db, seed=i)

    options = AttentionOptions(enabled=attention, granularity=AttentionGranularity.WORDS)
    options_for = decoding or (lambda search, row: search)
    per_chunk = 128 // len(engine.manifest.decoding.speeds)  # each clip is queued once per speed it is read at
    return served_shortest_first(engine, [r["duration"] for r in rows], lambda i: GenerationRequest(
        engine.manifest.name, audio=audio(i), decoding=options_for(DecodingOptions(beam_size=beam_size), rows[i]),
        attention=options), per_chunk)


def served_shortest_first(engine, durations: list[float], request_for, per_chunk: int,
                          refused_as_none: bool = False) -> list:
    """The engine's result for request_for(i) of every clip i, in clip order; clips are submitted shortest
    first, so batches pad little, and `per_chunk` at a time, under the batcher's queue bound.

    Args:
        refused_as_none: a request the engine refuses on submission (ValueError: e.g. slowed past the model's
            window) gives None instead of raising.
    """
    order = sorted(range(len(durations)), key=lambda i: durations[i])
    results = [None] * len(durations)
    for begin in range(0, len(order), per_chunk):
        chunk, futures = order[begin : begin + per_chunk], []
        for i in chunk:
            try:
                futures.append(engine.submit(request_for(i)))
            except ValueError:
                if not refused_as_none:
                    raise
                futures.append(None)
        for i, future in zip(chunk, futures):
            results[i] = future.result() if future is not None else None
    return results


def word_time_errors(row: dict, result) -> list[tuple[float, float]]:
    """(|start error|, |end error|) in seconds of each served word that matches a reference word.

    Clips whose corpus word times are inexact (an engine that reports none for some words) give none.
    """
    if row["inexact_words"]:
        return []
    served = [w.word for w in result.words]
    reference = [w for w, _, _ in row["words"]]
    errors = []
    for block in difflib.SequenceMatcher(None, served, reference, autojunk=False).get_matching_blocks():
        for k in range(block.size):
            word = result.words[block.a + k]
            _, start, end = row["words"][block.b + k]
            errors.append((abs(word.start_seconds - start), abs(word.end_seconds - end)))
    return errors


def timing_summary(errors: list[tuple[float, float]]) -> dict:
    """Median and 90th percentile of start and end errors, and the share of boundaries within 100 ms."""
    if not errors:
        return {"words": 0}
    starts, ends = np.array(errors).T
    both = np.concatenate([starts, ends])
    return {
        "words": len(errors),
        "start_median_s": float(np.median(starts)), "start_p90_s": float(np.percentile(starts, 90)),
        "end_median_s": float(np.median(ends)), "end_p90_s": float(np.percentile(ends, 90)),
        "boundaries_within_100ms": float(np.mean(both <= 0.1)),
    }


def example(row: dict, result) -> dict:
    """A clip's reference and served transcript, with served and corpus word times."""
    return {
        "voice": voice_group(row), "reference": row["text"], "hypothesis": result.text,
        "words": [[w.word, round(w.start_seconds, 2), round(w.end_seconds, 2)] for w in result.words],
        "reference_words": [[w, round(start, 2), round(end, 2)] for w, start, end in row["words"]],
    }


def score_split(engine, corpus: pathlib.Path, split: str, beam_size: int, limit: int | None,
                noise_snr_db: float | None = None) -> dict:
    rows = corpus_manifest.read(corpus / f"{split}.jsonl")
    rows = rows[:limit] if limit else rows
    started = time.monotonic()
    results = transcribe(engine, corpus, rows, beam_size, attention=True, noise_snr_db=noise_snr_db)
    seconds = time.monotonic() - started
    hypotheses, references = [r.text for r in results], [row["text"] for row in rows]
    groups = collections.defaultdict(list)
    for i, row in enumerate(rows):
        groups[voice_group(row)].append(i)
    timing = [e for row, result in zip(rows, results) for e in word_time_errors(row, result)]
    audio = sum(row["duration"] for row in rows)
    return {
        "clips": len(rows),
        "hours": round(audio / 3600, 3),
        "cer": error_rate(hypotheses, references, "char"),
        "wer": error_rate(hypotheses, references, "word"),
        "by_voice": {
            voice: {
                "clips": len(ix),
                "cer": error_rate([hypotheses[i] for i in ix], [references[i] for i in ix], "char"),
                "wer": error_rate([hypotheses[i] for i in ix], [references[i] for i in ix], "word"),
            }
            for voice, ix in sorted(groups.items())
        },
        "word_timing": timing_summary(timing),
        "audio_seconds_per_second": audio / seconds,
        "examples": [example(rows[i], results[i]) for i in range(min(5, len(rows)))],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model-dir", type=pathlib.Path, required=True, help="version folder, e.g. models/speech-en/1")
    parser.add_argument("--corpus", type=pathlib.Path, default=pathlib.Path("data/speech"))
    parser.add_argument("--splits", nargs="+", default=["test_seen", "test_heldout_voices"])
    parser.add_argument("--beam-size", type=int, default=1)
    parser.add_argument("--limit", type=int, help="score only the first N clips of each split (a quick look)")
    parser.add_argument("--out", type=pathlib.Path, help="write the scores here as JSON")
    parser.add_argument("--ctc-weight", type=float,
                        help="decode with this CTC weight instead of the manifest's (0: the speller alone)")
    parser.add_argument("--no-length-hint", action="store_true", help="decode without the manifest's length hint")
    parser.add_argument("--lm", type=pathlib.Path, help="fuse this n-gram LM instead of the manifest's")
    parser.add_argument("--lm-weight", type=float, help="the LM's weight in shallow fusion instead of the manifest's")
    parser.add_argument("--speeds", type=float, nargs="+",
                        help="read each clip at these playback speeds instead of the manifest's (1.0: once)")
    parser.add_argument("--noise-snr-db", type=float,
                        help="mix white noise into every clip at this signal-to-noise ratio (seeded per clip)")
    args = parser.parse_args()
    with decoding_variant(args.model_dir, args.ctc_weight, not args.no_length_hint, args.lm, args.lm_weight,
                          args.speeds) as model_dir:
        engine = open_engine(model_dir)
        manifest = engine.manifest
        try:
            scores = {"model": str(args.model_dir), "beam_size": args.beam_size,
                      "ctc_weight": manifest.encoder.ctc.weight if manifest.encoder.ctc else 0.0,
                      "length_hint": manifest.encoder.length_hint is not None,
                      "lm_weight": manifest.language_model.weight if manifest.language_model else 0.0,
                      "noise_snr_db": args.noise_snr_db, "speeds": list(manifest.decoding.speeds),
                      "splits": {s: score_split(engine, args.corpus, s, args.beam_size, args.limit, args.noise_snr_db)
                                 for s in args.splits}}
        finally:
            engine.close()
    emit(scores, args.out)


if __name__ == "__main__":
    main()
