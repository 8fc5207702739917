"""Before -> after on recorded and synthesized speech, with PocketSphinx 5 as the anchor, in one run.

    python -m attnserve.export.speech.evaluate_real --models models/speech-en/6 models/speech-en/7 \\
        --real /work/data/real-speech --tts /work/data/speech --out models/speech-en/scores-real.json

Every model folder is scored through the serving engine (export/speech/evaluate.py: its default search)
and PocketSphinx 5 (PyPI `pocketsphinx`, its bundled en-us acoustic model, language model and dictionary)
decodes the same clips: `test_real_heldout` of the recorded corpus (Drascula and the Asterisk voice, never
trained on) and its `test_microphone` (PocketSphinx's own test recordings, where the corpus has them), and
`test_heldout_voices` and `test_seen` of the synthesized corpus. PocketSphinx's words are
lower-cased and kept to the corpus alphabet (its `<sil>`-style fillers dropped) before scoring.
"""

from __future__ import annotations

import argparse
import collections
import json
import math
import pathlib
import re
import tempfile
import time
import wave

import numpy as np

from attnserve.export.common.serving import open_engine
from attnserve.export.speech import evaluate, manifest
from attnserve.export.speech.scoring import error_rate
from attnserve.export.common.reports import emit

SPLITS = ("test_real_heldout", "test_microphone", "test_heldout_voices", "test_seen")
_NOT_WORD = re.compile(r"[^a-z' ]")


def sphinx_words(hypothesis: str) -> str:
    words = [w for w in hypothesis.lower().split() if not w.startswith(("<", "[", "++"))]
    words = [re.sub(r"\(\d+\)$", "", w) for w in words]  # alternative pronunciations: "the(2)"
    return " ".join(_NOT_WORD.sub("", " ".join(words)).split())


def sphinx_decoder():
    from pocketsphinx import Decoder

    return Decoder(samprate=16000, loglevel="FATAL")


def sphinx_transcribe(decoder, path: pathlib.Path) -> str:
    with wave.open(str(path)) as f:
        if f.getframerate() != 16000 or f.getnchannels() != 1 or f.getsampwidth() != 2:
            raise ValueError(f"{path}: PocketSphinx is fed 16 kHz mono 16-bit")
        data = f.readframes(f.getnframes())
    decoder.start_utt()
    decoder.process_raw(data, full_utt=True)
    decoder.end_utt()
    hypothesis = decoder.hyp()
    return sphinx_words(hypothesis.hypstr if hypothesis is not None else "")


def subset(corpus: pathlib.Path, split: str, clips: int | None) -> str:
    """The split, or a manifest of `clips` rows spread evenly over it (every voice in its share), written
    beside it as `<split>.every<k>.jsonl`; returns the split name to score."""
    rows = (corpus / f"{split}.jsonl").read_text().splitlines()
    if not clips or clips >= len(rows):
        return split
    step = math.ceil(len(rows) / clips)
    name = f"{split}.every{step}"
    (corpus / f"{name}.jsonl").write_text("\n".join(rows[::step]) + "\n")
    return name


def rows_of(corpus: pathlib.Path, split: str) -> list[dict]:
    return manifest.read(corpus / f"{split}.jsonl")


def sphinx_split(corpus: pathlib.Path, split: str) -> dict:
    rows = rows_of(corpus, split)
    decoder = sphinx_decoder()
    started = time.monotonic()
    hypotheses = [sphinx_transcribe(decoder, corpus / row["path"]) for row in rows]
    seconds = time.monotonic() - started
    references = [row["text"] for row in rows]
    groups = collections.defaultdict(list)
    for i, row in enumerate(rows):
        groups[evaluate.voice_group(row)].append(i)
    return {
        "clips": len(rows), "hours": round(sum(r["duration"] for r in rows) / 3600, 3),
        "cer": error_rate(hypotheses, references, "char"), "wer": error_rate(hypotheses, references, "word"),
        "by_voice": {v: {"clips": len(ix), "cer": error_rate([hypotheses[i] for i in ix], [references[i] for i in ix], "char"),
                         "wer": error_rate([hypotheses[i] for i in ix], [references[i] for i in ix], "word")}
                     for v, ix in sorted(groups.items())},
        "audio_seconds_per_second": sum(r["duration"] for r in rows) / seconds,
        "examples": [{"reference": references[i], "hypothesis": hypotheses[i]} for i in range(min(5, len(rows)))],
    }


def model_split(model_dir: pathlib.Path, corpus: pathlib.Path, split: str) -> dict:
    # A repository holding only this version (linked), so an older version loads as the server would load it.
    with tempfile.TemporaryDirectory() as tmp:
        alone = pathlib.Path(tmp) / model_dir.parent.name / model_dir.name
        alone.parent.mkdir()
        alone.symlink_to(model_dir.resolve())
        engine = open_engine(alone)
        try:
            beam = engine.manifest.decoding.beam_size  # the served default search
            return {"beam_size": beam, **evaluate.score_split(engine, corpus, split, beam, None)}
        finally:
            engine.close()


def test_sets(real: pathlib.Path, tts: pathlib.Path | None, wanted) -> list[tuple[pathlib.Path, str]]:
    """(corpus, split) of the `wanted` splits that the corpora have."""
    sets = [(real, "test_real_heldout")]
    if (real / "test_microphone.jsonl").exists():  # corpora built before it have none
        sets.append((real, "test_microphone"))
    if tts is not None:
        sets += [(tts, "test_heldout_voices"), (tts, "test_seen")]
    return [(corpus, split) for corpus, split in sets if split in wanted]


def merge(paths: list[pathlib.Path]) -> dict:
    """Several runs' scores as one: each split's entries side by side (a split's subset is named by its clip
    spacing, `<split>.every<k>`, so entries under one name scored the same clips). An input may be an earlier
    merge: its clip settings and runs carry over, and a later file's entries replace an earlier's."""
    runs = [json.loads(p.read_text()) for p in paths]
    clips = {c for r in runs for c in (r["clips"] if isinstance(r["clips"], list) else [r["clips"]])}
    named = [name for r, p in zip(runs, paths) for name in r.get("runs", [str(p)])]
    merged: dict = {"clips": sorted(clips, key=str), "splits": {}, "runs": named}
    for run in runs:
        for split, entry in run["splits"].items():
            merged["splits"].setdefault(split, {}).update(entry)
    return merged


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", type=pathlib.Path, nargs="+", help="version folders")
    parser.add_argument("--real", type=pathlib.Path, help="export/speech/real.py's output")
    parser.add_argument("--merge", type=pathlib.Path, nargs="+", help="combine these runs' outputs into --out, and stop")
    parser.add_argument("--tts", type=pathlib.Path, help="export/speech/build.py's output")
    parser.add_argument("--clips", type=int, help="about N clips of each split, spread evenly over it")
    parser.add_argument("--no-sphinx", action="store_true", help="leave PocketSphinx out")
    parser.add_argument("--splits", nargs="+", choices=SPLITS, default=list(SPLITS), help="which to score")
    parser.add_argument("--out", type=pathlib.Path)
    args = parser.parse_args()
    if args.merge:
        text = json.dumps(merge(args.merge), indent=1)
        if args.out:
            args.out.write_text(text + "\n")
        return
    if not args.models or args.real is None:
        parser.error("--models and --real are needed (or --merge)")
    scores: dict = {"clips": args.clips, "splits": {}}
    for corpus, split in test_sets(args.real, args.tts, args.splits):
        split = subset(corpus, split, args.clips)
        entry = scores["splits"][split] = {}
        for model_dir in args.models:
            entry[str(model_dir)] = model_split(model_dir, corpus, split)
            print(split, model_dir, f"CER {entry[str(model_dir)]['cer']:.3f} WER {entry[str(model_dir)]['wer']:.3f}",
                  flush=True)
        if not args.no_sphinx:
            entry["pocketsphinx"] = sphinx_split(corpus, split)
            print(split, "pocketsphinx", f"CER {entry['pocketsphinx']['cer']:.3f} WER {entry['pocketsphinx']['wer']:.3f}",
                  flush=True)
    emit(scores, args.out, indent=1)


if __name__ == "__main__":
    main()
