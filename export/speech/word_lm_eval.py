"""Chooses a speech model's word LM weights (manifest `word_language_model`) on dev clips, and reports what
they do on other splits.

    python -m attnserve.export.speech.word_lm_eval --model-dir models/speech-en/12 --lm /tmp/words.npz \\
        --split dev=data/real-speech --split dev_channel=data/speech-sky2 \\
        --report-split test_real_heldout=data/real-speech --out models/speech-en/word-lm-v12.json

Every clip is decoded through the served engine without a word LM, once per speed of the model's
`decoding.speeds` (its samples relabelled, as speed readings do), returning all its beams' candidates; the
rescoring is then done here, as the server does it (server/decoding/word_lm.py WordRescorer over every
reading's candidates, the recording first and the beam's order breaking ties), for every weight of a grid.
The weights with the lowest mean WER over the `--split`s are chosen; `--report-split`s are scored with them
only, never used to choose. "without_word_lm" is the reading whose best sequence scores highest, as the
model answers without the LM.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import pathlib

from attnserve.api.generation import AudioInput, DecodingOptions, GenerationRequest
from attnserve.export.common.reports import emit
from attnserve.export.common.serving import open_engine
from attnserve.export.speech import manifest
from attnserve.export.speech.evaluate import decoding_variant, served_shortest_first
from attnserve.export.speech.scoring import error_rate
from attnserve.server.decoding.word_lm import WordLanguageModel, WordRescorer
from attnserve.server.inputs.audio import read_wav
from attnserve.server.model.manifest import load_manifest

WEIGHTS = (0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.4, 0.6)
WORD_BONUSES = (0.0, 0.25, 0.5, 1.0)
UNKNOWN_PENALTIES = (0.0, 0.5, 1.0, 3.0)


@dataclasses.dataclass
class Clip:
    reference: str
    readings: list[list]  # per speed (the recording first): its candidates (ScoredSequence), best first


def candidates(engine, corpus: pathlib.Path, rows: list[dict], speeds: list[float], beams: int) -> list[Clip]:
    """Every clip's candidates at every speed, decoded without a word LM; a reading the engine refuses (slowed
    past the window) has none."""
    clips = [Clip(r["text"], []) for r in rows]

    def request(i: int, speed: float) -> GenerationRequest:
        wav = read_wav((corpus / rows[i]["path"]).read_bytes())
        audio = AudioInput(samples=wav.samples(), sample_rate_hz=round(wav.sample_rate_hz * speed))
        return GenerationRequest(engine.manifest.name, audio=audio,
                                 decoding=DecodingOptions(beam_size=beams, num_return_sequences=beams))

    for speed in speeds:
        results = served_shortest_first(engine, [r["duration"] for r in rows], lambda i: request(i, speed), 64,
                                        refused_as_none=True)
        for clip, result in zip(clips, results):
            clip.readings.append(result.nbest if result is not None else [])
    return clips


def without_word_lm(clips: list[Clip]) -> list[str]:
    """The reading whose best sequence scores highest, the recording on ties (the choice without a word LM)."""
    out = []
    for clip in clips:
        bests = [r[0] for r in clip.readings if r]
        out.append(max(enumerate(bests), key=lambda ib: (ib[1].score, -ib[0]))[1].text if bests else "")
    return out


def rescored(clips: list[Clip], rescorer: WordRescorer) -> list[str]:
    """The candidate the rescorer ranks first among every reading's, as the server chooses."""
    out = []
    for clip in clips:
        ranked = [(rescorer.score(c), -i, -j, c.text) for i, r in enumerate(clip.readings) for j, c in enumerate(r)]
        out.append(max(ranked)[3] if ranked else "")
    return out


def scores(texts: list[str], clips: list[Clip]) -> dict:
    references = [c.reference for c in clips]
    return {"cer": round(error_rate(texts, references, "char"), 4), "wer": round(error_rate(texts, references, "word"), 4)}


def _named_splits(values: list[str]) -> list[tuple[str, pathlib.Path]]:
    return [(v.split("=", 1)[0], pathlib.Path(v.split("=", 1)[1])) for v in values]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model-dir", type=pathlib.Path, required=True)
    parser.add_argument("--lm", type=pathlib.Path, required=True, help="a word LM file (export/speech/word_lm.py)")
    parser.add_argument("--split", action="append", required=True, metavar="NAME=CORPUS", help="chooses the weights")
    parser.add_argument("--report-split", action="append", default=[], metavar="NAME=CORPUS", help="reported only")
    parser.add_argument("--beam-size", type=int, default=0, help="0: the manifest's")
    parser.add_argument("--out", type=pathlib.Path)
    args = parser.parse_args()
    model = WordLanguageModel.load(args.lm)
    with decoding_variant(args.model_dir, None, True, speeds=[1.0], word_lm=False) as plain:
        engine = open_engine(plain)
        speeds = [1.0] + [s for s in load_manifest(args.model_dir / "manifest.json").decoding.speeds if s != 1.0]
        beams = args.beam_size or engine.manifest.decoding.beam_size
        try:
            decoded = {name: candidates(engine, corpus, manifest.read(corpus / f"{name}.jsonl"), speeds, beams)
                       for name, corpus in _named_splits(args.split) + _named_splits(args.report_split)}
        finally:
            engine.close()
    choosing = [name for name, _ in _named_splits(args.split)]
    grid = []
    for weights in itertools.product(WEIGHTS, WORD_BONUSES, UNKNOWN_PENALTIES):
        rescorer = WordRescorer(model, *weights)
        wers = {name: scores(rescored(decoded[name], rescorer), decoded[name])["wer"] for name in choosing}
        grid.append({"weight": weights[0], "word_bonus": weights[1], "unknown_penalty": weights[2],
                     "mean_wer": round(sum(wers.values()) / len(wers), 4), "wer": wers})
    grid.sort(key=lambda g: g["mean_wer"])
    best = grid[0]
    rescorer = WordRescorer(model, best["weight"], best["word_bonus"], best["unknown_penalty"])
    report = {
        "model": str(args.model_dir), "lm": str(args.lm), "speeds": speeds, "beams": beams, "chosen_on": choosing,
        "chosen": {k: best[k] for k in ("weight", "word_bonus", "unknown_penalty")},
        "splits": {name: {"clips": len(clips), "without_word_lm": scores(without_word_lm(clips), clips),
                          "with_word_lm": scores(rescored(clips, rescorer), clips)} for name, clips in decoded.items()},
        "grid_best_10": grid[:10],
    }
    emit(report, args.out)


if __name__ == "__main__":
    main()
